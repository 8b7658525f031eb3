"""Answer normalisation for close-ended medical VQA: yes/no and multiple choice.

Two families of functions live here:

* the **native** parser (:func:`parse_yes_no`, :func:`parse_multiple_choice`,
  :func:`normalize_reference`, :func:`score_item`): rule-based, negation- and
  hedge-aware, deterministic. A prediction it cannot read is *unparsed* and counts
  as wrong; a reference it cannot read (label noise such as a binary answer
  ``"Abnormal"``) is flagged instead of being silently scored;
* the **upstream-compatible** scorer (:func:`upstream_yes_no`, :func:`upstream_yes_no_group`,
  :func:`upstream_group_breaks`, :func:`upstream_split_choice`,
  :func:`upstream_multiple_choice_correct`, :func:`upstream_group_accuracy`), which
  reproduces MedHEval's ``eval_yesno.py`` / ``eval_multichoice.py`` / ``type1_utils.py``
  per item and per group, bugs included (empty answers read as yes, a group whose last
  answer is blank scored 0, skipped multiple-choice items weighted in the means).

Decisions worth knowing (the tests pin them):

* A leading answer word wins: ``"No, there is ..."`` is ``no`` and
  ``"Yes, the gallbladder is not normal"`` is ``yes``.
* ``"Nothing abnormal"`` / ``"None seen"`` parse as ``no`` (existential negation,
  like ``"No abnormality"``), whatever the question: for "Is the heart normal?" this is
  the wrong reading; such phrasing is rare. (With the question, a leading "no" that is a
  determiner, ``"No pneumothorax, but ..."``, leaves the decision to the clauses.)
* A bare ``"Normal"`` / ``"Abnormal"`` carries no yes/no by itself and is unparsed.
* Hedges (``"cannot be determined"``, ``"unclear"``, ``"not sure"``, ``"may be"``,
  ``"possibly"``, ``"the image does not specify ..."``) are unparsed, even when they
  contain a negation word, unless a leading ``yes``/``no`` commits to an answer.
* Without a leading answer word the first of the first four sentences that decides wins.
  A hedge in it makes the answer unparsed. Without the question, a negation cue (``no``,
  ``not``, ``n't``, ``without``, ``absent``, ``negative``, ``unlikely``, ``free of``,
  ``ruled out`` ...) gives ``no`` and an explicit assertion (``there is``, ``shows``,
  ``present``, ``seen``, ``visible``, ``evident``, ``consistent with`` ...) gives ``yes``; a bare
  copula does not: ``"The lungs are clear."`` and ``"It is a CT scan."`` are unparsed.
* With the question (``parse_yes_no(answer, question)``, what the metric does when it gets
  ``questions``), such a sentence decides only where it affirms or denies the question's
  finding: a clause that names the finding's key word (the question's last content word, and
  the last one before a location phrase) is ``no`` when negated before it or by a verb negation
  after it ("No effusion is seen", "The effusion is not visible"), ``yes`` when it names at
  least half of the question's content words without contradicting it (left/right,
  small/large, normal/enlarged ...). An elliptical sentence ("It is not seen.", "It is.")
  answers by its polarity. Anything else is unparsed: for "Is there a pleural effusion?",
  ``"The lungs are clear."`` is unparsed.
* Multiple choice: an answer naming two option letters (``"A or B"``, ``"A/B"``, ``"A and B"``)
  is unparsed, and so is one that negates the option it names (``"Not B"``, ``"It is not
  pneumonia"``). A lone lower-case reference letter (``"b"``) reads as ``"B"``.
"""

from __future__ import annotations

import difflib
import inspect
import re
from dataclasses import dataclass
from functools import lru_cache, wraps
from typing import Any, Callable, NamedTuple, TypeVar

