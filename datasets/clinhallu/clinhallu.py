"""ClinHallu: 7,031 medical VQA items (VQA-RAD, PathVQA, MedFrameQA, MedXpertQA-MM test sets), each
with a validated gold reasoning trace (Visual Recognition -> Knowledge Recall -> Reasoning -> Answer).

Read from the Hub dataset ``Alibaba-DAMO-Academy/ClinHallu`` (its Parquet configs) or, with
``data_dir=``, from a local snapshot of it (``hf download ... --local-dir``). The mapping lives in
:mod:`medheval.families.clinhallu.source`.
"""

import datasets

from medheval.data.schema import FEATURES
from medheval.families.clinhallu import source as clinhallu_source
from medheval.families.clinhallu import task as clinhallu_task
from medheval.families.clinhallu import trace as clinhallu_trace  # noqa: F401  (imported so the cache key covers it)

# run_eval drives this benchmark through its own protocol (four traces per item + judges), not "one
# answer per item": the runner imports it by this name (medheval.run.protocol.protocol_for)
PROTOCOLS = {"generate": "medheval.families.clinhallu.task:ClinHalluProtocol"}
# VQA-RAD and PathVQA ask several questions about one image: the report resamples images (an item's four
# settings stay within it); the run records each item's cluster beside its protocol logs
CLUSTER = "image"


class ClinHallu(datasets.GeneratorBasedBuilder):
    """Configs: one per source dataset, and ``all`` (their union, in source order)."""

    VERSION = datasets.Version("1.0.0")
    BUILDER_CONFIGS = [
        datasets.BuilderConfig(name="all", description="all four sources"),
        datasets.BuilderConfig(name="vqa_rad", description="VQA-RAD test (yes/no and open questions, one image)"),
        datasets.BuilderConfig(name="pathvqa", description="PathVQA test (yes/no and open questions, one image)"),
        datasets.BuilderConfig(name="medframeqa", description="MedFrameQA (multiple choice, 2-5 video frames)"),
        datasets.BuilderConfig(name="medxpertqa", description="MedXpertQA-MM test (multiple choice)"),
    ]
    DEFAULT_CONFIG_NAME = "all"
    NOT_PUBLISHED = "its authors publish it on the Hub as Alibaba-DAMO-Academy/ClinHallu: load it from there"

    def _info(self) -> datasets.DatasetInfo:
        return datasets.DatasetInfo(
            description="ClinHallu: stage-wise hallucination diagnosis on three-stage medical reasoning traces.",
            features=FEATURES, homepage=clinhallu_source.HOMEPAGE, citation=clinhallu_source.CITATION,
        )

    def sources(self) -> list[str]:
        """The source configs this config reads."""
        return list(clinhallu_source.SOURCES) if self.config.name == "all" else [self.config.name]

    def input_files(self) -> list[dict]:
        """What each source was read from (``relpath``, ``sha256``, ``verified``, ``origin``), for the results."""
        return [item for name in self.sources() for item in clinhallu_source.load_source(name, self.config.data_dir)[1]]

    def apply_run_options(self, dataset: datasets.Dataset, options: dict | None):
        """``--benchmark-option clinhallu.prompts=own|upstream``, ``max_new_tokens=N``, ``temperature=T``
        (:mod:`medheval.families.clinhallu.task`)."""
        return clinhallu_task.apply_run_options(dataset, options)

    def _split_generators(self, dl_manager: datasets.DownloadManager) -> list[datasets.SplitGenerator]:
        return [datasets.SplitGenerator(name=datasets.Split.TEST, gen_kwargs={"names": self.sources()})]

    def _generate_examples(self, names: list[str]):
        seen: set[str] = set()
        for name in names:
            rows, _ = clinhallu_source.load_source(name, self.config.data_dir)
            for record in clinhallu_source.records(rows, name):
                if record["id"] in seen:
                    raise ValueError(f"ClinHallu {name}: duplicate record id {record['id']!r} "
                                     f"(upstream id {record['meta']['upstream_id']} repeated)")
                seen.add(record["id"])
                yield record["id"], record
