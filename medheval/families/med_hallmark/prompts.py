"""Judge / detector prompts for MediHall levels, and the validators of the replies.

Two styles:

* ``"json"`` (default, for LLM judges): this project's own description of Med-HallMark's
  hierarchy (the level names and weights are the paper's facts; the wording is ours), the
  item in the user message, and a JSON reply (``{"level": …}`` for an answer, one entry per
  numbered sentence for a report).
* ``"upstream"``: Med-HallMark's exact prompts, for a judge or a detector trained on them. The
  text is never stored here: it is read at run time from the pinned, sha256-verified upstream
  files (:func:`medheval.families.med_hallmark.source.upstream_vqa_template`, the human turn of a
  ``Conventional..json`` record; :func:`~medheval.families.med_hallmark.source.upstream_irg_template`,
  the ``prompt`` field of ``Irg.json``). Replies are plain text: a level name (VQA) or
  ``Sentence: … / "Hallucination type"： …`` blocks (:func:`parse_irg_upstream`).

Bump :data:`PROMPT_VERSION` whenever the ``json`` wording changes (it is recorded with the
results; the judge cache is keyed on the prompt text). The levels follow the paper (Med-HallMark
Sec. 3.3; Sec. 6.2 on Figure 2(b) / Table 3): prompt-induced (0.6) is an answer misled by a false
premise (the counterfactual questions); a confidence-weakening preface changes nothing about the
level, which is decided from the answer as for a conventional question, as the rule classifier does
(:func:`~medheval.families.med_hallmark.levels.premise_level`).
"""

from __future__ import annotations

import re
from typing import Any, Callable, Sequence

from medheval.families.med_hallmark.levels import IRG_LEVELS, LEVEL_NAMES, VQA_LEVELS, Classified, parse_level, split_sentences

__all__ = [
    "PROMPT_VERSION", "PROMPT_STYLES", "vqa_prompt", "irg_prompt", "vqa_validator", "vqa_text_validator",
    "irg_validator", "irg_text_validator", "parse_irg_upstream",
]

PROMPT_VERSION = "medihall-v3"  # v3: a confidence-weakening preface is no longer prompt-induced
PROMPT_STYLES = ("json", "upstream")

# This project's wording of each level (what a reviewer should look for), most severe first.
_LEVEL_GUIDE: dict[str, str] = {
    "catastrophic": (
        "the answer gets the basic picture wrong: it misjudges whether the image is healthy or diseased, "
        "names or invents the wrong organ, reports a lesion on an image that has none, or builds further "
        "claims on such a mistake. Clinically this could derail the whole decision."
    ),
    "critical": (
        "the organ and overall state are right, but the answer misstates what a finding is or does: the "
        "wrong kind of disease, a lesion of another type on an abnormal image, a missed or misread finding, "
        "or a wrong cause. Serious, one step below catastrophic."
    ),
    "attribute": (
        "the right finding with a wrong property: its size, shape, position, side or count is misstated."
    ),
    "prompt_induced": (
        "the question asserts something the image contradicts (a false premise, as in a counterfactual "
        "question) and the answer goes along with it. A preface that only casts doubt on the model's "
        "confidence is not a false premise: judge such an answer by its content, like any other question."
    ),
    "minor": (
        "a slip with little clinical weight, typically about how the image was acquired: the modality, "
        "plane, sequence or view."
    ),
    "correct": "no hallucination: the answer agrees in meaning with {basis}.",
}
_IRG_ATTRIBUTE_EXTRA = " It lowers the report's precision without changing the diagnosis."


def _choices(levels: Sequence[str]) -> str:
    return ", ".join(f'"{LEVEL_NAMES[level]}"' for level in levels)


def _hierarchy(levels: Sequence[str], basis: str, irg: bool = False) -> str:
    lines = []
    for rank, level in enumerate(levels, 1):
        text = _LEVEL_GUIDE[level].format(basis=basis)
        if irg and level == "attribute":
            text += _IRG_ATTRIBUTE_EXTRA
        lines.append(f"{rank}. {LEVEL_NAMES[level]}: {text}")
    return "\n".join(lines)


def _has(value: Any) -> bool:
    return value is not None and str(value).strip() != ""


def _check_style(style: str) -> None:
    if style not in PROMPT_STYLES:
        raise ValueError(f"style must be one of {PROMPT_STYLES}, got {style!r}")


