"""lmms-eval loads this file by path for the task yamls' ``!function utils.…``; the functions live in
:mod:`medheval.integrations.lmms_eval.functions` (imported once, so its score cache is shared)."""

from medheval.integrations.lmms_eval.functions import *  # noqa: F401,F403
