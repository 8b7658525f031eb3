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
* Files a run owns are opened with :func:`open_owned`: never through a symbolic link (``O_NOFOLLOW``), never
  a FIFO/device or a file with other hard links, never below a linked sub-folder of a locked output
  folder (the folder the user named may itself be a link). Anyone who can write into an output folder
  could otherwise plant ``predictions.jsonl -> ~/.bashrc`` and have a run append to it:
  :class:`UnsafeOutputPath` says which file and what to do instead.
* :func:`replace_folder` puts a folder built aside (a staging folder) in place of another in one rename
  (``renameat2(RENAME_EXCHANGE)`` on Linux): readers see the old folder or the new one, never a mix.
  ``medheval publish`` and ``medheval report`` build into staging folders this way, under an :class:`OutputLock`.
* Temporary files are named ``.<target>.<8 random>.medheval.tmp``; only files of that shape (regular
  files owned by this user) are ever removed as leftovers, so other tools' ``*.tmp`` files are left alone.
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import re
import shutil
import socket
import stat
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
TEMP_SUFFIX = ".medheval.tmp"
# what atomic_write_bytes names its temporary files: .<target>.<8 random chars of tempfile>.medheval.tmp
ORPHAN_NAME = re.compile(r"\..+\.[a-z0-9_]{8}" + re.escape(TEMP_SUFFIX))
STAGING_SUFFIX = ".medheval-staging"  # folders built aside by publish/report: .<name>.<8 random>.medheval-staging
STAGING_NAME = re.compile(r"\..+\.[a-z0-9_]{8}" + re.escape(STAGING_SUFFIX))
_HELD: set[str] = set()  # absolute paths of the output folders whose lock this process holds


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


class OutputFolderUnusable(RuntimeError):
    """``--output`` names a file, or a folder this process cannot create or write into."""


def check_output_folder(folder: str | Path, flag: str = "--output") -> Path:
    """Fail fast, before a model loads: ``folder`` must be a folder this process can write into, or a path
    that can become one.

    Writes (and deletes) one probe file in the folder, or in its nearest existing parent when it does not
    exist yet, so permissions, read-only file systems and a path through a file are caught the way the run
    would meet them; nothing is created. Raises :class:`OutputFolderUnusable` with one line naming the path
    and what to do (``flag``: the option that named it)."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise OutputFolderUnusable(f"{flag} {folder} is a file, not a folder: give a folder path "
                                   "(it is created when missing)")
    existing = folder.absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        raise OutputFolderUnusable(f"{flag} {folder} lies below {existing}, which is a file, not a folder: "
                                   "give a folder path")
    try:
        probe = tempfile.NamedTemporaryFile("wb", dir=existing, prefix=".medheval-write-check.", suffix=".probe")
        probe.close()  # deleted on close
    except OSError as error:
        reason = error.strerror or type(error).__name__
        raise OutputFolderUnusable(f"{flag} {folder} cannot be written ({reason} in {existing}): choose a "
                                   "folder you can write to") from None
    return folder


def saved_predictions(folder: str | Path) -> int:
    """How many complete prediction lines the ``predictions*.jsonl`` logs under ``folder`` hold (what a
    resumed run keeps; a torn last line is not counted)."""
    count = 0
    folder = Path(folder)
    if not folder.is_dir():
        return 0
    for log in folder.rglob("predictions*.jsonl"):
        try:
            with open(log, "rb") as handle:
                count += sum(1 for line in handle if line.endswith(b"\n") and line.strip())
        except OSError:
            continue
    return count


class UnsafeOutputPath(RuntimeError):
    """A file a run owns is a symbolic link, not a regular file, or below a linked sub-folder."""


def _check_parents(path: Path) -> None:
    """Refuse ``path`` when a folder between a locked output folder (held by this process) and it is a
    symbolic link: a link planted there would send the run's files elsewhere."""
    absolute = os.path.abspath(path)
    roots = [root for root in _HELD if absolute.startswith(root.rstrip(os.sep) + os.sep)]
    if not roots:
        return
    current = max(roots, key=len)
    for part in Path(os.path.relpath(os.path.dirname(absolute), current)).parts:
        if part in (".", ""):
            continue
        current = os.path.join(current, part)
        if os.path.islink(current):
            raise UnsafeOutputPath(
                f"{current} is a symbolic link (to {os.readlink(current)}) inside the output folder; medheval "
                f"writes its files only into real folders there: remove the link, or choose another --output")


