"""Negation, hedge and affirmation cues, and the one sentence splitter, for the project's text rules.

Every rule-based reader of free text in the project takes its cue vocabulary and its sentence
boundaries from here:

* **close-ended answers** (:mod:`medheval.scoring.parsing`): answer-level cues (:data:`NEGATION`,
  :data:`HEDGE`, :data:`LEAD_HEDGE`, :data:`LEAD_YES`, :data:`LEAD_NO`, :data:`ASSERTION`) and
  :data:`ANSWER_SENTENCES`;
* **the CheXpert rule labeler** (:mod:`medheval.labelers.chexpert_rules`): the NegEx/ConText-style
  trigger table :data:`CHEXPERT_TRIGGERS` (phrases with a role, a direction and a word window) and
  :data:`CHEXPERT_SENTENCES`;
* **RaTEScore's rule splitter** (:mod:`medheval.radiology.ratescore_scoring`): :data:`RATESCORE_SENTENCES`;
* **report-sentence clause cues** (:data:`REPORT_NEGATION`, :data:`REPORT_POST_NEGATION`,
  :data:`REPORT_UNCERTAIN`, :data:`REPORT_CLAUSE_BREAK`) and :data:`MEDIHALL_SENTENCES`: the
  MediHall Score's offline IRG classifier reads generated reports with exactly these.

The splitter is :func:`split_sentences` with a :class:`SentenceOptions`; each preset above
reproduces what its user needs (what counts as a boundary, whether the terminator stays, line
handling, abbreviations, list numbers, the filter for empty pieces).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Callable, Pattern

__all__ = [
    "SentenceOptions", "split_sentences", "sentence_ends", "keep_sentence",
    "ANSWER_SENTENCES", "CHEXPERT_SENTENCES", "RATESCORE_SENTENCES", "MEDIHALL_SENTENCES",
    "NEGATION", "POST_NEGATION", "HEDGE", "LEAD_HEDGE", "LEAD_YES", "LEAD_NO", "ASSERTION", "NEUTRAL_VERB",
    "REPORT_NEGATION", "REPORT_POST_NEGATION", "REPORT_UNCERTAIN", "REPORT_CLAUSE_BREAK",
    "CHEXPERT_TRIGGERS", "FORWARD", "BACKWARD", "expand",
]


# =============================================================================================
# Sentence splitting
# =============================================================================================


def _keep_nonblank(piece: str) -> bool:
    return bool(piece.strip())


@dataclass(frozen=True)
class SentenceOptions:
    """How :func:`split_sentences` cuts a text.

    ``boundary`` matches the separators between sentences; with ``keep_boundary`` the matched
    text stays at the end of the sentence before it (a full stop), otherwise it is dropped.
    ``blocks`` first cuts the text into independent blocks: ``"text"`` (one block),
    ``"blank_lines"`` (paragraphs) or ``"lines"`` (every line). ``clean_block`` rewrites each
    block before it is split (e.g. removes a role prefix or a bullet). A boundary directly after
    one of ``abbreviations`` (the last word of the sentence so far, lower case, leading
    brackets/quotes removed) is no boundary. ``merge_list_numbers`` joins a bare list number
    (``"2."``) with the sentence after it. Pieces are stripped when ``strip`` and kept when ``keep``
    says so.
    """

    boundary: Pattern[str]
    keep_boundary: bool = False
    blocks: str = "text"
    clean_block: Callable[[str], str] | None = None
    abbreviations: frozenset[str] = field(default_factory=frozenset)
    merge_list_numbers: bool = False
    strip: bool = True
    keep: Callable[[str], bool] = _keep_nonblank


_BLANK_LINES = re.compile(r"\n\s*\n")
_LIST_NUMBER = re.compile(r"\d{1,2}[.)]")


def _blocks(text: str, how: str) -> list[str]:
    if how == "text":
        return [text]
    if how == "blank_lines":
        return _BLANK_LINES.split(text)
    if how == "lines":
        return text.replace("\r", "\n").split("\n")
    raise ValueError(f"SentenceOptions.blocks must be 'text', 'blank_lines' or 'lines', not {how!r}")


def _last_word(text: str, start: int, end: int) -> str:
    """``text[start:end].split()[-1]``, or ``""`` when that has no word, read backwards from ``end``: a line of
    many abbreviations ("dr. A dr. A ...") would otherwise re-split its growing sentence at every boundary."""
    while end > start and text[end - 1].isspace():
        end -= 1
    first = end
    while first > start and not text[first - 1].isspace():
        first -= 1
    return text[first:end]


def split_sentences(text: str | None, options: SentenceOptions) -> list[str]:
    """The sentences of ``text`` under ``options`` (see :class:`SentenceOptions` and the presets)."""
    if not text:
        return []
    out: list[str] = []
    for block in _blocks(str(text), options.blocks):
        if options.clean_block is not None:
            block = options.clean_block(block)
        pieces: list[str] = []
        start = 0
        for m in options.boundary.finditer(block):
            end = m.end() if options.keep_boundary else m.start()
            if options.abbreviations:
                word = _last_word(block, start, end)
                if word and word.lower().lstrip("(\"'") in options.abbreviations:
                    continue
            pieces.append(block[start:end])
            start = m.end()
        pieces.append(block[start:])
        if options.strip:
            pieces = [piece.strip() for piece in pieces]
        if options.merge_list_numbers:
            merged: list[str] = []
            for piece in pieces:
                if merged and _LIST_NUMBER.fullmatch(merged[-1]):  # "2." opening a sentence stays with it
                    merged[-1] = f"{merged[-1]} {piece}"
                else:
                    merged.append(piece)
            pieces = merged
        out.extend(piece for piece in pieces if options.keep(piece))
    return out


def sentence_ends(text: str, options: SentenceOptions) -> list[int]:
    """Offsets just after every boundary of ``text`` (one block, no cleaning): where sentences end."""
    return [m.end() for m in options.boundary.finditer(text)]


#: Close-ended answers: runs of ``. ! ? ;`` or line breaks, not inside a number ("3.5 cm").
ANSWER_SENTENCES = SentenceOptions(boundary=re.compile(r"(?<!\d)[.!?;\n]+|[.!?;\n]+(?!\d)"), strip=False)

#: The CheXpert rule labeler, on its normalised (lower-case, one-line) text: ``. ! ?`` followed by
#: white space or the end; the terminator stays; pieces with nothing but terminators are dropped.
CHEXPERT_SENTENCES = SentenceOptions(
    boundary=re.compile(r"[.!?](?=\s|$)"), keep_boundary=True, keep=lambda piece: bool(piece.strip(" .!?")))


def keep_sentence(sentence: str) -> bool:
    """RaTEScore's filter: drop sentences with no word or shorter than 3 characters (after strip)."""
    return bool(sentence.split()) and len(sentence) >= 3


