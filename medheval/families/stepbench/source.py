"""Med-StepBench: step-wise statement verification on PET/CT (arXiv 2605.10002), to its documented design.

The benchmark (12,500 whole-body FDG PET/CT studies, >1,000,000 image–statement pairs, four
diagnostic steps, Vietnamese originals with English translations) has no public release yet.
This module defines the on-disk layout this toolkit reads (``datasets/med_stepbench/README.md``):
``DIR/statements.jsonl`` or ``DIR/statements.parquet``, one statement per row, images and NIfTI
volumes under ``DIR/``.

Everything here is columnar (pyarrow): reading, checking and mapping a million rows to the
canonical record (:mod:`medheval.data.schema`) never builds one Python dict per row. Malformed rows
are reported by row number, ``statement_id`` and field.

Also here: the run options of a Med-StepBench run (knowledge, rationale, view choice; the
language is the builder config), the consistency question in this project's own wording, and
the answer parser (:func:`parse_verdict`).
"""

from __future__ import annotations

import json
import re
import unicodedata
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

BENCHMARK = "med_stepbench"
SOURCE = "med_stepbench"  # image source name: its root is DIR (``--image-root med_stepbench=DIR``)
STEPS: dict[int, str] = {
    1: "anatomical_mapping",
    2: "lesion_identification",
    3: "feature_characterization",
    4: "diagnostic_synthesis",
}
STEP_TITLES: dict[int, str] = {1: "S1 Anatomical Mapping", 2: "S2 Lesion Identification",
                               3: "S3 Feature Characterization", 4: "S4 Diagnostic Synthesis"}
STEP_OF_CATEGORY = {name: step for step, name in STEPS.items()}
LABELS = ("ground_truth", "hallucination")
POSITIVE_LABEL = "hallucination"
LANGUAGES = ("en", "vi")
PLANES = ("axial", "coronal", "sagittal")
MODALITIES = ("ct", "pet", "fused")
WINDOWS = ("lung", "mediastinal")
STATEMENT_FILES = ("statements.parquet", "statements.jsonl")

REQUIRED_FIELDS = ("statement_id", "study_id", "step", "statement", "label", "language", "views")
OPTIONAL_TEXT_FIELDS = ("subtype", "pair_id", "volume", "prior_knowledge", "external_knowledge",
                        "rationale_llm", "rationale_clinician")
_STRING_FIELDS = ("statement_id", "study_id", "statement", "label", "language") + OPTIONAL_TEXT_FIELDS
_BATCH_ROWS = 100_000


class StepBenchDataError(ValueError):
    """A statements file is malformed: the message names the file, row, statement_id and field."""


# --------------------------------------------------------------------------- reading


def find_statements_file(data_dir: str | Path) -> Path:
    """``DIR/statements.parquet`` or ``DIR/statements.jsonl`` (Parquet first when both exist)."""
    root = Path(data_dir).expanduser()
    for name in STATEMENT_FILES:
        if (root / name).is_file():
            return root / name
    raise FileNotFoundError(
        f"{root}: no {' or '.join(STATEMENT_FILES)}. Med-StepBench has no public release yet; point data_dir "
        f"(CLI: --data-dir) at a folder laid out as datasets/med_stepbench/README.md describes, e.g. the one "
        f"`python -m medheval.families.stepbench.fixtures OUT` writes"
    )


def _row_error(path: Path, row: int, sid: Any, field: str, problem: str) -> StepBenchDataError:
    sid_text = f" (statement_id={sid!r})" if sid is not None else ""
    return StepBenchDataError(f"{path}: row {row + 1}{sid_text}: field {field!r} {problem}. "
                              "Fix that row (datasets/med_stepbench/README.md documents every field).")


def _scan_jsonl_for_error(path: Path, cause: Exception) -> StepBenchDataError:
    """The slow path, only after the fast reader failed: find the first bad line and name it."""
    from medheval.data.schema import json_kind

    with open(path, encoding="utf-8") as handle:
        row = -1
        shapes: dict[str, str] = {}
        for lineno, line in enumerate(handle, 1):
            if not line.strip():
                continue
            row += 1
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as error:
                return StepBenchDataError(f"{path}: line {lineno} (row {row + 1}): not valid JSON ({error.msg})")
            if not isinstance(obj, dict):
                return StepBenchDataError(f"{path}: line {lineno}: expected a JSON object, got {type(obj).__name__}")
            sid = obj.get("statement_id")
            for field in _STRING_FIELDS:
                if obj.get(field) is not None and not isinstance(obj[field], str):
                    return _row_error(path, row, sid, field, f"must be a string, got {type(obj[field]).__name__}")
            if obj.get("step") is not None and (isinstance(obj["step"], bool) or not isinstance(obj["step"], int)):
                return _row_error(path, row, sid, "step", f"must be an integer 1-4, got {obj['step']!r}")
            for key, value in _walk_views(obj.get("views")):
                shape = "object" if isinstance(value, dict) else "string" if isinstance(value, str) else "other"
                if shape == "other":
                    return _row_error(path, row, sid, f"views.{key}", f"must be a path string or an object, got {value!r}")
                if shapes.setdefault(key, shape) != shape:
                    return _row_error(path, row, sid, f"views.{key}",
                                      f"is a {shape} here but a {shapes[key]} in earlier rows; use one shape per view key")
            for field, value in obj.items():  # a top-level field whose JSON type changes between rows
                kind = json_kind(value)  # null fits any column
                if kind != "null" and shapes.setdefault(f"/{field}", kind) != kind:
                    return _row_error(path, row, sid, field, f"is of JSON type {kind} here but {shapes[f'/{field}']} "
                                                             "in earlier rows; give it one type in every row")
    if row < 0:
        return StepBenchDataError(f"{path}: no statements (the file holds no rows); write one JSON object per line, "
                                  "as datasets/med_stepbench/README.md describes")
    return StepBenchDataError(f"{path}: could not be read as JSON Lines: {cause}")


