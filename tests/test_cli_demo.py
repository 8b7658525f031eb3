"""`make demo`'s Python entry runs the whole pipeline on the fixtures and labels the random model."""

from __future__ import annotations

import json

from medheval.cli.demo import DEMO_BENCHMARKS, medheval_command, run_demo
from medheval.run.predictions_log import read_log


def test_demo_runs_end_to_end(tmp_path, capsys):
    results = run_demo(tmp_path / "demo", batch_size=4)
    last = capsys.readouterr().out.strip().splitlines()[-3:]  # what to open and what to try next
    assert last[1] == f"open the report: {tmp_path / 'demo' / 'run' / 'report.html'}"
    assert last[2].startswith(f"next: {medheval_command()} report {tmp_path / 'demo' / 'run'} ")
    run_dir = tmp_path / "demo" / "run"
    assert set(results["benchmarks"]) == {
        "mm_vishal:all", "cxr_vishal:all", "vishal_report:default", "knowledge:closed", "knowledge:open",
        "context:default"}
    assert len(DEMO_BENCHMARKS) == len(results["benchmarks"])
    total = sum(entry["n_records"] for entry in results["benchmarks"].values())
    log = read_log(run_dir / "predictions.jsonl")
    assert len(log) == total and len({e["id"] for e in log}) == total
    assert all(isinstance(e["prediction"], str) for e in log)
    for split in ("mm_vishal:all", "cxr_vishal:all", "knowledge:closed", "context:default"):
        metric = results["benchmarks"][split]["metrics"]["close_ended_accuracy"]
        assert 0.0 <= metric["accuracy"] <= 1.0 and metric["n"] == results["benchmarks"][split]["n_records"]
    markdown = (run_dir / "results.md").read_text()
    assert "RANDOM WEIGHTS" in markdown and "Acc-A" in markdown
    saved = json.loads((run_dir / "results.json").read_text())
    assert saved["settings"]["backend"]["random_weights"] is True
    # Med-StepBench: both knowledge settings through the prefix-cached backend, one Table-3-shaped table
    table3 = (tmp_path / "demo" / "stepbench" / "table3.md").read_text()
    assert "| tiny-random-llava | none | none |" in table3 and "| tiny-random-llava | none | both |" in table3
    for knowledge in ("none", "both"):
        sb = json.loads((tmp_path / "demo" / "stepbench" / f"knowledge_{knowledge}" / "results.json").read_text())
        entry = sb["benchmarks"]["med_stepbench:all"]
        assert entry["n_scored"] == 48 and entry["run_options"]["knowledge"] == knowledge
        assert sb["settings"]["backend"]["prefix_cache"] is True


def test_the_documented_tiny_grid_example_runs_as_written(tmp_path):
    """Issue 23, point 15: the docs' tiny-model grid block (fixture + run; docs/running.md, "Run grids", linked
    from the README) runs as written, with its fixture folder moved under tmp_path and `medheval` as
    `python -m medheval.cli`."""
    import os
    import re
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    assert "docs/running.md#run-grids---config" in (repo / "README.md").read_text()
    page = (repo / "docs" / "running.md").read_text()
    assert "### Run grids (`--config`)" in page  # the heading the README's anchor points at
    block = next(body for body in re.findall(r"```bash\n(.*?)```", page, re.S)
                 if "medheval.families.medheval.fixtures /tmp/medheval-fixture" in body)
    script = (block.replace("/tmp/medheval-fixture", str(tmp_path / "fixture"))
              .replace("runs/try", str(tmp_path / "try"))
              .replace("python -m", f"{sys.executable} -m")
              .replace("medheval run", f"{sys.executable} -m medheval.cli run"))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_EVALUATE_OFFLINE": "1"}
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], capture_output=True, text=True, env=env,
                          cwd=Path(__file__).resolve().parents[1], timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((tmp_path / "try" / "results.json").read_text())
    assert results["runs"] and all(run["benchmarks"] for run in results["runs"])


def test_python_dash_m_medheval_is_the_command():
    """``python -m medheval`` runs the ``medheval`` command (for a venv whose scripts are not on PATH)."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "medheval", "run", "--help"], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "--benchmark" in done.stdout and "--mitigation" in done.stdout