#: RaTEScore's rule splitter (an approximation of medspacy/PyRuSH): paragraphs; ``. ! ?`` + white
#: space before a character that is not a lower-case letter; a line break before a capital, digit
#: or bullet; bare list numbers join their sentence; pieces under 3 characters are dropped.
RATESCORE_SENTENCES = SentenceOptions(
    boundary=re.compile(r"(?<=[.!?])\s+(?=[^a-z\s])|\n\s*(?=[A-Z0-9\-*\u2022])"),
    blocks="blank_lines", merge_list_numbers=True, keep=keep_sentence)

_ROLE_PREFIX = re.compile(r"^\s*(?:#+\s*)?(?:assistant|gpt|answer|response|report|findings|impression)\s*:\s*", re.I)
_BULLET = re.compile(r"^\s*(?:[-*\u2022]|\d+[.)])\s+")
_HAS_ALNUM = re.compile(r"[A-Za-z0-9]")


def _medihall_line(line: str) -> str:
    return _BULLET.sub("", _ROLE_PREFIX.sub("", line.strip()))


#: Generated reports for the MediHall Score's IRG unit: every line apart, a leading role/section
#: prefix and a list bullet removed; ``. ! ?`` (closing quotes/brackets allowed) + white space
#: before a capital or a digit, except after a common abbreviation; pieces need a letter or digit.
MEDIHALL_SENTENCES = SentenceOptions(
    boundary=re.compile(r"(?<=[.!?])[\"')\]]*\s+(?=[\"'(\[]?[A-Z0-9])"),
    blocks="lines", clean_block=_medihall_line,
    abbreviations=frozenset(("e.g.", "i.e.", "etc.", "vs.", "approx.", "dr.", "fig.", "cf.", "st.", "mr.", "mrs.",
                             "ms.", "prof.", "incl.", "resp.")),
    keep=lambda piece: bool(_HAS_ALNUM.search(piece)))


