"""MedHEval context-misalignment split: 2,000 close-ended yes/no items on MIMIC-CXR with patient context.

Credentialed (text derived from MIMIC-CXR reports and MIMIC-IV notes).
"""

import functools

import datasets

from medheval.families.medheval.source import MedHEvalBuilder, text_records

CLUSTER = "image"  # several questions per MIMIC-CXR image: the report resamples images


class Context(MedHEvalBuilder):
    """One config, ``default`` (2,000)."""

    DESCRIPTION = "MedHEval context misalignment: yes/no questions conditioned on clinical context."
    BUILDER_CONFIGS = [datasets.BuilderConfig(name="default", description="close-ended yes/no")]
    DEFAULT_CONFIG_NAME = "default"

    def config_files(self):
        return [("context", functools.partial(text_records, benchmark="context", config="default", category="context"))]
