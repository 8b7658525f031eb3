"""MedHEval visual open-ended split: chest X-ray report generation on MIMIC-CXR (490 items).

References are GPT-4 rewrites of the MIMIC-CXR reports; ``meta.structured_answer`` holds the
anatomy / measurement / symptom lists. Credentialed (PhysioNet).
"""

import functools

import datasets

from medheval.families.medheval.source import MedHEvalBuilder, report_records

CLUSTER = "report"  # one record per report: the report resamples reports


class VisHalReport(MedHEvalBuilder):
    """One config, ``default`` (490)."""

    DESCRIPTION = "MedHEval visual open-ended: report generation on MIMIC-CXR."
    BUILDER_CONFIGS = [datasets.BuilderConfig(name="default", description="MIMIC-CXR report generation")]
    DEFAULT_CONFIG_NAME = "default"

    def config_files(self):
        return [("report", functools.partial(report_records, benchmark="vishal_report", config="default"))]
