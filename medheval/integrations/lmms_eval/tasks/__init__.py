"""lmms-eval task folder (yaml files and ``utils.py``); importable so ``LMMS_EVAL_PLUGINS`` finds it."""
