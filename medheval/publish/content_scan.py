"""Find pixels hidden in text: the encodings :func:`medheval.publish.hub.check_no_credentialed_bytes` refuses.

No repo medheval publishes holds image bytes, in any spelling. A text file (or a Parquet column: its values,
decoded once, :func:`parts_kind`) is refused when, by content:

- it starts with a netpbm header (``P1``-``P7`` then a width and height: ASCII or binary PBM/PGM/PPM/PAM);
- after normalising (:func:`normalise`: whitespace and ``\\n``/``\\r``/``\\t`` escapes dropped, ``\\/`` and
  ``\\u002f``-style escapes undone, JSON/YAML string boundaries — quotes, commas, brackets, YAML keys — dropped,
  so base64 wrapped at 76 characters, split into list items or slash-escaped reads as one run) it holds an image
  data URL, a run of :data:`MIN_RUN` or more base64 characters (standard or URL-safe alphabet) that looks like
  encoded bytes (:func:`looks_encoded`: upper case, lower case and digits mixed as in base64 of binary data, or
  the decoded run starts like an image, DICOM, array or archive file), or a run of :data:`MIN_HEX_RUN` or more
  hex digits (hex of 1 KB of bytes);
- the same, in the strings of its JSON (:func:`json_parts`): a file (or a Parquet cell) that parses as JSON is
  decoded (every escape undone) and the keys and string values of each object and array, nested ones and JSON
  held in strings included, are joined in order, so base64 or hex split across object values (``"k1": chunk,
  "k2": chunk``) reads as one run;
- it holds bytes as characters (:func:`latin1_text`): a quarter or more of some :data:`LATIN1_WINDOW` characters
  are U+0080–U+00FF or control characters, or ``\\u00XX``/``\\xXX`` escapes (a JPEG decoded as Latin-1);
- it holds a long run of numbers (:func:`number_run`), separated by whitespace or punctuation of any kind
  (``,;:|/``, quotes, brackets), in the text or in its JSON's values: :data:`MAX_SMALL_INTS` or more byte values
  (integers in -128..255, or two-digit hex like ``ff``), or :data:`MAX_NUMBERS` or more numbers of any size
  (floats, 16-bit values): bytes or pixels written as a list of numbers.

Prose, identifiers, hashes and paths do not look encoded: lower-case words fail the mix test, punctuation
breaks a run, and a digest is 64 hex digits (a bare list of more than 31 digests in a row reads as hex bytes and
is refused). A results table breaks its number runs at every row's label.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from typing import Any, Iterable

MIN_RUN = 2048  # base64 characters: about 1.5 KB of bytes, far longer than any annotation's token
# hex digits in a row: 1 KB of bytes; 32 sha256 digests with nothing between them (a provenance record or a card
# names each file beside its digest, so its runs stay at 64)
MIN_HEX_RUN = 2048
MAX_SMALL_INTS = 512  # byte values in a row: a 16x32 thumbnail; no annotation or results table lists that many
# numbers of any kind in a row: a 32x32 image as floats or 16-bit values. A results table of a few hundred numbers
# passes (and its runs break at every row's label); thousands in one unbroken run are an array, never a result
MAX_NUMBERS = 1024
LATIN1_WINDOW = 1024  # characters; a quarter of them bytes-as-characters is binary (prose in French: about 3%)
LATIN1_SHARE = 0.25
MAX_GAP = 8  # punctuation between two numbers of one run (whitespace not counted): '", "', '], [', ' | '
NETPBM_HEADER = re.compile(rb"\s*(?:P[1-6](?:\s+#[^\n]*)*\s+\d+\s+\d+|P7\s+(?:WIDTH|HEIGHT|DEPTH|MAXVAL|TUPLTYPE)\b)")
DATA_URL = re.compile(rb"data:image/[a-z0-9.+-]+;base64", re.IGNORECASE)
_YAML_KEY = re.compile(rb"(?m)^[ \t]*(?:-[ \t]+)?[A-Za-z0-9_.-]{1,64}:(?=[ \t\r\n]|$)")  # "key:" starting a line
_ESCAPES = re.compile(rb"\\[nrt]|\s+")  # whitespace, and JSON/YAML line-break and tab escapes
_UNICODE_ESCAPE = re.compile(rb"\\u00(2[bBfF]|3[dD])")  # \u002b \u002f \u003d: '+', '/', '='
_BOUNDARIES = re.compile(rb"[\"',\[\]]+")  # JSON/YAML string and list-item boundaries
_RUN = re.compile(rb"[A-Za-z0-9+/_-]{%d,}" % MIN_RUN)
_HEX_RUN = re.compile(rb"[0-9A-Fa-f]{%d,}" % MIN_HEX_RUN)
# a number standing alone (not part of a word, a hash or a version): an integer, a decimal, an exponent; or one
# byte as two hex digits (0x optional)
_NUMBER = re.compile(rb"(?<![A-Za-z0-9_.])(?:[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|(?:0x)?[0-9A-Fa-f]{2})"
                     rb"(?![A-Za-z0-9_])")
_WORD = re.compile(rb"[A-Za-z0-9_]")
_BYTE_ESCAPE = re.compile(r"\\u00[0-9A-Fa-f]{2}|\\x[0-9A-Fa-f]{2}")


def normalise(data: bytes) -> bytes:
    """``data`` with YAML keys starting a line, whitespace and ``\\n``/``\\r``/``\\t`` escapes dropped, ``\\/``
    and ``\\u002f``-style escapes of ``+ / =`` undone, and quotes, commas and brackets dropped (so list items
    and the values of a YAML mapping join)."""
    text = _ESCAPES.sub(b"", _YAML_KEY.sub(b"", data))
    text = _UNICODE_ESCAPE.sub(lambda match: bytes([int(match.group(1), 16)]), text)
    text = text.replace(b"\\/", b"/")
    return _BOUNDARIES.sub(b"", text)


def _decoded_head(run: bytes, size: int = 264) -> bytes:
    """The first bytes ``run`` decodes to as base64 (either alphabet); ``b""`` when it does not decode."""
    head = run[: size // 3 * 4].replace(b"-", b"+").replace(b"_", b"/")
    try:
        return base64.b64decode(head[: len(head) // 4 * 4], validate=True)
    except (binascii.Error, ValueError):
        return b""


def looks_encoded(run: bytes, magic: Iterable[tuple[int, bytes, str]] = ()) -> bool:
    """Whether a base64-alphabet run is encoded bytes rather than joined words: at least 10% upper case,
    10% lower case and 3% digits (base64 of binary data has about 40/40/16), or a decoded head that starts
    like a file in ``magic`` (``(offset, leading bytes, kind)``, as :data:`medheval.publish.hub.MAGIC_BYTES`)."""
    upper = sum(65 <= c <= 90 for c in run)
    lower = sum(97 <= c <= 122 for c in run)
    digits = sum(48 <= c <= 57 for c in run)
    if upper >= 0.10 * len(run) and lower >= 0.10 * len(run) and digits >= 0.03 * len(run):
        return True
    head = _decoded_head(run)
    return bool(head) and any(head[offset : offset + len(lead)] == lead for offset, lead, _ in magic)


def encoded_run(data: bytes, magic: Iterable[tuple[int, bytes, str]] = ()) -> str | None:
    """What ``data`` hides once normalised (``"text with an image data URL"``, ``"base64 text"``, ``"hex
    text"``), or ``None``."""
    text = normalise(data)
    if DATA_URL.search(text):
        return "text with an image data URL"
    magic = tuple(magic)
    if any(looks_encoded(m.group(), magic) for m in _RUN.finditer(text)):
        return "base64 text"
    return "hex text" if _HEX_RUN.search(text) else None


def _walk(value: Any, parts: tuple[list[str], list[str], list[str]], seen: set[str], depth: int = 0) -> None:
    """:func:`json_parts` below one value, appending to ``parts`` = ``(texts, values, numbers)``: keys to
    ``texts``; strings to ``texts`` and ``values`` (once each: a string seen before is left out) and to
    ``numbers``; numbers to ``numbers`` (``true``/``false``/``null`` there as words, which end a run)."""
    texts, values, numbers = parts
    if depth > 64 and isinstance(value, (dict, list, tuple)):  # deeper than any record: read as its JSON text
        value = json.dumps(value, default=str)
    if isinstance(value, str):
        stripped = value.strip()
        if depth < 32 and stripped[:1] in ("{", "[") and stripped[-1:] in ("}", "]"):
            try:  # JSON held in a string (a Parquet meta cell): its own strings and numbers
                return _walk(json.loads(stripped), parts, seen, depth + 1)
            except (ValueError, RecursionError):
                pass
        if value not in seen:
            seen.add(value)
            texts.append(value)
            values.append(value)
        numbers.append(value)
    elif isinstance(value, bool) or value is None:
        numbers.append(json.dumps(value))
    elif isinstance(value, (int, float)):
        numbers.append(repr(value))
    elif isinstance(value, dict):
        for key, item in value.items():
            texts.append(str(key))  # repeated too: a key between two digests keeps them apart
            _walk(item, parts, seen, depth + 1)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _walk(item, parts, seen, depth + 1)
    else:
        _walk(str(value), parts, seen, depth + 1)


def json_parts(value: Any) -> tuple[bytes, bytes, bytes]:
    """``(texts, values, numbers)`` of a decoded JSON value (nested objects and arrays, and JSON held in strings,
    read in order), each joined by newlines: its keys and strings; its strings alone (so base64 or hex split over
    the values of an object, or over its keys, joins once :func:`normalise` drops the newlines; each distinct
    string once, so a value repeated down a column, a commit id in every row, is no long run); its numbers and
    strings (keys left out, so pixels as the values of an object form one run for :func:`number_run`)."""
    parts: tuple[list[str], list[str], list[str]] = ([], [], [])
    _walk(value, parts, set())
    return tuple("\n".join(part).encode("utf-8", "replace") for part in parts)  # type: ignore[return-value]


def latin1_text(data: bytes, window: int = LATIN1_WINDOW, share: float = LATIN1_SHARE) -> bool:
    """Whether ``data`` holds bytes written as characters: in some ``window`` characters (all of them, in a
    shorter text of at least a quarter window), a ``share`` or more are U+0080–U+00FF, control characters other
    than tab and line breaks, or ``\\u00XX``/``\\xXX`` escapes (each counted as one character). A JPEG decoded as
    Latin-1 has about 60%; accented prose (French, German) 1-4%; symbols in a table (±, °, µ) far less."""
    import numpy as np

    text = _BYTE_ESCAPE.sub("\x80", data.decode("utf-8", "replace"))
    if len(text) < window // 4:
        return False
    codes = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    odd = ((codes >= 0x80) & (codes <= 0xFF)) | ((codes < 0x20) & ~np.isin(codes, (9, 10, 13)))
    size = min(window, len(codes))
    if int(odd.sum()) < share * size:
        return False
    total = np.concatenate(([0], np.cumsum(odd, dtype=np.int64)))
    return bool((total[size:] - total[:-size]).max() >= share * size)


def number_run(data: bytes, byte_limit: int = MAX_SMALL_INTS, limit: int = MAX_NUMBERS) -> str | None:
    """``"list of byte values"`` when ``data`` holds ``byte_limit`` or more byte values in a row (integers in
    -128..255, or two hex digits), ``"list of numbers"`` when it holds ``limit`` or more numbers of any kind in a
    row; ``None`` otherwise. Numbers stand alone (not inside a word, hash or version) and belong to one run when
    only whitespace and at most :data:`MAX_GAP` other non-word characters separate them (``,``, ``;``, ``:``,
    ``|``, ``/``, quotes, brackets); a word ends the run."""
    run = small = 0
    previous = 0
    for match in _NUMBER.finditer(data):
        gap = data[previous : match.start()]
        if previous and (_WORD.search(gap) or len(gap) - sum(gap.count(c) for c in b" \t\r\n") > MAX_GAP):
            run = small = 0
        previous = match.end()
        token = match.group()
        run += 1
        try:
            value = int(token)
            is_byte = -128 <= value <= 255
        except ValueError:
            is_byte = len(token.removeprefix(b"0x")) == 2 and not token.lstrip(b"-+").replace(b".", b"").isdigit()
        small = small + 1 if is_byte else 0
        if small >= byte_limit:
            return "list of byte values"
        if run >= limit:
            return "list of numbers"
    return None


def netpbm_header(data: bytes) -> bool:
    """Whether ``data`` starts like a netpbm image (``P1``-``P6`` width height, or a ``P7`` PAM header)."""
    return bool(NETPBM_HEADER.match(data))


def _json_value(data: bytes) -> tuple[bool, Any]:
    """``(True, value)`` when ``data`` is a JSON document (an object or array), else ``(False, None)``."""
    stripped = data.strip()
    if stripped[:1] not in (b"{", b"["):
        return False, None
    try:
        return True, json.loads(stripped)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return False, None


def parts_kind(parts: tuple[bytes, bytes, bytes], magic: Iterable[tuple[int, bytes, str]] = (), numbers: bool = True,
               text: bytes = b"") -> str | None:
    """What a decoded JSON value hides, given its :func:`json_parts` (a Parquet column's values, read once:
    no JSON text to write and parse back); ``text``, the JSON document it was parsed from when there is one, is
    read too for bytes as characters and number runs. The kinds of :func:`text_kind`."""
    texts, values, numbered = parts
    return _kind((texts, values), (text, texts), (text, numbered), magic, numbers)


def _kind(runs: Iterable[bytes], chars: Iterable[bytes], numbered: Iterable[bytes],
          magic: Iterable[tuple[int, bytes, str]], numbers: bool) -> str | None:
    """The first finding, in order: an encoded run in ``runs``, bytes as characters in ``chars``, then (with
    ``numbers``) a number run in ``numbered``."""
    magic = tuple(magic)
    for text in runs:
        found = encoded_run(text, magic)
        if found:
            return found
    if any(latin1_text(text) for text in chars):
        return "bytes as characters"
    if not numbers:
        return None
    return next(filter(None, map(number_run, numbered)), None)


def text_kind(data: bytes, magic: Iterable[tuple[int, bytes, str]] = (), numbers: bool = True) -> str | None:
    """What a text file hides: ``"netpbm image"``, ``"text with an image data URL"``, ``"base64 text"``, ``"hex
    text"``, ``"bytes as characters"``, ``"list of byte values"`` or ``"list of numbers"`` (these two only with
    ``numbers``); ``None`` for plain text. A JSON document is read twice: as text, and decoded
    (:func:`json_parts`, :func:`parts_kind`)."""
    if netpbm_header(data):
        return "netpbm image"
    parsed, value = _json_value(data)
    if parsed:  # decoded JSON: every escape undone, its values joined
        return parts_kind(json_parts(value), magic, numbers, data)
    return _kind((data,), (data,), (data,), magic, numbers)


__all__ = ["MAX_NUMBERS", "MAX_SMALL_INTS", "MIN_HEX_RUN", "MIN_RUN", "encoded_run", "json_parts", "latin1_text",
           "looks_encoded", "netpbm_header", "normalise", "number_run", "parts_kind", "text_kind"]
