"""Finds the project's units by name: ``datasets/<name>/``, ``metrics/<name>/``, ``mitigations/<name>/``.

``datasets/`` and ``metrics/`` are deliberately not Python packages (a package named
``datasets`` would shadow the library), so their modules are loaded by path and
registered in ``sys.modules`` under ``medheval_units.<kind>.<name>`` (datasets needs a
builder's module to be importable by name).
"""

from __future__ import annotations

import difflib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

UNIT_KINDS = ("datasets", "metrics", "mitigations")


def project_root() -> Path:
    """The folder holding ``datasets/``, ``metrics/``, ``mitigations/`` (``$MEDHEVAL_HOME`` overrides)."""
    override = os.environ.get("MEDHEVAL_HOME")
    if override:
        return Path(override)
    return Path(__file__).resolve().parent.parent


def list_units(kind: str) -> list[str]:
    """Names of the units of one kind (folders holding ``<name>.py`` or ``custom_generate/``)."""
    if kind not in UNIT_KINDS:
        raise ValueError(f"unknown unit kind {kind!r}; expected one of {UNIT_KINDS}")
    folder = project_root() / kind
    if not folder.is_dir():
        return []
    return sorted(
        entry.name
        for entry in folder.iterdir()
        if (entry / f"{entry.name}.py").is_file() or (entry / "custom_generate").is_dir()
    )


def unit_dir(kind: str, name: str) -> Path:
    """The folder of one unit; a clear error (with close matches) for an unknown name."""
    names = list_units(kind)
    if name not in names:
        close = difflib.get_close_matches(name, names, n=3)
        hint = f" Did you mean {', '.join(close)}?" if close else ""
        raise KeyError(
            f"unknown {kind[:-1]} {name!r}.{hint} Available: {', '.join(names) or '(none)'}"
            f" (looked in {project_root() / kind})"
        )
    return project_root() / kind / name


def load_unit_module(kind: str, name: str) -> ModuleType:
    """Import ``<kind>/<name>/<name>.py`` by path, once, registered under a stable module name."""
    module_name = f"medheval_units.{kind}.{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    path = unit_dir(kind, name) / f"{name}.py"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[module_name]
        raise
    return module


def metric_path(name: str) -> str:
    """Local path of a metric module, for ``evaluate.load``."""
    return str(unit_dir("metrics", name))