def _walk_views(views: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    if not isinstance(views, dict):
        return
    for key, value in views.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        yield name, value
        if isinstance(value, dict):
            yield from _walk_views(value, name)


def read_statements(path: str | Path) -> pa.Table:
    """The raw statements table (columns as in the file), read with pyarrow's C++ readers."""
    path = Path(path)
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        try:
            return pq.read_table(path)
        except (pa.ArrowInvalid, OSError) as error:
            raise StepBenchDataError(f"{path}: not a readable Parquet file ({error})") from error
    import pyarrow.json as pj

    schema = pa.schema([(name, pa.string()) for name in _STRING_FIELDS] + [("step", pa.int64())])
    parse = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="infer")
    try:
        return pj.read_json(path, read_options=pj.ReadOptions(block_size=BLOCK_SIZE), parse_options=parse)
    except pa.ArrowInvalid as error:
        if "straddl" not in str(error):
            raise _scan_jsonl_for_error(path, error) from error
    # a row longer than one block: read again with blocks that hold the longest row, up to MAX_ROW_BYTES
    longest, line = _longest_line(path)
    if longest > MAX_ROW_BYTES:
        raise StepBenchDataError(f"{path}: line {line} is {longest / 2**20:.0f} MB, more than one statement row may "
                                 f"hold ({MAX_ROW_BYTES / 2**20:.0f} MB): is a volume or an image embedded in it? "
                                 "Rows hold paths under DIR, never file contents")
    try:
        return pj.read_json(path, read_options=pj.ReadOptions(block_size=longest + 1024), parse_options=parse)
    except pa.ArrowInvalid as error:
        raise _scan_jsonl_for_error(path, error) from error


BLOCK_SIZE = 16 << 20  # pyarrow's JSON block; a row longer than this is read again with larger blocks
MAX_ROW_BYTES = 256 << 20


def _longest_line(path: Path) -> tuple[int, int]:
    """``(bytes, line number)`` of the longest line of ``path``, read in chunks."""
    longest, longest_line, current, line = 0, 1, 0, 1
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            parts = chunk.split(b"\n")
            for index, part in enumerate(parts):
                current += len(part)
                if index < len(parts) - 1:
                    if current > longest:
                        longest, longest_line = current, line
                    current, line = 0, line + 1
    if current > longest:
        longest, longest_line = current, line
    return longest, longest_line


# --------------------------------------------------------------------------- checking


def _flatten_views(column: pa.ChunkedArray, path: Path, table: pa.Table) -> dict[str, pa.ChunkedArray]:
    """``views`` -> {"axial": ..., "axial/ct/lung": ...}: one string column per leaf (null where absent)."""
    leaves: dict[str, pa.ChunkedArray] = {}

    def walk(col: pa.ChunkedArray, name: str) -> None:
        if pa.types.is_struct(col.type):
            for index in range(col.type.num_fields):
                field = col.type.field(index)
                child = pc.struct_field(col, [index])
                if name:
                    # a null parent makes the leaf null too
                    child = pc.if_else(pc.is_valid(col), child, pa.scalar(None, child.type))
                walk(child, f"{name}/{field.name}" if name else field.name)
        elif pa.types.is_string(col.type) or pa.types.is_large_string(col.type) or pa.types.is_null(col.type):
            leaves[name] = col.cast(pa.string())
        else:
            bad = pc.index(pc.is_valid(col), True).as_py()
            raise _row_error(path, max(bad, 0), table["statement_id"][max(bad, 0)].as_py(),
                             f"views.{name.replace('/', '.')}", f"must be a path string, got type {col.type}")

    if not pa.types.is_struct(column.type):
        raise _row_error(path, 0, table["statement_id"][0].as_py() if len(table) else None, "views",
                         f"must be an object of relative paths (axial/coronal/sagittal ...), got type {column.type}")
    walk(column, "")
    unknown = [key for key in leaves if key.split("/")[0] not in PLANES]
    if unknown:
        column_name = unknown[0]
        bad = pc.index(pc.is_valid(leaves[column_name]), True).as_py()
        raise _row_error(path, max(bad, 0), table["statement_id"][max(bad, 0)].as_py(), f"views.{column_name.replace('/', '.')}",
                         f"is not a view: keys start with one of {PLANES}, then optionally a modality {MODALITIES} "
                         f"and a window {WINDOWS}")
    return dict(sorted(leaves.items()))


# One regex for every path that may not be a safe relative path; the exact check
# (medheval.data.images) then runs only on the rows it flags.
_MAYBE_UNSAFE = r"(^/)|(^|/)\.\.?(/|$)|\\|[\x00-\x1f\x7f]|^[A-Za-z][A-Za-z0-9+.\-]*:|//|/$|%|^$"