from medheval.scoring.text_cues import (
    ANSWER_SENTENCES,
    ASSERTION,
    HEDGE,
    LEAD_HEDGE,
    LEAD_NO,
    LEAD_YES,
    NEGATION,
    NEUTRAL_VERB,
    POST_NEGATION,
    split_sentences,
)

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
    "upstream_yes_no_group",
    "upstream_group_breaks",
    "upstream_group_accuracy",
    "upstream_split_choice",
    "upstream_multiple_choice_correct",
]

_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"

#: A text longer than this is not memoised (see :func:`_memo`).
MEMO_MAX_CHARS = 1_000
_F = TypeVar("_F", bound=Callable[..., Any])


def _memo(maxsize: int) -> Callable[[_F], _F]:
    """``lru_cache(maxsize)``, except for calls whose first argument (the text read) is a string of more than
    :data:`MEMO_MAX_CHARS` characters (a degenerate answer, which does not repeat): those are read each time.
    With the plain cache a run of such answers kept every one: 65,536 of 100,000 characters are gigabytes."""

    def decorate(function: _F) -> _F:
        cached = lru_cache(maxsize=maxsize)(function)

        def call(text: Any, *args: Any, **kwargs: Any) -> Any:
            if isinstance(text, str) and len(text) > MEMO_MAX_CHARS:
                return function(text, *args, **kwargs)
            return cached(text, *args, **kwargs)

        def call_one(text: Any) -> Any:  # the hot one-argument functions (_stem, _norm) without argument packing
            return function(text) if isinstance(text, str) and len(text) > MEMO_MAX_CHARS else cached(text)

        memoised = wraps(function)(call_one if len(inspect.signature(function).parameters) == 1 else call)
        memoised.cache_clear = cached.cache_clear  # type: ignore[attr-defined]
        memoised.cache_info = cached.cache_info  # type: ignore[attr-defined]
        return memoised  # type: ignore[return-value]

    return decorate


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
# Fullmatched against a stripped string: "A, B, C, D" or "A/B." (no leading/trailing whitespace to match).
_BARE_LETTERS = re.compile(r"[A-Z](?:\s*[,;/]\s*[A-Z])*(?:\s*\.)?")
_TRAILING_CONJ = re.compile(r"[\s,;](?:or|and)\Z", re.I)
_LIST_PREFIX = re.compile(r"^\s*\(?([A-Z])\s*[.:),]\s*")
STRICT_WINDOW = 5  # the most characters _STRICT_BEFORE is run on: " and" plus one whitespace character


def _strict_window(s: str, start: int) -> str:
    """The end of ``s[:start]`` that decides whether ``_STRICT_BEFORE`` matches it, at most
    :data:`STRICT_WINDOW` characters: the four characters before the trailing whitespace run, then a newline
    when that run holds one, else its first character. The regex on the whole prefix backtracks over every
    whitespace run (quadratic in a long one); on this window it gives the same answer in constant time."""
    end = start
    while end > 0 and s[end - 1].isspace():  # the same characters as the regex's \s and str.strip()
        end -= 1
    tail = "\n" if "\n" in s[end:start] else s[end:end + 1] if end < start else ""
    return s[max(0, end - 4):end] + tail


def _drop_trailing_conj(text: str) -> str:
    """``text`` without a trailing ``or``/``and`` and the run of whitespace, ``,`` and ``;`` before it (what
    ``[\\s,;]+(?:or|and)$`` removed), found from the end: the regex retried every position of a long run."""
    if not _TRAILING_CONJ.search(text[-4:]):
        return text
    end = len(text) - (2 if text[-2:].lower() == "or" else 3)
    while end > 0 and (text[end - 1].isspace() or text[end - 1] in ",;"):
        end -= 1
    return text[:end]


def _clean_option(text: str) -> str:
    text = text.strip(" \t\r\n,;").rstrip(" .")
    prev = None
    while prev != text:
        prev = text
        text = _drop_trailing_conj(text).strip(" \t\r\n,;").rstrip(" .")
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
            if strict:
                if not _STRICT_BEFORE.search(_strict_window(s, start)):
                    continue
            elif not (s[start - 1].isspace() or s[start - 1] in ",;/"):
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


