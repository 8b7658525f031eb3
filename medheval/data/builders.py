"""Builders over pinned upstream annotation files, and the label-noise summary every split reports.

A family's base builder subclasses :class:`PinnedFilesBuilder` with its ``PINNED`` files (e.g.
:class:`medheval.families.medheval.source.MedHEvalBuilder`); :func:`medheval.data.benchmarks.prepare_benchmark`
fetches them by sha256 and keys the Arrow cache on what it read.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import datasets

from medheval.data.fetch import AnotherConfigsFile, FetchedFile, PinnedFile, fetch
from medheval.data.schema import FEATURES


def read_utf8(path: str | Path) -> str:
    """A text file's content; a byte that is not UTF-8 is an error naming the file, line and byte."""
    data = Path(path).read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise ValueError(f"{path}: line {line} is not UTF-8 (byte {error.start}, {data[error.start:error.start + 1]!r}): "
                         "save the file as UTF-8") from None


def read_json_records(path: str | Path, what: str = "a benchmark annotation file") -> list[Any]:
    """One JSON array of records; the error names the file when it is not one (or not UTF-8 JSON)."""
    try:
        data = json.loads(read_utf8(path))
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not valid JSON ({error}); is this {what}?") from error
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON array of records, found {type(data).__name__}")
    if not data:
        raise ValueError(f"{path}: the JSON array holds no records; is this {what}, and was it written in full?")
    return data


def _shown(value: Any) -> str:
    return "null" if value is None else f"{type(value).__name__} {json.dumps(value, default=str)[:60]}"


MAX_TEXT_CHARS = 50_000  # the longest annotation text field read (a radiology report is a few thousand)


def check_text_length(value: str, key: str, where: str) -> str:
    """``value`` when it holds at most :data:`MAX_TEXT_CHARS` characters; else an error naming ``where`` (file,
    record) and the field: no benchmark's question, answer, choices or report is that long, and the parsers
    are not meant for megabytes of text."""
    if len(value) > MAX_TEXT_CHARS:
        raise ValueError(f"{where}: field {key!r} holds {len(value):,} characters, more than the {MAX_TEXT_CHARS:,} "
                         "an annotation text field may hold; fix the record or drop it from the file")
    return value


def text_field(raw: dict, key: str, where: str) -> str:
    """``raw[key]`` when it is a string of at most :data:`MAX_TEXT_CHARS` characters; else an error naming
    ``where`` (file, record), the field and the value (nothing is coerced: ``["Yes"]`` would become the answer
    ``"['Yes']"``)."""
    value = raw.get(key)
    if not isinstance(value, str):
        raise ValueError(f"{where}: field {key!r} is {_shown(value)}, expected a string; fix the record")
    return check_text_length(value, key, where)


def image_field(raw: dict, key: str, where: str) -> str:
    """``raw[key]`` when it is a non-blank string (an image reference); else an error naming ``where`` (file,
    record), the field and the value. A blank reference names no image: it would load, then fail far from its
    record (the image root itself as the "file", or a missing file named by spaces)."""
    value = text_field(raw, key, where)
    if not value.strip():
        raise ValueError(f"{where}: field {key!r} is {_shown(value)}, expected an image reference (a non-empty "
                         f"path); fix the record or drop it from the file")
    return value


def id_field(raw: dict, key: str, where: str) -> int | str:
    """``raw[key]`` when it is an integer or a non-empty string (a record id); else an error naming it
    (a null id would make every such record ``.../None``)."""
    value = raw.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, str)) or (isinstance(value, str) and not value.strip()):
        raise ValueError(f"{where}: field {key!r} is {_shown(value)}, expected an integer or a non-empty string")
    return value


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

    def fetch_file(self, key: str) -> FetchedFile:
        """Fetch ``PINNED[key]`` (``data_dir`` first, :func:`~medheval.data.fetch.fetch`). A ``data_dir`` file
        whose bytes are another pin at the same relative path (another config's revision of the file) is refused
        (:class:`~medheval.data.fetch.AnotherConfigsFile`): it would load under this config's record ids."""
        pinned = self.PINNED[key]
        got = fetch(pinned, data_dir=self.config.data_dir)
        if got.verified or got.origin != "data_dir":
            return got
        other = next((name for name, pin in self.PINNED.items()
                      if name != key and pin.relpath == pinned.relpath and pin.sha256 == got.sha256), None)
        if other is None:
            return got  # a modified copy: read, and the run says so
        configs = " / ".join(f"`{name}`" for name in self._configs_reading(other)) or f"pinned as `{other}`"
        folder = pinned.url.removesuffix(pinned.relpath)
        raise AnotherConfigsFile(
            f"{got.path} is the file of config {configs} (sha256 {got.sha256}), not of `{self.config.name}` "
            f"(sha256 {pinned.sha256}): `{self.config.name}` needs a --data-dir copy of {folder} (that upstream "
            f"commit), or drop --data-dir to download its file")

    def _configs_reading(self, key: str) -> list[str]:
        """The names of this builder's configs whose ``config_files()`` include ``PINNED[key]``."""
        names = []
        for config in self.BUILDER_CONFIGS:
            view = object.__new__(type(self))  # a shallow copy (copy.copy would share __dict__: datasets' setstate)
            view.__dict__.update(vars(self), config=config)
            if any(name == key for name, _ in view.config_files()):
                names.append(config.name)
        return names

    def _split_generators(self, dl_manager: datasets.DownloadManager) -> list[datasets.SplitGenerator]:
        parts = [(self.fetch_file(key).path, make) for key, make in self.config_files()]
        return [datasets.SplitGenerator(name=datasets.Split.TEST, gen_kwargs={"parts": parts})]

    def _generate_examples(self, parts: list[tuple[Path, Any]]) -> Iterator[tuple[str, dict]]:
        seen: set[str] = set()
        for path, make in parts:
            for record in make(path):
                if record["id"] in seen:
                    raise ValueError(f"{path}: duplicate record id {record['id']!r} (upstream qid repeated)")
                seen.add(record["id"])
                yield record["id"], record
