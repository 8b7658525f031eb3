"""Reading a JSON object out of an LLM's reply, robustly.

Judges are asked for one JSON object, but real replies wrap it in code fences, add prose
before or after, use Python-style single quotes, ``True``/``None``, trailing commas, bare
keys or ``//`` comments. :func:`parse_json_object` accepts all of these and raises
``ValueError`` (with a short excerpt of the text) when no object can be read, so a caller
never mistakes an unreadable reply for a score.
"""

from __future__ import annotations

import json
import re
from collections.abc import Hashable
from typing import Any

# A code fence's opening: the backticks, an optional language tag, then the rest of its line. The block runs
# from there to the next ```. Matched at one place each (see _fence_blocks), never backtracked into: the old
# single regex (opening, lazy body, closing) tried every split of a run of blanks after an unclosed ```
# (minutes for a few thousand blanks).
_FENCE_OPEN = re.compile(r"```[ \t]*(?:json5?|javascript|js|python|py)?[ \t]*\r?\n?", re.IGNORECASE)
_SMART_QUOTES = str.maketrans({"\u201c": '"', "\u201d": '"', "\u2018": "'", "\u2019": "'"})
_BARE_WORDS = {"true": "true", "false": "false", "null": "null", "True": "true", "False": "false",
               "None": "null", "TRUE": "true", "FALSE": "false", "NULL": "null"}
_IDENT_START = re.compile(r"[A-Za-z_$]")
_IDENT = re.compile(r"[A-Za-z0-9_$\-]*")
_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")


