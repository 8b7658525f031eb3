"""Find pixels hidden in text: the encodings :func:`medheval.publish.hub.check_no_credentialed_bytes` refuses.

No repo medheval publishes holds image bytes, in any spelling. A text file (or a Parquet column: its values,
decoded once, :func:`parts_kind`) is refused when, by content:

- it starts with a netpbm header (``P1``-``P7`` then a width and height: ASCII or binary PBM/PGM/PPM/PAM);
- after normalising (:func:`normalise`: whitespace and ``\\n``/``\\r``/``\\t`` escapes dropped, ``\\/`` and
  ``\\u002f``-style escapes undone, JSON/YAML string boundaries — quotes, commas, brackets, YAML keys — dropped,
  so base64 wrapped at 76 characters, split into list items or slash-escaped reads as one run) it holds an image
  data URL, a run of :data:`MIN_RUN` or more base64 characters (standard or URL-safe alphabet) that looks like
  encoded bytes (:func:`looks_encoded`: upper case, lower case and digits mixed as in base64 of binary data, or
  the decoded run starts like an image, DICOM, array or archive file), a run of :data:`MIN_HEX_RUN` or more
  hex digits (hex of 1 KB of bytes), or 1 KB of bytes in another encoding of :data:`ENCODINGS` that
  :func:`is_encoded` (mixed like encoded binary data, or decoding to a file's header): :data:`MIN_B32_RUN` base32
  characters (``b32encode``, ``b32hexencode``, either case) or :data:`MIN_B85_RUN` base85 or ascii85 characters
  (``b85encode``, ``a85encode``; ascii85, whose alphabet has quotes, commas and backslashes, is read with
  whitespace alone dropped). Each run is read in the normalised text and in the text as it is (where a run
  starts where its encoding does), and a decoded header of 3 bytes or more may start up to :data:`MAX_SHIFT`
  characters in (a heading or key the normalised text joined in front). The mix is also measured without the
  run's runs of zero bytes (:func:`mixed`: a headerless payload mostly zeros). A shorter run of
  :data:`MIN_HEADER_BYTES` of bytes or more is refused when it decodes to a header of 3 bytes or more (a small
  image). Runs cut by punctuation (:func:`chains`: pieces of :data:`MIN_PIECE` characters or more cut by 1 to
  :data:`MAX_GAP` of ``;`` ``.`` ``|`` ``:`` ``!`` ``#`` ..., spaces or tabs around them) are joined inside one
  line of one string (a JSON value, a Parquet cell, a line of a text file; never across values, rows or lines)
  and refused when they decode to a header of 3 bytes or more (:func:`has_chain`); a headerless payload cut by
  punctuation passes (ids and tokens cut by dots are mixed like base64 too);
- it holds bytes mapped one to one onto 256 code points (:func:`block_run`), :data:`MIN_BLOCK_RUN` characters in
  a row (``\\uXXXX`` escapes undone): all in one Unicode block above U+00FF (a space ends the run) whose low
  bytes start like an image, DICOM, array or archive file, 2-byte headers included (``chr(0x2800 + b)``,
  ``chr(0x100 + b)``); or, with any start (``chr(0x2810 + b)``) and ASCII dropped, within 256 of each other and
  starting with a header of :data:`MIN_FREE_HEADER` bytes or more less the start it implies (where a mapping
  could start: first, or after a character outside those 256), or taking :data:`MIN_BLOCK_DISTINCT` distinct
  values;
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
is refused). A results table breaks its number runs at every row's label. Upper-case words hold no 12% of
digits 2-7 (base32 of binary data: 19%), code and tables no 15% each of upper case, lower case and symbols
(base85 of binary data: 25-33% each), and text in one script (Cyrillic, kana, braille) or CJK text (whose
characters spread over dozens of blocks) passes: no text runs 1,024 characters in one block without a space; with
any start, a 2- or 3-byte header is just two or three letters a few code points apart (``Ха`` less 0x3E3 reads
as ``BM``), so only headers of 4 bytes or more count, three code-point differences and 1,024 characters within
the 256 they imply; and natural scripts take 30-100 values in a window, never 192.
"""