def open_owned(path: str | Path, flags: int, mode: int = 0o666) -> int:
    """``os.open(path, flags)`` for a file a run owns, never following a symbolic link: a link, a FIFO or
    device, a file with other hard links, or one below a linked sub-folder raises :class:`UnsafeOutputPath`."""
    path = Path(path)
    _check_parents(path)
    why = None
    try:
        descriptor = os.open(path, flags | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
                             | getattr(os, "O_CLOEXEC", 0), mode)
    except OSError as error:
        if error.errno == errno.ELOOP or path.is_symlink():
            why = f"is a symbolic link (to {os.readlink(path)})"
        elif os.path.lexists(path) and not stat.S_ISREG(path.lstat().st_mode):
            why = "is not a regular file"  # a FIFO without a reader (ENXIO), a socket...
        else:
            raise
    else:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode):
            why = "is not a regular file"
        elif info.st_nlink > 1:
            why = f"has {info.st_nlink} hard links (another name shares its content)"
        if why is None:
            return descriptor
        os.close(descriptor)
    raise UnsafeOutputPath(f"{path} {why}; medheval opens the files of its output folder only as plain files, so "
                           f"that nothing it writes lands elsewhere: remove {path.name} (nothing was written to "
                           "it), or choose another --output folder")


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
    _check_parents(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # mkstemp: O_CREAT | O_EXCL | O_NOFOLLOW; os.replace then replaces a planted link, never its target
    handle = tempfile.NamedTemporaryFile("wb", dir=path.parent, prefix=f".{path.name}.", suffix=TEMP_SUFFIX,
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


def is_orphan(path: Path) -> bool:
    """Whether ``path`` is a temporary file of :func:`atomic_write_bytes` (its name, a regular file, ours)."""
    if not ORPHAN_NAME.fullmatch(path.name):
        return False
    try:
        info = path.lstat()
    except OSError:
        return False
    return stat.S_ISREG(info.st_mode) and info.st_uid == os.getuid()


def remove_orphans(folder: str | Path) -> list[Path]:
    """Delete the temporary files of :func:`atomic_write_bytes` that a killed process left in ``folder`` and
    its sub-folders (never following links, never in a sub-folder holding its own lock: another run's
    folder). Only files named as ours (:func:`is_orphan`) go: another tool's ``.x.tmp`` stays. Only call it
    while holding the folder's lock; returns what was removed."""
    removed = []
    folder = Path(folder)
    pending = [folder]
    while pending:
        current = pending.pop()
        for path in current.iterdir():
            if path.is_dir() and not path.is_symlink():
                if not os.path.lexists(path / LOCK_NAME):
                    pending.append(path)
            elif is_orphan(path):
                path.unlink(missing_ok=True)
                removed.append(path)
    return removed


def staging_folder(target: str | Path) -> Path:
    """A new empty folder beside ``target`` (same file system, so it can be renamed onto it), named as ours."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=STAGING_SUFFIX, dir=target.parent))


def remove_stale_staging(folder: str | Path, name: str | None = None) -> list[Path]:
    """Delete the staging folders a killed publish/report left directly in ``folder`` (ours by name, for
    target ``name`` when given; real folders, never followed links). Only call it while holding the lock
    that covers them."""
    removed = []
    folder = Path(folder)
    if not folder.is_dir():
        return removed
    for path in folder.iterdir():
        if (STAGING_NAME.fullmatch(path.name) and (name is None or path.name.startswith(f".{name}."))
                and path.is_dir() and not path.is_symlink()):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _exchange(first: Path, second: Path) -> bool:
    """Swap two paths atomically (Linux ``renameat2`` with ``RENAME_EXCHANGE``); ``False`` where the
    platform or the file system cannot."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError, TypeError):  # no renameat2 (macOS), no libc handle (Windows)
        return False
    renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    if renameat2(_AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second), _RENAME_EXCHANGE) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(code, os.strerror(code), str(first), None, str(second))


def replace_folder(staged: str | Path, target: str | Path) -> None:
    """Put the folder ``staged`` at ``target`` in one rename, then delete the folder it replaced.

    Where ``target`` exists, the two are swapped with ``RENAME_EXCHANGE``; where the platform cannot, the old
    folder is first renamed aside (a kill between the two renames leaves ``target`` missing, never mixed).
    The replaced folder goes to ``staged``'s name, which :func:`remove_stale_staging` recognises if a kill
    stops its deletion."""
    staged, target = Path(staged), Path(target)
    if target.is_symlink():
        raise UnsafeOutputPath(f"{target} is a symbolic link (to {os.readlink(target)}); medheval replaces only real "
                               "folders: remove the link, or choose another folder")
    if not os.path.lexists(target):
        os.rename(staged, target)
    elif not _exchange(staged, target):
        aside = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=STAGING_SUFFIX, dir=target.parent))
        os.rename(target, aside / "old")
        os.rename(staged, target)
        staged = aside
    _fsync_dir(target.parent)
    shutil.rmtree(staged, ignore_errors=True)


