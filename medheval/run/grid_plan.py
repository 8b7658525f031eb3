"""A grid's plan: every cell it will run, recorded in ``<output>/grid.json`` before the first cell starts.

``grid.json`` holds the grid's axes (``models``, ``mitigations``, ``controls``; seeds are in ``seeds.json``,
:mod:`medheval.run.seeds`) and, under ``"plan"``, one entry per cell: the run folder it writes (relative to
the grid folder), its model, mitigation spec, image control, sampling seed and benchmarks::

    {"controls": ["none"], "mitigations": ["none", "vcd"], "models": ["org/a"],
     "plan": {"cells": [{"folder": "org__a/none", "model": "org/a", "mitigation": "none",
                         "control": "none", "seed": null, "benchmarks": ["mm_vishal"]}, ...]}}

A resume over the same axes keeps the plan (or records it in a grid folder written before plans were, or
after the benchmarks changed, which a resume allows); one over other axes is refused, as before plans
existed, and so is one whose plan has other cells (another ``protocol`` adding method options, other seeds),
before anything is written. ``medheval report`` reads the plan (:func:`read_plan`) to name the cells of an
interrupted grid that never started. Only the main process of a data-parallel launch writes the file.

A config grid (:func:`medheval.run.grids.run_config`) writes the plan of all its cells in its output folder,
and each model's folder, a command-line grid of its own (:func:`medheval.run.runner.run_grid`: its own
lock, combined results and resume), keeps its own ``grid.json`` too. That inner plan is not redundant:
``medheval report <output>/<model>`` reads it to name the model's cells that never started (without it, the
folder's lock alone says only that cells may be missing); the file's axes guard a resume of that folder on
its own, as before plans. The report of the whole grid reads only the outermost plan, so no cell is counted
twice.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Mapping, Sequence

from medheval.run.control import cell_slug
from medheval.run.protocol import RunError
from medheval.run.seeds import seed_folder

GRID_FILE = "grid.json"
PLAN_KEY = "plan"


def mitigation_slug(spec: str) -> str:
    """A folder name for one mitigation spec (``vcd:alpha=1`` -> ``vcd_alpha-1``)."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "_", spec.replace("=", "-")).strip("_")
    return slug if slug not in ("", ".", "..") else "none"  # never the grid folder itself or its parent


def cell_folder(mitigation: str, control: str, seed: int | None) -> str:
    """The sub-folder one cell of a grid writes: its mitigation's slug, ``__<control>`` when blind,
    ``__seed-<s>`` for a pass of ``--seeds``."""
    return seed_folder(cell_slug(mitigation_slug(mitigation), control), seed)


