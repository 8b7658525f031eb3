"""Prompt templates per answer type, in one place.

Every backend (local HF model, API model, mitigation) builds its text prompt through
:func:`build_prompt`, so one run asks every model the same thing, and the template
version is recorded with the results (:data:`PROMPT_VERSION`, :func:`describe_templates`).

Templates (``{question}`` is the record's question, stripped)::

    yes_no           "{question} Please answer Yes or No."
    multiple_choice  "{question} Please choose from the following options: A. x, B. y, C. z. Answer with the option's letter."
    open             "{question}"
    report           "{question}"
    statement        "{question}"

The option letters are generated from the record's parsed ``choices`` list (A, B, C, ...),
so they always match what :mod:`medheval.scoring.parsing` maps a letter answer back to.
"""

from __future__ import annotations

import string

from medheval.data.schema import ANSWER_TYPES

PROMPT_VERSION = "medheval-prompts-v1"

TEMPLATES: dict[str, str] = {
    "yes_no": "{question} Please answer Yes or No.",
    "multiple_choice": (
        "{question} Please choose from the following options: {options}. "
        "Answer with the option's letter."
    ),
    "open": "{question}",
    "report": "{question}",
    "statement": "{question}",
}

OPTION_LETTERS = string.ascii_uppercase

assert set(TEMPLATES) == set(ANSWER_TYPES), "every answer type needs a template"


def format_options(choices: list[str], *, record_id: object = "<no id>") -> str:
    """``["x", "y"]`` -> ``"A. x, B. y"``; raises ``ValueError`` for no or too many choices."""
    if isinstance(choices, str) or not isinstance(choices, (list, tuple)):
        raise ValueError(
            f"record {record_id!r}: 'choices' must be a list of option texts, got {type(choices).__name__}"
        )
    if not choices:
        raise ValueError(f"record {record_id!r}: multiple_choice record has no 'choices'")
    if len(choices) > len(OPTION_LETTERS):
        raise ValueError(
            f"record {record_id!r}: {len(choices)} choices, at most {len(OPTION_LETTERS)} can be lettered"
        )
    return ", ".join(f"{letter}. {str(text).strip()}" for letter, text in zip(OPTION_LETTERS, choices))


def build_prompt(record: dict) -> str:
    """The text prompt for one canonical record (keys ``question``, ``answer_type``, ``choices``).

    Raises ``ValueError`` naming the record id when the answer type is unknown, the
    question is missing, or a multiple-choice record has no usable choices.

    >>> build_prompt({"id": "x", "question": "Is the heart enlarged?", "answer_type": "yes_no"})
    'Is the heart enlarged? Please answer Yes or No.'
    >>> build_prompt({"id": "y", "question": "Which organ?", "answer_type": "multiple_choice",
    ...               "choices": ["liver", "spleen"]})
    "Which organ? Please choose from the following options: A. liver, B. spleen. Answer with the option's letter."
    """
    record_id = record.get("id", "<no id>")
    answer_type = record.get("answer_type")
    if answer_type not in TEMPLATES:
        raise ValueError(
            f"record {record_id!r}: unknown answer_type {answer_type!r}; "
            f"expected one of {sorted(TEMPLATES)}"
        )
    question = record.get("question")
    if not isinstance(question, str):
        raise ValueError(
            f"record {record_id!r}: 'question' must be a string, got {type(question).__name__}"
        )
    question = question.strip()
    if answer_type == "multiple_choice":
        options = format_options(record.get("choices") or [], record_id=record_id)
        return TEMPLATES[answer_type].format(question=question, options=options)
    return TEMPLATES[answer_type].format(question=question)


def describe_templates() -> dict:
    """What to record in results.json: the version and the literal templates."""
    return {
        "version": PROMPT_VERSION,
        "templates": dict(TEMPLATES),
        "option_letters": "A, B, C, ... (from the parsed 'choices' list, in order)",
    }


__all__ = ["PROMPT_VERSION", "TEMPLATES", "build_prompt", "describe_templates", "format_options"]
