"""CXR-VisHal: MedHEval's visual close-ended split on chest X-rays, IU-Xray and MIMIC-CXR (5,587 items).

Built from the per-source fine-grained files so ids map back to the upstream ``qid``s.
MIMIC-CXR items are credentialed (PhysioNet): images come from the user's own copy.
"""

import functools

import datasets

from medheval.families.medheval.source import MedHEvalBuilder, visual_close_records

_SOURCES = ("iu_xray", "mimic_cxr")
CLUSTER = "image"  # several questions per image: the report resamples images


class CXRVisHal(MedHEvalBuilder):
    """Configs: ``all`` (5,587), ``iu_xray`` (2,017), ``mimic_cxr`` (3,570)."""

    DESCRIPTION = "MedHEval CXR-VisHal: visual misinterpretation, close-ended, IU-Xray + MIMIC-CXR."
    BUILDER_CONFIGS = [
        datasets.BuilderConfig(name="all", description="IU-Xray and MIMIC-CXR"),
        datasets.BuilderConfig(name="iu_xray", description="IU-Xray frontal views"),
        datasets.BuilderConfig(name="mimic_cxr", description="MIMIC-CXR-JPG (credentialed)"),
    ]
    DEFAULT_CONFIG_NAME = "all"

    def config_files(self):
        sources = _SOURCES if self.config.name == "all" else (self.config.name,)
        return [
            (source, functools.partial(visual_close_records, benchmark="cxr_vishal", config=source, source=source))
            for source in sources
        ]
