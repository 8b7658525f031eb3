"""A grid's plan (``grid.json``, :mod:`medheval.run.grid_plan`): every cell and the folder it writes, recorded
before the first cell starts, kept on a resume over the same axes; ``medheval report`` counts the cells of an
interrupted grid and names each that did not finish once (never started: in the plan's caveat; started: as an
incomplete run); a grid.json written before plans were recorded reports as it did."""

from __future__ import annotations

import argparse
import json
import re
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from report_runs import write_grid
from medheval.report.build import write_report
from medheval.report.collect import ReportError, find_runs, plan_progress, planned_grid
from medheval.run import distributed, grids, runner
from medheval.run.distributed import Group
from medheval.run.grid_plan import GRID_FILE, PlannedCell, plan_cells, read_plan, record_plan
from medheval.run.grids import grid_plan, parse_grid_config, run_config
from medheval.run.protocol import RunError

TINY = "tiny-random-llava"
MODELS = ["org/model-a", "org/model-b"]
VCD = "vcd:alpha=0"
RESUME = "re-run the same `medheval run` command to resume"


class Interrupted(Exception):
    """Stands for a kill between two cells."""


def _config(fixture: dict, out: Path, mitigations: list[str] | None = None) -> grids.GridConfig:
    return parse_grid_config({"output": str(out), "models": MODELS, "benchmarks": ["context"], "limit": 2,
                              "mitigations": mitigations or ["none", VCD], "data_dir": fixture["data_dir"],
                              "image_roots": dict(fixture["image_roots"]), "generation": {"defaults": {
                                  "max_new_tokens": 2}}}, "grid.yaml")


def _tiny_as_named(args: argparse.Namespace):
    """The tiny random model answering under the grid's model name (two "models" without a download)."""
    from medheval.run.options import build_backend

    backend, labels = build_backend(argparse.Namespace(**{**vars(args), "model": TINY}))
    backend.name = args.model
    return backend, labels


@pytest.fixture
def interrupted(fixture_benchmark, tmp_path, monkeypatch) -> Path:
    """A 2 models × 2 mitigations grid stopped after its first cell (model-a · none) finished."""
    monkeypatch.setattr(grids, "check_model", lambda model: None)
    real_run, calls = runner.run, []

    def stop_after_first(*args, **kwargs):
        if calls:
            raise Interrupted("killed between cells")
        calls.append(1)
        return real_run(*args, **kwargs)

    monkeypatch.setattr(runner, "run", stop_after_first)
    out = tmp_path / "grid"
    with pytest.raises(Interrupted):
        run_config(_config(fixture_benchmark, out), build_backend=_tiny_as_named)
    monkeypatch.setattr(runner, "run", real_run)
    return out


def _caveats(written: dict) -> list[str]:
    markdown = Path(written["markdown"]).read_text()
    if "## Caveats" not in markdown:
        return []
    section = markdown.split("## Caveats")[1].split("\n## ")[0]
    return [line[2:] for line in section.splitlines() if line.startswith("- ")]


# -- the plan in grid.json -------------------------------------------------------------------------------------
def test_the_plan_is_every_cell_with_its_folder(fixture_benchmark, tmp_path):
    cells = grid_plan(_config(fixture_benchmark, tmp_path / "g"))
    vcd = cells[1].mitigation
    assert vcd.startswith("vcd:") and [cell.folder for cell in cells] == [
        "org__model-a/none", f"org__model-a/{runner.mitigation_slug(vcd)}", "org__model-b/none",
        f"org__model-b/{runner.mitigation_slug(vcd)}"]
    assert [(c.model, c.mitigation, c.control, c.seed, c.benchmarks) for c in cells] == [
        (model, label, "none", None, ("context",)) for model in MODELS for label in ("none", vcd)]
    one = grid_plan(_config(fixture_benchmark, tmp_path / "g", mitigations=["none"]))
    assert [cell.folder for cell in one] == ["org__model-a", "org__model-b"]  # one cell per model: its folder
    seeded = plan_cells("m", ["context"], ["none"], ["none", "no_image"], [0, 1], "m")
    assert [cell.folder for cell in seeded] == ["m/none__seed-0", "m/none__seed-1", "m/none__no_image__seed-0",
                                                "m/none__no_image__seed-1"]