# =============================================================================================
# Answer-level cues (close-ended yes/no answers, lower-cased text)
# =============================================================================================

#: A hedge at the very start of an answer ("not sure", "unclear", "i don't know" ...).
LEAD_HEDGE = re.compile(
    r"^(?:not\s+(?:sure|possible|able|enough|clear|certain|known|determinable|specified|provided|available|applicable|mentioned)"
    r"|unsure|unclear|uncertain|unknown|indeterminate|inconclusive|equivocal|undetermined|maybe|perhaps|possibly"
    r"|no\s+(?:idea|information|info\b|data\b|way\s+to|answer|comment|definitive|conclusive)"
    r"|(?:nothing|none)\s+can\s+be|n/?a\b|impossible|difficult\s+to|hard\s+to"
    r"|i\s+(?:do\s*n[o']t|cannot|can't|am\s+not|'m\s+not|m\s+not)|insufficient|information\s+(?:is\s+)?not"
    r"|it\s+depends|hard\s+to\s+say|difficult\s+to\s+say)",
)
#: A leading answer word meaning yes / no.
LEAD_YES = re.compile(r"^(?:yes|yeah|yep|yup|affirmative|correct|true|positive|present)\b")
LEAD_NO = re.compile(r"^(?:no|nope|nah|negative|incorrect|false|absent|none|nothing|neither)\b")
#: A hedge anywhere in a sentence: the answer commits to nothing.
HEDGE = re.compile(
    r"\b(?:not\s+sure|unsure|unclear|uncertain(?:ty)?|unknown|indeterminate|inconclusive|equivocal|undetermined"
    r"|maybe|perhaps|possibly|may\s+or\s+may\s+not"
    r"|(?:cannot|can\s*not|can't|unable\s+to|impossible\s+to|not\s+possible\s+to|difficult\s+to|hard\s+to|not\s+able\s+to)"
    r"\s+(?:be\s+)?(?:determin|tell|say|assess|evaluat|confirm|ascertain|know|answer|infer|specif|comment|conclude"
    r"|establish|judge|decide|definitively|accurately|reliably|clearly|with\s+certainty)\w*"
    r"|not\s+(?:clear|certain|determinable|specified|provided|available|mentioned|stated|known|enough\s+information)"
    r"|(?:does|do|did)\s*n[o']t\s+(?:specify|confirm|indicate\s+whether|indicate\s+if|mention|state|say|provide|allow)"
    r"|no\s+(?:information|idea|way\s+to)|insufficient|(?:could|may|might)\s+(?:be|indicate|represent|suggest|show)"
    r"|i\s+do\s*n[o']t\s+know|i\s+don't\s+know)"
)
#: A negation anywhere in a sentence.
NEGATION = re.compile(
    r"\b(?:no|not|none|nothing|neither|nor|without|absent|absence|negative|never|cannot|unlikely|improbable)\b|n't\b"
    r"|\bfree\s+of\b|\brul(?:ed|es)\s+out\b|\black(?:s|ing)?\b|\bexclud(?:es|ed)\b"
)
#: An explicit statement that something is there ("there is", "is seen", "shows", "consistent
#: with" ...). A bare copula ("is", "are") or "has" is no such statement: "The lungs are clear."
#: asserts nothing about the question's finding.
ASSERTION = re.compile(
    r"\b(?:yes|there\s+(?:is|are|was|were)|there's|shows?|showing|shown|demonstrat\w*|reveal\w*|presen(?:t|ce)"
    r"|positive|seen|visible|evident|noted|observed|identified|detected|consistent\s+with|indicat\w*"
    r"|suggest\w*|contains?|exists?|correct|true|confirm\w*)\b"
)
#: A negation after a finding that denies it ("X is not seen", "X isn't present", "X: absent"); unlike
#: "no"/"without", which introduce another finding ("effusion without pneumothorax").
POST_NEGATION = re.compile(
    r"\b(?:not|never|none|absent|negative|cannot|unlikely|improbable)\b|n't\b|\brul(?:ed|es)\s+out\b|\bexclud(?:es|ed)\b")
