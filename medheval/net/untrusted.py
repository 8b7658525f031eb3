"""Text from a remote party (an endpoint's error message, a server's reply) made safe to print or log.

A server's error text may carry terminal control sequences: ``ESC ]0;…`` retitles the window, ``ESC [2K`` and
``\\r`` overwrite what was printed, ``ESC ]52;…`` writes the clipboard; bidirectional and zero-width format
characters reorder or hide text. :func:`printable` spells every such character as an escape (``\\x1b``,
``\\u202e``), keeping newlines and tabs; it is applied where such text reaches an error message, a log record or
the terminal.
"""

from __future__ import annotations

import re
import unicodedata

# control (Cc), format (Cf), surrogate (Cs) and line/paragraph separator (Zl, Zp) characters, newline and tab aside
_UNSAFE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
_CANDIDATE = re.compile(r"[^\n\t\x20-\x7e]")


def _escape(char: str) -> str:
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def printable(text: str | None) -> str | None:
    """``text`` with each control or format character (Unicode Cc, Cf, Cs, Zl, Zp; newline and tab kept) replaced
    by its escape (``\\x1b``), so a remote party's text cannot drive the terminal it is printed on."""
    if not text:
        return text
    return _CANDIDATE.sub(
        lambda match: _escape(match.group()) if unicodedata.category(match.group()) in _UNSAFE_CATEGORIES
        else match.group(), text)


__all__ = ["printable"]