from __future__ import annotations

import base64
import binascii
import functools
import json
import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable

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
# 1 KB of bytes in the other encodings, as for hex. Measured on this repository, ../shared (578 files) and
# samples (upper-case reports, Chinese, Russian, kana, braille, sha256 lists, long words, '=' and '~' rules),
# benign runs this long exist (joined words: 23,700 characters) but none is mixed as encoded binary data is
# base32 characters (RFC 4648 or its extended-hex alphabet) in a row: 205 groups of 8
MIN_B32_RUN = 1640
MIN_B85_RUN = 1280  # base85 / ascii85 characters in a row: 256 groups of 5
# characters in a row within one 256-wide Unicode block above U+00FF (chr(0x2800 + byte)), one per byte; braille
# or kana text runs longer (6,600 measured) and passes: its low bytes start no file
MIN_BLOCK_RUN = 1024
MIN_FREE_HEADER = 4  # leading bytes a header mapped onto a window of any start has at the least (not BM, JPEG)
MIN_BLOCK_DISTINCT = 192  # distinct values in MIN_BLOCK_RUN characters of one window: bytes, never letters
# bytes a shorter run decodes to at the least to be read for a file's header: a small image (a 1x1 PNG is 67
# bytes) in base64, hex, base32 or base85, however short, is refused when its decoded head starts like a file
MIN_HEADER_BYTES = 64
MIN_REST = 64  # characters of a run left without its runs of zero bytes for their mix to be measured
MAX_SHIFT = 16  # characters a run's decoded header may start after: a heading or key joined in front of it
MAX_GAP = 8  # punctuation between two numbers of one run (whitespace not counted): '", "', '], [', ' | '
# base64 (or hex, base32, base85) cut by punctuation inside one string: pieces of MIN_PIECE alphabet characters or
# more, cut by 1 to MAX_GAP of these ASCII punctuation characters (those outside the encoding's alphabet)
CUTS = b".;:|!#$%&*?@^~"
MIN_PIECE = 16
NETPBM_HEADER = re.compile(rb"\s*(?:P[1-6](?:\s+#[^\n]*)*\s+\d+\s+\d+|P7\s+(?:WIDTH|HEIGHT|DEPTH|MAXVAL|TUPLTYPE)\b)")
DATA_URL = re.compile(rb"data:image/[a-z0-9.+-]+;base64", re.IGNORECASE)
_YAML_KEY = re.compile(rb"(?m)^[ \t]*(?:-[ \t]+)?[A-Za-z0-9_.-]{1,64}:(?=[ \t\r\n]|$)")  # "key:" starting a line
_ESCAPES = re.compile(rb"\\[nrt]|\s+")  # whitespace, and JSON/YAML line-break and tab escapes
_UNICODE_ESCAPE = re.compile(rb"\\u00(2[bBfF]|3[dD])")  # \u002b \u002f \u003d: '+', '/', '='
_BOUNDARIES = re.compile(rb"[\"',\[\]]+")  # JSON/YAML string and list-item boundaries
# a number standing alone (not part of a word, a hash or a version): an integer, a decimal, an exponent; or one
# byte as two hex digits (0x optional)
_NUMBER = re.compile(rb"(?<![A-Za-z0-9_.])(?:[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|(?:0x)?[0-9A-Fa-f]{2})"
                     rb"(?![A-Za-z0-9_])")
_WORD = re.compile(rb"[A-Za-z0-9_]")
_BYTE_ESCAPE = re.compile(r"\\u00[0-9A-Fa-f]{2}|\\x[0-9A-Fa-f]{2}")
_ANY_ESCAPE = re.compile(rb"\\u([0-9A-Fa-f]{4})")
_SPACES = re.compile(rb"\s+")