class OutputLock:
    """Exclusive lock on an output folder for the life of a run (a context manager).

    Args:
        folder: the output folder (created if needed).
        timeout: seconds to wait for another run to release the folder; ``0`` refuses at once.
        poll: seconds between attempts while waiting.
        purpose: what the holder does, for the refusal's message (``"run"``, ``"publish"``, ``"report"``).
    """

    REASONS = {"run": "Two runs into one folder would duplicate every record",
               "publish": "Two publishes into one folder would mix their repo folders and publish.json",
               "report": "Two reports into one folder would replace each other's files"}

    def __init__(self, folder: str | Path, timeout: float = 0.0, poll: float = 0.5, purpose: str = "run") -> None:
        self.folder = Path(folder)
        self.purpose = purpose
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
        deadline = time.monotonic() + self.timeout
        while True:
            handle = os.fdopen(open_owned(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND), "a+", encoding="utf-8")
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    holder = self._holder()
                    handle.close()
                    waited = f" after waiting {self.timeout:g} s" if self.timeout > 0 else ""
                    reason = self.REASONS.get(self.purpose, self.REASONS["run"])
                    raise OutputFolderLocked(
                        f"{self.folder} is in use by another {self.purpose} ({holder}){waited}. {reason}: wait for "
                        f"it to finish (or pass --lock-timeout SECONDS to wait), or choose another folder."
                    ) from None
                handle.close()
                time.sleep(self.poll)
                continue
            if self._still_the_lock_file(handle):
                break
            handle.close()  # the folder was replaced whole while we waited (a report): lock the new one
        handle.seek(0)
        handle.truncate()
        handle.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                                 "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}))
        handle.flush()
        self._handle = handle
        _HELD.add(os.path.abspath(self.folder))
        self.removed_orphans = remove_orphans(self.folder)
        return self

    def _still_the_lock_file(self, handle: IO[str]) -> bool:
        """Whether the file locked is still ``<folder>/.medheval.lock`` (a report's folder is replaced whole)."""
        try:
            now = os.stat(self.path, follow_symlinks=False)
        except FileNotFoundError:
            return False
        held = os.fstat(handle.fileno())
        return (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino)

    def release(self) -> None:
        if self._handle is not None:
            _HELD.discard(os.path.abspath(self.folder))
            fcntl.flock(self._handle.fileno(), fcntl.LOCK_UN)
            self._handle.close()
            self._handle = None

    def __enter__(self) -> "OutputLock":
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
