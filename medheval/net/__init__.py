"""What every outbound request and every written byte share: one transport policy (:mod:`.transport`) and one
registry of the secrets a process holds (:mod:`.secrets`). Imports nothing else of medheval, so every layer may
use it (images in ``data``, model calls in ``backends``, judges)."""
