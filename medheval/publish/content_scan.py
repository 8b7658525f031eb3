"""Find pixels hidden in text: the encodings :func:`medheval.publish.hub.check_no_credentialed_bytes` refuses.

No repo medheval publishes holds image bytes, in any spelling. A text file (or a Parquet string column, read as
its JSON) is refused when, by content:

- it starts with a netpbm header (``P1``-``P7`` then a width and height: ASCII or binary PBM/PGM/PPM/PAM);
- after normalising (:func:`normalise`: whitespace and ``\\n``/``\\r``/``\\t`` escapes dropped, ``\\/`` and
  ``\\u002f``-style escapes undone, JSON/YAML string boundaries — quotes, commas, brackets — dropped, so base64
  wrapped at 76 characters, split into list items or slash-escaped reads as one run) it holds an image data URL,
  or a run of :data:`MIN_RUN` or more base64 characters (standard or URL-safe alphabet) that looks like encoded
  bytes (:func:`looks_encoded`: upper case, lower case and digits mixed as in base64 of binary data, or the
  decoded run starts like an image, DICOM, array or archive file);
- it holds :data:`MAX_SMALL_INTS` or more integers in -128..255 in a row (:func:`small_int_run`), separated by
  whitespace, commas, semicolons, quotes or brackets only: bytes or pixels written as a JSON or CSV list of numbers.

Prose, identifiers, hashes and paths do not look encoded: lower-case words and hex digests fail the mix test,
and punctuation breaks a run.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Iterable

MIN_RUN = 2048  # base64 characters: about 1.5 KB of bytes, far longer than any annotation's token
MAX_SMALL_INTS = 512  # integers in -128..255 in a row: a 16x32 thumbnail; no annotation lists that many
NETPBM_HEADER = re.compile(rb"\s*(?:P[1-6](?:\s+#[^\n]*)*\s+\d+\s+\d+|P7\s+(?:WIDTH|HEIGHT|DEPTH|MAXVAL|TUPLTYPE)\b)")
DATA_URL = re.compile(rb"data:image/[a-z0-9.+-]+;base64", re.IGNORECASE)
_ESCAPES = re.compile(rb"\\[nrt]|\s+")  # whitespace, and JSON/YAML line-break and tab escapes
_UNICODE_ESCAPE = re.compile(rb"\\u00(2[bBfF]|3[dD])")  # \u002b \u002f \u003d: '+', '/', '='
_BOUNDARIES = re.compile(rb"[\"',\[\]]+")  # JSON/YAML string and list-item boundaries
_RUN = re.compile(rb"[A-Za-z0-9+/_-]{%d,}" % MIN_RUN)
_SMALL_INT = re.compile(rb"-?\d{1,3}")
_TOKEN = re.compile(rb"[^\s,;\"'\[\]]+")


def normalise(data: bytes) -> bytes:
    """``data`` with whitespace and ``\\n``/``\\r``/``\\t`` escapes dropped, ``\\/`` and ``\\u002f``-style
    escapes of ``+ / =`` undone, and quotes, commas and brackets dropped (so list items join)."""
    text = _ESCAPES.sub(b"", data)
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
    """What base64 ``data`` hides once normalised (``"text with an image data URL"``, ``"base64 text"``), or ``None``."""
    text = normalise(data)
    if DATA_URL.search(text):
        return "text with an image data URL"
    magic = tuple(magic)
    return "base64 text" if any(looks_encoded(m.group(), magic) for m in _RUN.finditer(text)) else None


def small_int_run(data: bytes, limit: int = MAX_SMALL_INTS) -> bool:
    """Whether ``data`` holds ``limit`` or more integers in -128..255 in a row: tokens split by whitespace,
    commas, semicolons, quotes and brackets (so rows of a nested list count together); any other token
    ends the row."""
    row = 0
    for token in _TOKEN.finditer(data):
        text = token.group()
        if len(text) <= 4 and _SMALL_INT.fullmatch(text) and -128 <= int(text) <= 255:
            row += 1
            if row >= limit:
                return True
        else:
            row = 0
    return False


def netpbm_header(data: bytes) -> bool:
    """Whether ``data`` starts like a netpbm image (``P1``-``P6`` width height, or a ``P7`` PAM header)."""
    return bool(NETPBM_HEADER.match(data))


def text_kind(data: bytes, magic: Iterable[tuple[int, bytes, str]] = (), numbers: bool = True) -> str | None:
    """What a text file (or a Parquet column's JSON) hides: ``"netpbm image"``, ``"text with an image data URL"``,
    ``"base64 text"``, ``"list of byte values"`` (only with ``numbers``); ``None`` for plain text."""
    if netpbm_header(data):
        return "netpbm image"
    found = encoded_run(data, magic)
    if found:
        return found
    return "list of byte values" if numbers and small_int_run(data) else None


__all__ = ["MAX_SMALL_INTS", "MIN_RUN", "encoded_run", "looks_encoded", "netpbm_header", "normalise",
           "small_int_run", "text_kind"]
