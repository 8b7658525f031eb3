"""Pinned annotation downloads: ``URL@commit`` + sha256, a local override, an offline cache.

A builder declares its upstream files as :class:`PinnedFile` objects. :func:`fetch`
returns a local path, in this order:

0. ``folder_env`` given and that environment variable set: ``$<folder_env>/<relpath>`` (a local
   copy of the upstream repository), and only there; checked as ``data_dir`` is.
1. ``data_dir`` given: ``data_dir/<relpath>`` (a local copy of the upstream folder).
   Its sha256 is computed and returned so results can record which bytes were used;
   a mismatch with the pin is reported (``verified=False``), not an error, because
   users may evaluate on a patched copy on purpose (but a builder refuses another config's pinned file:
   :meth:`medheval.data.builders.PinnedFilesBuilder.fetch_file`). With ``data_dir_optional`` a
   ``data_dir`` without the file is passed over (the next places are tried), else it is an error.
2. the cache (``$MEDHEVAL_CACHE`` or ``~/.cache/medheval/annotations``), when the
   cached file's sha256 matches the pin;
3. a download from ``url`` into the cache, verified against the pin (a mismatch is an
   error and nothing is kept).

Offline (no network, or ``HF_HUB_OFFLINE``/``MEDHEVAL_OFFLINE`` set) the error names the
file, the URL and where to put a local copy.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import requests

from medheval.net import transport
from medheval.run.outputs import atomic_write_bytes

_TRUTHY = {"1", "true", "yes", "on"}
MAX_DOWNLOAD_BYTES = 512 * 2**20  # one pinned upstream file (the largest annotation file is a few MB)
DOWNLOAD_DEADLINE = 900.0  # seconds for one whole download



# A data_dir holding this file is the embedded fixture (synthetic records written by code, in the real
# file formats): its files differ from the pins by design, and runs say so once instead of per file.
FIXTURE_MARKER = ".medheval-fixture"

class AnnotationUnavailable(FileNotFoundError):
    """An annotation file is neither in ``data_dir``, nor cached, nor downloadable."""


class AnotherConfigsFile(AnnotationUnavailable):
    """A ``data_dir`` file holds the pinned bytes of another config that reads the same relative path."""


class ChecksumMismatch(ValueError):
    """A downloaded file does not have the pinned sha256."""


@dataclass(frozen=True)
class PinnedFile:
    """One upstream file: path relative to the upstream data folder, URL, sha256."""

    relpath: str
    url: str
    sha256: str


@dataclass(frozen=True)
class FetchedFile:
    """Where a pinned file was found, and whether its bytes match the pin."""

    path: Path
    sha256: str
    verified: bool
    origin: str  # "data_dir" | "cache" | "download"


def sha256_of(path: str | Path, chunk_size: int = 1 << 20) -> str:
    """Hex sha256 of a file, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(chunk_size), b""):
            digest.update(block)
    return digest.hexdigest()


def default_cache_dir() -> Path:
    """``$MEDHEVAL_CACHE/annotations`` or ``~/.cache/medheval/annotations``."""
    base = os.environ.get("MEDHEVAL_CACHE") or os.path.join(Path.home(), ".cache", "medheval")
    return Path(base) / "annotations"


