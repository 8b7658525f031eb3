"""The exceptions that mean "the user's input or setup is wrong" (shown as one message, no traceback)."""

from __future__ import annotations

from medheval.backends.base import BackendError
from medheval.fetch import AnnotationUnavailable, ChecksumMismatch
from medheval.images import ImageError
from medheval.judges import CredentialedDataError, JudgeError
from medheval.outputs import OutputFolderLocked
from medheval.predictions_log import CorruptLogError
from medheval.credentialed import CredentialedImageError
from medheval.distributed import RankFailed
from medheval.registry import NoUnitsError
from medheval.runner import RunError

USER_ERRORS: tuple[type[BaseException], ...] = (
    AnnotationUnavailable,
    CredentialedImageError,
    BackendError,
    ChecksumMismatch,
    CorruptLogError,
    CredentialedDataError,
    JudgeError,
    ImageError,
    OutputFolderLocked,
    RankFailed,
    NoUnitsError,
    RunError,
    KeyError,
    ValueError,
)
