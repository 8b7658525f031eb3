"""Read by lmms-eval when ``LMMS_EVAL_PLUGINS`` names this package: the plugin's models (none; models come
from lmms-eval itself, our tasks come from the ``tasks`` folder)."""

AVAILABLE_MODELS: dict[str, str] = {}