def _check_paths(column: pa.ChunkedArray, field: str, path: Path, ids: pa.ChunkedArray) -> None:
    """Refuse the first empty or whitespace-only path (null: no such view), or one that could leave ``DIR``."""
    from medheval.data.images import _unsafe_reason

    bad = _first(pc.fill_null(pc.equal(pc.utf8_length(pc.utf8_trim_whitespace(column)), 0), False))
    if bad is not None:
        raise _row_error(path, bad, ids[bad].as_py(), field,
                         f"is {'empty' if column[bad].as_py() == '' else 'only whitespace'} ({column[bad].as_py()!r}); "
                         "give a path relative to DIR, or leave the key out")
    flagged = pc.fill_null(pc.match_substring_regex(column, _MAYBE_UNSAFE), False)
    for row in np.flatnonzero(flagged.to_numpy(zero_copy_only=False)):
        reason = _unsafe_reason(column[int(row)].as_py())
        if reason is not None:
            raise _row_error(path, int(row), ids[int(row)].as_py(), field,
                             f"{reason}: paths are relative to DIR and may never leave it")


def _first(mask: pa.ChunkedArray | pa.Array) -> int | None:
    mask = pc.fill_null(mask, True)
    index = pc.index(mask, True).as_py()
    return None if index < 0 else index


def check_statements(table: pa.Table, path: str | Path) -> dict[str, pa.ChunkedArray]:
    """Vectorized checks of the raw table; returns the flattened view columns.

    Raises :class:`StepBenchDataError` for the first offending row: a missing required field,
    an empty string, ``step`` not 1–4, ``label``/``language`` outside their values, a duplicate
    ``statement_id``, a row without any view, or a path that could leave ``DIR``.
    """
    path = Path(path)
    if len(table) == 0:
        raise StepBenchDataError(f"{path}: no statements (the file holds no rows); write one statement per row, as "
                                 "datasets/med_stepbench/README.md describes")
    missing = [name for name in REQUIRED_FIELDS if name not in table.column_names]
    if missing:
        raise StepBenchDataError(f"{path}: no column(s) {missing} in any row; every row needs {list(REQUIRED_FIELDS)}")
    ids = table["statement_id"].cast(pa.string())
    for name in ("statement_id", "study_id", "statement", "label", "language"):
        column = table[name]
        if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
            bad = _first(pc.is_valid(column)) or 0
            raise _row_error(path, bad, ids[bad].as_py(), name, f"must be a string (column type {column.type})")
        bad = _first(pc.or_(pc.is_null(column), pc.equal(pc.utf8_length(pc.utf8_trim_whitespace(column)), 0)))
        if bad is not None:
            raise _row_error(path, bad, ids[bad].as_py(), name, "is missing or empty")
    step = table["step"]
    if not pa.types.is_integer(step.type):
        raise _row_error(path, 0, ids[0].as_py(), "step", f"must be an integer 1-4 (column type {step.type})")
    bad = _first(pc.invert(pc.is_in(step, pa.array(list(STEPS), step.type))))
    if bad is not None:
        raise _row_error(path, bad, ids[bad].as_py(), "step", f"must be one of 1, 2, 3, 4, got {step[bad].as_py()!r}")
    for name, allowed in (("label", LABELS), ("language", LANGUAGES)):
        bad = _first(pc.invert(pc.is_in(table[name], pa.array(allowed))))
        if bad is not None:
            raise _row_error(path, bad, ids[bad].as_py(), name, f"must be one of {list(allowed)}, got {table[name][bad].as_py()!r}")
    if pc.count_distinct(ids).as_py() != len(ids):
        counts = pa.table({"statement_id": ids}).group_by("statement_id").aggregate([("statement_id", "count")])
        dup = counts.filter(pc.greater(counts["statement_id_count"], 1))["statement_id"][0].as_py()
        rows = np.flatnonzero(pc.equal(ids, dup).to_numpy(zero_copy_only=False))
        raise _row_error(path, int(rows[1]), dup, "statement_id",
                         f"repeats row {int(rows[0]) + 1}; statement ids must be unique")
    for name in OPTIONAL_TEXT_FIELDS:
        if name in table.column_names and not (pa.types.is_string(table[name].type) or pa.types.is_null(table[name].type)):
            bad = _first(pc.is_valid(table[name])) or 0
            raise _row_error(path, bad, ids[bad].as_py(), name, f"must be a string (column type {table[name].type})")
    views = _flatten_views(table["views"], path, table)
    any_view = None
    for key, column in views.items():
        _check_paths(column, f"views.{key.replace('/', '.')}", path, ids)
        valid = pc.is_valid(column)
        any_view = valid if any_view is None else pc.or_(any_view, valid)
    bad = _first(pc.invert(any_view)) if any_view is not None else 0
    if bad is not None:
        raise _row_error(path, bad, ids[bad].as_py(), "views", "has no image path; give at least one of axial/coronal/sagittal")
    for name in table.column_names:  # "volume", and any other volume field ("volume_pet", "volume_ct"...)
        if name == "volume" or name.startswith("volume_"):
            _check_paths(table[name].cast(pa.string()), name, path, ids)
    return views


# --------------------------------------------------------------------------- canonical records


def _images_column(views: Mapping[str, pa.ChunkedArray], start: int, length: int) -> pa.Array:
    """Per row, the non-null view paths in view-key order (``images``), as an Arrow list array."""
    columns = [views[key].slice(start, length).combine_chunks() for key in views]
    valid = np.stack([c.is_valid().to_numpy(zero_copy_only=False) for c in columns], axis=1)  # (rows, keys)
    offsets = np.concatenate([[0], np.cumsum(valid.sum(axis=1))]).astype(np.int32)
    values = pa.concat_arrays(columns)  # key-major: key k, row r at k * rows + r
    positions = (np.arange(len(columns))[None, :] * length + np.arange(length)[:, None]).reshape(-1)  # row-major
    flat = values.take(pa.array(positions[valid.reshape(-1)]))
    return pa.ListArray.from_arrays(pa.array(offsets), flat)