def test_same_axes_keep_the_plan_other_axes_are_refused_and_an_old_file_gets_one(tmp_path):
    axes = {"mitigations": ["none", "vcd"], "controls": ["none"]}
    cells = plan_cells("m", ["context"], ["none", "vcd"], ["none"])
    record_plan(tmp_path, axes, cells)
    path = tmp_path / GRID_FILE
    written = path.read_text()
    assert read_plan(tmp_path) == cells and json.loads(written)["mitigations"] == ["none", "vcd"]
    stamp = path.stat().st_mtime_ns
    record_plan(tmp_path, axes, cells)  # a resume over the same axes
    assert path.read_text() == written and path.stat().st_mtime_ns == stamp
    with pytest.raises(RunError, match=re.escape("holds a grid over other axes (grid.json; changed: mitigations "
                                                 "none, vcd → none)")):
        record_plan(tmp_path, {**axes, "mitigations": ["none"]}, cells[:1])
    assert path.read_text() == written
    path.write_text(json.dumps(axes))  # written before plans were recorded
    assert read_plan(tmp_path) is None
    record_plan(tmp_path, axes, cells)
    assert read_plan(tmp_path) == cells


def test_another_protocol_over_the_same_axes_is_refused_before_anything_is_written(fixture_benchmark, tmp_path,
                                                                                   monkeypatch):
    """medheval-mitigation adds avisc's options: the same axes plan other cells. Resumed under clean, the grid
    is refused before its plan (or a model folder's) changes, not after the plan was replaced."""
    monkeypatch.setattr(grids, "check_model", lambda model: None)

    def killed(*args, **kwargs):
        raise Interrupted("killed as the first cell started")

    monkeypatch.setattr(runner, "run", killed)
    out = tmp_path / "grid"

    def config(protocol: str) -> grids.GridConfig:
        return parse_grid_config({"output": str(out), "models": MODELS, "benchmarks": ["context"],
                                  "mitigations": ["none", "avisc"], "protocol": protocol,
                                  "data_dir": fixture_benchmark["data_dir"],
                                  "image_roots": dict(fixture_benchmark["image_roots"])}, "grid.yaml")

    def run(protocol: str) -> None:
        run_config(config(protocol), build_backend=lambda args: (SimpleNamespace(name=args.model, needs_images=True),
                                                                 {}))

    def files() -> dict[Path, bytes]:
        return {path: path.read_bytes() for path in out.rglob("*") if path.is_file() and path.name != ".medheval.lock"}

    with pytest.raises(Interrupted):
        run("medheval-mitigation")
    written = files()
    assert sorted(path.relative_to(out).as_posix() for path in written) == [GRID_FILE, f"org__model-a/{GRID_FILE}"]
    planned, now = ([cell.folder for cell in grid_plan(config(protocol))] for protocol in ("medheval-mitigation",
                                                                                          "clean"))
    assert read_plan(out) == grid_plan(config("medheval-mitigation")) and now[1] != planned[1]
    with pytest.raises(RunError, match=f"{re.escape(str(out))} holds a grid whose plan \\(grid.json\\) has other "
                                       "cells over the same axes \\(planned: .*; now: .*\\): another model, "
                                       "--protocol or --seeds") as error:
        run("clean")
    assert all(folder in str(error.value) for folder in (planned[1], planned[3], now[1], now[3]))
    assert files() == written


@pytest.mark.parametrize("cell", [{"folder": "../elsewhere", "model": "m", "mitigation": "none"},
                                  {"folder": "/abs", "model": "m", "mitigation": "none"},
                                  {"folder": "x", "model": "m"}, "x"])
def test_an_edited_plan_is_no_plan(tmp_path, cell):
    (tmp_path / GRID_FILE).write_text(json.dumps({"mitigations": ["none"], "plan": {"cells": [cell]}}))
    assert read_plan(tmp_path) is None
    with pytest.raises(ValueError):
        PlannedCell.from_json(cell)


def test_the_plan_is_written_before_the_first_model_loads_and_only_by_the_main_process(fixture_benchmark, tmp_path,
                                                                                      monkeypatch):
    monkeypatch.setattr(grids, "check_model", lambda model: None)

    def no_model(args):
        raise Interrupted("killed while the first model loaded")

    other = Group(rank=1, world_size=2, gather=lambda status: [None, None])  # the second process of a launch
    monkeypatch.setattr(distributed, "group", lambda device=None: other)
    with pytest.raises(Interrupted):
        run_config(_config(fixture_benchmark, tmp_path / "rank1"), build_backend=no_model)
    assert not (tmp_path / "rank1" / GRID_FILE).exists()
    monkeypatch.undo()
    monkeypatch.setattr(grids, "check_model", lambda model: None)
    out = tmp_path / "main"
    with pytest.raises(Interrupted):
        run_config(_config(fixture_benchmark, out), build_backend=no_model)
    assert len(read_plan(out)) == 4 and sorted(p.name for p in out.iterdir()) == [".medheval.lock", GRID_FILE]
    with pytest.raises(ReportError) as error:  # nothing to show, but the report says what never started
        find_runs([out])
    assert "has 4 cell(s): 0 finished (in the report), 0 started but unfinished, 4 never started" in str(error.value)
    assert "org/model-a · none (org__model-a/none)" in str(error.value)