@_memo(maxsize=8192)
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
_WORD = re.compile(r"[a-z0-9]+")
# Clauses of an answer sentence: a question's finding is judged in the clause that names it.
# A comma starts a new clause only before a word that opens a new statement ("..., a small effusion
# is seen"), not around a parenthetical ("the heart, as depicted in the image, ...").
_CLAUSE_SPLIT = re.compile(
    r";|:|\b(?:but|however|although|though|whereas|while|yet)\b"
    r"|,\s*(?=(?:there|a|an|the|mild|mildly|small|large|moderate|severe|trace|minimal)\b)")
_CLAUSE_PIECES = re.compile(r"[,;:]")

# Words of a question that do not name its finding: function words, question verbs, generic
# words about the image, the patient or the evidence.
_QUESTION_STOP = frozenset(
    "a an the this that these those it its they them their there here you we i me my our is are was were be been "
    "being am does do did done can could would should will shall may might must has have had having of in on at "
    "to for with from by as and or nor not any some all each every other another what which where when why how "
    "who whom whose if whether than then so such into onto about based according given considering regarding "
    "image images picture pictures photo scan scans film view views radiograph radiographs x ray rays xray "
    "chest study exam examination patient patients s show shows shown showing visible visualized seen see "
    "present presence evidence evident sign signs suggest suggests suggestive suggesting indicate indicates "
    "indicative identify identified detect detected noted observed finding findings appear appears appearing "
    "demonstrate demonstrates reveal reveals depict depicts contain contains exist exists noticeable apparent "
    "likely possible possibility probably due related associated size".split()
)
# Words that end the finding's core phrase ("pneumothorax in the lungs": the core is "pneumothorax").
_LOCATION_WORDS = frozenset("in on within at inside near located along above below between into".split())
# Words an elliptical answer consists of ("It is not seen.", "Not visible.", "There is.").
_ELLIPTICAL = _QUESTION_STOP | frozenset(
    "no none nothing neither never without absent negative positive yes yeah correct true false n t isn "
    "aren wasn weren doesn don didn cannot clearly definitely definitively certainly really".split()
)
# (one side, other side): a clause naming only the other side of what the question asks is no affirmation.
_CONFLICTS = (
    (frozenset({"left"}), frozenset({"right"})),
    (frozenset({"small", "smaller", "tiny", "minimal", "mild"}), frozenset({"large", "larger", "massive", "severe"})),
    (frozenset({"upper"}), frozenset({"lower"})),
    (frozenset({"anterior"}), frozenset({"posterior"})),
    (frozenset({"increased", "increase"}), frozenset({"decreased", "decrease", "reduced"})),
    (frozenset({"normal", "normally", "unremarkable"}),
     frozenset({"abnormal", "enlarged", "enlargement", "increased", "widened", "dilated", "abnormality",
                "abnormalities"})),
)
_COVERAGE = 0.5
# "no" followed by a word: a determiner ("no effusion"), not the answer "No, ..." / "No."
_DETERMINER_NO = re.compile(r"^no\s+(?=[a-z])")
# Words of a global negation ("no acute abnormality", "no significant findings").
_GLOBAL_WORDS = frozenset(
    "abnormal abnormality abnormalities acute significant pathology pathological findings finding disease "
    "process issues issue problems problem concerning remarkable cardiopulmonary intrathoracic cardiothoracic "
    "thoracic".split())


class _Finding(NamedTuple):
    """What a yes/no question asks about: its content words and the ones an answer must name
    (as stems, see :func:`_stem`)."""

    terms: tuple[str, ...]
    keys: frozenset[str]


@_memo(maxsize=65536)
def _stem(word: str) -> str:
    """Crude stemming: a plural ending off, then the first five letters (effusion/effusions,
    enlarged/enlargement, mass/masses, lung/lungs)."""
    if len(word) > 4 and word.endswith("es") and word[-3] in "sxz":
        word = word[:-2]
    elif len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
        word = word[:-1]
    return word[:5]


