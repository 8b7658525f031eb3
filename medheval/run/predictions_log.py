"""The append-only predictions log (``predictions.jsonl``): one JSON object per line, flushed per line.

A run killed at any point leaves every finished record on disk; at most the line being written
is torn. :func:`read_log` repairs a torn *last* line (it is dropped, then regenerated) and refuses
a corrupt line anywhere else, naming the line number. Logs are opened without following symbolic
links (:func:`medheval.run.outputs.open_owned`): a link planted in the output folder is refused, its
target left as it was.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import IO, Any, Callable, Hashable

from medheval.backends.predictions import MAX_LINE_BYTES
from medheval.net.secrets import redact
from medheval.run.outputs import named, open_owned


class CorruptLogError(ValueError):
    """A line other than the last one of ``predictions.jsonl`` is not valid JSON."""


def log_key(entry: dict[str, Any]) -> tuple[str, str, str, str]:
    """Records are unique per (id, model, mitigation, image control); entries without a control are ``none``
    (:mod:`medheval.run.control`)."""
    return entry["id"], entry.get("model", ""), entry.get("mitigation", "none"), entry.get("control", "none")


PREDICTION_FIELDS = ("id", "prediction")


def read_log(path: str | Path, repair: bool = True, required: tuple[str, ...] = PREDICTION_FIELDS,
             key: Callable[[dict[str, Any]], Hashable] | None = None) -> list[dict[str, Any]]:
    """All entries of a predictions log (or of another append-only log whose lines carry the
    string fields ``required``; entries unique by ``key``: by default :func:`log_key` for a predictions log,
    none for another log).

    Every newline-terminated line must be valid JSON. An unterminated final line is what a
    kill mid-write leaves: with ``repair`` it is truncated away (its record is regenerated).
    Entries are unique by ``key`` (:func:`unique_entries`).
    """
    path = Path(path)
    if not os.path.lexists(path):
        return []
    with os.fdopen(open_owned(path, os.O_RDONLY), "rb") as handle:
        raw = handle.read()
    complete_end = raw.rfind(b"\n") + 1  # bytes up to and including the last newline
    if complete_end < len(raw) and repair:
        descriptor = open_owned(path, os.O_WRONLY)
        try:
            os.ftruncate(descriptor, complete_end)
        finally:
            os.close(descriptor)
    parsed: list[tuple[int, Any]] = []
    for number, line in enumerate(raw[:complete_end].split(b"\n")[:-1], start=1):
        if not line.strip():
            continue
        if len(line) > MAX_LINE_BYTES:
            raise CorruptLogError(
                f"{path}: line {number} holds {len(line)} bytes; a line holds at most {MAX_LINE_BYTES}. The log was "
                f"edited or damaged: fix or remove that line, or start a new --output folder.")
        try:
            parsed.append((number, json.loads(line)))
        except json.JSONDecodeError as error:
            raise CorruptLogError(
                f"{path}: line {number} is not valid JSON ({error.msg}); the log was edited or"
                f" damaged. Fix or remove that line, or start a new --output folder."
            ) from error
    entries: list[dict[str, Any]] = []
    for number, entry in parsed:  # damage (invalid JSON) is reported first, then entries of the wrong shape
        problem = _entry_problem(entry, required)
        if problem:
            fields = " and ".join(f'"{key}"' for key in required)
            raise CorruptLogError(
                f"{path}: line {number} {problem}; every line is an object with a string {fields}."
                f" Fix or remove that line, or start a new --output folder."
            )
        entries.append(entry)
    key = key or (log_key if required == PREDICTION_FIELDS else None)
    return entries if key is None else unique_entries(path, entries, [number for number, _ in parsed], key)


def unique_entries(path: Path, entries: list[dict[str, Any]], lines: list[int],
                   key: Callable[[dict[str, Any]], Hashable] = log_key) -> list[dict[str, Any]]:
    """``entries`` (read from ``path`` at line numbers ``lines``) with one entry per ``key``.

    Two different entries for one key (an edited or concatenated log) are refused, naming both lines: which
    answer counts is not ours to pick. An exact copy of an entry is dropped (the first kept): it carries
    the same answer, so the scores cannot change (a log appended twice, a part log merged twice after a
    kill, :func:`medheval.run.distributed.merge_parts`). A ``--predictions`` file is stricter (any repeated id is
    refused, :mod:`medheval.backends.predictions`): a file of the user's own has no resume to explain a copy."""
    first: dict[Hashable, int] = {}
    kept: list[dict[str, Any]] = []
    for index, entry in enumerate(entries):
        found = first.get(key(entry))
        if found is None:
            first[key(entry)] = index
            kept.append(entry)
        elif entries[found] != entry:
            raise CorruptLogError(
                f"{path}: lines {lines[found]} and {lines[index]} hold two different entries for id "
                f"{entry['id']!r} (key {key(entry)!r}); the log was edited or concatenated. "
                f"Remove the line that is wrong (or both, to regenerate the record), or start a new --output "
                f"folder.")
    return kept


def _entry_problem(entry: Any, required: tuple[str, ...]) -> str | None:
    """Why a parsed log line is not a usable entry (``None`` when it is)."""
    if not isinstance(entry, dict):
        return f"is a JSON {type(entry).__name__}, not an object"
    for key in required:
        if key not in entry:
            return f"has no {key!r} (keys: {sorted(entry)})"
        if not isinstance(entry[key], str):
            return f"has a non-string {key!r} ({entry[key]!r})"
    return None


# Characters str.splitlines() treats as line ends that json.dumps(ensure_ascii=False) leaves raw.
_LINE_BREAKS = {"\u0085": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"}


def jsonl_line(entry: Any) -> str:
    """One JSON Lines line (UTF-8 text kept readable); the Unicode line separators that
    ``str.splitlines`` would cut at are escaped, so naive readers see one record per line too. Every secret
    the process holds is redacted (:func:`medheval.net.secrets.redact`)."""
    text = redact(json.dumps(entry, ensure_ascii=False, sort_keys=True)) or ""
    for char, escaped in _LINE_BREAKS.items():
        text = text.replace(char, escaped)
    return text + "\n"


class LogWriter:
    """Appends entries one per line, flushing each so a killed process loses nothing written."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._handle: IO[str] = os.fdopen(open_owned(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND), "a",
                                          encoding="utf-8")

    def write(self, entry: dict[str, Any]) -> None:
        try:
            self._handle.write(jsonl_line(entry))
            self._handle.flush()
        except OSError as error:  # a full disk: say which file
            raise named(error, self.path) from None

    def close(self) -> None:
        self._handle.flush()
        os.fsync(self._handle.fileno())
        self._handle.close()

    def __enter__(self) -> "LogWriter":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
