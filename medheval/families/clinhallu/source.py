"""ClinHallu's released data (Hugging Face Hub ``Alibaba-DAMO-Academy/ClinHallu``, Parquet) and its
mapping to the canonical record (:mod:`medheval.data.schema`).

One Parquet config per source dataset, one row per item, with the columns ``question``,
``answer`` (``"F. <option text>"`` for multiple choice), ``answer_letter``, ``options``
(``["A. ...", ...]``), ``question_type`` (``multiple_choice`` | ``yes_no`` | ``open_ended``),
``source_id`` (MedFrameQA question id, MedXpertQA ``MM-<n>``; empty for VQA-RAD/PathVQA),
``images`` (file names, 2-5 for MedFrameQA), optional ``system``/``organ``/``modality``/
``keyword``/``video_id``/``split`` and ``gold_cot`` (``raw`` trace text, and in the pipeline's
own records the parsed stages ``{visual_recognition: {text}, knowledge_recall: {text},
reasoning: {text, answer}}``).

Ids follow ClinHallu's own sample identifier: ``source_id`` when present, else the column
``original_index``, else the row index. ``meta.upstream_id`` keeps the upstream form
(``source_id:MM-26`` / ``original_index:12``) so results can be joined with ClinHallu's outputs.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import datasets
import pyarrow as pa
import pyarrow.parquet as pq

from medheval.families.clinhallu.trace import STAGES, parse_trace
from medheval.data.builders import text_field
from medheval.data.fetch import sha256_of
from medheval.scoring.parsing import normalize_reference
from medheval.data.schema import make_id

HUB_ID = "Alibaba-DAMO-Academy/ClinHallu"
HOMEPAGE = "https://github.com/alibaba-damo-academy/ClinHallu"
BENCHMARK = "clinhallu"
CITATION = """@misc{clinhallu,
  title        = {ClinHallu},
  author       = {{Alibaba DAMO Academy}},
  howpublished = {https://github.com/alibaba-damo-academy/ClinHallu and https://huggingface.co/datasets/Alibaba-DAMO-Academy/ClinHallu}
}"""

# config name -> prefix a Hub config name / Parquet path has once lower-cased without punctuation
SOURCES: dict[str, str] = {
    "vqa_rad": "vqarad",
    "pathvqa": "pathvqa",
    "medframeqa": "medframeqa",
    "medxpertqa": "medxpert",
}
_QUESTION_TYPES = {"multiple_choice": "multiple_choice", "yes_no": "yes_no", "open_ended": "open", "open": "open"}
_OPTION = re.compile(r"^\s*\(?([A-Z])[.):]\s*(.*)$", re.DOTALL)
_META_COLUMNS = ("split", "system", "organ", "modality", "keyword", "video_id", "specialty", "body_system")


class ClinHalluUnavailable(FileNotFoundError):
    """Neither a local snapshot nor the Hub could provide a ClinHallu config."""


def image_source(config: str) -> str:
    """The image-root key of one source: ClinHallu renames the source images (``vqarad_00012.jpg``),
    so its images need their own root, separate from the original VQA-RAD folder."""
    return f"{BENCHMARK}_{config}"


def _norm(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def _match_config(source: str, names: list[str]) -> str | None:
    matches = [name for name in names if _norm(name).startswith(SOURCES[source])]
    if len(matches) > 1:
        raise ValueError(f"ClinHallu: several configs match source {source!r}: {matches}; pass data_dir= a snapshot "
                         "holding one config per source")
    return matches[0] if matches else None


def _unavailable(source: str, where: str, error: Exception | None = None) -> ClinHalluUnavailable:
    cause = f" ({type(error).__name__}: {error})" if error is not None else ""
    return ClinHalluUnavailable(
        f"ClinHallu source {source!r} is not available from {where}{cause}.\n"
        f"  fix: hf download {HUB_ID} --repo-type dataset --local-dir <folder>, then pass data_dir=<folder>"
        " (--data-dir); the folder must hold the snapshot's README.md (its configs) or Parquet files whose"
        f" path names the source ({', '.join(SOURCES.values())})."
    )


def _split_of(loaded: Any) -> datasets.Dataset:
    if isinstance(loaded, datasets.DatasetDict):
        return loaded["test"] if "test" in loaded else loaded[next(iter(loaded))]
    return loaded


def _local_parquet(source: str, root: Path) -> list[Path]:
    return sorted(path for path in root.rglob("*.parquet")
                  if SOURCES[source] in _norm(str(path.relative_to(root))) and ".cache" not in path.parts)


def load_source(source: str, data_dir: str | Path | None = None) -> tuple[Iterable[Mapping[str, Any]], list[dict]]:
    """The rows of one source and the files they came from
    (``relpath``, ``sha256``, ``verified``, ``origin``), from ``data_dir`` or the Hub."""
    if source not in SOURCES:
        raise ValueError(f"unknown ClinHallu source {source!r}; expected one of {sorted(SOURCES)}")
    if data_dir is None:
        try:
            name = _match_config(source, datasets.get_dataset_config_names(HUB_ID))
            if name is None:
                raise ValueError(f"no Hub config matches {source!r}")
            rows = _split_of(datasets.load_dataset(HUB_ID, name))
        except (ConnectionError, OSError, ValueError) as error:
            raise _unavailable(source, f"the Hub ({HUB_ID})", error) from error
        # no per-file sha256 here: the datasets fingerprint (Hub revision + files) identifies the bytes
        return rows, [{"relpath": f"{HUB_ID}:{name}", "sha256": None, "fingerprint": rows._fingerprint,
                       "verified": None, "origin": "hub"}]
    root = Path(data_dir)
    if not root.is_dir():
        raise ClinHalluUnavailable(f"data_dir={str(data_dir)!r} is not a folder (expected a snapshot of {HUB_ID})")
    files = _local_parquet(source, root)
    if not files:
        raise _unavailable(source, f"data_dir={str(data_dir)!r}")
    tables = [pq.read_table(path) for path in files]
    rows = pa.concat_tables(tables, promote_options="default").to_pylist()
    # verified=None: ClinHallu publishes no checksums to compare with; the sha256 records the bytes used
    described = [{"relpath": str(path.relative_to(root)), "sha256": sha256_of(path), "verified": None,
                  "origin": "data_dir"} for path in files]
    return rows, described


def _gold_trace(raw_cot: Any, flags: list[str]) -> dict[str, str]:
    """The gold trace's stages: the parsed fields when the row has them, else parsed from ``raw``."""
    if not isinstance(raw_cot, Mapping):
        flags.append("gold_trace_missing")
        return {name: "" for name in (*STAGES, "answer")}
    structured = all(isinstance(raw_cot.get(name), Mapping) and raw_cot[name].get("text") for name in STAGES)
    parsed = parse_trace(str(raw_cot.get("raw") or ""))
    if structured:
        trace = {name: str(raw_cot[name]["text"]) for name in STAGES}
        trace["answer"] = str(raw_cot["reasoning"].get("answer") or parsed.answer)
    else:
        trace = parsed.as_dict()
    if not parsed.valid and not structured:
        flags.append(f"gold_trace_invalid:{parsed.reason}")
    return trace


def _choices(options: Any, flags: list[str]) -> tuple[list[str], list[str]]:
    """Option texts without their letters, and the letters (``A``, ``B``, ...)."""
    texts, letters = [], []
    for option in list(options or []):
        found = _OPTION.match(str(option))
        if found is None:
            flags.append("option_without_letter")
            letters.append(chr(ord("A") + len(letters)))
            texts.append(str(option).strip())
        else:
            letters.append(found.group(1))
            texts.append(found.group(2).strip())
    return texts, letters


def _answer_type(row: Mapping[str, Any], flags: list[str]) -> str:
    declared = str(row.get("question_type") or "")
    if declared in _QUESTION_TYPES:
        return _QUESTION_TYPES[declared]
    flags.append(f"unknown_question_type:{declared or '<empty>'}")
    if row.get("options"):
        return "multiple_choice"
    answer = str(row.get("answer") or "").strip().rstrip(".").lower()
    return "yes_no" if answer in {"yes", "no"} else "open"


def upstream_id(row: Mapping[str, Any], index: int) -> tuple[str, str]:
    """ClinHallu's sample identifier of a row: (``source_id``|``original_index``|``row_index``, value)."""
    source_id = str(row.get("source_id") or "").strip()
    if source_id:
        return "source_id", source_id
    original = row.get("original_index")
    if original is not None and str(original).strip():
        return "original_index", str(original).strip()
    return "row_index", str(index)


def image_refs(value: Any, where: str) -> list[str]:
    """A row's ``images`` as a list of references: a list (each entry a non-blank string), one string, or
    nothing (``None``, ``[]``, a blank string: a text-only row, flagged ``no_images``). A ``None`` or blank entry
    in a list names no image (``str(None)`` would become the file ``None``): an error naming ``where``."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return []
    if isinstance(value, str):
        return [value]
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"{where}: field 'images' is {type(value).__name__} {value!r:.60}, expected a list of image "
                         f"references (or one reference string); fix the row")
    refs = list(value)
    for position, ref in enumerate(refs):
        if not isinstance(ref, str) or not ref.strip():
            shown = "null" if ref is None else repr(ref)
            raise ValueError(f"{where}: field 'images' entry {position} is {shown}, expected an image reference (a "
                             f"non-empty path); fix the row or leave the entry out")
    return refs


def record(row: Mapping[str, Any], index: int, config: str) -> dict:
    """The canonical record of one ClinHallu row (``index`` = its row index in the source)."""
    for field in ("question", "answer"):
        if row.get(field) is None:
            raise ValueError(f"ClinHallu {config} row {index}: field {field!r} is missing; is this the ClinHallu "
                             f"Parquet layout (question, answer, options, images, gold_cot)?")
    kind, value = upstream_id(row, index)
    rid = make_id(BENCHMARK, config, value)
    where = f"ClinHallu {config} row {index} (id {rid!r})"
    question, answer = text_field(row, "question", where), text_field(row, "answer", where)
    options = row.get("options")
    if options is not None and not isinstance(options, (list, tuple)):
        raise ValueError(f"{where}: field 'options' is {type(options).__name__} {options!r:.60}, expected a list of "
                         f"option strings such as [\"A. ...\", \"B. ...\"]; fix the row")
    flags: list[str] = [] if question.strip() else ["empty_question"]
    answer_type = _answer_type(row, flags)
    choices: list[str] = []
    letter = str(row.get("answer_letter") or "").strip()
    if answer_type == "multiple_choice":
        choices, letters = _choices(options, flags)
        if letter and letter not in letters:
            flags.append("answer_letter_not_in_options")
        if normalize_reference(answer, "multiple_choice", choices) is None:
            flags.append("answer_not_in_choices")
    images = image_refs(row.get("images"), where)
    if not images:
        flags.append("no_images")
    meta = {
        "upstream_id": f"{'original_index' if kind == 'row_index' else kind}:{value}",
        "id_from": kind,
        "source_id": row.get("source_id"),
        "question_type": row.get("question_type"),
        "answer_letter": letter or None,
        "options": list(options or []),
        "gold_trace": _gold_trace(row.get("gold_cot"), flags),
        **{name: row.get(name) for name in _META_COLUMNS if row.get(name) is not None},
        "quality_flags": flags,
        "credentialed": False,
    }
    return {
        "id": rid,
        "benchmark": BENCHMARK,
        "config": config,
        "images": images,
        "question": question,
        "answer": answer,
        "answer_type": answer_type,
        "choices": choices,
        "category": "",
        "source": image_source(config),
        "meta": meta,
    }


def records(rows: Iterable[Mapping[str, Any]], config: str) -> Iterator[dict]:
    """Canonical records of one source's rows, in row order."""
    for index, row in enumerate(rows):
        yield record(row, index, config)