#: Verbs that carry no polarity of their own (a statement "X is Y" / "X has Y" / "it does").
NEUTRAL_VERB = re.compile(r"\b(?:is|are|was|were|has|have|had|does|do|did|appears?|seems?|looks?|remains?)\b")


# =============================================================================================
# Report-sentence clause cues (lower-cased text): the MediHall Score's offline IRG classifier
# =============================================================================================

#: A negation before a finding in its clause.
REPORT_NEGATION = re.compile(
    r"\b(?:no|not|without|negative\s+for|free\s+of|absence\s+of|resolved|clear\s+of|nor|ruled\s+out|exclude[sd]?)\b"
)
#: A negation shortly after a finding ("X is not seen", "X has resolved").
REPORT_POST_NEGATION = re.compile(
    r"^[^.;]{0,40}?\b(?:(?:is|are|was|were|has|have)\s+(?:not|no\s+longer)|absent|resolved)\b")
#: A hedge before a finding in its clause.
REPORT_UNCERTAIN = re.compile(
    r"\b(?:may|might|possib\w*|probabl\w*|likely|suggest\w*|concerning\s+for|cannot\s+be\s+(?:excluded|ruled\s+out)"
    r"|could|questionable|versus|vs|worrisome\s+for)\b"
)
#: Where a clause ends inside a sentence (cue scopes stop there).
REPORT_CLAUSE_BREAK = re.compile(
    r";|\b(?:but|however|although|whereas|except|while)\b|,\s+(?:and\s+)?(?=(?:the|a|an|there)\b)"
)


# =============================================================================================
# CheXpert-style triggers (NegEx/ConText): the rule labeler's scope table
# =============================================================================================
#
# Each entry: (entry kind, roles, phrase patterns over lower-cased text). Roles: (kind, direction,
# window in words or None) with kinds "pre" (pre-negation uncertainty), "neg", "post" (post-negation
# uncertainty), "stable" (post uncertainty for the neutral heart/mediastinum descriptors only).
# Entry kinds: "trig" (ends earlier forward scopes where it opens a new phrase: after a comma, "and",
# "or", "with"), "break" (always ends them), "soft" (never does), "soft_pre" (ends "pre" scopes only),
# "pseudo" (looks like a trigger, is none; consumes the text), "term" (ends scopes in both
# directions), "term_f" (ends forward scopes only). Patterns start with a literal word and use
# non-capturing groups only.

FORWARD, BACKWARD = "f", "b"


def expand(heads: str, tail: str = "", head: str = "") -> list[str]:
    """Expand ``head + h + tail`` for every ``h`` in the ``|``-separated ``heads`` (pattern lists)."""
    return [f"{head}{h}{tail}" for h in heads.split("|")]


_x = expand


_F, _B = FORWARD, BACKWARD
_END = r"(?=\s*(?:[.,;:!?]|$|(?:and|but|or|with|although|however)\b))"  # end of a clause
_COPULA = "is|are|was|were|remains?|remain|appears?|appear|seems?|seem|looks?|look|has been|have been|is now|are now"
_ADV = r"(?:(?:now|otherwise|again|still|overall|grossly|essentially|relatively|largely|entirely|completely|" \
       r"within|stably|also|likely|probably|largely) )?"

