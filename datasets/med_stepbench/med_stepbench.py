"""Med-StepBench: step-wise verification of PET/CT statements (arXiv 2605.10002), from a local folder.

No public release exists yet; the layout read here is the one ``README.md`` (the card) defines:
``DIR/statements.jsonl`` or ``DIR/statements.parquet`` plus the images and NIfTI volumes under
``DIR/``. Rows are mapped column-wise with pyarrow (:mod:`medheval.families.stepbench.source`).
"""

import hashlib
from pathlib import Path

import datasets

from medheval.families.stepbench import pet_ct
from medheval.families.stepbench import source as stepbench
from medheval.data.schema import FEATURES

_CITATION = """@misc{medstepbench,
  title = {Med-StepBench},
  note = {arXiv:2605.10002}
}"""
_LANGUAGES = {"en": ("en",), "vi": ("vi",), "all": stepbench.LANGUAGES}
# step number -> the category its statements carry (the report's Table 3 columns read it from here)
STEPS = stepbench.STEPS
CLUSTER = "study"  # many statements per study: the report resamples studies


class MedStepBench(datasets.ArrowBasedBuilder):
    """Configs: ``en`` (English translations), ``vi`` (Vietnamese originals), ``all`` (both)."""

    VERSION = datasets.Version("1.0.0")
    BUILDER_CONFIGS = [
        datasets.BuilderConfig(name="en", description="English statements"),
        datasets.BuilderConfig(name="vi", description="Vietnamese statements (the originals)"),
        datasets.BuilderConfig(name="all", description="both languages"),
    ]
    DEFAULT_CONFIG_NAME = "all"
    NOT_PUBLISHED = ("no public release: the statements are your own data (publish them yourself, under your "
                     "data's terms)")

    def _info(self) -> datasets.DatasetInfo:
        return datasets.DatasetInfo(
            description="Med-StepBench statements (S1-S4) labelled ground_truth or hallucination, PET/CT views.",
            features=FEATURES, homepage="https://arxiv.org/abs/2605.10002", citation=_CITATION,
        )

    def statements_path(self) -> Path:
        if not self.config.data_dir:
            raise FileNotFoundError(
                "Med-StepBench has no public download: pass data_dir=DIR (CLI: --data-dir DIR) holding "
                "statements.jsonl or statements.parquet (layout: datasets/med_stepbench/README.md)")
        return stepbench.find_statements_file(self.config.data_dir)

    def record_volumes(self, record: dict) -> dict:
        """The NIfTI volumes of one record (``meta.volume``, and ``meta.volume_pet`` when present) as
        arrays, for a 3D-capable backend (``needs_volumes``); paths are read inside ``DIR`` only."""
        fields = ("volume", "volume_pet") if (record.get("meta") or {}).get("volume_pet") else ("volume",)
        return pet_ct.load_record_volumes(self.config.data_dir, record, fields)

    def input_files(self) -> list[dict]:
        """What the results record about the input (and what keys the Arrow cache): path and sha256."""
        path = self.statements_path()
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 24), b""):
                digest.update(block)
        return [{"relpath": path.name, "sha256": digest.hexdigest(), "verified": None, "origin": str(path)}]

    def quality_summary(self, dataset: datasets.Dataset) -> dict:
        return stepbench.quality_summary(dataset)

    def apply_run_options(self, dataset: datasets.Dataset, options: dict | None):
        return stepbench.apply_run_options(dataset, options)

    def _split_generators(self, dl_manager):
        # read and checked here, so a malformed row raises StepBenchDataError itself (not wrapped by datasets)
        table, views = stepbench.load_checked(self.statements_path())
        return [datasets.SplitGenerator(name=datasets.Split.TEST, gen_kwargs={"checked": (table, views)})]

    def _generate_tables(self, checked):
        table, views = checked
        for index, batch in enumerate(stepbench.canonical_batches(table, views, _LANGUAGES[self.config.name])):
            yield datasets.builder.Key(0, index), batch