_JSON_ESCAPES = (("\\", "\\\\"), ('"', '\\"'), ("\n", "\\n"), ("\r", "\\r"), ("\t", "\\t"))
_OTHER_CONTROL = r"[\x00-\x08\x0b\x0c\x0e-\x1f]"
_NEEDS_ESCAPE = r"[\\\"\x00-\x1f]"


def _json_values(column: pa.ChunkedArray | pa.Array) -> pa.Array:
    """Each value of ``column`` as JSON text (``null`` for nulls), computed column-wise.

    Strings are escaped with Arrow string kernels; the rare row holding another control character
    is encoded by :func:`json.dumps`. Numbers and booleans are cast; any other type (lists,
    objects in extra fields) falls back to :func:`json.dumps` per row for that column only."""
    column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    kind = column.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        text = column.cast(pa.string())
        if pc.any(pc.match_substring_regex(text, _NEEDS_ESCAPE)).as_py():  # most columns (paths, ids) need none
            for old, new in _JSON_ESCAPES:
                text = pc.replace_substring(text, old, new)
            odd = np.flatnonzero(pc.fill_null(pc.match_substring_regex(column, _OTHER_CONTROL), False)
                                 .to_numpy(zero_copy_only=False))
        else:
            odd = np.array([], dtype=np.int64)
        text = pc.binary_join_element_wise('"', text, '"', "")
        if odd.size:
            values = text.to_pylist()
            for row in odd:
                values[row] = json.dumps(column[int(row)].as_py(), ensure_ascii=False)
            text = pa.array(values, pa.string())
    elif pa.types.is_integer(kind) or pa.types.is_boolean(kind) or pa.types.is_floating(kind):
        text = column.cast(pa.string())
    elif pa.types.is_null(kind):
        text = pa.nulls(len(column), pa.string())
    else:
        text = pa.array([json.dumps(value, ensure_ascii=False) for value in column.to_pylist()], pa.string())
    return pc.fill_null(text, "null")


def _meta_column(table: pa.Table, views: Mapping[str, pa.ChunkedArray]) -> pa.Array:
    """``meta`` as JSON text per row: every field but the canonical ones, ``views`` keyed
    ``plane[/modality[/window]]`` (null where a row lacks a view). Built column-wise: one
    ``{"key": value, ...}`` concatenation over Arrow columns, no per-row Python."""
    keep = [name for name in table.column_names if name not in ("statement", "label", "views")]
    pieces: list[Any] = []
    for index, name in enumerate(keep):
        pieces += [("{" if index == 0 else ", ") + json.dumps(name) + ": ", _json_values(table[name])]
    pieces.append(("{" if not keep else ", ") + '"views": ')
    for index, key in enumerate(views):
        pieces += [("{" if index == 0 else ", ") + json.dumps(key) + ": ", _json_values(views[key])]
    pieces.append("}}" if views else "{}}")
    return pc.binary_join_element_wise(*pieces, "")


def load_checked(path: str | Path) -> tuple[pa.Table, dict[str, pa.ChunkedArray]]:
    """The raw table of ``path`` and its flattened view columns, every row checked."""
    table = read_statements(path)
    return table, check_statements(table, path)


def canonical_batches(table: pa.Table, views: dict[str, pa.ChunkedArray], languages: tuple[str, ...] = LANGUAGES,
                      batch_rows: int = _BATCH_ROWS) -> Iterator[pa.Table]:
    """Checked statements (:func:`load_checked`) in ``languages`` as canonical tables
    (:data:`medheval.data.schema.FEATURES` order), ``batch_rows`` rows at a time."""
    from medheval.data.schema import FEATURES

    if set(languages) != set(LANGUAGES):
        keep = pc.is_in(table["language"], pa.array(list(languages)))
        table = table.filter(keep)
        views = {key: column.filter(keep) for key, column in views.items()}
    schema = FEATURES.arrow_schema
    for start in range(0, len(table), batch_rows):
        part = table.slice(start, batch_rows)
        n = len(part)
        language = part["language"].combine_chunks()
        sid = part["statement_id"].combine_chunks()
        step = part["step"].combine_chunks().to_numpy(zero_copy_only=False)
        categories = np.array([""] + [STEPS[k] for k in sorted(STEPS)], dtype=object)[step]
        columns = {
            "id": pc.binary_join_element_wise(BENCHMARK, language, sid, "/"),
            "benchmark": pa.array(np.full(n, BENCHMARK, dtype=object), pa.string()),
            "config": language,
            "images": _images_column(views, start, n),
            "question": part["statement"].combine_chunks(),
            "answer": part["label"].combine_chunks(),
            "answer_type": pa.array(np.full(n, "statement", dtype=object), pa.string()),
            "choices": pa.ListArray.from_arrays(pa.array(np.zeros(n + 1, dtype=np.int32)), pa.array([], pa.string())),
            "category": pa.array(categories, pa.string()),
            "source": pa.array(np.full(n, SOURCE, dtype=object), pa.string()),
            "meta": _meta_column(part, {key: column.slice(start, n) for key, column in views.items()}),
        }
        yield pa.table([columns[field.name].cast(field.type) for field in schema], schema=schema)


