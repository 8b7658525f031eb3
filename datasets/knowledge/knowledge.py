"""MedHEval knowledge-deficiency split on MIMIC-CXR images: ``closed`` (2,000 yes/no) and ``open`` (2,318).

Credentialed (text derived from MIMIC-CXR reports).
"""

import functools

import datasets

from medheval.families.medheval.source import MedHEvalBuilder, text_records

CLUSTER = "image"  # several questions per MIMIC-CXR image: the report resamples images


class Knowledge(MedHEvalBuilder):
    """Configs: ``closed`` (2,000), ``open`` (2,318)."""

    DESCRIPTION = "MedHEval knowledge deficiency: close-ended yes/no and open-ended questions on MIMIC-CXR."
    BUILDER_CONFIGS = [
        datasets.BuilderConfig(name="closed", description="yes/no questions"),
        datasets.BuilderConfig(name="open", description="open-ended questions (LLM-judged)"),
    ]
    DEFAULT_CONFIG_NAME = "closed"

    def config_files(self):
        key = "knowledge_closed" if self.config.name == "closed" else "knowledge_open"
        return [(key, functools.partial(text_records, benchmark="knowledge", config=self.config.name, category="knowledge"))]
