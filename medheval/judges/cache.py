"""The on-disk judge cache: one SQLite file, safe for many threads and processes.

Location: ``cache_dir`` if given, else ``$MEDHEVAL_CACHE/judge``, else ``~/.cache/medheval/judge``;
the file is ``judge_cache.sqlite3`` there. Each row maps a request key (sha256 of backend,
model, endpoint, the full conversation with image digests, and the generation parameters;
never the API key) to the reply that *validated*, with its token usage. Failed records are not
stored, so a re-run retries them and re-asks nothing else. SQLite in WAL mode with a busy
timeout lets concurrent writers (threads here, other processes) share the file; each entry
is committed as soon as its record finishes, so an interrupted run resumes from there.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

CACHE_FILENAME = "judge_cache.sqlite3"


def default_cache_dir() -> Path:
    root = os.environ.get("MEDHEVAL_CACHE")
    base = Path(root).expanduser() if root else Path.home() / ".cache" / "medheval"
    return base / "judge"


class JudgeCache:
    """``get_many(keys) -> {key: entry}`` and ``put(key, entry)``; entries are JSON objects."""

    def __init__(self, directory: str | os.PathLike | None = None):
        self.directory = Path(directory).expanduser() if directory is not None else default_cache_dir()
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path = self.directory / CACHE_FILENAME
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        with self._lock:
            self._connection()

    def _connection(self) -> sqlite3.Connection:
        """The open connection (caller holds the lock); opened again after :meth:`close`."""
        if self._conn is None:
            conn = sqlite3.connect(str(self.path), timeout=60.0, check_same_thread=False, isolation_level=None)
            try:
                conn.execute("PRAGMA journal_mode=WAL")
            except sqlite3.OperationalError:  # e.g. a network file system without shared memory
                pass
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute(
                "CREATE TABLE IF NOT EXISTS entries (key TEXT PRIMARY KEY, value TEXT NOT NULL, created REAL NOT NULL)"
            )
            self._conn = conn
        return self._conn

    @property
    def is_open(self) -> bool:
        """Whether a SQLite connection is open now."""
        return self._conn is not None

    def get_many(self, keys) -> dict[str, dict[str, Any]]:
        keys = list(dict.fromkeys(keys))
        found: dict[str, dict[str, Any]] = {}
        with self._lock:
            for start in range(0, len(keys), 500):
                chunk = keys[start : start + 500]
                marks = ",".join("?" * len(chunk))
                rows = self._connection().execute(f"SELECT key, value FROM entries WHERE key IN ({marks})", chunk).fetchall()
                for key, value in rows:
                    try:
                        found[key] = json.loads(value)
                    except json.JSONDecodeError:  # a damaged row is a miss; it is overwritten later
                        continue
        return found

    def get(self, key: str) -> dict[str, Any] | None:
        return self.get_many([key]).get(key)

    def put(self, key: str, entry: dict[str, Any]) -> None:
        value = json.dumps(entry, ensure_ascii=False, sort_keys=True)
        with self._lock:
            self._connection().execute(
                "INSERT OR REPLACE INTO entries (key, value, created) VALUES (?, ?, ?)", (key, value, time.time())
            )

    def __len__(self) -> int:
        with self._lock:
            return int(self._connection().execute("SELECT COUNT(*) FROM entries").fetchone()[0])

    def clear(self) -> None:
        with self._lock:
            self._connection().execute("DELETE FROM entries")

    def close(self) -> None:
        """Close the SQLite connection (idempotent); the next read or write opens it again."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


__all__ = ["CACHE_FILENAME", "JudgeCache", "default_cache_dir"]
