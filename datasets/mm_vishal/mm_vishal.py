"""MM-VisHal: MedHEval's visual close-ended split on SLAKE and VQA-RAD images (3,610 items).

Built from the per-source fine-grained files so ids map back to the upstream ``qid``s the
MedHEval scorer matches on (``MM-VisHal.json`` renumbers them).
"""

import functools

import datasets

from medheval.families.medheval.source import MedHEvalBuilder, visual_close_records

_SOURCES = ("slake", "vqa_rad")
CLUSTER = "image"  # several questions per image: the report resamples images


class MMVisHal(MedHEvalBuilder):
    """Configs: ``all`` (3,610), ``slake`` (1,536), ``vqa_rad`` (2,074)."""

    DESCRIPTION = "MedHEval MM-VisHal: visual misinterpretation, close-ended, SLAKE + VQA-RAD."
    BUILDER_CONFIGS = [
        datasets.BuilderConfig(name="all", description="SLAKE and VQA-RAD"),
        datasets.BuilderConfig(name="slake", description="SLAKE images (CT, MRI, X-ray)"),
        datasets.BuilderConfig(name="vqa_rad", description="VQA-RAD images"),
    ]
    DEFAULT_CONFIG_NAME = "all"

    def config_files(self):
        sources = _SOURCES if self.config.name == "all" else (self.config.name,)
        return [
            (source, functools.partial(visual_close_records, benchmark="mm_vishal", config=source, source=source))
            for source in sources
        ]
