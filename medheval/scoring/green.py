"""GREEN (Ostmeier et al., 2024): the upstream judge prompt, read at run time from the pinned file, the
parser of the judge's structured error counts, and the score.

The judge compares a candidate report with a reference and counts, in six categories, clinically
significant and insignificant errors: (a) a finding reported falsely, (b) a finding of the reference
missed, (c) a wrong location, (d) a wrong severity, (e) a comparison the reference does not make,
(f) a change from a prior study left out; plus the number of matched findings. Then

    GREEN = matched / (matched + sum of the significant counts (a)-(f)),   0 when matched = 0,

and insignificant errors do not enter the score. The prompt is upstream text: it is read with ``ast``
(never imported or run) from ``green_score/utils.py`` (``make_prompt``) at the pinned commit, fetched and
sha256-verified like the annotation files (:func:`upstream_prompt`). A reply without a matched-findings
count or a significant-errors section, or with a listed category and no count, is unparseable:
:func:`parse_reply` raises, and the metric counts it as a failure, never as a score (upstream's parser
reads a missing section as zero errors or zero matches, which scores 0).
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path
from typing import Any

from medheval.data.fetch import PinnedFile, fetch

__all__ = ["CATEGORIES", "UPSTREAM_FILE", "PROMPT_VERSION", "CHAT_TEMPLATE", "upstream_prompt", "render",
           "parse_reply", "green_score"]

_GREEN_COMMIT = "d72c1951e69683b93405968901fd4f14cc6c27b0"
_RELPATH = "green_score/utils.py"
UPSTREAM_FILE = PinnedFile(
    relpath=_RELPATH,
    url=f"https://raw.githubusercontent.com/Stanford-AIMI/GREEN/{_GREEN_COMMIT}/{_RELPATH}",
    sha256="285e076c8707dc5d506497b922d44e73458e0a88de69bfc73ee07a37e9fd1062",
)
PROMPT_VERSION = f"green-upstream@{_GREEN_COMMIT[:8]}"
#: The six error categories, in the reply's (a)-(f) order (short names of this project).
CATEGORIES = ("false_finding", "missing_finding", "wrong_location", "wrong_severity", "extra_comparison",
              "missing_comparison")
#: The GREEN models' chat layout (as the green_score package sets it: ``<|user|>`` / ``<|assistant|>`` turns
#: closed by EOS, an empty assistant turn, then the generation prompt), for ``green_model=``.
CHAT_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'system' %}{{ '<|system|>\\n' + m['content'] + eos_token + '\\n' }}"
    "{% elif m['role'] == 'user' %}{{ '<|user|>\\n' + m['content'] + eos_token + '\\n' }}"
    "{% else %}{{ '<|assistant|>\\n' + m['content'] + eos_token + '\\n' }}{% endif %}"
    "{% if loop.last and add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}{% endfor %}"
)
_FIELDS = {"text1": "{reference}", "text2": "{candidate}"}


@functools.lru_cache(maxsize=None)
def upstream_prompt(data_dir: str | None = None) -> tuple[str, int]:
    """``(template, max_words)``: the f-string of ``make_prompt`` with its two report fields as ``{reference}``
    and ``{candidate}``, and its word limit per report (the ``max_len`` default).

    ``data_dir``: a local copy of the GREEN repository root (holding ``green_score/utils.py``); default: the
    pinned download / cache. A copy whose sha256 differs from the pin is refused."""
    got = fetch(UPSTREAM_FILE, data_dir=data_dir)
    if not got.verified:
        raise ValueError(f"{got.path} has sha256 {got.sha256}, not the pinned {UPSTREAM_FILE.sha256}: the GREEN "
                         f"prompt is read only from the released file ({UPSTREAM_FILE.url})")
    tree = ast.parse(Path(got.path).read_text(encoding="utf-8"), filename=str(got.path))
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.name == "make_prompt":
            defaults = dict(zip([a.arg for a in node.args.args][-len(node.args.defaults):], node.args.defaults))
            limit = defaults.get("max_len")
            for inner in ast.walk(node):
                if isinstance(inner, ast.JoinedStr):
                    template = _template(inner)
                    if template and all(field in template for field in _FIELDS.values()) and isinstance(
                            limit, ast.Constant) and isinstance(limit.value, int):
                        return template, limit.value
    raise ValueError(f"{got.path}: no make_prompt(text1, text2, max_len=...) returning an f-string with both "
                     "reports found; is this GREEN's green_score/utils.py?")


def _template(node: ast.JoinedStr) -> str | None:
    """The f-string's text with ``{text1}``/``{text2}`` as the named fields (other substitutions: None)."""
    parts = []
    for value in node.values:
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            parts.append(value.value.replace("{", "{{").replace("}", "}}"))
        elif isinstance(value, ast.FormattedValue) and isinstance(value.value, ast.Name) and value.value.id in _FIELDS \
                and value.conversion == -1 and value.format_spec is None:
            parts.append(_FIELDS[value.value.id])
        else:
            return None
    return "".join(parts)


