"""The software stack a result was made with, and the stack this release was tested on.

Mitigation outputs depend on transformers' generation internals and on torch's kernels, so every
run records its stack (``run.json``, ``results.json``, the report), a run on a stack newer than the
tested one warns once (``medheval selftest`` checks the installed stack in under a minute), and a
run resumed under another transformers or torch warns, naming both versions.

``TESTED`` is the stack of ``requirements/lock.txt``, on which the whole suite is green (a test keeps
the two equal); ``OLDEST_TESTED`` holds the lower bounds of ``setup.cfg``, on which ``make test-oldest``
runs the decoding and mitigation tests and the self-test.
"""

from __future__ import annotations

import platform
import re
import sys
from importlib import metadata
from typing import Mapping

# the packages a result's numbers can depend on (recorded with every run)
STACK_PACKAGES = ("transformers", "torch", "datasets", "evaluate", "huggingface_hub")
# newer than tested -> the runner warns (these move decoding outputs and data loading)
WATCHED_PACKAGES = ("transformers", "torch", "datasets")
# a resumed run under another version of these may give other outputs
OUTPUT_PACKAGES = ("transformers", "torch")

TESTED = {
    "transformers": "5.24.0",
    "torch": "2.13.0",
    "datasets": "5.2.0",
    "evaluate": "0.4.6",
    "huggingface_hub": "2.4.0",
}
OLDEST_TESTED = {
    "transformers": "5.18.0",
    "torch": "2.13.0",
    "datasets": "5.0.0",
    "evaluate": "0.4.0",
    "huggingface_hub": "1.31.0",
}


def installed_version(package: str) -> str | None:
    """The installed distribution's version (``None`` if it is not installed)."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def stack_versions() -> dict[str, str | None]:
    """``{"medheval": ..., "python": ..., "transformers": ..., "torch": ..., ...}`` of this process."""
    from medheval import __version__

    versions: dict[str, str | None] = {"medheval": __version__, "python": platform.python_version()}
    for package in STACK_PACKAGES:
        versions[package] = installed_version(package)
    return versions


def release(version: str) -> tuple[int, ...]:
    """``"2.13.0+cpu"`` -> ``(2, 13, 0)``: the numeric release, without local or pre-release tags."""
    match = re.match(r"\s*v?(\d+(?:\.\d+)*)", version or "")
    if not match:
        raise ValueError(f"not a version: {version!r}")
    parts = [int(p) for p in match.group(1).split(".")]
    while len(parts) > 1 and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


def newer_than_tested(versions: Mapping[str, str | None] | None = None) -> list[tuple[str, str, str]]:
    """``(package, installed, newest tested)`` for each watched package newer than :data:`TESTED`."""
    versions = stack_versions() if versions is None else versions
    newer = []
    for package in WATCHED_PACKAGES:
        installed = versions.get(package)
        if installed and release(installed) > release(TESTED[package]):
            newer.append((package, installed, TESTED[package]))
    return newer


_warned_newer = False


def warn_if_newer_than_tested(versions: Mapping[str, str | None] | None = None, stream=None) -> str | None:
    """Print one warning per process when a watched package is newer than tested; returns its text."""
    global _warned_newer
    newer = newer_than_tested(versions)
    if not newer or _warned_newer:
        return None
    _warned_newer = True
    listed = ", ".join(f"{package} {installed} (tested up to {tested})" for package, installed, tested in newer)
    text = (f"{listed} is newer than this medheval release was tested with; mitigation outputs may differ. "
            "Run `medheval selftest` (under a minute) to check the decoding invariants on this stack.")
    print(f"warning: {text}", file=stream if stream is not None else sys.stderr)
    return text


def changed_output_packages(before: Mapping[str, str | None], after: Mapping[str, str | None]) -> list[tuple[str, str, str]]:
    """``(package, before, after)`` for each of :data:`OUTPUT_PACKAGES` whose version differs (both known)."""
    changed = []
    for package in OUTPUT_PACKAGES:
        old, new = before.get(package), after.get(package)
        if old and new and old != new:
            changed.append((package, str(old), str(new)))
    return changed


__all__ = [
    "OLDEST_TESTED",
    "OUTPUT_PACKAGES",
    "STACK_PACKAGES",
    "TESTED",
    "WATCHED_PACKAGES",
    "changed_output_packages",
    "installed_version",
    "newer_than_tested",
    "release",
    "stack_versions",
    "warn_if_newer_than_tested",
]
