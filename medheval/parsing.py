"""Answer normalisation for close-ended medical VQA: yes/no and multiple choice.

Two families of functions live here:

* the **native** parser (:func:`parse_yes_no`, :func:`parse_multiple_choice`,
  :func:`normalize_reference`, :func:`score_item`): rule-based, negation- and
  hedge-aware, deterministic. A prediction it cannot read is *unparsed* and counts
  as wrong; a reference it cannot read (label noise such as a binary answer
  ``"Abnormal"``) is flagged instead of being silently scored;
* the **upstream-compatible** scorer (:func:`upstream_yes_no`,
  :func:`upstream_split_choice`, :func:`upstream_multiple_choice_correct`), which
  reproduces MedHEval's ``eval_yesno.py`` / ``eval_multichoice.py`` per item.

Decisions worth knowing (the tests pin them):

* A leading answer word wins: ``"No, there is ..."`` is ``no`` and
  ``"Yes, the gallbladder is not normal"`` is ``yes``.
* ``"Nothing abnormal"`` / ``"None seen"`` parse as ``no`` (existential negation,
  like ``"No abnormality"``). The parser never sees the question, so for a question
  such as "Is the heart normal?" this is the wrong reading; such phrasing is rare.
* A bare ``"Normal"`` / ``"Abnormal"`` carries no yes/no by itself and is unparsed.
* Hedges (``"cannot be determined"``, ``"unclear"``, ``"not sure"``, ``"may be"``,
  ``"possibly"``, ``"the image does not specify ..."``) are unparsed, even when they
  contain a negation word, unless a leading ``yes``/``no`` commits to an answer.
* Without a leading answer word the first sentence that carries a cue decides:
  a negation cue (``no``, ``not``, ``n't``, ``without``, ``absent``, ``negative``,
  ``free of``, ``ruled out`` ...) gives ``no``; otherwise an affirmative cue (a
  copula or ``shows``/``present``/``seen``/``visible``/``evident`` ...) gives ``yes``.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from functools import lru_cache

__all__ = [
    "ItemScore",
    "YES_NO_TYPES",
    "MULTIPLE_CHOICE_TYPES",
    "canonical_answer_type",
    "split_choices",
    "parse_yes_no",
    "parse_multiple_choice",
    "normalize_reference",
    "score_item",
    "join_choices",
    "clear_caches",
    "upstream_yes_no",
    "upstream_yes_no_correct",
    "upstream_split_choice",
    "upstream_multiple_choice_correct",
]

_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"

#: Accepted spellings of the two close-ended answer types (schema names first).
YES_NO_TYPES = frozenset({"yes_no", "binary", "yes/no", "yesno", "closed"})
MULTIPLE_CHOICE_TYPES = frozenset({"multiple_choice", "multi-choice", "multi_choice", "mc", "choice"})


def canonical_answer_type(answer_type: str) -> str:
    """Map an answer-type spelling to ``"yes_no"`` or ``"multiple_choice"``; ``ValueError`` otherwise."""
    if answer_type == "yes_no" or answer_type == "multiple_choice":
        return answer_type
    key = (answer_type or "").strip().lower()
    if key in YES_NO_TYPES:
        return "yes_no"
    if key in MULTIPLE_CHOICE_TYPES:
        return "multiple_choice"
    raise ValueError(
        f"answer_type {answer_type!r} is not close-ended (expected 'yes_no' or 'multiple_choice')"
    )


# ---------------------------------------------------------------------------
# Choices
# ---------------------------------------------------------------------------

# A letter marker: optional "(", a capital, then ".", ":", ")" or "," followed by
# whitespace or the end of the string.
_MARKER = re.compile(r"\(?([A-Z])([.:),])(?=\s|$)")
_STRICT_BEFORE = re.compile(r"(?:[,;]|\n|[,;]?\s+(?:or|and))\s*$", re.I)
_BARE_LETTERS = re.compile(r"\s*[A-Z](?:\s*[,;/]\s*[A-Z])*\s*[.]?\s*")
_TRAILING_CONJ = re.compile(r"[\s,;]+(?:or|and)$", re.I)
_LIST_PREFIX = re.compile(r"^\s*\(?([A-Z])\s*[.:),]\s*")


def _clean_option(text: str) -> str:
    text = text.strip(" \t\r\n,;").rstrip(" .")
    prev = None
    while prev != text:
        prev = text
        text = _TRAILING_CONJ.sub("", text).strip(" \t\r\n,;").rstrip(" .")
    return text


def _marker_positions(s: str, strict: bool) -> list[re.Match]:
    """Accepted letter markers of ``s``, in sequence A, B, C ... (see :func:`split_choices`)."""
    accepted: list[re.Match] = []
    expected = 0
    comma_ok = False
    for m in _MARKER.finditer(s):
        letter, punct = m.group(1), m.group(2)
        if _LETTERS.index(letter) != expected:
            continue
        start = m.start()
        if start:
            before = s[:start]
            if strict:
                if not _STRICT_BEFORE.search(before):
                    continue
            elif not (before[-1].isspace() or before[-1] in ",;/"):
                continue
        if punct == ",":
            # "A, Stent; B, CHF" style: only when the A marker itself used a comma.
            if expected == 0:
                comma_ok = True
            elif not comma_ok:
                continue
        accepted.append(m)
        expected += 1
    return accepted


def _split_marked(s: str) -> list[str] | None:
    strict = _marker_positions(s, True)
    loose = _marker_positions(s, False)
    # The strict pass (markers after a separator) wins unless the loose pass finds more.
    marks = loose if len(loose) > len(strict) else strict
    if not marks:
        return None
    return [
        _clean_option(s[m.end() : (marks[i + 1].start() if i + 1 < len(marks) else len(s))])
        for i, m in enumerate(marks)
    ]


@lru_cache(maxsize=8192)
def _split_choices_str(raw: str) -> tuple[str, ...]:
    s = raw.strip()
    if not s:
        return ()
    if _BARE_LETTERS.fullmatch(s):
        letters = re.findall(r"[A-Z]", s)
        if letters == list(_LETTERS[: len(letters)]):
            return tuple(letters)
    marked = _split_marked(s)
    if marked is not None:
        return tuple(marked)
    # No letters at all: one option per line, else per ";", else per ",".
    for sep in ("\n", ";", ","):
        if sep in s:
            return tuple(p for p in (_clean_option(x) for x in s.split(sep)) if p)
    return (_clean_option(s),)


def split_choices(raw: str | list | tuple | None) -> list[str]:
    """Parse an upstream choices string (or list) into option texts without their letters.

    Handles ``"A. x, B. y"``, ``"A: x, B: y"``, ``"A) x, B) y"``, ``"(A) x (B) y"`` and
    ``"A, x; B, y"``. Markers must run A, B, C ... in order and follow the start of
    the string, a ``,``/``;`` separator or a newline (a second, looser pass accepts
    any whitespace), so commas and letters inside option text (``"Vitamin B. deficiency"``)
    do not split. Content-free bare letters (``"A, B, C, D"``, SLAKE label noise)
    come back as ``["A", "B", "C", "D"]``. A list has its letter prefixes removed
    where they run in order. ``""``/``None`` give ``[]``.
    """
    if raw is None:
        return []
    if isinstance(raw, str):
        return list(_split_choices_str(raw))
    out: list[str] = []
    for i, item in enumerate(raw):
        text = "" if item is None else str(item).strip()
        m = _LIST_PREFIX.match(text)
        if m and m.group(1) == _LETTERS[i % 26] and m.end() < len(text):
            text = text[m.end() :].strip()
        out.append(text)
    return out


def join_choices(choices: list[str]) -> str:
    """Rebuild an upstream-style choices string ``"A. x, B. y"`` from option texts."""
    return ", ".join(f"{_LETTERS[i]}. {c}" for i, c in enumerate(choices))


# ---------------------------------------------------------------------------
# Shared text normalisation
# ---------------------------------------------------------------------------

_QUOTES = str.maketrans({"\u2019": "'", "\u2018": "'", "\u201c": '"', "\u201d": '"', "\u2013": "-", "\u2014": "-"})
_LEAD_JUNK = re.compile(r"^[\s*\"'`>#_\-\u2022:]+")
_ANSWER_PREFIX = re.compile(
    r"^(?:(?:the\s+)?(?:final\s+|correct\s+|short\s+|best\s+)?answer(?:\s+is)?\s*[:\-]?\s*"
    r"|(?:assistant|response|output)\s*:\s*)",
    re.I,
)


def _clean_text(text: str) -> str:
    """Strip markdown, quotes and an ``Answer:``-style prefix."""
    t = text if text.isascii() else text.translate(_QUOTES)
    t = _LEAD_JUNK.sub("", t)
    t2 = _ANSWER_PREFIX.sub("", t, count=1)
    if t2 != t:
        t = _LEAD_JUNK.sub("", t2)
    return t.strip()


# ---------------------------------------------------------------------------
# Yes / no
# ---------------------------------------------------------------------------

_YN_FAST = {"yes": "yes", "no": "no", "y": "yes", "n": "no"}
_SENTENCE_SPLIT = re.compile(r"(?<!\d)[.!?;\n]+|[.!?;\n]+(?!\d)")
_LEAD_HEDGE = re.compile(
    r"^(?:not\s+(?:sure|possible|able|enough|clear|certain|known|determinable|specified|provided|available|applicable|mentioned)"
    r"|unsure|unclear|uncertain|unknown|indeterminate|inconclusive|equivocal|undetermined|maybe|perhaps|possibly"
    r"|no\s+(?:idea|information|info\b|data\b|way\s+to|answer|comment|definitive|conclusive)"
    r"|(?:nothing|none)\s+can\s+be|n/?a\b|impossible|difficult\s+to|hard\s+to"
    r"|i\s+(?:do\s*n[o']t|cannot|can't|am\s+not|'m\s+not|m\s+not)|insufficient|information\s+(?:is\s+)?not"
    r"|it\s+depends|hard\s+to\s+say|difficult\s+to\s+say)",
)
_LEAD_YES = re.compile(r"^(?:yes|yeah|yep|yup|affirmative|correct|true|positive|present)\b")
_LEAD_NO = re.compile(r"^(?:no|nope|nah|negative|incorrect|false|absent|none|nothing|neither)\b")
_HEDGE = re.compile(
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
_NEG = re.compile(
    r"\b(?:no|not|none|nothing|neither|nor|without|absent|absence|negative|never|cannot)\b|n't\b"
    r"|\bfree\s+of\b|\brul(?:ed|es)\s+out\b|\black(?:s|ing)?\b|\bexclud(?:es|ed)\b"
)
_AFFIRM = re.compile(
    r"\b(?:yes|is|are|was|were|there's|shows?|showing|shown|demonstrat\w*|reveal\w*|presen(?:t|ce)|positive"
    r"|seen|visible|evident|noted|observed|identified|detected|appears?|consistent\s+with|indicat\w*"
    r"|suggest\w*|has|have|contains?|exists?|correct|true|confirm\w*)\b"
)


@lru_cache(maxsize=65536)
def parse_yes_no(text: str) -> str | None:
    """Read a free-text answer to a yes/no question: ``"yes"``, ``"no"`` or ``None``.

    ``None`` means unparsed (empty, a hedge, or no cue at all). See the module
    docstring for the rules.
    """
    if not text:
        return None
    low = _clean_text(text).lower()
    if not low:
        return None
    fast = _YN_FAST.get(low.rstrip(" .!,"))
    if fast is not None:
        return fast
    if _LEAD_HEDGE.match(low):
        return None
    if _LEAD_YES.match(low):
        return "yes"
    if _LEAD_NO.match(low):
        return "no"
    for sentence in _SENTENCE_SPLIT.split(low)[:4]:
        if not sentence.strip():
            continue
        if _HEDGE.search(sentence):
            return None
        if _NEG.search(sentence):
            return "no"
        if _AFFIRM.search(sentence):
            return "yes"
    return None


# ---------------------------------------------------------------------------
# Multiple choice
# ---------------------------------------------------------------------------

_NON_WORD = re.compile(r"[\W_]+")
_ARTICLE_WORDS = frozenset({"a", "an", "the"})
_WHOLE_LETTER = re.compile(r"^\(?\s*([A-Za-z])\s*\)?\s*[.:)]?$")
_LEAD_LETTER = re.compile(r"^(?:\(([A-Z])\)|([A-Z])\s*[.:)]|([A-Z]),|([A-Z])\s+-)(?=\s|$)")
_EXPLICIT_LETTER = re.compile(
    r"\b(?:answer|option|choice)\b(?:\s+(?:is|would\s+be|will\s+be|should\s+be))?\s*[:\-]?\s*"
    r"(?:option\s+|choice\s+)?\(?([A-Za-z])(?![A-Za-z0-9])\)?",
    re.I,
)
_PAREN_LETTER = re.compile(r"\(([A-Z])\)")
_AFTER_LOWER = re.compile(r"\s*(?:[.,;:!)]|$)")
_AFTER_ARTICLE = re.compile(r"\s+[a-z]")
_SHORT_LETTER = re.compile(r"(?<![A-Za-z'])([B-H])(?![A-Za-z'\-])")


@lru_cache(maxsize=65536)
def _norm(text: str) -> str:
    """Lower case, punctuation to spaces, articles dropped, spaces collapsed."""
    if not text.isascii():
        text = text.translate(_QUOTES)
    return " ".join(w for w in _NON_WORD.sub(" ", text.lower()).split() if w not in _ARTICLE_WORDS)


def _letter_index(letter: str, n: int) -> int | None:
    i = _LETTERS.find(letter.upper())
    return i if 0 <= i < n else None


def _find_letter(t: str, n: int) -> int | None:
    """Letter stage of :func:`parse_multiple_choice` on cleaned text ``t``."""
    m = _WHOLE_LETTER.match(t)
    if m:
        return _letter_index(m.group(1), n)
    m = _LEAD_LETTER.match(t)
    if m:
        idx = _letter_index(next(g for g in m.groups() if g), n)
        if idx is not None:
            return idx
    found: set[int] = set()
    for m in _EXPLICIT_LETTER.finditer(t):
        letter = m.group(1)
        after = t[m.end() :]
        if letter.islower():
            if not _AFTER_LOWER.match(after):
                continue
        elif letter in "AI" and _AFTER_ARTICLE.match(after):
            continue  # "The answer is A large effusion": an article, not a letter.
        idx = _letter_index(letter, n)
        if idx is not None:
            found.add(idx)
    if len(found) == 1:
        return found.pop()
    if found:
        return None
    paren = {i for i in (_letter_index(x, n) for x in _PAREN_LETTER.findall(t)) if i is not None}
    if len(paren) == 1:
        return paren.pop()
    return None


def _find_short_letter(t: str, n: int) -> int | None:
    """Last resort for short answers such as ``"B is correct"`` (B..H only: A and I are words)."""
    if len(t.split()) > 5:
        return None
    short = {i for i in (_letter_index(x, n) for x in _SHORT_LETTER.findall(t)) if i is not None}
    return short.pop() if len(short) == 1 else None


@lru_cache(maxsize=8192)
def _norm_options(choices: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(_norm(c) for c in choices)


def _match_text(norm_text: str, options: tuple[str, ...], threshold: float) -> int | None:
    """Text stage: exact, contained (longest wins), containing, fuzzy, then fuzzy per word window."""
    if not norm_text:
        return None
    for i, o in enumerate(options):
        if o and o == norm_text:
            return i
    padded = f" {norm_text} "
    hits = [i for i, o in enumerate(options) if o and f" {o} " in padded]
    if hits:
        if len(hits) > 1:
            hits = [
                i for i in hits
                if not any(j != i and options[i] != options[j] and f" {options[i]} " in f" {options[j]} " for j in hits)
            ]
            if len({options[i] for i in hits}) > 1:
                return None
        return hits[0]
    within = [i for i, o in enumerate(options) if o and padded in f" {o} "]
    if within:
        return within[0] if len({options[i] for i in within}) == 1 else None
    idx = _fuzzy(norm_text, options, threshold)
    if idx is not None or idx is _TIE:
        return None if idx is _TIE else idx
    # A misspelt option inside a sentence ("I think it is Pneumonai"): compare each option
    # with the windows of the text that have as many words as it does, more strictly.
    words = norm_text.split()
    if len(words) < 2 or len(words) > _MAX_WINDOW_WORDS:
        return None
    best, best_i, tie = 0.0, None, False
    win_threshold = max(threshold, _WINDOW_THRESHOLD)
    matcher = difflib.SequenceMatcher(None, "", "", autojunk=False)
    for i, o in enumerate(options):
        if not o:
            continue
        k = o.count(" ") + 1
        if k >= len(words):
            continue
        matcher.set_seq2(o)
        for start in range(len(words) - k + 1):
            matcher.set_seq1(" ".join(words[start : start + k]))
            if matcher.real_quick_ratio() < win_threshold or matcher.quick_ratio() < win_threshold:
                continue
            r = matcher.ratio()
            if r > best:
                best, best_i, tie = r, i, False
            elif r == best and best_i is not None and options[best_i] != o:
                tie = True
    if best_i is None or best < win_threshold or tie:
        return None
    return best_i


_TIE = -1
_MAX_WINDOW_WORDS = 40
_WINDOW_THRESHOLD = 0.75


def _fuzzy(norm_text: str, options: tuple[str, ...], threshold: float) -> int | None:
    """Best option by ``difflib`` ratio at or above ``threshold``; ``_TIE`` when two differ and tie."""
    matcher = difflib.SequenceMatcher(None, "", norm_text, autojunk=False)
    best, best_i, tie = 0.0, None, False
    for i, o in enumerate(options):
        if not o:
            continue
        matcher.set_seq1(o)
        if matcher.real_quick_ratio() < threshold or matcher.quick_ratio() < threshold:
            continue
        r = matcher.ratio()
        if r > best:
            best, best_i, tie = r, i, False
        elif r == best and best_i is not None and options[best_i] != o:
            tie = True
    if best_i is None or best < threshold:
        return None
    return _TIE if tie else best_i


@lru_cache(maxsize=65536)
def _parse_mc_cached(text: str, choices: tuple[str, ...], threshold: float) -> int | None:
    t = _clean_text(text)
    if not t or not choices:
        return None
    idx = _find_letter(t, len(choices))
    if idx is not None:
        return idx
    idx = _match_text(_norm(t), _norm_options(choices), threshold)
    if idx is not None:
        return idx
    return _find_short_letter(t, len(choices))


def parse_multiple_choice(text: str, choices: list[str], threshold: float = 0.6) -> int | None:
    """Index of the option ``text`` picks, or ``None`` (nothing found, or ambiguous).

    Letters first (``"B"``, ``"(B)"``, ``"B."``, ``"B)"``, ``"Option B"``,
    ``"The answer is B"``; a lowercase letter only in an explicit ``"answer: b"``
    form or alone), then option text after normalisation (case, punctuation,
    articles): exact, contained (the longest contained option wins when one contains
    the other; two unrelated options is ambiguous), text contained in exactly one
    option, and finally the best ``difflib`` ratio at or above ``threshold``.
    """
    if not text:
        return None
    if isinstance(choices, str):
        choices = split_choices(choices)
    return _parse_mc_cached(text, tuple(choices or ()), float(threshold))


# ---------------------------------------------------------------------------
# References and per-item scoring
# ---------------------------------------------------------------------------

_REF_LETTER = re.compile(r"^\(?([A-Z])\)?\s*(?:[.:),]\s*(.*))?$", re.S)


@lru_cache(maxsize=65536)
def _normalize_mc_reference(answer: str, choices: tuple[str, ...]) -> int | None:
    s = answer.strip()
    if not s or not choices:
        return None
    n = len(choices)
    # Several lettered options in one reference ("A) x, B) y") is not a single answer.
    letters = {x for x, _ in _MARKER.findall(s) if _letter_index(x, n) is not None}
    if len(letters) >= 2 and (
        len(_marker_positions(s, strict=True)) >= 2 or _norm(s) not in _norm_options(choices)
    ):
        return None
    opts = _norm_options(choices)
    m = _REF_LETTER.match(s)
    if m:
        idx = _letter_index(m.group(1), n)
        if idx is not None:
            rest = _norm(m.group(2) or "")
            if rest and rest != opts[idx]:
                # "B. Chest" with A = "Chest": the letter and the text disagree (label noise).
                other = _match_text(rest, opts, 0.8)
                if other is not None and opts[other] != opts[idx]:
                    return None
            return idx
    return _match_text(_norm(s), opts, 0.8)


def normalize_reference(answer: str, answer_type: str, choices: list[str] | None = None) -> str | int | None:
    """The reference as ``"yes"``/``"no"`` or an option index; ``None`` when unusable.

    ``"B. Pneumonia"``, ``"B"`` and ``"Pneumonia"`` all give ``1`` for choices
    ``["Pleural effusion", "Pneumonia", ...]``. Unusable references (label noise:
    a binary ``"Abnormal"``, ``"Unclear"``, a multi-answer ``"A) x, B) y"``, text
    that matches no option) give ``None``.
    """
    kind = canonical_answer_type(answer_type)
    if answer is None:
        return None
    if kind == "yes_no":
        return parse_yes_no(answer)
    if isinstance(choices, str):
        choices = split_choices(choices)
    return _normalize_mc_reference(answer, tuple(choices or ()))


@dataclass(frozen=True, slots=True)
class ItemScore:
    """The score of one close-ended item."""

    correct: bool
    parsed: bool
    reference_ok: bool
    parsed_prediction: str | int | None


def score_item(
    prediction: str,
    reference: str,
    answer_type: str,
    choices: list[str] | str | None = None,
    threshold: float = 0.6,
) -> ItemScore:
    """Score one item. Unparsed predictions and unusable references count as wrong."""
    kind = canonical_answer_type(answer_type)
    prediction = prediction or ""
    if kind == "yes_no":
        ref = parse_yes_no(reference) if reference else None
        pred = parse_yes_no(prediction)
    else:
        if isinstance(choices, str):
            choices = split_choices(choices)
        opts = tuple(choices or ())
        ref = _normalize_mc_reference(reference, opts) if reference else None
        pred = _parse_mc_cached(prediction, opts, float(threshold)) if prediction else None
    return ItemScore(
        correct=ref is not None and pred == ref,
        parsed=pred is not None,
        reference_ok=ref is not None,
        parsed_prediction=pred,
    )


# ---------------------------------------------------------------------------
# Upstream MedHEval compatibility
# ---------------------------------------------------------------------------

_UPSTREAM_SPLIT = re.compile(r"(?<!\w)([A-Z][:.])|([A-Z]\))")


def upstream_yes_no(text: str) -> int:
    """MedHEval's yes/no rule: ``1`` yes, ``0`` no, ``-1`` for an empty answer.

    Keep the text before the first ``.``, drop ``,``, split on single spaces; the
    exact (case-sensitive) tokens ``No``, ``not`` or ``no`` mean no, anything else
    yes. So ``"Abnormal"`` is 1, ``"Not sure."`` is 1 (``Not`` is not a listed
    token) and ``"I am not sure."`` is 0. Upstream's empty-answer handling depends
    on a stale loop variable; here an empty answer is ``-1``, which never equals a
    label and so scores wrong.
    """
    if text is None or not text.strip():
        return -1
    if "." in text:
        text = text.split(".")[0]
    words = text.replace(",", "").split(" ")
    return 0 if ("No" in words or "not" in words or "no" in words) else 1


def _upstream_label(reference: str) -> int:
    # Labels go through the same rule without the empty check (an empty label is 1).
    text = reference or ""
    if "." in text:
        text = text.split(".")[0]
    words = text.replace(",", "").split(" ")
    return 0 if ("No" in words or "not" in words or "no" in words) else 1


def upstream_yes_no_correct(prediction: str, reference: str) -> bool:
    """One yes/no item scored as MedHEval does: the two token-rule values are equal."""
    return upstream_yes_no(prediction) == _upstream_label(reference)


def upstream_split_choice(raw_choices: str) -> list[str]:
    """MedHEval's ``split_choice``: pieces of ``raw_choices`` that keep their letter prefix."""
    pieces: list[str] = []
    previous = 0
    for m in _UPSTREAM_SPLIT.finditer(raw_choices):
        start = m.start()
        if previous < start:
            pieces.append(raw_choices[previous:start].strip(", "))
        previous = start
    pieces.append(raw_choices[previous:].strip(", "))
    return pieces