def render(reference: Any, candidate: Any, data_dir: str | None = None) -> str:
    """The GREEN prompt for one pair, each report cut to the prompt's word limit (upstream ``make_prompt``)."""
    template, limit = upstream_prompt(data_dir)

    def words(text: Any) -> str:
        return " ".join(("" if text is None else str(text)).split()[:limit])

    return template.format(reference=words(reference), candidate=words(candidate))


# A section header "[Header]:" and a category line "(a) ...", each after the blanks that open its line: what
# re.finditer(r"^\s*" + pattern, text, re.MULTILINE) finds, read by _line_matches without the regex's retry at
# every line start of a run of blank lines (quadratic in a reply of many empty lines).
_HEADER = re.compile(r"\[([^\]\n]+)\]\s*:?")
_ITEM = re.compile(r"\(([a-f1-6])\)\s*(.*)$", re.MULTILINE)
_NON_BLANK = re.compile(r"\S")


def _line_matches(pattern: re.Pattern[str], text: str) -> list[tuple[int, re.Match[str]]]:
    """``(line start, match)`` of ``pattern`` after the blanks that open a line, as ``re.finditer`` finds
    ``^\\s*`` + ``pattern`` (MULTILINE): every line start of one blank run reaches the same first non-blank
    character, so each run is read once."""
    found: list[tuple[int, re.Match[str]]] = []
    pos = 0
    while True:
        if pos and text[pos - 1] != "\n":  # the next line start
            pos = text.find("\n", pos) + 1
            if not pos:
                return found
        blank_end = _NON_BLANK.search(text, pos)
        first = blank_end.start() if blank_end else len(text)
        match = pattern.match(text, first)
        if match:
            found.append((pos, match))
            pos = match.end()
        elif first >= len(text):
            return found
        else:
            pos = first + 1


def _sections(text: str) -> dict[str, str]:
    """``[Header]:`` sections of the reply, by lower-cased header."""
    marks = _line_matches(_HEADER, text)
    return {m.group(1).strip().lower(): text[m.end():marks[i + 1][0] if i + 1 < len(marks) else len(text)]
            for i, (_, m) in enumerate(marks)}


def _count(digits: str, where: str) -> int:
    """``int(digits)``; a ValueError naming ``where`` for a run of digits past Python's limit on digits converted
    at once (4,300 by default), which is no count (a degenerate reply)."""
    try:
        return int(digits)
    except ValueError:
        raise ValueError(f"{where} has a count of {len(digits)} digits") from None


def _counts(body: str, section: str) -> list[int]:
    """Counts (a)-(f) of one error section; "No ..." means none; an item without a count is an error."""
    counts = [0] * len(CATEGORIES)
    if body.strip().lower().startswith("no"):
        return counts
    items = [match.groups() for _, match in _line_matches(_ITEM, body)]
    if not items:
        raise ValueError(f"[{section}] lists no (a)-(f) categories")
    for label, rest in items:
        index = "abcdef".index(label) if label.isalpha() else int(label) - 1
        number = re.search(r":\s*(\d+)\b", rest)
        if number is None:
            raise ValueError(f"[{section}] ({label}) has no count (expected '({label}) <type>: <number>. ...')")
        counts[index] = _count(number.group(1), f"[{section}] ({label})")
    return counts


def parse_reply(text: str) -> dict[str, Any]:
    """``{"matched": int, "significant": [6 ints], "insignificant": [6 ints] | None}`` from a GREEN reply,
    or ``ValueError`` saying what is missing (the reply is then counted as unparseable)."""
    sections = _sections(text or "")
    matched_body = sections.get("matched findings")
    if matched_body is None:
        raise ValueError("no [Matched Findings] section")
    matched = re.match(r"\s*(\d+)\b", matched_body)
    if matched is None:
        if not matched_body.strip().lower().startswith("no"):
            raise ValueError("[Matched Findings] does not start with a count")
    significant = sections.get("clinically significant errors")
    if significant is None:
        raise ValueError("no [Clinically Significant Errors] section")
    insignificant = sections.get("clinically insignificant errors")
    return {"matched": _count(matched.group(1), "[Matched Findings]") if matched else 0,
            "significant": _counts(significant, "Clinically Significant Errors"),
            "insignificant": None if insignificant is None else _counts(insignificant,
                                                                         "Clinically Insignificant Errors")}


def green_score(matched: int, significant: list[int]) -> float:
    """GREEN = matched / (matched + sum(significant)); 0 when nothing matched (Ostmeier et al., 2024; green_score
    `compute_green`)."""
    return 0.0 if matched == 0 else matched / (matched + sum(significant))