def quality_summary(dataset: Any) -> dict[str, Any]:
    """Counts per language × step × label, from the columns (no per-row meta decoding)."""
    table = dataset.data.table.select(["config", "category", "answer"]) if hasattr(dataset, "data") else dataset
    counts = table.group_by(["config", "category", "answer"]).aggregate([("answer", "count")]).to_pylist()
    summary: dict[str, Any] = {"n_records": len(table), "n_flagged": 0, "flags": {}, "counts": {}}
    for row in counts:
        summary["counts"].setdefault(row["config"], {}).setdefault(row["category"], {})[row["answer"]] = row["answer_count"]
    return summary


# --------------------------------------------------------------------------- run options and prompts

KNOWLEDGE = ("none", "prior", "external", "both")
# The steps whose prompts take prior/external knowledge: 2-4. Step 1 has no earlier step and no knowledge
# variant in the paper (Table 3 shows "–" for its with-knowledge cells; Table 5 covers steps 2-4 only).
KNOWLEDGE_STEPS = (2, 3, 4)
RATIONALE = ("none", "llm", "clinician")
VIEW_MODES = ("separate", "fused")
PROMPT_VERSION = "med-stepbench-prompts-v1"

# This project's wording (not the paper's, which is unpublished). {statement} etc. are filled per record.
QUESTION = {
    "en": ("Look at the PET/CT images and decide whether the statement below agrees with them.\n"
           "{context}Statement: {statement}\n"
           "Is the statement consistent with the images? Answer with one word: Consistent or Inconsistent."),
    "vi": ("Hãy xem các ảnh PET/CT và cho biết nhận định dưới đây có khớp với ảnh hay không.\n"
           "{context}Nhận định: {statement}\n"
           "Nhận định có nhất quán với ảnh không? Trả lời bằng một từ: Consistent hoặc Inconsistent."),
}
CONTEXT_LABELS = {
    "en": {"prior": "Finding from the previous step: ", "external": "Background knowledge: ",
           "rationale": "Explanation offered with the statement: "},
    "vi": {"prior": "Kết quả của bước trước: ", "external": "Kiến thức nền: ",
           "rationale": "Giải thích kèm theo nhận định: "},
}


@dataclass(frozen=True)
class StepBenchOptions:
    """The prompting settings of one run (recorded in ``results.json``).

    knowledge: none | prior (the previous step's ground-truth statement) | external | both; given to
        steps 2-4 only (:data:`KNOWLEDGE_STEPS`), as in the paper.
    rationale: none | llm | clinician (the explanation shown with the statement).
    views: which 2D views a model sees, in order: ``plane`` or ``plane/modality[/window]`` keys
        (e.g. ``axial/fused``); by default one view per plane (:func:`choose_views`).
    modality: per plane, ``ct``, ``pet``, ``fused``, or ``separate`` (the CT and the PET view).
    window: for CT views: ``lung`` or ``mediastinal``.
    """

    knowledge: str = "none"
    rationale: str = "none"
    views: tuple[str, ...] = ()
    modality: str | None = None
    window: str | None = None

    def __post_init__(self) -> None:
        for name, allowed in (("knowledge", KNOWLEDGE), ("rationale", RATIONALE)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"Med-StepBench option {name}={getattr(self, name)!r}: choose one of {list(allowed)}")
        if self.modality is not None and self.modality not in VIEW_MODALITIES:
            raise ValueError(f"Med-StepBench option modality={self.modality!r}: choose one of {list(VIEW_MODALITIES)}")
        if self.window is not None and self.window not in WINDOWS:
            raise ValueError(f"Med-StepBench option window={self.window!r}: choose one of {list(WINDOWS)}")
        for key in self.views:
            if key.split("/")[0] not in PLANES:
                raise ValueError(f"Med-StepBench option views: {key!r} does not start with one of {list(PLANES)}")

    @classmethod
    def from_mapping(cls, options: Mapping[str, Any] | None) -> "StepBenchOptions":
        options = dict(options or {})
        unknown = sorted(set(options) - {"knowledge", "rationale", "views", "modality", "window"})
        if unknown:
            raise ValueError(f"unknown Med-StepBench option(s) {unknown}; known: knowledge, rationale, views, modality, window")
        views = options.get("views") or ()
        if isinstance(views, str):
            views = tuple(v.strip() for v in views.split(",") if v.strip())
        options["views"] = tuple(views)
        return cls(**options)

    def describe(self) -> dict[str, Any]:
        return {**asdict(self), "views": list(self.views), "prompt_version": PROMPT_VERSION,
                "question": dict(QUESTION), "knowledge_steps": list(KNOWLEDGE_STEPS)}


VIEW_MODALITIES = ("ct", "pet", "fused", "separate")  # "separate": the CT and the PET view of each plane
_DEFAULT_PREFERENCE = ("", "fused", "ct", "pet")  # per plane, without a modality option