@_memo(maxsize=8192)
def _question_finding(question: str) -> _Finding | None:
    """The finding a yes/no question asks about, from its last clause that has content words.

    ``terms``: the clause's content words. ``keys``: its last content word, and the last one before
    a location phrase ("Is there evidence of pneumothorax in the lungs?": pneumothorax and lungs;
    "in the image" is no location phrase).
    ``None`` when the question has no content word.
    """
    low = _clean_text(question).lower() if question else ""
    for piece in reversed(_CLAUSE_PIECES.split(low)):
        words = _WORD.findall(piece)
        content = [w for w in words if w not in _QUESTION_STOP]
        if not content:
            continue
        keys = [content[-1]]
        core: list[str] = []
        for j, w in enumerate(words):
            # a location phrase with content ("in the lungs", not "in the image") ends the core
            if w in _LOCATION_WORDS and core and any(x not in _QUESTION_STOP for x in words[j + 1 : j + 4]):
                break
            if w not in _QUESTION_STOP:
                core.append(w)
        if core:
            keys.append(core[-1])
        return _Finding(tuple(content), frozenset(_stem(k) for k in keys))
    return None


def _conflicts(finding: _Finding, words: list[str]) -> bool:
    asked, said = set(finding.terms), set(words)
    for one, other in _CONFLICTS:
        for mine, theirs in ((one, other), (other, one)):
            if asked & mine and not asked & theirs and said & theirs and not said & mine:
                return True
    return False


def _clause_verdict(clause: str, finding: _Finding) -> str | None:
    """``"yes"``/``"no"`` when the clause names the question's finding and asserts or denies it.

    Denied: a negation before the finding's key word, or a verb negation after it ("X is not
    seen"). Affirmed: otherwise, when it names at least half of the question's content words and
    no opposite (left/right, small/large, normal/enlarged ...) of what was asked.
    """
    matches = list(_WORD.finditer(clause))
    stems = {_stem(m.group()) for m in matches}
    if not stems & finding.keys:
        return None
    first = next(m.start() for m in matches if _stem(m.group()) in finding.keys)
    if any(m.start() < first for m in NEGATION.finditer(clause)) or POST_NEGATION.search(clause, first):
        return "no"
    words = [m.group() for m in matches]
    if _conflicts(finding, words):
        return None
    covered = sum(_stem(term) in stems for term in finding.terms)
    return "yes" if covered >= _COVERAGE * len(finding.terms) else None


def _sentence_verdict(sentence: str, finding: _Finding | None) -> str | None:
    """One sentence of an answer (lower case, no hedge): ``"yes"``, ``"no"`` or ``None`` (no cue).

    Without a question: any negation gives no, an explicit assertion (:data:`ASSERTION`) yes.
    With one: an elliptical sentence ("It is not seen.", "There is.") answers the question by its
    polarity; otherwise only a clause that names the question's finding decides.
    """
    if finding is None:
        if NEGATION.search(sentence):
            return "no"
        return "yes" if ASSERTION.search(sentence) else None
    words = _WORD.findall(sentence)
    if all(w in _ELLIPTICAL or not w.isalpha() for w in words):  # numbers: "(q14)", "2"
        if NEGATION.search(sentence):
            return "no"
        return "yes" if ASSERTION.search(sentence) or NEUTRAL_VERB.search(sentence) else None
    for clause in _CLAUSE_SPLIT.split(sentence):
        verdict = _clause_verdict(clause, finding)
        if verdict is not None:
            return verdict
    return None