def _excerpt(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")


def _balanced_objects(text: str):
    """Yield every top-level ``{...}`` span of ``text`` (string- and quote-aware), in order."""
    depth = 0
    start = -1
    quote = ""
    escaped = False
    for pos, char in enumerate(text):
        if quote:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == quote:
                quote = ""
            continue
        if char in "\"'" and depth > 0:
            # an apostrophe inside prose between objects is not a string start; only inside objects
            quote = char
        elif char == "{":
            if depth == 0:
                start = pos
            depth += 1
        elif char == "}" and depth > 0:
            depth -= 1
            if depth == 0:
                yield text[start : pos + 1]
    if depth > 0 and start >= 0:  # unterminated object: offer it anyway (a missing final brace)
        yield text[start:] + "}" * depth


def _fence_blocks(text: str) -> list[str]:
    """The bodies of the Markdown code fences of ``text``, in order, in linear time.

    The same blocks as ``re.findall(r"```[ \\t]*(?:json5?|...)?[ \\t]*\\r?\\n?(.*?)```", text, re.I | re.S)``: an
    opening takes the longest language tag and blanks it can (its first reading in that regex), its body ends at
    the next ```, and an opening with no ``` after its body ends the search (no later one has one either).
    """
    blocks: list[str] = []
    pos = 0
    while (start := text.find("```", pos)) >= 0:
        body = _FENCE_OPEN.match(text, start).end()
        close = text.find("```", body)
        if close < 0:
            break
        blocks.append(text[body:close])
        pos = close + 3
    return blocks


def _skip_blank(text: str, pos: int) -> int:
    """The position of the next character that is neither whitespace nor inside a comment."""
    n = len(text)
    while pos < n:
        if text[pos].isspace():
            pos += 1
        elif text.startswith("//", pos) or text[pos] == "#":
            end = text.find("\n", pos)
            pos = n if end < 0 else end
        elif text.startswith("/*", pos):
            end = text.find("*/", pos + 2)
            pos = n if end < 0 else end + 2
        else:
            break
    return pos


def _normalise(candidate: str) -> str:
    """Rewrite a JSON5/Python-literal-like object as strict JSON.

    Handles single-quoted strings, bare keys, True/False/None, trailing commas and
    ``//``/``/* */``/``#`` comments outside strings.
    """
    out: list[str] = []
    i = 0
    n = len(candidate)
    while i < n:
        char = candidate[i]
        if char in "\"'":
            quote = char
            j = i + 1
            buf: list[str] = []
            while j < n:
                c = candidate[j]
                if c == "\\" and j + 1 < n:
                    nxt = candidate[j + 1]
                    if nxt == "'" and quote == "'":
                        buf.append("'")
                    else:
                        buf.append(c + nxt)
                    j += 2
                    continue
                if c == quote:
                    break
                if c == '"' and quote == "'":
                    buf.append('\\"')
                elif c == "\n":
                    buf.append("\\n")
                elif c == "\t":
                    buf.append("\\t")
                elif c == "\r":
                    buf.append("\\r")
                else:
                    buf.append(c)
                j += 1
            out.append('"' + "".join(buf) + '"')
            i = j + 1
            continue
        if char == "/" and candidate.startswith("//", i) or char == "#":
            end = candidate.find("\n", i)
            i = n if end < 0 else end
            continue
        if char == "/" and candidate.startswith("/*", i):
            end = candidate.find("*/", i + 2)
            i = n if end < 0 else end + 2
            continue
        if char == ",":
            j = _skip_blank(candidate, i + 1)
            if j < n and candidate[j] in "}]":
                i += 1  # trailing comma
                continue
            out.append(char)
            i += 1
            continue
        if _IDENT_START.match(char):
            match = _IDENT.match(candidate, i + 1)
            word = char + (match.group(0) if match else "")
            j = i + len(word)
            k = j
            while k < n and candidate[k] in " \t":
                k += 1
            if k < n and candidate[k] == ":":  # a bare key
                out.append(json.dumps(word))
            elif word in _BARE_WORDS:
                out.append(_BARE_WORDS[word])
            else:
                out.append(json.dumps(word))  # a bare word value: keep it as a string
            i = j
            continue
        if char in "+-." or char.isdigit():
            match = _NUMBER.match(candidate, i)
            if match:
                number = match.group(0).lstrip("+")
                if number.startswith("."):
                    number = "0" + number
                elif number.startswith("-."):
                    number = "-0" + number[1:]
                if number.endswith("."):
                    number += "0"
                out.append(number)
                i = match.end()
                continue
        out.append(char)
        i += 1
    return "".join(out)


def _loads_object(candidate: str) -> dict | None:
    for attempt in (candidate, None):
        try:
            value = json.loads(attempt if attempt is not None else _normalise(candidate))
        except (ValueError, RecursionError):  # not JSON, or a number past Python's limit on digits (4,300)
            continue
        if isinstance(value, dict):
            return value
        return None
    return None


_DEEP = ("nested too deep for a key",)


def _same_key(value: Any) -> Hashable:
    """A hashable stand-in for a JSON value, equal for equal values (an object's members as a frozenset, an
    array's items as a tuple), so that each value is compared only with values that may equal it: a reply
    holding thousands of different objects was checked pair by pair (quadratic)."""
    if isinstance(value, dict):
        return "object", frozenset((key, _same_key(item)) for key, item in value.items())
    if isinstance(value, list):
        return "array", tuple(_same_key(item) for item in value)
    return value


def parse_json_object(text: str) -> dict[str, Any]:
    """The one JSON object in ``text``, read leniently (the same object repeated, e.g. in a fence and
    outside it, counts once; two different objects are ambiguous and raise).

    Accepts: a bare object; one inside a Markdown code fence; one with prose before or after
    it; single quotes, Python literals (``True``/``False``/``None``), trailing commas, bare
    keys, comments, typographic quotes; a final ``}`` that was cut off.

    Raises:
        ValueError: ``text`` holds no JSON object (the message quotes the start of it).

    >>> parse_json_object('Sure! ```json\\n{"score": 2, "reason": "minor",}\\n``` Hope it helps.')
    {'score': 2, 'reason': 'minor'}
    >>> parse_json_object("{'score': 0, 'ok': True}")
    {'score': 0, 'ok': True}
    """
    if not isinstance(text, str):
        raise ValueError(f"expected the judge's reply as a string, got {type(text).__name__}")
    stripped = text.strip()
    if not stripped:
        raise ValueError("the judge's reply is empty (expected one JSON object)")
    candidates: list[str] = []
    for block in _fence_blocks(stripped):
        candidates.extend(_balanced_objects(block))
    candidates.extend(_balanced_objects(stripped))
    seen: set[str] = set()
    values: list[dict] = []
    alike: dict[Hashable, list[dict]] = {}  # the values found so far, by _same_key
    for candidate in candidates:
        for variant in (candidate, candidate.translate(_SMART_QUOTES)):
            if variant in seen:
                continue
            seen.add(variant)
            value = _loads_object(variant)
            if value is not None:
                try:
                    key = _same_key(value)
                except RecursionError:
                    key = _DEEP
                if value not in alike.setdefault(key, []):
                    alike[key].append(value)
                    values.append(value)
                break
    if len(values) == 1:
        return values[0]
    if values:  # which one the judge meant is a guess: unparsed, so it is asked again
        raise ValueError(f"the judge's reply holds {len(values)} different JSON objects, expected one: {_excerpt(text)}")
    if not candidates:
        raise ValueError(f"no JSON object ('{{...}}') in the judge's reply: {_excerpt(text)}")
    raise ValueError(f"the JSON object in the judge's reply could not be parsed: {_excerpt(text)}")


__all__ = ["parse_json_object"]
