"""The canonical record every benchmark maps to (DESIGN.md, "Data model").

One row per item::

    id           "benchmark/config/upstream-id", stable and unique
    benchmark    e.g. "cxr_vishal"
    config       the per-source config the item belongs to (e.g. "mimic_cxr"), also inside "all"
    images       image references relative to the source's image root (never bytes)
    question     the question or instruction as released
    answer       the reference answer as released (never re-labelled)
    answer_type  yes_no | multiple_choice | open | report | statement
    choices      parsed option texts, without their letters ([] unless multiple choice)
    category     benchmark-specific category (anatomy/measurement/symptom/radiology for the visual splits)
    source       image source: slake, vqa_rad, iu_xray, mimic_cxr, ...
    meta         everything else (upstream fields, quality flags), as JSON
"""

from __future__ import annotations

import re

from datasets import Features, Json, List, Value

ANSWER_TYPES = ("yes_no", "multiple_choice", "open", "report", "statement")

FEATURES = Features(
    {
        "id": Value("string"),
        "benchmark": Value("string"),
        "config": Value("string"),
        "images": List(Value("string")),
        "question": Value("string"),
        "answer": Value("string"),
        "answer_type": Value("string"),
        "choices": List(Value("string")),
        "category": Value("string"),
        "source": Value("string"),
        "meta": Json(),
    }
)

# Image sources whose images (and derived text) are under a data use agreement:
# never embed them in anything published, never send them to a third-party endpoint.
CREDENTIALED_SOURCES = frozenset({"mimic_cxr", "mimic_iv"})

# MedHEval's hallucination_type codes (Type1_* notebooks' GPT-4 system prompt).
HALLUCINATION_TYPE_TO_CATEGORY = {
    "type_1": "anatomy",
    "type_2": "measurement",
    "type_3": "symptom",
    "type_4": "radiology",
}
VISUAL_CATEGORIES = ("anatomy", "measurement", "symptom", "radiology")

# The unit a benchmark's items are correlated within, which the report's bootstrap resamples (one unit per
# benchmark: ``CLUSTER = "<unit>"`` in its dataset unit ``datasets/<name>/<name>.py``; ``item`` when absent).
CLUSTER_UNITS = {
    "image": "the image set a record asks about (``images``, order ignored); a record without images is its own",
    "study": "the study a statement is about (``meta.study_id``)",
    "report": "the report a record asks for (one record per report)",
    "item": "the record itself (no clustering)",
}


def cluster_id(record: dict, unit: str) -> str:
    """The cluster label of ``record`` under ``unit`` (:data:`CLUSTER_UNITS`); ``ValueError`` naming the
    record when it lacks the field the unit needs."""
    if unit == "image":
        images = sorted(str(image) for image in record.get("images") or [])
        return "image:" + "+".join(images) if images else "item:" + str(record["id"])
    if unit == "study":
        study = (record.get("meta") or {}).get("study_id")
        if study in (None, ""):
            raise ValueError(f"record {record.get('id')!r}: clustered by study but meta.study_id is missing")
        return f"study:{study}"
    if unit in ("report", "item"):
        return f"{unit}:{record['id']}"
    raise ValueError(f"unknown cluster unit {unit!r}; choose one of {sorted(CLUSTER_UNITS)}")


def json_kind(value: object) -> str:
    """JSON's name for the type of a parsed JSON ``value``: ``null``, ``boolean``, ``number``, ``string``, ``array``
    or ``object`` (for errors about a file's fields: a Python type name reads ``NoneType``, ``dict``)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    return {dict: "object", list: "array", str: "string"}.get(type(value), "number")


def make_id(benchmark: str, config: str, upstream_id: object) -> str:
    """The stable record id ``benchmark/config/upstream-id``."""
    return f"{benchmark}/{config}/{upstream_id}"


def is_credentialed(source: str) -> bool:
    """True when images/text from ``source`` fall under a credentialed-access agreement, whatever the spelling:
    ``mimic_cxr``, ``MIMIC_CXR``, ``MIMIC-CXR-JPG``, ``mimic_iv`` … (any MIMIC database)."""
    name = re.sub(r"[\s_-]+", "_", str(source or "").strip().lower())
    return name in CREDENTIALED_SOURCES or name.startswith("mimic")


def record_credentialed(row: dict) -> bool:
    """A record's ``meta.credentialed``; a record without it counts by its source (MIMIC: credentialed)."""
    flag = (row.get("meta") or {}).get("credentialed")
    return flag if isinstance(flag, bool) else is_credentialed(str(row.get("source") or ""))


def validate_record(record: dict) -> None:
    """Raise ``ValueError`` naming the record and field when ``record`` breaks the schema."""
    rid = record.get("id", "<no id>")
    missing = [name for name in FEATURES if name not in record]
    if missing:
        raise ValueError(f"record {rid!r}: missing field(s) {missing}")
    if record["answer_type"] not in ANSWER_TYPES:
        raise ValueError(
            f"record {rid!r}: answer_type {record['answer_type']!r} is not one of {ANSWER_TYPES}"
        )
    if not isinstance(record["images"], list) or not isinstance(record["choices"], list):
        raise ValueError(f"record {rid!r}: 'images' and 'choices' must be lists")