def offline() -> bool:
    """True when the user asked for no network access."""
    return any(
        os.environ.get(name, "").strip().lower() in _TRUTHY
        for name in ("MEDHEVAL_OFFLINE", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
    )


def _cache_path(pinned: PinnedFile, cache_dir: Path) -> Path:
    return cache_dir / pinned.sha256[:16] / Path(pinned.relpath).name


def _unavailable(pinned: PinnedFile, reason: str, what: str = "annotation file",
                 fix: str | None = None, looked: list[str] | None = None) -> AnnotationUnavailable:
    fix = fix or (f"download it and pass data_dir=<folder> (or --data-dir) where <folder>/{pinned.relpath} exists, "
                  f"or allow network access to fetch it once into the cache.")
    return AnnotationUnavailable(
        f"{what} {pinned.relpath!r} is not available ({reason}).\n"
        f"  upstream URL: {pinned.url}\n"
        f"  expected sha256: {pinned.sha256}\n"
        f"  fix: {fix}" + (f"\n  looked in: {'; '.join(looked)}" if looked else "")
    )


def _local(pinned: PinnedFile, path: Path) -> FetchedFile:
    digest = sha256_of(path)
    return FetchedFile(path, digest, digest == pinned.sha256, "data_dir")


def _not_in_data_dir(pinned: PinnedFile, data_dir: Path) -> AnnotationUnavailable:
    below = [child for child in sorted(data_dir.iterdir()) if (child / pinned.relpath).is_file()] \
        if data_dir.is_dir() else []
    if below:  # one level too high (e.g. the demo's fixture_data/ instead of fixture_data/benchmark_data/)
        return AnnotationUnavailable(f"data_dir={str(data_dir)!r} has no file {pinned.relpath!r}, but its "
                                     f"subfolder {below[0]} has: pass --data-dir {below[0]}")
    return AnnotationUnavailable(
        f"data_dir={str(data_dir)!r} has no file {pinned.relpath!r} (looked at {data_dir / pinned.relpath}).\n"
        f"  data_dir must be a local copy of the upstream folder with the same relative paths;"
        f" the file's upstream URL is {pinned.url}"
    )


def fetch(
    pinned: PinnedFile,
    data_dir: str | Path | None = None,
    cache_dir: str | Path | None = None,
    timeout: float = 60.0,
    what: str = "annotation file",
    fix: str | None = None,
    folder_env: str | None = None,
    data_dir_optional: bool = False,
) -> FetchedFile:
    """Return a local copy of ``pinned`` (see the module docstring for the order); ``what`` and ``fix`` word the
    error when it cannot be had (default: an annotation file, fixed with ``--data-dir``), which also lists the
    places looked in."""
    folder = os.environ.get(folder_env, "").strip() if folder_env else ""
    if folder:
        local = Path(folder) / pinned.relpath
        if not local.is_file():
            raise _unavailable(pinned, f"not in ${folder_env}={folder}, looked at {local}", what, fix)
        return _local(pinned, local)
    looked = [f"${folder_env} (not set)"] if folder_env else []
    if data_dir is not None:
        local = Path(data_dir) / pinned.relpath
        if local.is_file():
            return _local(pinned, local)
        if not data_dir_optional:
            raise _not_in_data_dir(pinned, Path(data_dir))
        looked.append(f"{local} (the data folder: absent)")
    cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    looked.append(f"the cache {cache}")
    cached = _cache_path(pinned, cache)
    if cached.is_file() and sha256_of(cached) == pinned.sha256:
        return FetchedFile(cached, pinned.sha256, True, "cache")
    if offline():
        raise _unavailable(pinned, "offline mode is set and the file is not cached", what, fix, looked)
    try:  # the one outbound policy (medheval.net.transport): same-origin redirects, a deadline, a size cap
        response = transport.request(transport.session_for(pinned.url, credentialed=False), "GET", pinned.url,
                                     timeout=timeout, deadline=DOWNLOAD_DEADLINE, max_bytes=MAX_DOWNLOAD_BYTES)
        if response.status_code >= 400:
            raise requests.HTTPError(f"HTTP {response.status_code} for url: {pinned.url}")
    except (requests.RequestException, transport.TransportError) as error:
        raise _unavailable(pinned, f"download failed: {type(error).__name__}: {error}", what, fix, looked) from error
    digest = hashlib.sha256(response.content).hexdigest()
    if digest != pinned.sha256:
        raise ChecksumMismatch(
            f"downloaded {pinned.url} has sha256 {digest}, expected {pinned.sha256}; nothing was cached."
        )
    atomic_write_bytes(cached, response.content)
    return FetchedFile(cached, digest, True, "download")