@lru_cache(maxsize=8192)
def _upstream_options(raw_choices: str) -> tuple[str, ...] | None:
    """``option_A`` ... list as ``eval_mc`` builds it; ``None`` when upstream skips the item."""
    slots: dict[str, str] = {}
    for piece in upstream_split_choice(raw_choices):
        if piece and piece[0] in "ABCDEF":
            slots[piece[0]] = piece
    if "B" not in slots or "A" not in slots:  # no option_A would crash upstream; treat as skipped
        return None
    out = [slots["A"], slots["B"]]
    for letter in "CDEF":
        if letter not in slots:
            break
        out.append(slots[letter])
    return tuple(out)


def _upstream_most_similar(options: tuple[str, ...], target: str) -> int | None:
    best_i, best = None, 0.0
    for i, o in enumerate(options):
        r = difflib.SequenceMatcher(None, o, target).ratio()
        if r > best:
            best_i, best = i, r
    return best_i


@lru_cache(maxsize=65536)
def _upstream_label_index(reference: str, raw_choices: str) -> int | None:
    options = _upstream_options(raw_choices)
    return None if options is None else _upstream_most_similar(options, reference)


def upstream_multiple_choice_correct(prediction: str, reference: str, raw_choices: str) -> bool | None:
    """MedHEval's ``eval_mc`` for one item; ``None`` when upstream skips it (no ``option_B``).

    Prediction and reference are both mapped to the option (letter prefix kept)
    with the highest ``difflib.SequenceMatcher(None, option, text).ratio()``,
    first strictly-higher wins, all-zero gives no index; correct when the two
    indices are equal (so two ``None`` indices count as correct, as upstream).
    A letter-only reference is fuzzy-matched as is (upstream's expansion of it is
    dead code behind a misspelled key).
    """
    options = _upstream_options(raw_choices or "")
    if options is None:
        return None
    return _upstream_most_similar(options, prediction or "") == _upstream_label_index(reference or "", raw_choices)