@_memo(maxsize=65536)
def parse_yes_no(text: str, question: str | None = None) -> str | None:
    """Read a free-text answer to a yes/no question: ``"yes"``, ``"no"`` or ``None``.

    ``None`` means unparsed (empty, a hedge, or no cue). A leading answer word decides; then the
    first of the first four sentences that decides: see the module docstring. With ``question``
    a sentence without a yes/no word counts only when it affirms or denies the question's finding.
    """
    if not text:
        return None
    low = _clean_text(text).lower()
    if not low:
        return None
    fast = _YN_FAST.get(low.rstrip(" .!,"))
    if fast is not None:
        return fast
    if LEAD_HEDGE.match(low):
        return None
    if LEAD_YES.match(low):
        return "yes"
    finding = _question_finding(question) if question else None
    if LEAD_NO.match(low):
        if finding is None or not _DETERMINER_NO.match(low):
            return "no"
        # "No pneumothorax, but a small effusion ...": "no" is a determiner, the sentences decide;
        # a global negation ("No acute abnormality.") still denies.
        verdict = _read_sentences(low, finding)
        if verdict is None and all(w in _ELLIPTICAL or w in _GLOBAL_WORDS or not w.isalpha()
                                   for w in _WORD.findall(_first_clause(low))):
            return "no"
        return verdict
    return _read_sentences(low, finding)


def _first_clause(text: str) -> str:
    return _CLAUSE_SPLIT.split(split_sentences(text, ANSWER_SENTENCES)[0])[0]


def _read_sentences(low: str, finding: _Finding | None) -> str | None:
    """The first of the first four sentences that decides (a hedge makes the answer unparsed)."""
    for sentence in split_sentences(low, ANSWER_SENTENCES)[:4]:
        hedge = HEDGE.search(sentence)
        # "not clear" is a hedge unless the question asks whether something is clear
        if hedge and not (finding and _stem(hedge.group().split()[-1]) in finding.keys):
            return None
        verdict = _sentence_verdict(sentence, finding)
        if verdict is not None:
            return verdict
    return None


# ---------------------------------------------------------------------------
# Multiple choice
# ---------------------------------------------------------------------------

_NON_WORD = re.compile(r"[\W_]+")
_ARTICLE_WORDS = frozenset({"a", "an", "the"})
# Blank runs are read in one way only (no "\s*X?\s*"): the regex engine tried every split of a long blank run
# (quadratic, cubic for _EXPLICIT_LETTER's three runs) before failing.
_WHOLE_LETTER = re.compile(r"^\(?\s*([A-Za-z])\s*(?:\)\s*)?[.:)]?$")
_LEAD_LETTER = re.compile(r"^(?:\(([A-Z])\)|([A-Z])\s*[.:)]|([A-Z]),|([A-Z])\s+-)(?=\s|$)")
_EXPLICIT_LETTER = re.compile(
    r"\b(?:answer|option|choice)\b(?:\s+(?:is|would\s+be|will\s+be|should\s+be))?\s*(?:[:\-]\s*)?"
    r"(?:option\s+|choice\s+)?\(?([A-Za-z])(?![A-Za-z0-9])\)?",
    re.I,
)
_PAREN_LETTER = re.compile(r"\(([A-Z])\)")
_AFTER_LOWER = re.compile(r"\s*(?:[.,;:!)]|$)")
_AFTER_ARTICLE = re.compile(r"\s+[a-z]")
_SHORT_LETTER = re.compile(r"(?<![A-Za-z'])([B-H])(?![A-Za-z'\-])")


@_memo(maxsize=65536)
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
        if letter.islower():
            if not _AFTER_LOWER.match(t, m.end()):
                continue
        elif letter in "AI" and _AFTER_ARTICLE.match(t, m.end()):
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


@_memo(maxsize=8192)
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


# Two standalone capital letters joined by "or", "and", "/", "&" or ",": "A or B", "(A)/(B)", "B, C".
_LETTER_PAIR = re.compile(
    r"(?<![A-Za-z0-9'])\(?([A-Z])\)?(?=\s*(?:,\s*(?:or|and)\b|,|/|&|\bor\b|\band\b)\s*\(?([A-Z])\)?(?![A-Za-z0-9'\-]))"
)
# Clause breaks for the negation check.
_NEG_CLAUSE = re.compile(r"[.;:,!?\n]|\b(?:but|however|whereas|while|although|though|rather|instead)\b", re.I)
# A negation cue and at most three words before the mention (_MENTION), in one normalised clause.
_PRE_NEGATION = re.compile(r"\b(?:not|no|never|nor|neither|without|[a-z]+n t)(?: [a-z0-9]+){0,3}? \x00")
_NEG_CUE = re.compile(r"\b(?:not|no|never|nor|neither|without|[a-z]+n t)\b")
_POST_NEGATION = re.compile(
    r"\x00 (?:(?:is|are|was|were) )?(?:not|incorrect|wrong|unlikely|absent|excluded|ruled out)\b"
    r"|\x00 (?:isn|aren|wasn|weren) t\b")