def vqa_prompt(question: Any, prediction: Any, reference: Any = None, style: str = "json",
               upstream_dir: str | None = None) -> tuple[str | None, str]:
    """``(system, user)`` asking for the hallucination level of one VQA answer.

    Without a reference (``None``/empty) the judge must decide from the image. ``style="upstream"``:
    Med-HallMark's prompt (the variant with or without ground truth) filled with the item, all in
    the user message (``system`` is ``None``); the reply is a level name (:func:`vqa_text_validator`).
    ``upstream_dir``: a local folder holding the upstream files (else the pinned download/cache).
    """
    _check_style(style)
    has_ref = _has(reference)
    if style == "upstream":
        from medheval.families.med_hallmark.source import upstream_vqa_template

        template = upstream_vqa_template(has_ref, upstream_dir)
        values = {"question": question, "response": prediction}
        if has_ref:
            values["reference"] = reference
        return None, template.render(**values)
    basis = "the ground-truth answer" if has_ref else "what the image shows"
    system = (
        "You review answers that a medical vision-language model gave to questions about medical images, "
        "and you classify each answer's hallucination by clinical severity. Compare the answer with "
        + ("the ground-truth answer and the image, if one is attached." if has_ref else "the attached image.")
        + " Pick exactly one level, the most severe that applies:\n\n" + _hierarchy(VQA_LEVELS, basis)
    )
    item = f"Question: {question}\nModel answer: {prediction}"
    if has_ref:
        item += f"\nGround-truth answer: {reference}"
    return system, (f"{item}\n\nReply with one JSON object and nothing else: "
                    f'{{"level": "<one of {_choices(VQA_LEVELS)}>"}}')


def irg_prompt(reference: Any, prediction: Any = None, sentences: Sequence[str] | None = None,
               style: str = "json", upstream_dir: str | None = None) -> tuple[str | None, str]:
    """``(system, user)`` asking for the level of each sentence of a generated report.

    ``style="json"``: the report is given as numbered ``sentences`` (default: :func:`split_sentences`
    of ``prediction``, so the levels line up with it); the reply is
    ``{"sentences": [{"index": 1, "level": "...", "reason": "..."}, ...]}``. ``style="upstream"``:
    Med-HallMark's ``Irg.json`` prompt with the whole ``prediction``; the reply is its plain-text
    blocks (:func:`parse_irg_upstream`).
    """
    _check_style(style)
    if style == "upstream":
        from medheval.families.med_hallmark.source import upstream_irg_template

        return None, upstream_irg_template(upstream_dir).render(reference=reference, response=prediction)
    if sentences is None:
        sentences = split_sentences(prediction)
    numbered = "\n".join(f"{i}. {s}" for i, s in enumerate(sentences, 1))
    system = (
        "You are a radiologist checking a machine-written radiology report against the report a doctor "
        "wrote for the same image. Give every numbered sentence of the machine report one level, the most "
        "severe that applies:\n\n" + _hierarchy(IRG_LEVELS, "the doctor's report", irg=True)
    )
    user = (
        f"Doctor's report:\n{reference}\n\nMachine report, one sentence per line:\n{numbered}\n\n"
        f"Reply with one JSON object and nothing else: "
        f'{{"sentences": [{{"index": 1, "level": "<one of {_choices(IRG_LEVELS)}>", "reason": "<short>"}}, '
        f"...]}} with exactly one entry per sentence (indices 1 to {len(sentences)})."
    )
    return system, user


def vqa_validator(allowed: Sequence[str] = VQA_LEVELS) -> Callable[[dict], str]:
    """A ``validate`` for the judge layer: the parsed JSON reply -> a level key (``ValueError`` if none)."""

    def validate(reply: dict) -> str:
        if not isinstance(reply, dict):
            raise ValueError("expected a JSON object")
        value = reply.get("level", reply.get("hallucination_type", reply.get("type")))
        if value is None and len(reply) == 1:
            (value,) = reply.values()
        level = parse_level(value, allowed)
        if level is None:
            raise ValueError(f'"level" must be one of {_choices(allowed)}, got {value!r}')
        return level

    return validate


def vqa_text_validator(allowed: Sequence[str] = VQA_LEVELS) -> Callable[[str], str]:
    """A ``validate`` for a plain-text reply (``reply_format="text"``): the level it names."""

    def validate(text: str) -> str:
        level = parse_level(text, allowed)
        if level is None:
            raise ValueError(f"reply with one of {_choices(allowed)} only, got {str(text)[:80]!r}")
        return level

    return validate