# -- the report ------------------------------------------------------------------------------------------------
def test_an_interrupted_grid_names_the_three_cells_that_never_started(interrupted, tmp_path):
    plan = read_plan(interrupted)
    assert len(plan) == 4 and (interrupted / plan[0].folder / "results.json").is_file()
    assert not any((interrupted / cell.folder).exists() for cell in plan[1:])
    progress = plan_progress(interrupted, plan)
    assert progress.finished == plan[:1] and progress.unfinished == [] and progress.never_started == plan[1:]
    slug = plan[1].folder.split("/")[1]
    names = f"org/model-a · vcd (medheval) (org__model-a/{slug}), org/model-b · none (org__model-b/none), " \
            f"org/model-b · vcd (medheval) (org__model-b/{slug})"
    line = (f"{interrupted}: grid without its combined results.json: it did not finish; its plan (grid.json) has 4 "
            f"cell(s): 1 finished (in the report), 0 started but unfinished, 3 never started; never started: "
            f"{names}; {RESUME}")
    written = write_report([interrupted], tmp_path / "report", plots=False)
    assert line in _caveats(written), "\n".join(_caveats(written))
    assert "Runs: `org/model-a · none`" in Path(written["markdown"]).read_text()
    assert line in json.loads(Path(written["json"]).read_text())["caveats"]
    page = Path(written["html"]).read_text()
    items = re.findall(r"<li>(.*?)</li>", page.split("<h2>Caveats")[1], flags=re.S)
    assert any("4 cell(s): 1 finished (in the report), 0 started but unfinished, 3 never started; never started: "
               "org/model-a · vcd" in item and "org/model-b · vcd" in item for item in items)



def test_a_model_folder_keeps_its_own_plan_for_its_own_report_and_the_grid_counts_only_its_own(interrupted):
    model = interrupted / "org__model-a"
    outer = read_plan(interrupted)
    assert [f"org__model-a/{cell.folder}" for cell in read_plan(model)] == [cell.folder for cell in outer[:2]]
    notes = find_runs([interrupted])[0].notes  # the whole grid: its own plan only, each cell named once
    assert [note for note in notes if "did not finish" in note] == [next(note for note in notes if "4 cell(s)" in note)]
    assert sum(outer[1].folder in note for note in notes) == 1
    slug = outer[1].folder.split("/")[1]
    assert find_runs([model])[0].notes == [  # the model's folder alone: its plan names what never started
        f"{model}: grid without its combined results.json: it did not finish; its plan (grid.json) has 2 cell(s): "
        f"1 finished (in the report), 0 started but unfinished, 1 never started; never started: org/model-a · "
        f"vcd (medheval) ({slug}); {RESUME}"]
    (model / GRID_FILE).unlink()  # without it the folder's lock says only that cells may be missing
    assert find_runs([model])[0].notes == [
        f"{model}: grid without its combined results.json: it did not finish; the report shows the 1 finished "
        f"run(s) found in it, and cells that never started are not listed; {RESUME}"]

@pytest.mark.parametrize("extra", ["org__model-a", "org__model-a/none", "."])
@pytest.mark.parametrize("first", [True, False])
def test_a_grid_given_with_its_own_folders_names_each_cell_once(interrupted, tmp_path, extra, first):
    """`medheval report out out/org__a` (either order; a cell folder, or the grid again as another path): the
    grid is searched once, so the never-started cell of model a is named once, by the grid's plan."""
    inner = (interrupted / extra).resolve() if extra != "." else Path(f"{interrupted}/./")
    paths = [interrupted, inner] if first else [inner, interrupted]
    runs = find_runs(paths)
    assert len(runs) == 1 and runs[0].path == interrupted / "org__model-a" / "none"
    notes = runs[0].notes
    assert [note for note in notes if "did not finish" in note] == find_runs([interrupted])[0].notes
    vcd = read_plan(interrupted)[1].folder.split("/")[1]
    assert sum(vcd in note for note in notes) == 1 and "4 cell(s)" in notes[0]
    written = write_report(paths, tmp_path / "report", plots=False)
    assert sum(f"org/model-a · vcd (medheval) (org__model-a/{vcd})" in line for line in _caveats(written)) == 1
    assert not any(f"({vcd})" in line for line in _caveats(written))  # the model folder's own plan: not said


