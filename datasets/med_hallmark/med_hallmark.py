"""Med-HallMark (Chen et al. 2024, arXiv 2406.10185): the released hallucination-benchmark files.

Configs: ``conventional`` (499 VQA-RAD items with a human hallucination level), ``counterfactual``
(111 SLAKE items with a false premise, all labelled prompt-induced), ``confidence_weakening``
(140 VQA-RAD questions behind a confidence-weakening prefix) and ``irg`` (359 MIMIC-CXR report
generation items; credentialed). Readers and pins: :mod:`medheval.med_hallmark_source`.
"""

import functools

import datasets

from medheval import med_hallmark_source as source
from medheval.medheval_source import MedHEvalBuilder

# run_eval's metrics for every config: MediHall Score (levels from --judge, --detector or the rules) and
# the text metrics against the ground truth (paper Table 1)
DEFAULT_METRICS = ("medihall_score", "text_generation")


class MedHallMark(MedHEvalBuilder):
    """Configs: ``conventional`` (499), ``counterfactual`` (111), ``confidence_weakening`` (140), ``irg`` (359)."""

    DESCRIPTION = ("Med-HallMark: medical VQA and report generation items with Med-VLM answers and human "
                   "hallucination levels (MediHall Score).")
    PINNED = source.FILES
    HOMEPAGE = source.HOMEPAGE
    CITATION = source.CITATION
    BUILDER_CONFIGS = [
        datasets.BuilderConfig(name="conventional", description="VQA-RAD questions, released answers, human levels"),
        datasets.BuilderConfig(name="counterfactual", description="SLAKE questions with a false premise"),
        datasets.BuilderConfig(name="confidence_weakening", description="VQA-RAD questions behind a doubt prefix"),
        datasets.BuilderConfig(name="irg", description="MIMIC-CXR report generation (credentialed)"),
    ]
    DEFAULT_CONFIG_NAME = "conventional"

    def config_files(self):
        name = self.config.name
        return [(name, functools.partial(source.READERS[name], config=name))]
