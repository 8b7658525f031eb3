"""MedHEval visual open-ended split: chest X-ray report generation on MIMIC-CXR.

References are GPT-4 rewrites of the MIMIC-CXR reports; ``meta.structured_answer`` holds the
anatomy / measurement / symptom lists. Credentialed (PhysioNet).

Configs: ``default`` (490, the released file at ``7f7d980e``, the set the paper describes) and ``ba4586e``
(500, the same file before upstream commit ``42e36fc`` changed its instruction, dropped 10 items and
edited 60 references).
"""

import functools

import datasets

from medheval.families.medheval.source import MedHEvalBuilder, report_records

CLUSTER = "report"  # one record per report: the report resamples reports
FILE_OF_CONFIG = {"default": "report", "ba4586e": "report_ba4586e"}


class VisHalReport(MedHEvalBuilder):
    """Configs: ``default`` (490), ``ba4586e`` (500, the pre-42e36fc revision)."""

    DESCRIPTION = "MedHEval visual open-ended: report generation on MIMIC-CXR."
    BUILDER_CONFIGS = [
        datasets.BuilderConfig(name="default", description="MIMIC-CXR report generation (released file, 490)"),
        datasets.BuilderConfig(name="ba4586e", description="MIMIC-CXR report generation, the file at upstream "
                                                          "commit ba4586e (500, earlier instruction)"),
    ]
    DEFAULT_CONFIG_NAME = "default"
    OUTSIDE_GROUP = ("ba4586e",)  # its lmms-eval task exists; the `medheval` group runs the released file only

    def config_files(self):
        return [(FILE_OF_CONFIG[self.config.name],
                 functools.partial(report_records, benchmark="vishal_report", config=self.config.name))]