def irg_validator(n_sentences: int) -> Callable[[dict], list[Classified]]:
    """A ``validate`` for an IRG reply: one :class:`Classified` (IRG level, reason) per sentence, in
    order (``ValueError`` otherwise)."""

    def validate(reply: dict) -> list[Classified]:
        entries = reply.get("sentences") if isinstance(reply, dict) else None
        if isinstance(entries, dict):
            entries = [{"index": k, "level": v} for k, v in entries.items()]
        if not isinstance(entries, list):
            raise ValueError('expected {"sentences": [{"index": 1, "level": "..."}, ...]}')
        levels: dict[int, Classified] = {}
        for position, entry in enumerate(entries, 1):
            reason = ""
            if isinstance(entry, dict):
                raw_index, value = entry.get("index", position), entry.get("level", entry.get("type"))
                reason = str(entry.get("reason") or "")
            else:
                raw_index, value = position, entry
            try:
                index = int(raw_index)
            except (TypeError, ValueError):
                raise ValueError(f"sentence index {raw_index!r} is not a number") from None
            level = parse_level(value, IRG_LEVELS)
            if level is None:
                raise ValueError(f"sentence {index}: level must be one of {_choices(IRG_LEVELS)}, got {value!r}")
            levels[index] = Classified(level, reason)
        missing = [i for i in range(1, n_sentences + 1) if i not in levels]
        if missing or len(levels) != n_sentences:
            raise ValueError(f"expected levels for sentences 1 to {n_sentences}; "
                             + (f"missing {missing}" if missing else f"got indices {sorted(levels)}"))
        return [levels[i] for i in range(1, n_sentences + 1)]

    return validate


# One block of the upstream IRG reply: 'Sentence: <text>', a line break, '"Hallucination type": <level>'. Read
# in parts by _irg_blocks: as one regex with a lazy middle, every "Sentence:" without a type line after it
# rescanned the rest of the reply, and every blank of a long run was tried as the middle's end (quadratic).
_IRG_HEAD = re.compile(r"Sentence\"?\s*[:：]", re.I)
_IRG_TYPE = re.compile(r"\"?Hallucination type\"?\s*[:：]\s*(?P<level>[^\n]*)", re.I)
# a type line after a blank run that starts after a non-blank character and holds a line break
_IRG_BREAK_TYPE = re.compile(r"(?<=\S)(?=[^\S\n]*\n)\s*" + _IRG_TYPE.pattern, re.I)
_NON_BLANK = re.compile(r"\S")


def _irg_blocks(text: str) -> list[tuple[str, str]]:
    """``(sentence, level)`` text of each block, in linear time: the groups that ``re.finditer`` gives for
    ``Sentence"?\\s*[:：]\\s*(?P<sentence>.*?)\\s*\\n\\s*"?Hallucination type"?\\s*[:：]\\s*(?P<level>[^\\n]*)``
    (``re.I | re.S``), the single regex this replaced. The sentence runs from the first non-blank after
    "Sentence:" to the first type line after it; with none, a type line right after the colon's blanks gives
    an empty sentence when those blanks hold a line break (the regex's last resort); else no later block can
    match either."""
    blocks: list[tuple[str, str]] = []
    pos = 0
    while (head := _IRG_HEAD.search(text, pos)) is not None:
        first = _NON_BLANK.search(text, head.end())
        start = first.start() if first else len(text)
        tail = _IRG_BREAK_TYPE.search(text, start)
        if tail is not None:
            blocks.append((text[start:tail.start()], tail["level"]))
        elif "\n" in text[head.end():start] and (tail := _IRG_TYPE.match(text, start)) is not None:
            blocks.append(("", tail["level"]))
        else:
            break
        pos = tail.end()
    return blocks


def parse_irg_upstream(text: str) -> list[tuple[str, str]]:
    """``[(sentence, level), …]`` from a reply in Med-HallMark's IRG output format (full-width colons).

    ``ValueError`` when no block is found or a block's type is not an IRG level.
    """
    out = []
    for sentence, raw_level in _irg_blocks(text or ""):
        level = parse_level(raw_level, IRG_LEVELS)
        if level is None:
            raise ValueError(f"unknown hallucination type {raw_level.strip()!r} for sentence {sentence[:60]!r}")
        out.append((sentence.strip().strip('"'), level))
    if not out:
        raise ValueError('no "Sentence: … / "Hallucination type": …" blocks in the reply')
    return out


def irg_text_validator() -> Callable[[str], list[Classified]]:
    """A ``validate`` for a plain-text IRG reply in the upstream format: one :class:`Classified`
    per block (the judge's own sentence split, so the count may differ from :func:`split_sentences`)."""

    def validate(text: str) -> list[Classified]:
        return [Classified(level, sentence) for sentence, level in parse_irg_upstream(text)]

    return validate