_MENTION = "\x00"
_PLACEHOLDER = "qqmentionqq"  # stands for _MENTION while _norm drops punctuation


def _names_several_letters(t: str, n: int) -> bool:
    """``t`` joins two different option letters ("A or B", "A/B", "B and C")."""
    for m in _LETTER_PAIR.finditer(t):
        first, second = _letter_index(m.group(1), n), _letter_index(m.group(2), n)
        if first is not None and second is not None and first != second:
            return True
    return False


def _is_negated(t: str, idx: int, options: tuple[str, ...], threshold: float) -> bool:
    """Whether a clause of ``t`` negates option ``idx``, named by its letter or its text.

    The mention counts as negated after "not"/"no"/"never"/"n't"/"without" ... with at most three
    words between ("It is not pneumonia", "Not B") or before "is not"/"is incorrect" ("B is wrong").
    """
    letter_re = re.compile(r"(?<![A-Za-z0-9'])\(?" + _LETTERS[idx] + r"\)?(?![A-Za-z0-9'\-])")
    option = options[idx]
    for clause in _NEG_CLAUSE.split(t):
        # the mentions of the option (its letter, its normalised text) become _MENTION
        norm = f" {_norm(letter_re.sub(f' {_PLACEHOLDER} ', clause))} "
        if option:
            norm = norm.replace(f" {option} ", f" {_PLACEHOLDER} ")
        norm = norm.strip().replace(_PLACEHOLDER, _MENTION)
        if _MENTION in norm:
            if _PRE_NEGATION.search(norm) or _POST_NEGATION.search(norm):
                return True
            continue
        # A misspelt option after the clause's last cue ("not pnuemonia"): the rest of the clause matches it.
        cues = list(_NEG_CUE.finditer(norm))
        if cues and cues[-1].group() not in option.split():
            rest = norm[cues[-1].end() :].strip()
            if rest and _match_text(rest, options, max(threshold, _WINDOW_THRESHOLD)) == idx:
                return True
    return False


@_memo(maxsize=65536)
def _parse_mc_cached(text: str, choices: tuple[str, ...], threshold: float) -> int | None:
    t = _clean_text(text)
    if not t or not choices:
        return None
    n = len(choices)
    if _names_several_letters(t, n):
        return None
    idx = _find_letter(t, n)
    if idx is None:
        idx = _match_text(_norm(t), _norm_options(choices), threshold)
    if idx is None:
        idx = _find_short_letter(t, n)
    if idx is None or _is_negated(t, idx, _norm_options(choices), threshold):
        return None
    return idx


