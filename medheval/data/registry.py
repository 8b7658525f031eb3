"""Finds the project's units by name: ``datasets/<name>/``, ``metrics/<name>/``, ``mitigations/<name>/``.

``datasets/`` and ``metrics/`` are deliberately not Python packages (a package named
``datasets`` would shadow the library), so their modules are loaded by path and
registered in ``sys.modules`` under ``medheval_units.<kind>.<name>`` (datasets needs a
builder's module to be importable by name).

Where the units live: ``$MEDHEVAL_HOME`` when set; else ``medheval/units/`` inside an installed
wheel (the build copies the three top-level folders there, see ``setup.py``); else the source
checkout holding ``medheval/`` (editable installs, ``PYTHONPATH=.``). Finding no units at all is
an error, never an empty listing.
"""

from __future__ import annotations

import difflib
import importlib.util
import os
import sys
from pathlib import Path
from types import ModuleType

UNIT_KINDS = ("datasets", "metrics", "mitigations")


PACKAGE = Path(__file__).resolve().parents[1]  # the installed ``medheval/`` folder
PACKAGED_UNITS = PACKAGE / "units"
SOURCE_CHECKOUT = PACKAGE.parent


class NoUnitsError(RuntimeError):
    """The registry found no unit folders: a broken install or a wrong ``$MEDHEVAL_HOME``."""


def _is_checkout(folder: Path) -> bool:
    # the folder above ``medheval/`` in a non-editable install is site-packages, which holds HF's
    # own ``datasets`` package: only a folder with this project's packaging files is a checkout
    return (folder / "setup.cfg").is_file() and all((folder / kind).is_dir() for kind in UNIT_KINDS)


def project_root() -> Path:
    """The folder holding ``datasets/``, ``metrics/``, ``mitigations/``: ``$MEDHEVAL_HOME``, the
    installed package's ``medheval/units/``, or the source checkout; :class:`NoUnitsError` if none."""
    override = os.environ.get("MEDHEVAL_HOME")
    if override:
        return Path(override)
    if PACKAGED_UNITS.is_dir():
        return PACKAGED_UNITS
    if _is_checkout(SOURCE_CHECKOUT):
        return SOURCE_CHECKOUT
    raise NoUnitsError(
        f"medheval found no unit folders: neither {PACKAGED_UNITS} (installed wheel) nor a source checkout at "
        f"{SOURCE_CHECKOUT}. Reinstall the package (pip install medheval) or set MEDHEVAL_HOME to a folder "
        "holding datasets/, metrics/ and mitigations/."
    )


def list_units(kind: str) -> list[str]:
    """Names of the units of one kind (folders holding ``<name>.py`` or ``custom_generate/``);
    :class:`NoUnitsError` when there are none."""
    if kind not in UNIT_KINDS:
        raise ValueError(f"unknown unit kind {kind!r}; expected one of {UNIT_KINDS}")
    folder = project_root() / kind
    names = sorted(
        entry.name
        for entry in (folder.iterdir() if folder.is_dir() else ())
        if (entry / f"{entry.name}.py").is_file() or (entry / "custom_generate" / "generate.py").is_file()
    )
    if not names:
        raise NoUnitsError(
            f"no {kind} units in {folder} (each is a folder <name>/ holding <name>.py or custom_generate/generate.py)."
            " Reinstall the package, or point MEDHEVAL_HOME at a folder holding datasets/, metrics/, mitigations/."
        )
    return names


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