CHEXPERT_TRIGGERS: list[tuple] = [
    # ---- pseudo triggers (consume the text; "no change" is a stable-appearance trigger)
    ("pseudo", (), ["not only", "whether or not", "with or without", "gram negative", "no sooner",
                    "not necessarily"]),
    ("trig", (("stable", _F, 6),), [
        r"no (?:(?:significant|substantial|appreciable|definite|major|interval|other|gross|notable|"
        r"significant interval|appreciable interval|relevant) )?(?:changes?|difference)",
        r"without (?:(?:significant|substantial|appreciable|interval|significant interval) )?(?:changes?|difference)",
    ]),
    ("trig", (), [  # "no increase in effusion": the effusion is there
        r"no (?:(?:significant|substantial|appreciable|definite|interval|further|significant interval|"
        r"appreciable interval|radiographic) )?(?:increase|decrease|worsening|progression|improvement|shift|"
        r"evolution|growth|reduction|enlargement in size)",
        r"without (?:(?:significant|substantial|appreciable|interval|further) )?"
        r"(?:increase|decrease|worsening|progression|improvement|evolution|growth)",
    ]),
    # ---- stable / unchanged (uncertain for the neutral heart/mediastinum descriptors only)
    ("trig", (("stable", _F, 5), ("stable", _B, 8)), [
        "stable", "stably", "unchanged", "similar", "constant", "grossly stable", "grossly unchanged",
        "little changed", "not changed", "essentially unchanged", "essentially stable",
        *_x("stable|unchanged|similar", " in appearance"), *_x("stable|unchanged|similar", " appearance"),
    ]),
    ("trig", (("stable", _B, 8),), [
        *_x("has|have", r" not (?:significantly |substantially |appreciably )?changed"),
        r"not (?:been )?(?:significantly |substantially |appreciably )?changed",
        *_x("is|are", r" similar to (?:the )?(?:prior|previous)"),
    ]),
    # ---- pre-negation uncertainty
    ("trig", (("pre", _F, None),), [
        *_x("cannot|can not|could not|can't|may not|is not possible to|not able to|unable to|difficult to",
            r" (?:entirely |completely |definitely |totally |reliably )?(?:exclude|rule out)"),
        r"no evidence to rule out", "not excluding", "not ruling out",
    ]),
    ("trig", (("pre", _B, 10),), [
        *_x("cannot|can not|could not|can't|may not", r" be (?:entirely |completely |definitely |totally |"
            r"reliably |fully )?(?:excluded|ruled out)"),
        r"not (?:be )?(?:entirely |completely |definitely |totally |fully )?(?:excluded|ruled out)",
        r"is not (?:entirely |completely |definitely |totally |fully )?(?:excluded|ruled out)",
    ]),
    # "no new X" is uncertain (CheXpert); the "no" still negates what follows further on
    ("trig", (("pre", _F, None), ("neg", _F, None)), [
        r"no (?:(?:definite|significant|other|focal|acute|obvious|convincing|large|appreciable|clear|"
        r"definitive|gross) )?new",
        r"no new (?:areas?|foci|focus|sites?|regions?) of",
        "without new", "without any new",
    ]),
    # ---- negation, forward
    ("trig", (("neg", _F, None),), [
        "no", "without", "neither", "nor", "no evidence of", "no evidence for", "no signs? of",
        "negative for", "free of", "clear of", "clearing of", "absence of", "resolution of",
        "interval resolution of", "removal of", "interval removal of", "rule out", "to exclude", "exclude",
        "excludes", "none", "lack of", "lacks", "no longer any", "no sign of",
    ]),
    ("trig", (("neg", _F, 4),), ["not", "rather than", "instead of", "normal", "unremarkable"]),
    ("trig", (("neg", _F, 4), ("neg", _B, 8)), ["top normal", "top-normal", "high normal", "high-normal",
                                               "upper normal"]),
    ("trig", (("neg", _F, 3),), ["history of", "absent"]),
    # "no opacity to suggest pneumonia": what the absent finding would have suggested is absent too
    ("break", (("neg", _F, 6),), _x("suggest|indicate|explain|account for|support|represent", head="to ")),
    ("trig", (("neg", _F, 3), ("neg", _B, 8)), ["resolved", "removed"]),
    # ---- negation, backward
    ("trig", (("neg", _B, 8),), [
        r"not (?:definitely |clearly |convincingly |definitively |significantly |substantially |currently )?"
        r"(?:seen|identified|demonstrated|present|evident|detected|observed|noted|visible|apparent|"
        r"appreciated|appreciable|enlarged|widened|increased|dilated|shown|found|depicted|visualised)",
        r"no longer (?:clearly )?(?:seen|visualized|visualised|visible|present|evident|identified|"
        r"demonstrated|apparent|noted|appreciated|detected|appreciable)",
        "no longer", *_x("has|have", r" (?:since |now |completely |nearly )?(?:resolved|cleared|disappeared)"),
        *_x("has|have", r" been (?:removed|withdrawn|discontinued|resolved|taken out)"),
        "cleared", "disappeared", "ruled out", "excluded", "is absent", "are absent",
        *_x("is|are|was|were", r" (?:now )?(?:gone|negative)"),
        *_x(_COPULA, f" {_ADV}(?:normal|unremarkable|within normal limits|within the normal range|"
                     r"normal in (?:size|caliber|configuration|appearance|contour))"),
        *_x("appears?|appear|seems?|seem", r" to be (?:normal|unremarkable|within normal limits)"),
        "within normal limits", "within the normal range", "within normal range", "wnl",
        *_x("at|near", r" (?:the )?upper limits? of normal"), r"upper limits? of normal",
        "normal in size", "normal in caliber", "normal" + _END, "unremarkable" + _END,
        r"of normal (?:size|caliber|configuration|appearance|contours?|width)",
        r"normal (?:size|caliber|configuration|appearance|contours?|width)" + _END,
    ]),
    # ---- post-negation uncertainty, forward (hedges: they end other forward scopes)
    ("trig", (("post", _F, None),), [
        "possible", "possibly", "probable", "probably", "likely", "most likely", "more likely", "less likely",
        "presumed", "presumably", "presumptive", "questionable", "questionably", "question of", "suspect",
        "suspected", "suspicious", "suspicion of", "suspicion for",
        "cannot be determined", "perhaps", "maybe", "favor", "favored", "favoring", "favour", "favoured",
        "consider", "considered", "considering", "possibility of", "possibilities include", "equivocal",
        "indeterminate", "uncertain", "differential diagnosis", "differential",
        "correlate clinically", "clinical correlation", "correlate", "concern", "query",
        "can represent", "can reflect", "versus", "potential", "potentially",
    ]),
    # "suggesting" ends a "no new" scope but not a negation: "no new opacity suggesting pneumonia" → 0
    ("soft_pre", (("post", _F, 6),), [r"suggest\w*"]),
    ("soft", (("post", _F, 6),), [  # non-breaking: "no findings concerning for pneumonia" stays negative
        "concerning for", r"concerns? for", r"concerns? of", "worrisome for", "worrying for",
        "secondary to", "raising the possibility of", "raises the possibility of", "representing",
        "may", "might", "could", "would",
    ]),
    ("soft", (("post", _F, 3),), [r"obscur\w*"]),
    ("trig", (("post", _F, None), ("post", _B, 4)), ["borderline"]),
    ("soft", (("post", _F, 3), ("post", _B, 3)), ["if any"]),
    # ---- post-negation uncertainty, backward
    ("trig", (("post", _B, 8),), [
        *_x("is|are|was|were", r" (?:most |more |less |also |very )?(?:likely|possible|probable|suspected|"
            r"questioned|favored|favoured|considered|uncertain|equivocal|questionable|not excluded)" + _END),
        *_x("may|might|could|can", r" (?:also )?be (?:present|seen|noted|considered|possible|included)"),
        *_x("is|are", r" (?:partially |partly |largely |completely )?obscured"),
        r"poorly (?:seen|visualized|visualised|evaluated|assessed)",
        r"incompletely (?:seen|visualized|visualised|evaluated|assessed)",
        r"not (?:well|clearly|adequately|fully|optimally) (?:seen|visualized|visualised|evaluated|assessed|"
        r"appreciated|demonstrated|characterized)",
        r"not (?:visualized|visualised|evaluated|assessed)",
        *_x("cannot|can not|could not", r" be (?:evaluated|assessed|excluded with certainty)"),
        r"difficult to (?:evaluate|assess|see)", *_x("likely|possible|suspected|questionable", _END),
    ]),
    # ---- terminators
    ("term", (), ["but", "however", "although", "though", "whereas", "which", "except", "aside from",
                  "apart from", "other than", "besides", "while", "yet"]),
    ("term", (), [r"and(?= (?:there|this|these|it|its)\b)"]),
    ("term_f", (), [
        r"there (?:is|are|was|were|has been|have been|remains?)",
        r"and(?= (?:the|a|an|mild|mildly|moderate|moderately|severe|severely|small|large|"
        r"minimal|trace|stable|unchanged|persistent|new|increased|increasing|decreased|decreasing|improved|"
        r"improving|worsened|worsening|residual|chronic|slight|slightly|enlarged|significant)\b)",
        r"and(?=(?: [a-z0-9-]+){1,3}? (?:is|are|was|were|remains?|appears?|has|have|persists?|demonstrates?)\b)",
        r"(?<!consistent )(?<!compatible )(?<!associated )(?<!along )with",
    ]),
]