def clear_caches() -> None:
    """Empty the memo caches (for benchmarks and long-running processes)."""
    for fn in (
        _split_choices_str, parse_yes_no, _norm, _norm_options, _parse_mc_cached,
        _normalize_mc_reference, _upstream_options, _upstream_label_index,
    ):
        fn.cache_clear()


# --- generated-text cleaning shared by the open-ended metrics -------------------------------------

_ROLE_PREFIX = re.compile(r"^\s*assistant\s*:\s*", re.IGNORECASE)
UPSTREAM_SHORT_REPORT = "No report generated."
_UPSTREAM_MIN_REPORT_CHARS = 10


def clean_generated_text(text: str | None, upstream_compat: bool = False, report_csv: bool = False) -> str:
    """A generated answer as the open-ended metrics score it.

    Native: trim white space and drop a leading ``"Assistant:"`` role prefix. With
    ``upstream_compat``, MedHEval's ``text.strip("Assistant:")``, which strips any of the
    characters ``A s i t a n :`` from both ends (``"... effusion"`` -> ``"... effusio"``); with
    ``report_csv`` as well, its report CSV conversion: texts under 10 characters become
    ``"No report generated."`` (CheXbert, RadGraph).
    """
    text = "" if text is None else str(text)
    if not upstream_compat:
        return _ROLE_PREFIX.sub("", text).strip()
    text = text.strip("Assistant:")  # deliberately the upstream character-set strip
    if report_csv and len(text) < _UPSTREAM_MIN_REPORT_CHARS:
        return UPSTREAM_SHORT_REPORT
    return text
