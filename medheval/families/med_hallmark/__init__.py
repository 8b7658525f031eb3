"""MediHall Score (Med-HallMark, arXiv 2406.10185), in three parts:

* :mod:`medheval.families.med_hallmark.levels` — the levels, their weights, the item/report/overall scores,
  the report sentence splitter (the IRG unit);
* :mod:`medheval.families.med_hallmark.rules` — the offline ``rule`` classifier (VQA and IRG);
* :mod:`medheval.families.med_hallmark.prompts` — judge/detector prompts (this project's wording, or the exact
  upstream text read from the pinned files) and the validators of the replies.

Med-HallMark's released files are read by :mod:`medheval.families.med_hallmark.source` (the builder's side).
Everything public is re-exported here (``from medheval import medihall as mh; mh.WEIGHTS``).
"""

from medheval.families.med_hallmark.levels import *  # noqa: F401,F403
from medheval.families.med_hallmark.levels import __all__ as _levels_all
from medheval.families.med_hallmark.prompts import *  # noqa: F401,F403
from medheval.families.med_hallmark.prompts import __all__ as _prompts_all
from medheval.families.med_hallmark.rules import *  # noqa: F401,F403
from medheval.families.med_hallmark.rules import __all__ as _rules_all

__all__ = [*_levels_all, *_rules_all, *_prompts_all]