def test_a_started_cell_is_named_once_as_an_incomplete_run(interrupted, tmp_path):
    cell = read_plan(interrupted)[2]  # model-b · none: killed while it loaded
    (interrupted / cell.folder).mkdir(parents=True)
    (interrupted / cell.folder / "run.json").write_text("{}")
    notes = find_runs([interrupted])[0].notes
    grid_line = next(note for note in notes if "did not finish" in note)
    assert "4 cell(s): 1 finished (in the report), 1 started but unfinished (1 named as incomplete run(s)), 2 never " \
           "started; never started: org/model-a · vcd" in grid_line
    assert "org__model-b/none" not in grid_line and "started but unfinished:" not in grid_line
    assert [note for note in notes if str(interrupted / cell.folder) in note] == [
        f"{interrupted / cell.folder}: incomplete run (0 prediction(s) written, no results.json): not scored yet; "
        f"{RESUME}"]


def _three_cell_grid(folder: Path) -> tuple[Path, list[PlannedCell]]:
    """A command-line grid of three cells killed during its second: ``none`` finished, ``dola`` started (two
    answers written, no results.json), ``opera`` never started (no folder); its plan and lock stay."""
    write_grid(folder, {"none": [True, False, True, True], "dola": [True, True, False, True]})
    (folder / "results.json").unlink()
    (folder / ".medheval.lock").write_text("{}")
    dola = folder / "dola"
    answers = (dola / "predictions.jsonl").read_text().splitlines()[:2]
    for name in ("results.json", "scored.jsonl"):
        (dola / name).unlink()
    (dola / "predictions.jsonl").write_text("\n".join(answers) + "\n")
    cells = [PlannedCell(folder=name, model="m", mitigation=name, benchmarks=("mm_vishal",))
             for name in ("none", "dola", "opera")]
    record_plan(folder, {"mitigations": ["none", "dola", "opera"], "controls": ["none"]}, cells)
    return folder, cells


def test_each_cell_that_did_not_finish_is_named_exactly_once(tmp_path):
    grid, _ = _three_cell_grid(tmp_path / "grid")
    written = write_report([grid], tmp_path / "report", plots=False)
    started = f"{grid / 'dola'}: incomplete run (2 prediction(s) written, no results.json): not scored yet; {RESUME}"
    plan_line = (f"{grid}: grid without its combined results.json: it did not finish; its plan (grid.json) has 3 "
                 f"cell(s): 1 finished (in the report), 1 started but unfinished (1 named as incomplete run(s)), "
                 f"1 never started; never started: m · opera (opera); {RESUME}")
    caveats = _caveats(written)
    assert plan_line in caveats and started in caveats, "\n".join(caveats)
    assert json.loads(Path(written["json"]).read_text())["caveats"].count(plan_line) == 1
    for cell in ("dola", "opera"):  # each in exactly one caveat, in report.md, report.json and report.html
        assert sum(f"{grid / cell}" in line or f"({cell})" in line for line in caveats) == 1, cell
        structured = json.loads(Path(written["json"]).read_text())["caveats"]
        assert sum(f"{grid / cell}" in line or f"({cell})" in line for line in structured) == 1, cell
        items = re.findall(r"<li>(.*?)</li>", Path(written["html"]).read_text().split("<h2>Caveats")[1], flags=re.S)
        assert sum(f"{grid / cell}" in item or f"({cell})" in item for item in items) == 1, cell


def test_a_started_cell_no_caveat_names_is_named_by_the_plan(tmp_path):
    grid, cells = _three_cell_grid(tmp_path / "grid")
    line = planned_grid(grid, cells)  # no incomplete-run caveat given (a cell folder the search does not reach)
    assert "1 started but unfinished, 1 never started; started but unfinished: m · dola (dola); never started: " \
           "m · opera (opera)" in line


def test_a_grid_json_without_a_plan_reports_as_before(interrupted, tmp_path):
    old = tmp_path / "old"
    shutil.copytree(interrupted, old)
    recorded = json.loads((old / GRID_FILE).read_text())
    (old / GRID_FILE).write_text(json.dumps({key: value for key, value in recorded.items() if key != "plan"}))
    written = write_report([old], tmp_path / "report", plots=False)
    assert f"{old}: grid without its combined results.json: it did not finish; the report shows the 1 finished " \
           f"run(s) found in it, and cells that never started are not listed; {RESUME}" in _caveats(written)
    assert not any("never started:" in line for line in _caveats(written))


