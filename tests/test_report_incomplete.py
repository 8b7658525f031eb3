"""Runs that were started but never finished: a run folder with ``run.json``/``predictions.jsonl`` and no
results.json (killed, or still running) and a grid folder without its combined results.json are said in the
report's caveats (report.md, report.html, report.json), with how many answers were written and how to resume;
a lone unfinished folder gets that message, not "not a run folder"."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from report_runs import write_grid
from medheval.cli import main
from medheval.report.build import write_report
from medheval.report.collect import ReportError, find_runs

RESUME = "not scored yet; re-run the same `medheval run` command to resume"


def _kill(cell: Path, answered: int) -> Path:
    """The cell as a kill leaves it mid-generation: run.json, ``answered`` prediction lines and a torn last
    one, its lock, no results.json or scored.jsonl."""
    lines = (cell / "predictions.jsonl").read_text().splitlines()[:answered]
    for name in ("results.json", "scored.jsonl", "predictions.jsonl"):
        (cell / name).unlink()
    (cell / "run.json").write_text(json.dumps({"model": "m", "mitigation": cell.name}))
    (cell / "predictions.jsonl").write_text("\n".join(lines) + '\n{"id": "mm_vishal/sla')
    (cell / ".medheval.lock").write_text("{}")
    return cell


def _killed_grid(folder: Path) -> Path:
    """A 3-cell grid killed during its second cell: the first finished, the third never started (no folder),
    no combined results.json; the grid's lock stays in its folder."""
    write_grid(folder, {"none": [True, False, True, True], "dola": [True, True, False, True]})
    (folder / "results.json").unlink()
    (folder / ".medheval.lock").write_text("{}")
    _kill(folder / "dola", answered=3)
    return folder


def test_a_killed_grid_says_which_cell_is_unfinished_and_that_its_results_are_missing(tmp_path: Path) -> None:
    grid = _killed_grid(tmp_path / "grid")
    written = write_report([grid], tmp_path / "report", plots=False)
    markdown = Path(written["markdown"]).read_text()
    assert "Runs: `m · none`" in markdown  # the finished cell is reported
    caveats = markdown.split("## Caveats")[1].split("\n## ")[0]
    grid_line = (f"- {grid}: grid without its combined results.json: it did not finish; the report shows the 1 "
                 f"finished run(s) found in it, and cells that never started are not listed; re-run the same "
                 f"`medheval run` command to resume")
    cell_line = f"- {grid / 'dola'}: incomplete run (3 prediction(s) written, no results.json): {RESUME}"
    assert grid_line in caveats and cell_line in caveats
    assert caveats.index(grid_line) < caveats.index(cell_line)
    page = Path(written["html"]).read_text()
    items = re.findall(r"<li>(.*?)</li>", page.split("<h2>Caveats")[1])
    assert any("grid without its combined results.json: it did not finish" in item for item in items)
    assert any(f"{grid / 'dola'}: incomplete run (3 prediction(s) written, no results.json): not scored yet; "
               f"re-run the same <code>medheval run</code> command to resume" in item for item in items)
    assert cell_line[2:] in json.loads(Path(written["json"]).read_text())["caveats"]


def test_a_finished_grid_and_a_finished_run_add_no_such_caveat(tmp_path: Path) -> None:
    grid = write_grid(tmp_path / "grid", {"none": [True, False], "dola": [True, True]})
    (grid / ".medheval.lock").write_text("{}")
    notes = [note for run in find_runs([grid]) for note in run.notes]
    assert not any("incomplete run" in note or "did not finish" in note for note in notes)


def test_a_lone_killed_run_says_resume_not_not_a_run_folder(tmp_path: Path, capsys) -> None:
    write_grid(tmp_path / "g", {"none": [True, False, True]})
    run = _kill(tmp_path / "g" / "none", answered=2)
    with pytest.raises(ReportError) as error:
        find_runs([run])
    assert str(error.value) == f"{run}: incomplete run (2 prediction(s) written, no results.json): {RESUME}"
    assert main(["report", str(run), "--output", str(tmp_path / "report")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: {run}: incomplete run (2 prediction(s) written, no results.json): {RESUME}"
    assert "not a run folder" not in err and not (tmp_path / "report").exists()


def test_a_run_killed_before_its_first_answer_counts_none(tmp_path: Path) -> None:
    """run.json alone (killed while the model loaded): 0 predictions, still resumable."""
    (tmp_path / "k").mkdir()
    (tmp_path / "k" / "run.json").write_text("{}")
    with pytest.raises(ReportError, match=re.escape(f"{tmp_path / 'k'}: incomplete run (0 prediction(s) written")):
        find_runs([tmp_path / "k"])
