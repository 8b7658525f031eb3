"""lmms-eval tasks for our benchmarks, shipped inside the package.

Two ways in (lmms-eval 0.7.x):

- ``lmms-eval --include_path "$(medheval integrations lmms-eval-path)" --tasks medheval_cxr_vishal_mimic_cxr …``
- ``LMMS_EVAL_PLUGINS=medheval.integrations.lmms_eval lmms-eval --tasks …``: lmms-eval adds this package's
  ``tasks`` folder to its task paths and reads ``AVAILABLE_MODELS`` from its ``models`` module (empty: we
  add tasks, no models).

A split of credentialed (MIMIC) records is refused unless ``MEDHEVAL_ALLOW_CREDENTIALED=1``
(:func:`medheval.integrations.splits.check_credentialed`): lmms-eval hands the images to any model, API ones too.

One task per split of :func:`medheval.integrations.splits.harness_splits`, named ``medheval_<benchmark>_<config>``,
plus the group ``medheval`` (every public benchmark's tasks) and ``medheval_med_stepbench`` (Med-StepBench: no
public data, so not in ``medheval``). The yaml files are written by :mod:`.write_tasks`; ``tasks/utils.py``
hands lmms-eval our records, prompts, images and scores (:mod:`medheval.integrations.splits`).
"""

from __future__ import annotations

from pathlib import Path

TASKS_DIR = Path(__file__).resolve().parent / "tasks"


def tasks_path() -> Path:
    """The folder to pass to ``lmms-eval --include_path``."""
    return TASKS_DIR
