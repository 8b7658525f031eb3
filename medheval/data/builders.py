"""Builders over pinned upstream annotation files, and the label-noise summary every split reports.

A family's base builder subclasses :class:`PinnedFilesBuilder` with its ``PINNED`` files (e.g.
:class:`medheval.families.medheval.source.MedHEvalBuilder`); :func:`medheval.data.benchmarks.prepare_benchmark`
fetches them by sha256 and keys the Arrow cache on what it read.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import datasets

from medheval.data.fetch import PinnedFile, fetch
from medheval.data.schema import FEATURES


def quality_summary(records: Iterable[dict]) -> dict[str, Any]:
    """Counts of the upstream label-noise flags, overall and per config, with example ids."""
    by_flag: Counter[str] = Counter()
    by_config: dict[str, Counter[str]] = {}
    examples: dict[str, list[str]] = {}
    total = flagged = 0
    for record in records:
        total += 1
        flagged += bool(record["meta"].get("quality_flags"))
        for flag in record["meta"].get("quality_flags", []):
            by_flag[flag] += 1
            by_config.setdefault(record["config"], Counter())[flag] += 1
            examples.setdefault(flag, [])
            if len(examples[flag]) < 5:
                examples[flag].append(record["id"])
    return {
        "n_records": total,
        "n_flagged": flagged,
        "flags": dict(by_flag),
        "flags_by_config": {config: dict(counts) for config, counts in sorted(by_config.items())},
        "examples": examples,
    }


class PinnedFilesBuilder(datasets.GeneratorBasedBuilder):
    """Base builder over pinned upstream annotation files: a unit declares ``PINNED``, ``BUILDER_CONFIGS`` and
    ``config_files``.

    ``config_files()`` maps the chosen config to a list of ``(PINNED key, record generator)``; the base
    fetches each pinned file (``data_dir`` = local copy of ``benchmark_data/``) and yields the records,
    checking that ids are unique.
    """

    VERSION = datasets.Version("1.0.0")
    DESCRIPTION = ""
    PINNED: dict[str, PinnedFile] = {}  # the upstream files ``config_files()`` keys name
    HOMEPAGE = ""
    CITATION = ""

    def _info(self) -> datasets.DatasetInfo:
        return datasets.DatasetInfo(
            description=self.DESCRIPTION, features=FEATURES, homepage=self.HOMEPAGE, citation=self.CITATION
        )

    def config_files(self) -> list[tuple[str, Any]]:  # pragma: no cover - each unit overrides
        raise NotImplementedError

    def _split_generators(self, dl_manager: datasets.DownloadManager) -> list[datasets.SplitGenerator]:
        parts = [(fetch(self.PINNED[key], data_dir=self.config.data_dir).path, make) for key, make in self.config_files()]
        return [datasets.SplitGenerator(name=datasets.Split.TEST, gen_kwargs={"parts": parts})]

    def _generate_examples(self, parts: list[tuple[Path, Any]]) -> Iterator[tuple[str, dict]]:
        seen: set[str] = set()
        for path, make in parts:
            for record in make(path):
                if record["id"] in seen:
                    raise ValueError(f"{path}: duplicate record id {record['id']!r} (upstream qid repeated)")
                seen.add(record["id"])
                yield record["id"], record
