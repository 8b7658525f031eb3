"""Three-stage reasoning traces (ClinHallu): parse, validate, render.

A trace is written with four section markers (a format fact of the benchmark)::

    [Visual Recognition]  what the image shows, no diagnosis
    [Knowledge Recall]    the medical knowledge the question needs, no image
    [Reasoning]           the two combined ... ending with
    [Answer] <the final answer on this line>

:func:`parse_trace` splits a text at the three stage markers (text before the first marker
is ignored; a stage given twice keeps its last non-empty occurrence). The answer is the rest
of the first ``[Answer]`` line inside the Reasoning section (blank lines after the marker are
skipped); every ``[Answer] ...`` line is taken out of the reasoning text.

A trace is *valid* (strict, as in the ClinHallu paper) when all three stages are present,
each has at least :data:`MIN_WORDS` whitespace-separated words, and the answer is non-empty.
The reason names the first failing check, in stage order. By default markers must be written
exactly as above (ClinHallu's own parser is case- and spacing-sensitive, and the default
agrees with it on every trace); ``lenient_markers=True`` also accepts other letter case and
spacing (``[ visual   recognition ]``, ``[ANSWER]``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

STAGES: tuple[str, ...] = ("visual_recognition", "knowledge_recall", "reasoning")
STAGE_TITLES: dict[str, str] = {
    "visual_recognition": "Visual Recognition",
    "knowledge_recall": "Knowledge Recall",
    "reasoning": "Reasoning",
}
ANSWER_TITLE = "Answer"
MIN_WORDS = 3


def marker(title: str) -> str:
    """The section marker of a stage title: ``"Reasoning"`` -> ``"[Reasoning]"``."""
    return f"[{title}]"


def _marker_regex(title: str, lenient: bool) -> str:
    if not lenient:
        return re.escape(marker(title))
    words = r"\s+".join(re.escape(word) for word in title.split())
    return r"\[\s*" + words + r"\s*\]"


def _patterns(lenient: bool) -> tuple[re.Pattern[str], re.Pattern[str]]:
    flags = re.IGNORECASE if lenient else 0
    stage_alternatives = "|".join(
        f"(?P<{key}>{_marker_regex(title, lenient)})" for key, title in STAGE_TITLES.items()
    )
    # "[Answer]", optional whitespace (newlines included), then the answer up to the end of its line
    answer = re.compile(_marker_regex(ANSWER_TITLE, lenient) + r"\s*(?P<answer>.+?)$", flags | re.MULTILINE)
    return re.compile(stage_alternatives, flags), answer


_STRICT = _patterns(False)
_LENIENT = _patterns(True)


@dataclass(frozen=True)
class Trace:
    """One parsed trace; absent stages are ``""``. ``reason`` is ``"ok"`` when ``valid``."""

    visual_recognition: str
    knowledge_recall: str
    reasoning: str
    answer: str
    present: tuple[str, ...]  # the stages whose marker was found with non-empty text
    valid: bool
    reason: str

    def stage(self, name: str) -> str:
        """The text of one stage (``visual_recognition`` | ``knowledge_recall`` | ``reasoning``)."""
        if name not in STAGES:
            raise KeyError(f"unknown stage {name!r}; expected one of {STAGES}")
        return getattr(self, name)

    def as_dict(self) -> dict[str, str]:
        """``{visual_recognition, knowledge_recall, reasoning, answer}``, the ``meta.gold_trace`` shape."""
        return {**{name: self.stage(name) for name in STAGES}, "answer": self.answer}


def _sections(text: str, stage_pattern: re.Pattern[str]) -> dict[str, str]:
    hits = list(stage_pattern.finditer(text))
    found: dict[str, str] = {}
    for position, hit in enumerate(hits):
        end = hits[position + 1].start() if position + 1 < len(hits) else len(text)
        body = text[hit.end():end].strip()
        if body:  # an empty repeat never erases an earlier stage
            found[hit.lastgroup] = body
    return found


def parse_trace(text: str, lenient_markers: bool = False) -> Trace:
    """Parse and validate one trace (module docstring: markers, answer line, validity)."""
    if not isinstance(text, str):
        raise TypeError(f"a trace must be a string, got {type(text).__name__}")
    stage_pattern, answer_pattern = _LENIENT if lenient_markers else _STRICT
    found = _sections(text, stage_pattern)
    answer = ""
    if "reasoning" in found:
        first = answer_pattern.search(found["reasoning"])
        answer = first.group("answer").strip() if first else ""
        found["reasoning"] = answer_pattern.sub("", found["reasoning"]).strip()
    reason = "ok"
    for name in STAGES:
        if name not in found:
            reason = f"missing stage {marker(STAGE_TITLES[name])}"
            break
        if len(found[name].split()) < MIN_WORDS:
            reason = f"stage {marker(STAGE_TITLES[name])} has fewer than {MIN_WORDS} words"
            break
    else:
        if not answer:
            reason = f"no {marker(ANSWER_TITLE)} in the {marker('Reasoning')} stage"
    return Trace(
        visual_recognition=found.get("visual_recognition", ""),
        knowledge_recall=found.get("knowledge_recall", ""),
        reasoning=found.get("reasoning", ""),
        answer=answer,
        present=tuple(name for name in STAGES if name in found),
        valid=reason == "ok",
        reason=reason,
    )


def render_stages(**stages: str) -> str:
    """Stages written with their markers, in stage order, e.g. the prefix a continuation
    starts from: ``render_stages(visual_recognition=vr, knowledge_recall=kr)``."""
    unknown = sorted(set(stages) - set(STAGES) - {"answer"})
    if unknown:
        raise KeyError(f"unknown stage(s) {unknown}; expected names from {STAGES} or 'answer'")
    parts = [f"{marker(STAGE_TITLES[name])}\n{stages[name].strip()}" for name in STAGES if name in stages]
    text = "\n\n".join(parts)
    if "answer" in stages:
        text += f"\n{marker(ANSWER_TITLE)} {stages['answer'].strip()}"
    return text