def parse_multiple_choice(text: str, choices: list[str], threshold: float = 0.6) -> int | None:
    """Index of the option ``text`` picks, or ``None`` (nothing found, or ambiguous).

    Letters first (``"B"``, ``"(B)"``, ``"B."``, ``"B)"``, ``"Option B"``,
    ``"The answer is B"``; a lowercase letter only in an explicit ``"answer: b"``
    form or alone), then option text after normalisation (case, punctuation,
    articles): exact, contained (the longest contained option wins when one contains
    the other; two unrelated options is ambiguous), text contained in exactly one
    option, and finally the best ``difflib`` ratio at or above ``threshold``.
    Unparsed (``None``): two different option letters joined by "or"/"and"/"/"/","
    (``"A or B"``, ``"A/B"``), and a negated pick (``"Not B"``, ``"It is not pneumonia"``,
    ``"B is wrong"``).
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
# A lone lower-case letter ("b", "(b)"), read as its capital; the empty group stands for no option text.
_REF_LOWER_LETTER = re.compile(r"^\(?([a-z])\)?\s*[.:)]?()$")


@_memo(maxsize=65536)
def _normalize_mc_reference(answer: str, choices: tuple[str, ...]) -> int | None:
    idx = _read_mc_reference(answer, choices)
    # A reference that negates the option it names ("Not an MRI") is label noise, as a prediction would be unparsed.
    if idx is None or _is_negated(answer.strip(), idx, _norm_options(choices), 0.8):
        return None
    return idx


def _read_mc_reference(answer: str, choices: tuple[str, ...]) -> int | None:
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
    m = _REF_LETTER.match(s) or _REF_LOWER_LETTER.match(s)
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
    question: str | None = None,
) -> ItemScore:
    """Score one item. Unparsed predictions and unusable references count as wrong.

    ``question`` (yes/no items) lets the parser read an answer without a yes/no word that
    affirms or denies the question's finding; the reference is read without it, as the
    dataset builders read it.
    """
    kind = canonical_answer_type(answer_type)
    prediction = prediction or ""
    if kind == "yes_no":
        ref = parse_yes_no(reference) if reference else None
        pred = parse_yes_no(prediction, question or None)
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


def _upstream_first_sentence(text: str) -> str:
    """Upstream's reduction of one answer: the text before the first ``.``, without ``,``."""
    if "." in text:
        text = text.split(".")[0]
    return text.replace(",", "")


def _upstream_token_rule(text: str) -> int:
    words = _upstream_first_sentence(text).split(" ")
    return 0 if ("No" in words or "not" in words or "no" in words) else 1


def upstream_yes_no(text: str) -> int:
    """MedHEval's yes/no rule for one answer in an intact group: ``1`` yes, ``0`` no.

    Keep the text before the first ``.``, drop ``,``, split on single spaces; the
    exact (case-sensitive) tokens ``No``, ``not`` or ``no`` mean no, anything else
    yes. So ``"Abnormal"`` is 1, ``"Not sure."`` is 1 (``Not`` is not a listed
    token) and ``"I am not sure."`` is 0. An empty or white-space answer is 1 too:
    upstream's first pass leaves it untouched and its second pass splits it into
    empty tokens, none of which is a no-token. Whether the group is intact is
    :func:`upstream_group_breaks`; :func:`upstream_yes_no_group` applies both.
    """
    return _upstream_token_rule(text or "")


def upstream_group_breaks(last_text: str) -> bool:
    """True when upstream scores a whole yes/no group as unanswered because of ``last_text``.

    ``evaluate_yes_no`` checks ``len(text.strip()) < 1`` in its second loop on the
    variable ``text`` left over from the first loop: the *last* answer of the group
    after its reduction (its part before the first ``.``, without ``,``), or the last
    answer itself when that is empty or white space (the first loop skips it before
    reducing). When that is blank every prediction of the group becomes ``-1``, a
    false negative, and the group's accuracy is 0. Blank cases: an empty or white-space
    last answer, one that starts with ``.`` (``".5 cm"``), or one whose first sentence
    is only commas and spaces (``", ."``).
    """
    text = last_text or ""
    if not text.strip():
        return True
    return not _upstream_first_sentence(text).strip()


def upstream_yes_no_group(predictions: list[str], references: list[str]) -> list[bool]:
    """Per-item correctness of one group scored by one upstream ``evaluate_yes_no`` call.

    A group is what upstream passes in one call, in prediction order: the yes/no items
    of one source file and one hallucination type (visual splits), or all items of
    the file (knowledge, context). Correct when :func:`upstream_yes_no` of the
    prediction equals the label's token-rule value, unless :func:`upstream_group_breaks`
    on the group's last prediction, which makes every item wrong.
    """
    if len(predictions) != len(references):
        raise ValueError(f"{len(predictions)} predictions for {len(references)} references")
    if not predictions:
        return []
    if upstream_group_breaks(predictions[-1]):
        return [False] * len(predictions)
    return [upstream_yes_no_correct(p, r) for p, r in zip(predictions, references)]


