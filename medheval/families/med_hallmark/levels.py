"""MediHall Score levels, weights and scores (Med-HallMark, Chen et al. 2024, arXiv 2406.10185).

Each answer (VQA) or each sentence of a generated report (IRG) gets one hallucination level;
a level has a weight, and the score is a mean of weights::

    level            weight   Med-HallMark name                  classification_label
    catastrophic     0.0      "Catastrophic Hallucinations"      0
    critical         0.2      "Critical Hallucinations"          1
    attribute        0.4      "Attribute Hallucinations"         2
    prompt_induced   0.6      "Prompt-induced Hallucinations"    3
    minor            0.8      "Minor Hallucinations"             4
    correct          1.0      "Correct Statements"               5

    VQA item score   = weight(level of the answer)
    IRG item score   = (1/N) * sum_i weight(level of sentence i)     (N sentences in the report)
    MediHall Score   = mean of the item scores

IRG uses four levels (catastrophic, critical, attribute, correct): Med-HallMark's report
hierarchy has no prompt-induced or minor level. ``classification_label`` is the integer
encoding of the released ``Conventional..json`` / ``Counterfactual..json`` (0 = catastrophic
… 5 = correct), so ``weight == 0.2 * label``. In the counterfactual setting an answer misled
by the false premise is prompt-induced (:func:`premise_level`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Sequence

from medheval.scoring import text_cues

__all__ = [
    "LEVELS", "VQA_LEVELS", "IRG_LEVELS", "WEIGHTS", "LEVEL_NAMES", "LABEL_TO_LEVEL", "LEVEL_TO_LABEL",
    "PREMISE_CATEGORIES", "Classified", "parse_level", "level_weight", "report_score", "medihall_score",
    "vqa_correct", "vqa_accuracy", "level_distribution", "premise_level", "split_sentences",
]

LEVELS: tuple[str, ...] = ("catastrophic", "critical", "attribute", "prompt_induced", "minor", "correct")
VQA_LEVELS: tuple[str, ...] = LEVELS
IRG_LEVELS: tuple[str, ...] = ("catastrophic", "critical", "attribute", "correct")
WEIGHTS: dict[str, float] = {
    "catastrophic": 0.0, "critical": 0.2, "attribute": 0.4, "prompt_induced": 0.6, "minor": 0.8, "correct": 1.0,
}
LEVEL_NAMES: dict[str, str] = {
    "catastrophic": "Catastrophic Hallucinations",
    "critical": "Critical Hallucinations",
    "attribute": "Attribute Hallucinations",
    "prompt_induced": "Prompt-induced Hallucinations",
    "minor": "Minor Hallucinations",
    "correct": "Correct Statements",
}
LABEL_TO_LEVEL: dict[int, str] = dict(enumerate(LEVELS))
LEVEL_TO_LABEL: dict[str, int] = {level: i for i, level in enumerate(LEVELS)}


@dataclass(frozen=True)
class Classified:
    """One classification: the level and a short reason (which rule fired, or the judge's words)."""

    level: str
    reason: str = ""


# ---------------------------------------------------------------------------
# Levels and scores
# ---------------------------------------------------------------------------

_LEVEL_CUES: tuple[tuple[str, re.Pattern], ...] = (
    ("catastrophic", re.compile(r"\bcatastrophic\b")),
    ("critical", re.compile(r"\bcritical\b")),
    ("attribute", re.compile(r"\battribute\b")),
    ("prompt_induced", re.compile(r"\bprompt[\s_-]*induced\b|\bconfusion\b")),
    ("minor", re.compile(r"\bminor\b|without serious consequences")),
    ("correct", re.compile(r"\bcorrect(?:\s+statements?)?\b|\bno hallucinations?\b")),
)


def parse_level(text: Any, allowed: Sequence[str] = LEVELS) -> str | None:
    """The level named in ``text`` (a key, Med-HallMark's name, ``"**Attribute Hallucinations**"`` …).

    ``None`` when no level or more than one different level is named, or the level is not in
    ``allowed`` (IRG allows four). Numbers are not read: upstream numbers the levels 1–6 in its
    prompt but encodes them 0–5 in its labels, so a bare digit is ambiguous.
    """
    if not isinstance(text, str):
        return None
    low = text.strip().lower().replace("_", " ")
    found = {level for level, cue in _LEVEL_CUES if cue.search(low)}
    if "prompt_induced" in found and "minor" not in found:
        found.discard("correct")  # "…prompt-induced…" text never means a correct answer
    if len(found) == 2 and "correct" in found and re.search(r"\b(?:not|in)correct\b", low):
        found.discard("correct")
    if len(found) != 1:
        return None
    level = found.pop()
    return level if level in allowed else None


def level_weight(level: str) -> float:
    """The MediHall weight of a level key (``KeyError`` for an unknown level)."""
    return WEIGHTS[level]


def report_score(levels: Sequence[str]) -> float | None:
    """Mean weight over a report's sentence levels; ``None`` for a report without sentences."""
    if not levels:
        return None
    return sum(WEIGHTS[level] for level in levels) / len(levels)


def medihall_score(item_scores: Sequence[float | None]) -> float | None:
    """Mean over the scored items (``None`` entries are failed items, left out)."""
    scored = [s for s in item_scores if s is not None]
    return sum(scored) / len(scored) if scored else None


def vqa_correct(levels: Sequence[str | None]) -> list[bool | None]:
    """Per VQA answer, whether it is correct for Med-HallMark's ACC: its level is ``correct`` (MediHall
    weight 1.0); ``None`` for an answer without a level. Table 3 of the paper scores Accuracy 1 exactly
    for the answers whose MediHall Score is 1.0 (and 0 for the 0.6 and 0.4 ones)."""
    return [None if level is None else level == "correct" for level in levels]


def vqa_accuracy(levels: Sequence[str | None]) -> float | None:
    """Med-HallMark's ACC (Table 1, Med-VQA only): the share of classified answers at level ``correct``,
    ``ACC = |{i : level_i = correct}| / |{i : level_i given}|`` (0–1; ``None`` when none is classified).
    Never above the MediHall Score of the same answers, whose weights are at most 1."""
    judged = [ok for ok in vqa_correct(levels) if ok is not None]
    return sum(judged) / len(judged) if judged else None


def level_distribution(levels: Sequence[str | None], allowed: Sequence[str] = LEVELS) -> dict[str, int]:
    """``{level: count}`` over ``allowed`` (zeros kept), ``None`` entries skipped."""
    counts = {level: 0 for level in allowed}
    for level in levels:
        if level is not None:
            counts[level] = counts.get(level, 0) + 1
    return counts


# ---------------------------------------------------------------------------
# Sentence splitting (IRG)
# ---------------------------------------------------------------------------

def split_sentences(text: str | None) -> list[str]:
    """Split a generated report into sentences (the IRG unit of the MediHall Score): the shared
    splitter with its MediHall preset (:data:`medheval.scoring.text_cues.MEDIHALL_SENTENCES`: role/section
    prefixes dropped, line breaks and bullets end a sentence, no break inside numbers or after
    common abbreviations, pieces without a letter or digit dropped)."""
    return text_cues.split_sentences(text, text_cues.MEDIHALL_SENTENCES)


# Question types whose false premise (counterfactual) makes any wrong answer prompt-induced.
PREMISE_CATEGORIES: frozenset[str] = frozenset({"counterfactual"})


def premise_level(level: str | None, category: str | None) -> str | None:
    """Med-HallMark's counterfactual rule: in a question built on a false premise, an answer
    that is not correct was misled by the premise, so its level is ``prompt_induced`` (0.6)
    whatever the level source said. Other categories (and ``None``) pass through."""
    if level is None or level == "correct":
        return level
    key = str(category or "").strip().lower().replace("-", "_").replace(" ", "_")
    return "prompt_induced" if key in PREMISE_CATEGORIES else level