def choose_views(views: Mapping[str, str | None], options: StepBenchOptions) -> list[str]:
    """The image paths a 2D model sees for one statement, by :class:`StepBenchOptions`.

    Explicit ``views`` keys are taken as given (a key absent for this row raises ``KeyError``).
    Otherwise, per plane (axial, coronal, sagittal, those present): the ``modality`` asked for
    (``separate`` = CT then PET), else the first present of: the plain plane path, fused, CT,
    PET. CT uses ``window`` when given, else mediastinal, else whatever window exists.
    """
    present = {key: path for key, path in views.items() if path}
    if options.views:
        missing = [key for key in options.views if key not in present]
        if missing:
            raise KeyError(f"view(s) {missing} absent; this row has {sorted(present)}")
        return [present[key] for key in options.views]

    def pick(plane: str, modality: str) -> str | None:
        if modality == "":
            return present.get(plane)
        if modality != "ct":
            return present.get(f"{plane}/{modality}")
        windows = [options.window] if options.window else []
        for key in [f"{plane}/ct/{w}" for w in windows + ["mediastinal", "lung"]] + [f"{plane}/ct"]:
            if key in present:
                return present[key]
        return None

    chosen = []
    for plane in PLANES:
        if options.modality == "separate":
            chosen += [path for path in (pick(plane, "ct"), pick(plane, "pet")) if path]
            continue
        order = (options.modality,) if options.modality else _DEFAULT_PREFERENCE
        path = next((found for found in (pick(plane, m) for m in order) if found), None)
        if path:
            chosen.append(path)
    if not chosen:
        raise KeyError(f"no view matches modality={options.modality!r}, window={options.window!r}; "
                       f"this row has {sorted(present)}")
    return chosen


def build_prompt(statement: str, language: str, options: StepBenchOptions, meta: Mapping[str, Any]) -> str:
    """The consistency question for one statement with the context the options ask for: knowledge for
    steps 2-4 only (``meta["step"]`` in :data:`KNOWLEDGE_STEPS`, Med-StepBench Table 3), a rationale for any step."""
    labels = CONTEXT_LABELS[language]
    context = []
    takes_knowledge = meta.get("step") in KNOWLEDGE_STEPS
    if takes_knowledge and options.knowledge in ("prior", "both") and meta.get("prior_knowledge"):
        context.append(labels["prior"] + str(meta["prior_knowledge"]).strip())
    if takes_knowledge and options.knowledge in ("external", "both") and meta.get("external_knowledge"):
        context.append(labels["external"] + str(meta["external_knowledge"]).strip())
    if options.rationale != "none" and meta.get(f"rationale_{options.rationale}"):
        context.append(labels["rationale"] + str(meta[f"rationale_{options.rationale}"]).strip())
    text = "".join(line + "\n" for line in context)
    return QUESTION[language].format(context=text, statement=statement.strip())


def apply_run_options(dataset: Any, options: Mapping[str, Any] | None) -> tuple[Any, dict[str, Any]]:
    """The split ready for a model: ``question`` = the full prompt, ``images`` = the chosen views,
    rows ordered by study so statements sharing images sit together (prefix caching). Returns the
    dataset and what to record. A row lacking the context its option needs is counted, not dropped; so are
    the Step 1 rows, asked without knowledge whatever ``knowledge`` says (``step1_without_knowledge``)."""
    chosen = StepBenchOptions.from_mapping(options)
    counts = {"missing_prior_knowledge": 0, "missing_external_knowledge": 0, "missing_rationale": 0,
              "step1_without_knowledge": 0}

    def transform(batch: dict[str, list]) -> dict[str, list]:
        questions, images = [], []
        for rid, statement, meta in zip(batch["id"], batch["question"], batch["meta"]):
            meta = meta or {}
            questions.append(build_prompt(statement, meta.get("language", "en"), chosen, meta))
            try:
                images.append(choose_views(meta.get("views") or {}, chosen))
            except KeyError as error:
                raise ValueError(f"record {rid!r}: {error.args[0]}") from None
        batch["question"], batch["images"] = questions, images
        return batch

    metas = dataset.select_columns(["meta"])["meta"]
    studies = [(meta or {}).get("study_id", "") for meta in metas]
    for meta in metas:
        meta = meta or {}
        if chosen.knowledge != "none" and meta.get("step") not in KNOWLEDGE_STEPS:
            counts["step1_without_knowledge"] += 1
        elif chosen.knowledge in ("prior", "both") and not meta.get("prior_knowledge"):
            counts["missing_prior_knowledge"] += 1
        if chosen.knowledge in ("external", "both") and meta.get("step") in KNOWLEDGE_STEPS \
                and not meta.get("external_knowledge"):
            counts["missing_external_knowledge"] += 1
        if chosen.rationale != "none" and not meta.get(f"rationale_{chosen.rationale}"):
            counts["missing_rationale"] += 1
    order = sorted(range(len(studies)), key=lambda i: (studies[i], i))
    if order != list(range(len(studies))):
        dataset = dataset.select(order)
    dataset = dataset.map(transform, batched=True, batch_size=1000, desc="Med-StepBench prompts")
    return dataset, {**chosen.describe(), "counts": counts}


# --------------------------------------------------------------------------- answers

