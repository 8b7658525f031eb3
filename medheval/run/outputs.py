"""Safe output folders: atomic file writes and one run per folder at a time.

* :func:`atomic_write_text` writes to a temporary file in the same folder, fsyncs it and renames it
  over the target (``os.replace``): a kill or a full disk leaves the old file or the new one, never
  half of one. The file gets the permissions of the process's umask, like any file it creates (a
  colleague on a shared server can read results that ``predictions.jsonl`` sits beside). A temporary
  file a kill left behind is removed when the folder is next locked (:func:`remove_orphans`).
* :class:`OutputLock` holds an exclusive ``fcntl.flock`` on ``<folder>/.medheval.lock`` (the holder's
  pid and start time are written in it). The kernel drops the lock when its process dies, so a lock
  file left by a killed run is taken over, never mistaken for a live run. A second run into the
  folder refuses at once, or waits up to ``timeout`` seconds for the first to finish.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import time
from pathlib import Path
from typing import IO

from medheval.net.secrets import redact

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: no advisory locks, see OutputLock
    fcntl = None

LOCK_NAME = ".medheval.lock"
ORPHAN_PATTERN = ".*.tmp"  # what atomic_write_bytes names its temporary files: .<target>.<random>.tmp


def _umask() -> int:
    """The process umask, read without changing it where the platform allows (Linux ``/proc``)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    return _IMPORT_UMASK


def _read_umask_by_setting_it() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


_IMPORT_UMASK = _read_umask_by_setting_it()  # elsewhere than Linux: read once, at import


def file_mode() -> int:
    """The permissions ``open()`` would give a new file now (``0o666`` less the umask)."""
    return 0o666 & ~_umask()


class OutputFolderLocked(RuntimeError):
    """Another process is writing into the same output folder."""


def atomic_write_text(path: str | Path, text: str) -> None:
    """Replace ``path`` with ``text`` (UTF-8) atomically: temp file, fsync, ``os.replace``. Every secret the
    process holds is redacted first (:func:`medheval.net.secrets.redact`)."""
    atomic_write_bytes(path, (redact(text) or "").encode("utf-8"))


def named(error: BaseException, path: str | Path) -> BaseException:
    """An ``OSError`` without a file name (a full disk while writing) as the same error naming ``path``."""
    if isinstance(error, OSError) and not error.filename and error.errno:
        return type(error)(error.errno, os.strerror(error.errno), str(path))
    return error


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically: temp file in the same folder, fsync, ``os.replace``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle = tempfile.NamedTemporaryFile("wb", dir=path.parent, prefix=f".{path.name}.", suffix=".tmp",
                                         delete=False)
    try:
        with handle:
            handle.write(data)
            handle.flush()
            os.fchmod(handle.fileno(), file_mode())  # NamedTemporaryFile creates 0600
            os.fsync(handle.fileno())
        os.replace(handle.name, path)
    except BaseException as error:
        Path(handle.name).unlink(missing_ok=True)
        if isinstance(error, OSError) and not error.filename:  # a full disk: say which file
            raise named(error, path) from None
        raise
    _fsync_dir(path.parent)


def _fsync_dir(folder: Path) -> None:
    """Make the rename itself durable (POSIX; a no-op where folders cannot be opened)."""
    try:
        descriptor = os.open(folder, os.O_RDONLY)
    except OSError:  # pragma: no cover - Windows
        return
    try:
        os.fsync(descriptor)
    except OSError:  # pragma: no cover - some filesystems refuse fsync on folders
        pass
    finally:
        os.close(descriptor)


def remove_orphans(folder: str | Path) -> list[Path]:
    """Delete the temporary files of :func:`atomic_write_bytes` that a killed process left in ``folder`` and
    its sub-folders (except those holding their own lock: another run's folder). Only call it while
    holding the folder's lock; returns what was removed."""
    removed = []
    folder = Path(folder)
    pending = [folder]
    while pending:
        current = pending.pop()
        for path in current.iterdir():
            if path.is_dir() and not path.is_symlink():
                if not (path / LOCK_NAME).exists():
                    pending.append(path)
            elif path.match(ORPHAN_PATTERN) and path.is_file():
                path.unlink(missing_ok=True)
                removed.append(path)
    return removed


class OutputLock:
    """Exclusive lock on an output folder for the life of a run (a context manager).

    Args:
        folder: the output folder (created if needed).
        timeout: seconds to wait for another run to release the folder; ``0`` refuses at once.
        poll: seconds between attempts while waiting.
    """

    def __init__(self, folder: str | Path, timeout: float = 0.0, poll: float = 0.5) -> None:
        self.folder = Path(folder)
        self.path = self.folder / LOCK_NAME
        self.timeout = float(timeout)
        self.poll = poll
        self._handle: IO[str] | None = None
        self.removed_orphans: list[Path] = []  # temporary files a killed run left, removed on acquire

    def _holder(self) -> str:
        try:
            info = json.loads(self.path.read_text() or "{}")
        except (OSError, ValueError):
            return "another process"
        return f"pid {info.get('pid')} on {info.get('host')} (since {info.get('started')})"

    def acquire(self) -> "OutputLock":
        self.folder.mkdir(parents=True, exist_ok=True)
        if fcntl is None:  # pragma: no cover - no advisory locks on this platform: run unguarded
            return self
        handle = open(self.path, "a+", encoding="utf-8")
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = self._holder()
                    handle.close()
                    waited = f" after waiting {self.timeout:g} s" if self.timeout > 0 else ""
                    raise OutputFolderLocked(
                        f"{self.folder} is in use by another run ({holder}){waited}. Two runs into one folder "
                        f"would duplicate every record: wait for it to finish (or pass --lock-timeout SECONDS "
                        f"to wait), or choose another --output folder."
                    ) from None
                time.sleep(self.poll)
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                 "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}))
        handle.flush()
        self._handle = handle
        self.removed_orphans = remove_orphans(self.folder)
        return self

    def release(self) -> None:
        if self._handle is not None:
            fcntl.flock(self._handle.fileno(), fcntl.LOCK_UN)
            self._handle.close()
            self._handle = None

    def __enter__(self) -> "OutputLock":
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