@dataclass(frozen=True)
class PlannedCell:
    """One cell of a grid's plan: the run folder it writes (relative to the grid folder) and its axes."""

    folder: str
    model: str
    mitigation: str
    control: str = "none"
    seed: int | None = None
    benchmarks: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The cell as ``grid.json`` records it."""
        return {"folder": self.folder, "model": self.model, "mitigation": self.mitigation, "control": self.control,
                "seed": self.seed, "benchmarks": list(self.benchmarks)}

    @classmethod
    def from_json(cls, data: Any) -> "PlannedCell":
        """A cell read back from ``grid.json``; ``ValueError`` for an entry of another shape or a folder that
        is not a relative path inside the grid (an edited file)."""
        if not isinstance(data, dict):
            raise ValueError(f"a plan cell is a JSON object, got {type(data).__name__}")
        folder, model, mitigation = data.get("folder"), data.get("model"), data.get("mitigation")
        control, seed, benchmarks = data.get("control", "none"), data.get("seed"), data.get("benchmarks", [])
        if not all(isinstance(value, str) and value for value in (folder, model, mitigation, control)):
            raise ValueError("a plan cell needs non-empty folder, model, mitigation and control strings")
        parts = PurePosixPath(folder).parts
        if PurePosixPath(folder).is_absolute() or ".." in parts or "\\" in folder or not parts:
            raise ValueError(f"plan cell folder {folder!r} is not a relative folder inside the grid")
        if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
            raise ValueError(f"plan cell seed {seed!r} is not an integer")
        if not isinstance(benchmarks, list) or not all(isinstance(name, str) for name in benchmarks):
            raise ValueError("plan cell benchmarks are not a list of names")
        return cls(folder=folder, model=model, mitigation=mitigation, control=control, seed=seed,
                   benchmarks=tuple(benchmarks))


def plan_cells(model: str, benchmarks: Sequence[str], mitigations: Sequence[str], controls: Sequence[str],
               seeds: Sequence[int] | None = None, prefix: str = "") -> list[PlannedCell]:
    """One model's cells in the order a grid runs them (mitigation × control × seed), each in its own
    sub-folder when there are several or seeds (else the model's folder itself, ``prefix`` or ``.``);
    ``mitigations`` are the specs the runs record (``settings.mitigation``); ``prefix`` is the model's
    folder inside a config grid."""
    combos = [(label, control, seed) for label in mitigations for control in controls for seed in (seeds or [None])]
    several = len(combos) > 1 or bool(seeds)
    cells = []
    for label, control, seed in combos:
        own = cell_folder(label, control, seed) if several else ""
        folder = "/".join(part for part in (prefix, own) if part) or "."
        cells.append(PlannedCell(folder=folder, model=model, mitigation=label, control=control, seed=seed,
                                 benchmarks=tuple(benchmarks)))
    return cells


def changes(before: Mapping[str, Any], now: Mapping[str, Any], show: Callable[[Any], str]) -> list[str]:
    """``"key old → new"`` for every key whose value differs between ``before`` and ``now`` (absent = ``None``),
    each value written by ``show``."""
    return [f"{key} {show(before.get(key))} → {show(now.get(key))}"
            for key in sorted(set(before) | set(now)) if before.get(key) != now.get(key)]


def record_plan(output: str | Path, axes: Mapping[str, Sequence[str]], cells: Sequence[PlannedCell]) -> None:
    """Write ``<output>/grid.json`` (the axes and the plan of ``cells``) atomically before a grid's first cell.

    A folder holding a grid over other axes, or whose recorded plan has other cells over the same axes (another
    protocol's method options, other seeds, another model), is refused (:class:`RunError`; its combined results
    would gain or lose cells) and its file is left as it is; otherwise the recorded plan is kept when it is this
    one, else replaced by it (a grid folder from before plans were recorded, or a resume with other benchmarks)."""
    from medheval.run.outputs import atomic_write_text

    from medheval.net.secrets import redact

    path = Path(output) / GRID_FILE
    wanted = {**{name: list(values) for name, values in axes.items()},
              PLAN_KEY: {"cells": [cell.to_json() for cell in cells]}}
    if path.exists():
        recorded = json.loads(path.read_text(encoding="utf-8"))
        # the file was written redacted (a key in a model's URL reads ***): compared with this plan as it would be
        # written, else a grid whose model URL holds a key is refused on every resume ("changed: models X → X")
        wanted = json.loads(redact(json.dumps(wanted)))
        cells = _plan_of(wanted) or cells
        changed = changes({k: v for k, v in recorded.items() if k != PLAN_KEY},
                          {k: v for k, v in wanted.items() if k != PLAN_KEY},
                          lambda values: ", ".join(map(str, values or [])))
        if changed:
            raise RunError(f"{output} holds a grid over other axes ({GRID_FILE}; changed: {'; '.join(changed)}): its "
                           f"combined results would gain or lose cells. Re-run with the same axes (the cell folders "
                           f"resume), or choose another --output folder.")
        if recorded == wanted:
            return
        moved = _moved_cells(_plan_of(recorded), cells)
        if moved:
            raise RunError(f"{output} holds a grid whose plan ({GRID_FILE}) has other cells over the same axes "
                           f"({moved}): another model, --protocol or --seeds than it was started with. Re-run with "
                           f"those (the cell folders resume), or choose another --output folder.")
    Path(output).mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(wanted, indent=1, sort_keys=True))


def read_plan(folder: str | Path) -> list[PlannedCell] | None:
    """The cells ``<folder>/grid.json`` plans, or ``None`` when it has no plan (no file, a grid written before
    plans were recorded, or a file that does not read as one: the report then says what it said before)."""
    try:
        return _plan_of(json.loads((Path(folder) / GRID_FILE).read_text(encoding="utf-8")))
    except (OSError, ValueError):
        return None


def _plan_of(data: Any) -> list[PlannedCell] | None:
    """The cells a parsed ``grid.json`` plans, or ``None`` when it holds no plan that reads as one."""
    try:
        cells = data[PLAN_KEY]["cells"]
        if not isinstance(cells, list) or not cells:
            return None
        return [PlannedCell.from_json(cell) for cell in cells]
    except (ValueError, KeyError, TypeError):
        return None


def _moved_cells(recorded: Sequence[PlannedCell] | None, cells: Sequence[PlannedCell]) -> str | None:
    """How the ``recorded`` plan's cells differ from ``cells`` in anything but their benchmarks (which a resume
    may change), ``"planned: … ; now: …"`` by folder; ``None`` when they do not (or nothing was planned)."""
    if recorded is None:
        return None
    before, now = ({replace(cell, benchmarks=()) for cell in group} for group in (recorded, cells))
    if before == now:
        return None

    def named(group: set[PlannedCell]) -> str:
        return ", ".join(sorted(f"{cell.folder} ({cell.model} · {cell.mitigation})" for cell in group)) or "none"

    return f"planned: {named(before - now)}; now: {named(now - before)}"


__all__ = ["GRID_FILE", "PLAN_KEY", "PlannedCell", "cell_folder", "mitigation_slug", "plan_cells", "read_plan",
           "record_plan"]