# Verdict terms -> label. "Strong" terms are verdicts wherever they stand; "weak" ones (yes/no, có/không)
# are also ordinary words ("no lesion", "không có tổn thương"), so they count only where an answer is given
# (see parse_verdict). At one position the longest term wins, so a negated form ("not consistent",
# "không nhất quán", "no hallucination") beats the word it contains. The metric's own labels are terms too.
_STRONG_TERMS: dict[str, str] = {
    **dict.fromkeys((
        "inconsistent", "not consistent", "isn't consistent", "incorrect", "not correct", "isn't correct", "false",
        "not true", "isn't true", "untrue", "inaccurate", "not accurate", "hallucination", "hallucinations",
        "hallucinated", "hallucinatory", "does not match", "doesn't match", "do not match", "does not agree",
        "doesn't agree", "disagrees", "contradicts", "contradicted", "not supported", "unsupported",
        "wrong", "invalid", "not valid", "isn't valid", "disagree", "do not agree", "don't agree",
        "không nhất quán", "không đúng", "sai", "không chính xác", "không khớp", "không phù hợp", "mâu thuẫn",
        "ảo giác", "không hợp lệ", "không đồng ý"), "hallucination"),
    **dict.fromkeys((
        "consistent", "correct", "true", "accurate", "matches", "agrees", "supported", "ground truth",
        "ground_truth", "ground-truth", "not a hallucination", "no hallucination", "no hallucinations",
        "not hallucinated", "hallucination-free", "hallucination free", "not inconsistent", "not incorrect",
        "not false", "not wrong", "isn't wrong", "valid", "not invalid", "agree",
        "nhất quán", "đúng", "chính xác", "khớp với hình ảnh", "khớp với ảnh", "phù hợp", "không sai",
        "không phải ảo giác", "không phải là ảo giác", "không có ảo giác", "hợp lệ", "đồng ý"), "ground_truth"),
}
# "right" is mostly anatomy ("the right lung"): a verdict only as an answer's opening word before the end or
# punctuation ("Right."), or after a copula at the end of a clause ("the statement is right.", "that's not right")
_RIGHT_TERMS: dict[str, str] = {"right": "ground_truth", "not right": "hallucination",
                                "isn't right": "hallucination"}
_WEAK_TERMS: dict[str, str] = {"no": "hallucination", "không": "hallucination", "yes": "ground_truth",
                               "có": "ground_truth"}


def _terms_pattern(terms: Mapping[str, str]) -> re.Pattern[str]:
    phrases = sorted(terms, key=len, reverse=True)  # the longest term at a position wins
    body = "|".join(r"\s+".join(re.escape(word) for word in phrase.split()) for phrase in phrases)
    return re.compile(rf"(?<!\w)(?:{body})(?!\w)")


_STRONG = _terms_pattern(_STRONG_TERMS)
_ANY = _terms_pattern({**_STRONG_TERMS, **_WEAK_TERMS})
_RIGHT = _terms_pattern(_RIGHT_TERMS)
_COPULA = re.compile(r"(?:\b(?:is|was|are|be|seems|sounds|looks)|'s)\s+(?:(?:quite|entirely|completely|probably|"
                     r"likely|not|definitely|absolutely)\s+)?$")
_CLAUSE_END = re.compile(r"\s*(?:to\s+me\s*)?(?:$|[.,;:!?)\]*\"'\n\u2014\u2013])")
# a term right before "?" repeats the question ("Statement: consistent? No."): no verdict
_QUESTION_MARK = re.compile(r"\s*\?")
_LEAD = re.compile(r"^[\s*\"'`>#_\-:.(\[]*"
                   r"(?:(?:(?:final\s+)?answer|verdict|trả lời|đáp án|kết luận)(?!\w))?\s*[:\-]?\s*")
# what may follow an answer's opening verdict word: the end, punctuation, or a reason ("Sai vì ...")
_AFTER_OPENING = re.compile(r"\s*(?:$|[.,;:!?)\]*\"'\n\u2014\u2013-]|(?:because|since|as|given|vì|do|bởi|tại)\b)")
_AFTER_WEAK_OPENING = re.compile(r"\s*(?:$|[.,;:!?)\]*\"'\n\u2014\u2013-]"
                                 r"|(?:it|this|that|the statement|nó|đây|nhận định)\b)")
# the words that make a later term the statement's verdict: "the statement (about X) is TERM", "so TERM",
# "it is TERM", "answer: TERM"
_VERDICT_SUBJECT = re.compile(
    r"(?:\b(?:statement|claim|answer|verdict|conclusion|nhận định|câu|kết luận|đáp án|trả lời)\b"
    r"\W*(?:\w+\W+){0,6}"
    r"|\b(?:so|therefore|thus|hence|overall|nên|vì vậy|do đó|vậy)\b\W*(?:\w+\W+){0,3}"
    r"|\b(?:it|this)(?:\s+is|'s)\s+(?:\w+\s+)?)$")
# "consistent with malignancy" / "phù hợp với viêm" describe a finding (only "... with the images" is a
# verdict), and "it is true that ..." concedes a point: such uses are no verdict
_DESCRIBES = {"consistent", "nhất quán", "phù hợp"}
_CONCEDES = {"true", "correct"}
_DESCRIPTIVE_WITH = re.compile(r"\s+(?:with|với)\s+(?!(?:the\s+|these\s+|các\s+|những\s+)?"
                               r"(?:images?|scans?|slices?|views?|pet|ct|findings|study|picture|hình|ảnh|phim)(?!\w))")
_THAT = re.compile(r"\s+that(?!\w)")
_ANSWER_SUBJECT = re.compile(r"\b(?:answer|verdict|conclusion|kết luận|đáp án|trả lời)\b\W*(?:\w+\W+)?$")
# a question's two options repeated in an answer ("consistent or inconsistent") are no verdict
_ECHO = re.compile(r"(?<!\w)(?:consistent|nhất quán|yes|có|true|đúng|correct)\s+(?:or|hoặc|hay)\s+"
                   r"(?:inconsistent|không nhất quán|không|no|false|sai|incorrect)(?!\w)"
                   r"|(?<!\w)(?:inconsistent|không nhất quán|no|false|sai|incorrect)\s+(?:or|hoặc|hay)\s+"
                   r"(?:consistent|nhất quán|yes|có|true|đúng|correct)(?!\w)")


