"""MediHall Score (Med-HallMark, arXiv 2406.10185), in three parts:

* :mod:`medheval.medihall.levels` — the levels, their weights, the item/report/overall scores,
  the report sentence splitter (the IRG unit);
* :mod:`medheval.medihall.rules` — the offline ``rule`` classifier (VQA and IRG);
* :mod:`medheval.medihall.prompts` — judge/detector prompts (this project's wording, or the exact
  upstream text read from the pinned files) and the validators of the replies.

Med-HallMark's released files are read by :mod:`medheval.med_hallmark_source` (the builder's side).
Everything public is re-exported here (``from medheval import medihall as mh; mh.WEIGHTS``).
"""

from medheval.medihall.levels import *  # noqa: F401,F403
from medheval.medihall.levels import __all__ as _levels_all
from medheval.medihall.prompts import *  # noqa: F401,F403
from medheval.medihall.prompts import __all__ as _prompts_all
from medheval.medihall.rules import *  # noqa: F401,F403
from medheval.medihall.rules import __all__ as _rules_all

__all__ = [*_levels_all, *_rules_all, *_prompts_all]
