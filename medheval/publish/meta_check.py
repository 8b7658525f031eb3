"""What a dataset row's ``meta`` may carry into a published Parquet file.

``meta`` holds upstream fields the builders copy from the annotation files (``medheval.families.*.source``),
so an edited annotation file (``--data-dir``) could fill it with anything: a ``structured_answer`` of base64
chunks would reach the gated repo's Parquet. The exporter keeps only the keys the builders write
(:data:`META_FIELDS`), each of its kind and size (measured on the released files: the longest text is a
Med-HallMark ``released_response`` of under 1,000 characters, the longest id 72, a ``structured_answer`` list
13 terms of under 100 characters):

- ``flag``: true, false or null;
- ``id``: an integer, or a string of at most :data:`MAX_ID_CHARS` characters;
- ``text``: a string of at most :data:`MAX_TEXT_CHARS` characters (or a list of at most :data:`MAX_ITEMS` such
  strings, the upstream ``choices`` of some files);
- ``terms``: a list of at most :data:`MAX_ITEMS` strings of at most :data:`MAX_TERM_CHARS` characters;
- ``structured``: null, or an object of ``anatomy``/``measurement``/``symptom`` term lists.

Any value may be null. A key no builder writes is left out (the export names it); a known key of the wrong
kind or size stops the export, naming the record and the key (:class:`MetaError`).
"""

from __future__ import annotations

from typing import Any, Mapping

MAX_ID_CHARS = 200
MAX_TERM_CHARS = 200
MAX_TEXT_CHARS = 4000  # 4x the longest released text; the push guard also reads the joined column
MAX_ITEMS = 64
STRUCTURED_KEYS = ("anatomy", "measurement", "symptom")  # MedHEval's report terms (vishal_report, knowledge)
META_FIELDS: dict[str, str] = {
    # every builder (medheval.families.medheval.source._record, med_hallmark.source._record)
    "credentialed": "flag", "quality_flags": "terms",
    # MedHEval (visual close-ended, report, knowledge, context)
    "upstream_qid": "id", "hallucination_type": "id", "question_type": "id", "omission_type": "id",
    "img_id": "id", "location": "id", "modality": "id", "raw_choices": "text", "structured_answer": "structured",
    # Med-HallMark
    "upstream_id": "id", "upstream_image": "id", "human_label": "id", "human_label_text": "id",
    "human_level": "id", "has_ground_truth": "flag", "released_hallucination_type": "id",
    "released_response": "text", "plain_question": "text", "prefix": "text",
}


class MetaError(ValueError):
    """A row's ``meta`` holds a known key of the wrong kind or size."""


def _text(value: Any, limit: int) -> bool:
    return isinstance(value, str) and len(value) <= limit


def _terms(value: Any) -> bool:
    return isinstance(value, list) and len(value) <= MAX_ITEMS and all(_text(item, MAX_TERM_CHARS) for item in value)


def valid(kind: str, value: Any) -> bool:
    """Whether ``value`` is of ``kind`` (the module docstring lists the kinds); null always is."""
    if value is None:
        return True
    if kind == "flag":
        return isinstance(value, bool)
    if kind == "id":
        return (isinstance(value, int) and not isinstance(value, bool)) or _text(value, MAX_ID_CHARS)
    if kind == "text":
        return _text(value, MAX_TEXT_CHARS) or (isinstance(value, list) and len(value) <= MAX_ITEMS
                                                 and all(_text(item, MAX_TEXT_CHARS) for item in value))
    if kind == "terms":
        return _terms(value)
    if kind == "structured":
        return isinstance(value, Mapping) and set(value) <= set(STRUCTURED_KEYS) and all(
            item is None or _terms(item) for item in value.values())
    raise ValueError(f"unknown meta kind {kind!r}")


def publishable_meta(meta: Any, where: str) -> tuple[dict[str, Any] | None, list[str]]:
    """``(meta as published, the unknown keys left out)``; a :class:`MetaError` naming ``where`` (the record) and
    the key when a known key's value is not of its kind or size. ``None`` stays ``None``."""
    if meta is None:
        return None, []
    if not isinstance(meta, Mapping):
        raise MetaError(f"{where}: meta must be a JSON object, got {type(meta).__name__}")
    kept: dict[str, Any] = {}
    dropped: list[str] = []
    for key, value in meta.items():
        kind = META_FIELDS.get(key)
        if kind is None:
            dropped.append(str(key)[:40])
        elif valid(kind, value):
            kept[key] = value
        else:
            shown = repr(value)
            raise MetaError(f"{where}: meta.{key} is not what the builders write there (a {kind}: at most "
                            f"{MAX_ITEMS} items, {MAX_TEXT_CHARS} characters of text, {MAX_ID_CHARS} of an id), "
                            f"got {shown[:60] + '…' if len(shown) > 60 else shown}; the annotation file was edited: "
                            "use the released files")
    return kept, dropped


__all__ = ["META_FIELDS", "MetaError", "publishable_meta", "valid"]