def _phrase(match: re.Match[str]) -> str:
    return " ".join(match.group(0).split())


def _label(match: re.Match[str]) -> str:
    phrase = _phrase(match)
    return _STRONG_TERMS.get(phrase) or _WEAK_TERMS.get(phrase) or _RIGHT_TERMS[phrase]


def _is_verdict(text: str, match: re.Match[str]) -> bool:
    """Whether a term is used as a verdict, not to describe a finding, concede a point or repeat the
    question."""
    phrase = _phrase(match)
    if _QUESTION_MARK.match(text, match.end()):
        return False
    if phrase in _DESCRIBES and _DESCRIPTIVE_WITH.match(text, match.end()):
        return False
    return not (phrase in _CONCEDES and _THAT.match(text, match.end()))


def _right_verdicts(text: str) -> list[re.Match[str]]:
    """"right"/"not right" used as a verdict: opening the answer, or after a copula, before a clause end."""
    return [match for match in _RIGHT.finditer(text) if _CLAUSE_END.match(text, match.end())
            and (match.start() == 0 or _phrase(match).startswith("isn't")
                 or _COPULA.search(text[max(0, match.start() - 40):match.start()]))]


def _opening(text: str, start: int) -> str | None:
    """The verdict of the word opening ``text[start:]`` (spaces skipped) when rule 1 accepts it."""
    start += len(text[start:]) - len(text[start:].lstrip())
    opening = _ANY.match(text, start)
    if opening and _is_verdict(text, opening):
        weak = _phrase(opening) in _WEAK_TERMS
        if (_AFTER_WEAK_OPENING if weak else _AFTER_OPENING).match(text, opening.end()):
            return _label(opening)
    return None


def parse_verdict(text: str | None) -> str | None:
    """A model answer -> ``"ground_truth"`` (consistent), ``"hallucination"`` (inconsistent) or ``None``.

    Reads the verdict, not the first matching word, in this order:

    1. the answer's opening word, when it is a verdict followed by the end, punctuation or a reason
       ("Consistent, there is no other lesion."; "No."; "Sai vì ..."), or the same right after a question
       the answer repeats ("Is the statement consistent? Yes, ...");
    2. else a verdict tied to the statement ("the statement is not consistent", "so the statement is
       consistent", "it is correct"; yes/no only right after "answer": "the answer is no"), the last one;
    3. else the last verdict word anywhere, yes/no excepted ("no lesion" is no verdict);
    4. else a closing yes/no ("... I would say no.").

    "Consistent with malignancy" (with anything but the images) describes a finding, "it is true that"
    concedes a point, and a term before "?" repeats the question ("Statement: consistent? No."): none is a
    verdict. "Right" is mostly anatomy: it is a verdict only opening the answer ("Right.") or after a copula
    at a clause end ("the statement is right.", "that's not right"), where it counts as a tied verdict.

    Verdict words: consistent/inconsistent, correct/incorrect, true/false, right/wrong, valid/invalid,
    accurate, matches/does not match, agree/disagree, (no) hallucination, the labels
    ``ground_truth``/``hallucination``/"ground truth", and the Vietnamese nhất quán/không nhất quán,
    đúng/sai/không đúng, chính xác, (không) khớp, phù hợp, (không) hợp lệ, (không) đồng ý, (không phải) ảo giác;
    a negated form is its opposite. Both options of the question repeated ("consistent or inconsistent") are no verdict.
    Text is NFC-normalised and read case-insensitively; an answer with no verdict is ``None``.
    """
    if not isinstance(text, str):
        return None
    cleaned = unicodedata.normalize("NFC", text).replace("\u2019", "'").strip().lower()
    cleaned = _ECHO.sub(" ", _LEAD.sub("", cleaned, count=1))
    if not cleaned.strip():
        return None
    for start in dict.fromkeys((0, cleaned.rfind("?") + 1)):  # the answer's start; after an echoed question
        found = _opening(cleaned, start)
        if found is not None:
            return found
    rights = [match for match in _right_verdicts(cleaned) if _is_verdict(cleaned, match)]
    if rights and rights[0].start() == 0:
        return _label(rights[0])
    tied = None
    for match in _ANY.finditer(cleaned):
        before = cleaned[max(0, match.start() - 120):match.start()]
        weak = _phrase(match) in _WEAK_TERMS
        if (_ANSWER_SUBJECT if weak else _VERDICT_SUBJECT).search(before) and _is_verdict(cleaned, match):
            tied = match
    if rights and (tied is None or rights[-1].start() > tied.start()):
        tied = rights[-1]
    if tied is not None:
        return _label(tied)
    verdicts = [match for match in _STRONG.finditer(cleaned) if _is_verdict(cleaned, match)]
    if verdicts:
        return _label(verdicts[-1])
    closing = re.search(r"(?<!\w)(yes|no|có|không)\W*$", cleaned)
    return _WEAK_TERMS[closing.group(1)] if closing else None


__all__ = [
    "BENCHMARK", "KNOWLEDGE_STEPS", "LABELS", "LANGUAGES", "POSITIVE_LABEL", "STEPS", "STEP_TITLES", "StepBenchDataError",
    "StepBenchOptions", "apply_run_options", "build_prompt", "canonical_batches", "check_statements", "load_checked",
    "choose_views", "find_statements_file", "parse_verdict", "quality_summary", "read_statements",
]