def normalise(data: bytes) -> bytes:
    """``data`` with YAML keys starting a line, whitespace and ``\\n``/``\\r``/``\\t`` escapes dropped, ``\\/``
    and ``\\u002f``-style escapes of ``+ / =`` undone, and quotes, commas and brackets dropped (so list items
    and the values of a YAML mapping join)."""
    text = _ESCAPES.sub(b"", _YAML_KEY.sub(b"", data))
    text = _UNICODE_ESCAPE.sub(lambda match: bytes([int(match.group(1), 16)]), text)
    text = text.replace(b"\\/", b"/")
    return _BOUNDARIES.sub(b"", text)


@dataclass(frozen=True)
class Encoding:
    """A text encoding of bytes: ``alphabet`` (a regex character class) finds its runs (:func:`runs`) and its
    chains (:func:`chains`), ``decode`` decodes ``group = (characters, bytes)`` groups. A run of ``min_run``
    characters or more is encoded bytes when each ``(characters, share)`` of ``mix`` makes up that share of it
    (as encoded binary data does, and words do not), measured on the run or on the run less its runs of zero
    bytes (``zero``, 8 or more in a row), or when it decodes to a file's leading bytes (:func:`mixed`,
    :func:`is_encoded`); a chain (runs cut by punctuation inside one string) only when it decodes to a file's
    header (:func:`has_chain`)."""

    kind: str
    alphabet: bytes
    decode: Callable[[bytes], bytes]
    encode: Callable[[bytes], bytes]  # decode's inverse (the encoded first characters of a header: _prefixes)
    group: tuple[int, int]
    mix: tuple[tuple[bytes, float], ...]  # empty: every run of min_run is encoded bytes (hex)
    min_run: int
    zero: bytes  # the character zero bytes encode to ('A' in base64 and base32, '0' in hex, 'z' in ascii85)
    chains: bool = True  # whether runs cut by punctuation are joined and read for a header (not ascii85)
    normalised: bool = True  # False: read with whitespace alone dropped (ascii85 has quotes, commas, backslashes)

    @property
    def shortest(self) -> int:
        """The characters :data:`MIN_HEADER_BYTES` take (padding left out): the shortest run read."""
        characters, width = self.group
        return -(-MIN_HEADER_BYTES * characters // width)

    @property
    def classes(self) -> bytes:
        """Byte -> 1 for ``alphabet``, 0 otherwise."""
        return bytes(int(bool(re.fullmatch(rb"[%s]" % self.alphabet, bytes([byte])))) for byte in range(256))

    @property
    def cuts(self) -> bytes:
        """The punctuation a chain drops between its pieces: :data:`CUTS` outside ``alphabet``."""
        return bytes(byte for byte in CUTS if not re.fullmatch(rb"[%s]" % self.alphabet, bytes([byte])))


@functools.lru_cache(maxsize=None)
def _classes(encoding: Encoding) -> Any:
    import numpy as np

    return np.frombuffer(encoding.classes, dtype=np.uint8)


@functools.lru_cache(maxsize=None)
def _chain_pattern(encoding: Encoding) -> re.Pattern[bytes]:
    """Two or more pieces of :data:`MIN_PIECE` or more alphabet characters, each two cut by 1 to :data:`MAX_GAP`
    characters of :attr:`Encoding.cuts`, spaces and tabs (at least one cut: words are not pieces), starting where
    a piece starts (so a long run is tried once)."""
    alphabet, cuts = encoding.alphabet, re.escape(encoding.cuts)
    cut = rb"(?=[%s \t]{1,%d}[%s])[ \t]*[%s][%s \t]*" % (cuts, MAX_GAP, alphabet, cuts, cuts)
    return re.compile(rb"(?<![%s])[%s]{%d,}(?:%s[%s]{%d,})+"
                      % (alphabet, alphabet, MIN_PIECE, cut, alphabet, MIN_PIECE))


def _spans(mask: Any) -> tuple[Any, Any]:
    """The starts and ends of the runs of ``True`` in the NumPy array ``mask``."""
    import numpy as np

    edges = np.flatnonzero(np.diff(np.concatenate(([False], mask, [False])).astype(np.int8)))
    return edges[0::2], edges[1::2]


def runs(encoding: Encoding, text: bytes) -> list[bytes]:
    """The runs of ``encoding``'s alphabet in ``text`` of :attr:`Encoding.shortest` characters or more: any
    byte outside the alphabet (whitespace, punctuation, non-ASCII) ends a run."""
    import numpy as np

    starts, ends = _spans(_classes(encoding)[np.frombuffer(text, dtype=np.uint8)] == 1)
    keep = ends - starts >= encoding.shortest
    return [text[start:end] for start, end in zip(starts[keep].tolist(), ends[keep].tolist())]


def chains(encoding: Encoding, text: bytes) -> list[bytes]:
    """The chains of ``encoding``'s runs in ``text``, joined (the cuts dropped): two or more pieces of
    :data:`MIN_PIECE` or more alphabet characters with 1 to :data:`MAX_GAP` characters between each two, ASCII
    punctuation of :attr:`Encoding.cuts` (``;`` ``.`` ``|`` ``:`` ``!`` ``#`` ...) with spaces or tabs around
    it, :attr:`Encoding.shortest` characters or more in all. Anything else ends a chain: a line break, quotes,
    commas, brackets, a shorter piece, a longer cut, whitespace alone, any non-ASCII character; so a chain lies
    in one line of one string (a JSON value, a Parquet cell, a line of a text file), never across values, rows
    or lines."""
    cuts = encoding.cuts + b" \t"
    return [joined for joined in (match.group().translate(None, cuts)
                                  for match in _chain_pattern(encoding).finditer(text))
            if len(joined) >= encoding.shortest]


_UPPER, _LOWER, _DIGITS = bytes(range(65, 91)), bytes(range(97, 123)), b"0123456789"
_B85_SYMBOLS = b"!#$%&()*+-;<=>?@^_`{|}~"
_A85_SYMBOLS = bytes(range(0x21, 0x30)) + bytes(range(0x3A, 0x41)) + bytes(range(0x5B, 0x61))
BASE64 = Encoding("base64 text", rb"A-Za-z0-9+/_\-",
                  lambda run: base64.b64decode(run.translate(bytes.maketrans(b"-_", b"+/")), validate=True),
                  base64.b64encode, (4, 3), ((_UPPER, 0.10), (_LOWER, 0.10), (_DIGITS, 0.03)), MIN_RUN,
                  b"A")  # binary: 40/40/16
HEX = Encoding("hex text", rb"0-9A-Fa-f", lambda run: bytes.fromhex(run.decode("ascii")),
               lambda data: data.hex().encode(), (2, 1), (), MIN_HEX_RUN, b"0")
# encodings read after base64 and hex (base64.b32encode, b32hexencode, b85encode, a85encode): upper or lower case
# for base32. Binary data as base32 is 19% digits (12% asked), as base32hex 50% G-V and 31% digits (20%, 15%), as
# base85 or ascii85 about 30% upper case, 25-30% lower case, 12% digits, 27-33% symbols (15/15/5/15%); data mostly
# zeros (a DICOM file's preamble and padding) is measured without its runs of zero bytes too
OTHER_ENCODINGS = (
    Encoding("base32 text", rb"A-Za-z2-7", lambda run: base64.b32decode(run, casefold=True), base64.b32encode,
             (8, 5),
             ((b"234567", 0.12), (_UPPER + _LOWER, 0.5)), MIN_B32_RUN, b"A"),
    Encoding("base32 text", rb"0-9A-Va-v", lambda run: base64.b32hexdecode(run, casefold=True),
             base64.b32hexencode, (8, 5),
             ((b"GHIJKLMNOPQRSTUVghijklmnopqrstuv", 0.20), (_DIGITS, 0.15)), MIN_B32_RUN, b"0"),
    Encoding("base85 text", rb"0-9A-Za-z!#$%&()*+\-;<=>?@^_`{|}~", base64.b85decode, base64.b85encode, (5, 4),
             ((_UPPER, 0.15), (_LOWER, 0.15), (_DIGITS, 0.05), (_B85_SYMBOLS, 0.15)), MIN_B85_RUN, b"0"),
    Encoding("ascii85 text", rb"!-uz", base64.a85decode, base64.a85encode, (5, 4),
             ((_UPPER, 0.15), (_LOWER, 0.15), (_DIGITS, 0.05), (_A85_SYMBOLS, 0.15)), MIN_B85_RUN, b"z",
             chains=False, normalised=False),
)
ENCODINGS = (BASE64, HEX, *OTHER_ENCODINGS)


def _share(run: bytes, characters: bytes) -> float:
    """The share of ``run`` that is one of ``characters``."""
    return (len(run) - len(run.translate(None, characters))) / max(len(run), 1)


def _starts_like(head: bytes, magic: Iterable[tuple[int, bytes, str]]) -> bool:
    """Whether ``head`` starts like a file in ``magic`` (``(offset, leading bytes, kind)``)."""
    return bool(head) and any(head[offset : offset + len(lead)] == lead for offset, lead, _ in magic)


def decoded_head(encoding: Encoding, run: bytes, size: int = 264) -> bytes:
    """The first ``size`` or so bytes ``run`` decodes to (whole groups); ``b""`` when it does not decode."""
    characters, width = encoding.group
    head = run[: -(-size // width) * characters]
    for end in range(len(head), max(len(head) - characters, 0), -1):  # an ascii85 'z' shifts the groups
        try:
            return encoding.decode(head[:end])
        except (binascii.Error, ValueError):
            continue
    return b""


def mixed(encoding: Encoding, run: bytes) -> bool:
    """Whether ``run``'s characters are mixed as ``encoding`` of binary data: each share of ``encoding.mix``,
    in the run or in what is left of it without its runs of zero bytes (8 or more ``encoding.zero`` in a row,
    when :data:`MIN_REST` characters or more are left: a DICOM file's zero preamble and padding, an image's black
    border). Hex has no mix: every run of it is bytes."""
    if not encoding.mix:
        return True
    pieces = [run]
    if encoding.zero * 8 in run:
        rest = re.sub(rb"%s{8,}" % re.escape(encoding.zero), b"", run)
        pieces += [rest] if len(rest) >= MIN_REST else []
    return any(all(_share(piece, characters) >= share for characters, share in encoding.mix) for piece in pieces)


def _longer(magic: Iterable[tuple[int, bytes, str]]) -> tuple[tuple[int, bytes, str], ...]:
    """The entries of ``magic`` of 3 leading bytes or more (2 bytes, ``BM`` or gzip's, words hit by chance)."""
    return tuple(entry for entry in magic if len(entry[1]) >= 3)


@functools.lru_cache(maxsize=256)
def _prefixes(encoding: Encoding, leads: tuple[bytes, ...]) -> re.Pattern[bytes] | None:
    """A pattern matching (by lookahead, so overlapping) where a group of ``encoding`` could start one of
    ``leads``: the characters its first bytes (up to a group's width) fix, whatever the bytes after them. A
    run's header is decoded only where this matches: a regex scan instead of a decode at each shift."""
    characters, width = encoding.group
    found: set[bytes] = set()
    for lead in leads:
        known = lead[: max(width, 3)][:width] if width > 1 else lead[:3]  # hex: 3 bytes, 6 digits
        if encoding.kind in ("base85 text", "ascii85 text"):
            known = lead[:4]
            spare = 4 - len(known)
            low = int.from_bytes(known + bytes(spare), "big")
            # the characters no value of the spare bytes changes, but for one carry: 85^(5-k) >= 256^spare
            keep = max(k for k in range(6) if 85 ** (5 - k) >= 256 ** spare)
            for value in (low, low + 256 ** spare - 1):
                encoded = encoding.encode(value.to_bytes(4, "big"))
                found.add(encoded[:keep] if encoded != b"z" else b"!!!!!"[:keep])
        else:
            bits = {"hex text": 4, "base64 text": 6}.get(encoding.kind, 5)
            found.add(encoding.encode(known)[: len(known) * 8 // bits])
    if encoding.kind == "base64 text":
        found |= {prefix.translate(bytes.maketrans(b"+/", b"-_")) for prefix in found}
    flags = re.IGNORECASE if encoding.kind in ("hex text", "base32 text") else 0
    found.discard(b"")
    return re.compile(b"(?=(?:%s))" % b"|".join(map(re.escape, sorted(found))), flags) if found else None


def _decoded_at(encoding: Encoding, run: bytes, offset: int, size: int) -> bytes:
    """The ``size`` bytes ``run`` decodes to at byte ``offset``, decoding the groups that hold them alone (the
    whole head for ascii85 with a ``z`` before them, which shifts the groups); ``b""`` when they do not decode."""
    characters, width = encoding.group
    first, last = offset // width, -(-(offset + size) // width)
    if len(run) < last * characters:
        return b""
    if encoding.kind == "ascii85 text" and b"z" in run[: last * characters]:
        return decoded_head(encoding, run, offset + size)[offset : offset + size]
    try:
        return encoding.decode(run[first * characters : last * characters])[offset - first * width :][:size]
    except (binascii.Error, ValueError):
        return b""


def _has_header(encoding: Encoding, run: bytes, magic: tuple[tuple[int, bytes, str], ...],
                shifted: tuple[tuple[int, bytes, str], ...]) -> bool:
    """Whether ``run`` decodes to a header of ``magic`` from its start, or to one of ``shifted`` from one of its
    next :data:`MAX_SHIFT` characters. Headers at offset 0 are looked for by their encoded first characters
    (:func:`_prefixes`, one regex scan) and decoded only where those match; a header further in (DICOM's at
    128) by decoding the groups that hold it."""
    at_start = tuple(lead for offset, lead, _ in magic if offset == 0)
    moved = tuple(lead for offset, lead, _ in shifted if offset == 0)
    pattern = _prefixes(encoding, at_start + moved)
    if pattern is not None:
        longest = max(map(len, at_start + moved))
        for match in pattern.finditer(run[: MAX_SHIFT + 2 * encoding.group[0]]):
            start = match.start()
            if start > MAX_SHIFT or (start and not moved):
                break
            head = decoded_head(encoding, run[start:], longest)
            if head.startswith(moved) or (start == 0 and head.startswith(at_start)):
                return True
    if any(_decoded_at(encoding, run, offset, len(lead)) == lead for offset, lead, _ in magic if offset):
        return True
    return any(_decoded_at(encoding, run[start:], offset, len(lead)) == lead
               for offset, lead, _ in shifted if offset for start in range(1, MAX_SHIFT + 1))


def is_encoded(encoding: Encoding, run: bytes, magic: Iterable[tuple[int, bytes, str]] = ()) -> bool:
    """Whether a run of ``encoding``'s alphabet is encoded bytes rather than joined words. A run of
    ``encoding.min_run`` characters or more is when it is :func:`mixed`, or when its decoded head starts like a
    file in ``magic`` (``(offset, leading bytes, kind)``, as :data:`medheval.publish.hub.MAGIC_BYTES`), from the
    run's start or, for headers of 3 bytes or more (DICOM's at 128 too), from one of its next :data:`MAX_SHIFT`
    characters (a heading or key the normalised text joined in front). A shorter run (:data:`MIN_HEADER_BYTES` of bytes or
    more, whatever its mix) is when its decoded head starts like a file of a 3-byte header or longer, from its
    start, or shifted (as above) like one at offset 0: a small image, however short. Each is looked for cheaply
    (:func:`_has_header`)."""
    magic = tuple(magic)
    longer = _longer(magic)
    if len(run) >= encoding.min_run:  # few: every header of 3 bytes or more at each shift, DICOM's at 128 too
        return mixed(encoding, run) or _has_header(encoding, run, magic, longer)
    # many short runs (sentences of prose once spaces are dropped): shifted headers at offset 0 alone
    return _has_header(encoding, run, longer, tuple(entry for entry in longer if entry[0] == 0))


def has_chain(encoding: Encoding, text: bytes, magic: Iterable[tuple[int, bytes, str]] = ()) -> bool:
    """Whether ``text`` holds a chain of ``encoding`` (:func:`chains`: pieces cut by punctuation inside one
    string) whose joined pieces decode to a file's header of 3 bytes or more, from the chain's start. A chain is
    never judged by its mix: ids, digests, SRI hashes and version strings cut by dots or colons are mixed too."""
    longer = _longer(magic)
    return encoding.chains and any(_has_header(encoding, chain, longer, ()) for chain in chains(encoding, text))


def looks_encoded(run: bytes, magic: Iterable[tuple[int, bytes, str]] = ()) -> bool:
    """Whether a base64-alphabet run is encoded bytes rather than joined words: at least 10% upper case,
    10% lower case and 3% digits (base64 of binary data has about 40/40/16), or a decoded head that starts
    like a file in ``magic`` (:func:`is_encoded` with :data:`BASE64`)."""
    return is_encoded(BASE64, run, magic)


def encoded_run(data: bytes, magic: Iterable[tuple[int, bytes, str]] = ()) -> str | None:
    """What ``data`` hides once normalised (``"text with an image data URL"``, ``"base64 text"``, ``"hex
    text"``, ``"base32 text"``, ``"base85 text"``, ``"ascii85 text"``, ``"bytes as characters"``: a run of each
    of :data:`ENCODINGS` that :func:`is_encoded`, or a chain of its runs cut by punctuation that decodes to a
    file's header (:func:`has_chain`), then :func:`block_run`), or ``None``."""
    text = normalise(data)
    if DATA_URL.search(text):
        return "text with an image data URL"
    magic = tuple(magic)
    unescaped = unescape(data)
    # the normalised text joins wrapped lines and split values; the text as it is starts each run where its
    # encoding starts (a heading or a key joined in front would hide a decoded header)
    sources = {True: (text, data), False: (_SPACES.sub(b"", unescaped), unescaped)}
    for encoding in ENCODINGS:
        if any(is_encoded(encoding, run, magic) for source in sources[encoding.normalised]
               for run in runs(encoding, source)):
            return encoding.kind
    for encoding in ENCODINGS:  # then the runs cut by punctuation, in the text as it is (never across its lines)
        if has_chain(encoding, unescaped, magic):
            return encoding.kind
    return "bytes as characters" if block_run(text, magic) else None


def unescape(data: bytes) -> bytes:
    """``data`` with its ``\\uXXXX`` escapes (JSON, YAML) undone, as UTF-8."""
    return _ANY_ESCAPE.sub(lambda match: chr(int(match.group(1), 16)).encode("utf-8", "surrogatepass"), data)


def _code_points(text: str) -> Any:
    """``text``'s code points as a NumPy array."""
    import numpy as np

    return np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)


def _aligned_run(codes: Any, magic: tuple[tuple[int, bytes, str], ...], size: int) -> bool:
    """Bytes mapped onto a Unicode block (``chr(0x2800 + b)``, ``chr(0x100 + b)``): ``size`` or more code points
    in a row (ASCII included: a space ends the run) in one 256-wide block above U+00FF whose low bytes start like
    a file in ``magic``, headers of 2 bytes (``BM``) included: text never runs 1,024 characters without a space
    or a character of another block."""
    import numpy as np

    blocks = codes >> 8
    edges = np.concatenate(([0], np.flatnonzero(blocks[1:] != blocks[:-1]) + 1, [len(codes)]))
    for start, end in zip(edges[:-1].tolist(), edges[1:].tolist()):
        if end - start >= size and blocks[start] > 0:
            if _starts_like((codes[start : start + 264] & 0xFF).astype(np.uint8).tobytes(), magic):
                return True
    return False


def _free_header(codes: Any, magic: tuple[tuple[int, bytes, str], ...], size: int) -> bool:
    """A header of 4 bytes or more (:data:`MIN_FREE_HEADER`) mapped onto a window of any start, where a mapping
    could start: code points whose differences are those of the header's bytes, the ``size`` code points from
    the file's start all within the 256 above the start the header implies, and the code point before them (if
    any) outside those 256 (``codes``: ASCII dropped). Inside text of one script a 4-letter pattern turns up by
    chance (``екдо`` of ``человек до`` spells ``DICM`` less 0x3F1), never where a mapping would start."""
    import numpy as np

    positions = len(codes) - size + 1
    for offset, lead, _ in magic:
        if len(lead) < MIN_FREE_HEADER or offset + len(lead) > size or positions <= 0:
            continue
        first = codes[offset : offset + positions]
        hits = np.ones(positions, dtype=bool)
        for k in range(1, len(lead)):
            hits &= codes[offset + k : offset + k + positions] - first == lead[k] - lead[0]
        for at in np.flatnonzero(hits).tolist():
            base = int(codes[at + offset]) - lead[0]
            window = codes[at : at + size]
            if at and base <= int(codes[at - 1]) < base + 256:
                continue  # the mapping would have started earlier: a pattern inside text, no file's start
            if int(window.min()) >= base and int(window.max()) < base + 256:
                return True
    return False


def block_run(data: bytes, magic: Iterable[tuple[int, bytes, str]] = (), size: int = MIN_BLOCK_RUN) -> bool:
    """Whether ``data`` (``\\uXXXX`` escapes undone) holds bytes mapped one to one onto 256 code points above
    ASCII, ``size`` characters or more in a row (1 KB), refused when:

    - aligned to a Unicode block (``chr(0x2800 + b)``, ``chr(0x100 + b)``): a run all in one block above U+00FF
      whose low bytes start like a file in ``magic``, 2-byte headers (``BM``) included (:func:`_aligned_run`);
    - any start (``chr(0x2810 + b)``, ``chr(0x4E80 + b)``), ASCII characters dropped (so punctuation or words
      between pieces join them): a header of :data:`MIN_FREE_HEADER` bytes or more where a mapping could start
      (the first character, or one after a character outside the 256 it implies), the ``size`` code points from
      there within those 256 (:func:`_free_header`; a 2- or 3-byte header is two or
      three letters a few code points apart, as ``Ха`` in ``Характер`` reads as ``BM``), or
      :data:`MIN_BLOCK_DISTINCT` distinct values in ``size`` code points within 256 of each other (compressed or
      pixel bytes: about 250; a script of one block, a few dozen letters, never 200).

    CJK, Korean and mixed scripts jump further than 256 every few characters."""
    import numpy as np

    magic = tuple(magic)
    codes = _code_points(unescape(data).decode("utf-8", "replace")).astype(np.int64)
    if _aligned_run(codes, magic, size):
        return True
    codes = codes[codes >= 0x80]
    if len(codes) < size:
        return False
    if _free_header(codes, magic, size):
        return True
    near = np.abs(np.diff(codes)) < 256  # a window holds no step of 256: runs of such steps are candidates
    starts, ends = _spans(near)
    for start, end in zip(starts.tolist(), (ends + 1).tolist()):
        if end - start < size:
            continue
        run = codes[start:end]
        windows = np.lib.stride_tricks.sliding_window_view(run, size)
        low, high = windows.min(axis=1), windows.max(axis=1)
        for first, last in zip(*(part.tolist() for part in _spans(high - low < 256))):
            if any(len(np.unique(run[at : at + size])) >= MIN_BLOCK_DISTINCT for at in range(first, last, size // 2)):
                return True
    return False


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
    codes = _code_points(text)
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


__all__ = ["BASE64", "ENCODINGS", "HEX", "MAX_NUMBERS", "MAX_SHIFT", "MAX_SMALL_INTS", "MIN_B32_RUN", "MIN_B85_RUN",
           "MIN_BLOCK_DISTINCT", "MIN_BLOCK_RUN", "MIN_HEADER_BYTES", "MIN_HEX_RUN", "MIN_REST", "MIN_RUN",
           "OTHER_ENCODINGS", "Encoding", "block_run", "decoded_head", "encoded_run", "is_encoded", "json_parts",
           "latin1_text", "looks_encoded", "mixed", "netpbm_header", "normalise", "number_run", "parts_kind", "runs",
           "text_kind", "unescape"]
