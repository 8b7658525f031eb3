"""Med-HallMark (Chen et al. 2024, arXiv 2406.10185): the released hallucination-benchmark files.

Configs: ``conventional`` (499 VQA-RAD items with a human hallucination level), ``counterfactual``
(111 SLAKE items with a false premise, all labelled prompt-induced), ``confidence_weakening``
(140 VQA-RAD questions behind a confidence-weakening prefix) and ``irg`` (359 MIMIC-CXR report
generation items; credentialed). Readers and pins: :mod:`medheval.families.med_hallmark.source`.
"""

import functools

import datasets

from medheval.families.med_hallmark import source
from medheval.data.builders import PinnedFilesBuilder

# run_eval's metrics for every config: MediHall Score (levels from --judge, --detector or the rules) and
# the text metrics against the ground truth (paper Table 1)
DEFAULT_METRICS = ("medihall_score", "text_generation")
# run_eval --task detection: the level source scored against the human levels (medheval.run.protocol)
PROTOCOLS = {"detection": "medheval.families.med_hallmark.detection:DetectionProtocol"}
CLUSTER = "image"  # several questions per image: the report resamples images


class MedHallMark(PinnedFilesBuilder):
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

    QUESTION_OPTIONS = ("as_released", "plain")

    def apply_run_options(self, dataset: datasets.Dataset, options: dict | None):
        """Run option ``question``: ``as_released`` (default) or ``plain``, which asks confidence_weakening's
        questions without their prefix (``meta.plain_question``); two runs, one each way, give the
        prefix's effect (the paper's Table 2). Returns the dataset and what to record."""
        options = dict(options or {})
        question = str(options.pop("question", "as_released"))
        if options:
            raise ValueError(f"unknown med_hallmark run option(s) {sorted(options)}; known: "
                             f"question={'|'.join(self.QUESTION_OPTIONS)}")
        if question not in self.QUESTION_OPTIONS:
            raise ValueError(f"med_hallmark.question={question!r}: choose one of {list(self.QUESTION_OPTIONS)}")
        if question == "as_released":
            return dataset, {}
        if self.config.name != "confidence_weakening":
            raise ValueError(f"med_hallmark.question=plain applies to the confidence_weakening config only "
                             f"(its questions carry a prefix); {self.config.name!r} has none")

        def plain(row: dict) -> dict:
            return {"question": (row["meta"] or {}).get("plain_question") or row["question"]}

        return dataset.map(plain, desc="plain questions"), {"question": "plain"}

    def config_files(self):
        name = self.config.name
        return [(name, functools.partial(source.READERS[name], config=name))]