def _upstream_label(reference: str) -> int:
    # Labels go through the token rule without any empty check (an empty label is 1).
    return _upstream_token_rule(reference or "")


def upstream_yes_no_correct(prediction: str, reference: str) -> bool:
    """One yes/no item of an intact group scored as MedHEval does: the two token-rule values are equal."""
    return upstream_yes_no(prediction) == _upstream_label(reference)


def upstream_group_accuracy(yes_no_correct: list[bool], multiple_choice_correct: list[bool | None]) -> float:
    """Accuracy of one (source, hallucination type) group as MedHEval's ``eval_closed`` weights it.

    ``acc = (acc_yn * n_yn + acc_mc * n_mc) / (n_yn + n_mc)``, where ``acc_yn`` is the
    share of correct yes/no items (0 without any), ``acc_mc`` the share of correct items
    among the multiple-choice items ``eval_mc`` scores (0 when it scores none) and
    ``n_mc`` counts *all* multiple-choice items, skipped ones (``None``, no option B)
    included: a skipped item weighs in at the group's multiple-choice accuracy.
    0.0 for an empty group.
    """
    n_yn, n_mc = len(yes_no_correct), len(multiple_choice_correct)
    if n_yn + n_mc == 0:
        return 0.0
    acc_yn = sum(map(bool, yes_no_correct)) / n_yn if n_yn else 0.0
    scored = [c for c in multiple_choice_correct if c is not None]
    acc_mc = sum(map(bool, scored)) / len(scored) if scored else 0.0
    return (acc_yn * n_yn + acc_mc * n_mc) / (n_yn + n_mc)


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


@_memo(maxsize=8192)
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


@_memo(maxsize=65536)
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
        _split_choices_str, parse_yes_no, _question_finding, _stem, _norm, _norm_options, _parse_mc_cached,
        _normalize_mc_reference, _upstream_options, _upstream_label_index,
    ):
        fn.cache_clear()


# --- generated-text cleaning shared by the open-ended metrics -------------------------------------

_ROLE_PREFIX = re.compile(r"^\s*assistant\s*:\s*", re.IGNORECASE)
# The sentence MedHEval's report CSV conversion writes for a short report (code/evaluation/report_eval/run_chair.py
# and run_eval.py at 7f7d980; tests/test_metric_chair.py checks it against the released run_chair.py).
UPSTREAM_SHORT_REPORT = "No report generated."
_UPSTREAM_MIN_REPORT_CHARS = 10


def clean_generated_text(text: str | None, upstream_compat: bool = False, report_csv: bool = False) -> str:
    """A generated answer as the open-ended metrics score it.

    Native: trim white space and drop a leading ``"Assistant:"`` role prefix. With
    ``upstream_compat``, MedHEval's ``text.strip("Assistant:")``, which strips any of the
    characters ``A s i t a n :`` from both ends (``"... effusion"`` -> ``"... effusio"``); with
    ``report_csv`` as well, its report CSV conversion (``run_chair.py``, ``run_eval.py``), in its order:
    a strip that leaves nothing keeps the raw text, then a text under 10 characters becomes
    ``"No report generated."`` (CHAIR, CheXbert, RadGraph, and the generation metrics of reports).
    """
    text = "" if text is None else str(text)
    if not upstream_compat:
        return _ROLE_PREFIX.sub("", text).strip()
    stripped = text.strip("Assistant:")  # deliberately the upstream character-set strip
    if not report_csv:
        return stripped
    if not stripped:  # e.g. "Assistant:" itself: upstream keeps the raw text
        stripped = text
    return UPSTREAM_SHORT_REPORT if len(stripped) < _UPSTREAM_MIN_REPORT_CHARS else stripped