def test_a_resumed_grid_keeps_its_plan_and_reports_no_caveat(interrupted, fixture_benchmark, tmp_path, monkeypatch):
    monkeypatch.setattr(grids, "check_model", lambda model: None)
    recorded = (interrupted / GRID_FILE).read_text()
    with pytest.raises(RunError, match="holds a grid over other axes"):  # as before plans: refused, plan kept
        run_config(_config(fixture_benchmark, interrupted, mitigations=["none"]), build_backend=_tiny_as_named)
    assert (interrupted / GRID_FILE).read_text() == recorded
    run_config(_config(fixture_benchmark, interrupted), build_backend=_tiny_as_named)
    assert (interrupted / GRID_FILE).read_text() == recorded
    plan = read_plan(interrupted)
    assert all((interrupted / cell.folder / "results.json").is_file() for cell in plan)
    for model in ("org__model-a", "org__model-b"):  # each model's own grid plans the folders it wrote
        assert [f"{model}/{cell.folder}" for cell in read_plan(interrupted / model)] == \
            [cell.folder for cell in plan if cell.folder.startswith(model + "/")]
    written = write_report([interrupted], tmp_path / "report", plots=False)
    assert not any("did not finish" in line or "incomplete run" in line for line in _caveats(written))
    assert len(find_runs([interrupted])) == 4


# -- each model configured once; a refused plan reaches every process -------------------------------------------
def test_each_model_of_a_grid_is_configured_once_and_each_split_built_once(fixture_benchmark, tmp_path, monkeypatch):
    """Was: the first model ran configure_run for the refusal that puts the plan back, then again in run_grid; and
    every cell built the split again."""
    monkeypatch.setattr(grids, "check_model", lambda model: None)
    configured, built = [], []
    real_configure, real_prepare = runner.configure_run, runner.prepare_benchmark

    def configure(spec, backend, *args, **kwargs):
        configured.append(backend.name)
        return real_configure(spec, backend, *args, **kwargs)

    def prepare(name, config=None, **kwargs):
        built.append(name)
        return real_prepare(name, config, **kwargs)

    for module in (grids, runner):  # the grid's own call and any inside the runner
        monkeypatch.setattr(module, "configure_run", configure)
    monkeypatch.setattr(runner, "prepare_benchmark", prepare)
    out = tmp_path / "grid"
    combined = run_config(_config(fixture_benchmark, out, mitigations=["none"]), build_backend=_tiny_as_named)
    assert configured == MODELS and built == ["context"]
    assert [run["settings"]["model"] for run in combined["runs"]] == MODELS


def _launch(rank: int, statuses: list[list]) -> tuple[Group, list]:
    """Process ``rank`` of 2 whose n-th meeting hears ``statuses[n]`` from the processes (its own entry: what it
    sends)."""
    sent: list = []

    def gather(value):
        sent.append(value)
        return [value if r == rank else status for r, status in enumerate(statuses[len(sent) - 1])]

    return Group(rank=rank, world_size=2, gather=gather), sent


def test_a_grid_plan_the_main_process_refuses_stops_the_other_processes_before_a_model_loads(fixture_benchmark,
                                                                                            tmp_path, monkeypatch):
    """Was: only the main process checked the recorded plan; the others loaded their model and waited for it."""
    monkeypatch.setattr(grids, "check_model", lambda model: None)
    out = tmp_path / "grid"
    record_plan(out, {"models": MODELS, "mitigations": ["none"], "controls": ["none"]},
                plan_cells(MODELS[0], ["context"], ["none"], ["none"]))
    recorded = (out / GRID_FILE).read_text()
    loaded: list[str] = []

    def load(args):
        loaded.append(args.model)
        raise Interrupted("a model loaded")

    main, sent = _launch(0, [[None, None], [None, None]])
    monkeypatch.setattr(distributed, "group", lambda device=None: main)
    with pytest.raises(RunError, match="holds a grid over other axes"):
        run_config(_config(fixture_benchmark, out), build_backend=load)
    assert sent[0] is None and sent[1].startswith("RunError: ") and "holds a grid over other axes" in sent[1]
    other, sent = _launch(1, [[None, None], [sent[1], None]])  # the main process's refusal, as it sent it
    monkeypatch.setattr(distributed, "group", lambda device=None: other)
    with pytest.raises(distributed.RankFailed, match="process 0 of 2 failed while recording the grid plan: "
                                                     "RunError: .* holds a grid over other axes"):
        run_config(_config(fixture_benchmark, out), build_backend=load)
    assert loaded == [] and sent == [None, None] and (out / GRID_FILE).read_text() == recorded
