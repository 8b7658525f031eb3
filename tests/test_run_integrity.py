"""Integrity of a run's output folder: the user's files are never written into, nothing is mixed silently."""

from __future__ import annotations

import json
from pathlib import Path

from medheval.cli import main
from medheval.data.benchmarks import load_benchmark


def _predictions(fixture: dict, path: Path, limit: int = 4) -> tuple[Path, list[str]]:
    """A ``{"id", "prediction"}`` file for the first ``limit`` context records; returns it and the run's args."""
    ids = load_benchmark("context", data_dir=fixture["data_dir"])["id"][:limit]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"id": rid, "prediction": "yes"}) + "\n" for rid in ids))
    return path, ["run", "--benchmark", "context", "--predictions", str(path), "--data-dir", fixture["data_dir"],
                  "--limit", str(limit)]


def test_a_predictions_file_that_is_the_outputs_own_log_is_refused_untouched(fixture_benchmark, tmp_path, capsys):
    out = tmp_path / "own"
    path, args = _predictions(fixture_benchmark, out / "predictions.jsonl")
    before = path.read_bytes()
    assert main([*args, "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and "another --output" in err
    assert path.read_bytes() == before  # the input is left as it was
    assert not (out / "run.json").exists() and not (out / "results.json").exists()
    # the same file given through a relative path with .. is the same file
    relative = out / ".." / "own" / "predictions.jsonl"
    assert main([*args[:4], str(relative), *args[5:], "--output", str(out)]) == 2
    assert path.read_bytes() == before
    # another output folder reads it normally
    assert main([*args, "--output", str(tmp_path / "elsewhere")]) == 0
