"""``--seeds``: one sampling pass per seed, reproducible, batch-invariant, resumable, refused when meaningless."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from medheval.cli import main
from medheval.run.generation import GenerationPlan
from medheval.run.protocol import RunError
from medheval.run.seeds import parse_seeds, samples


def _args(fixture: dict, output: Path, *extra: str) -> list[str]:
    roots = [a for s, r in fixture["image_roots"].items() for a in ("--image-root", f"{s}={r}")]
    return ["run", "--benchmark", "context", "--model", "tiny-random-llava", "--output", str(output), "--data-dir",
            fixture["data_dir"], "--limit", "4", "--max-new-tokens", "6", *roots, *extra]


SAMPLING = ("--do-sample", "--temperature", "1.5")


def _predictions(folder: Path) -> dict[str, str]:
    return {json.loads(line)["id"]: json.loads(line)["prediction"]
            for line in (folder / "predictions.jsonl").read_text().splitlines()}


def _generated(folder: Path) -> int:
    return json.loads((folder / "results.json").read_text())["benchmarks"]["context:default"]["generated_this_run"]


@pytest.mark.parametrize("text, message", [("0,1,1", "listed twice"), ("0,x", "not a seed"), ("-1", "not a seed"),
                                           (",", "names no seed")])
def test_bad_seed_lists_are_refused(text, message):
    with pytest.raises(RunError, match=message):
        parse_seeds(text)


def test_parse_seeds_and_what_samples():
    assert parse_seeds("0, 1,2") == [0, 1, 2] and parse_seeds([3, 5]) == [3, 5] and parse_seeds(None) is None

    class Greedy:
        def settings(self):
            return {"do_sample": False}

    assert not samples(Greedy(), None) and not samples(Greedy(), GenerationPlan())
    assert samples(Greedy(), GenerationPlan(answer_types={"open": {"do_sample": True}}))  # a protocol's layer
    assert not samples(Greedy(), GenerationPlan(defaults={"do_sample": True}, fixed={"do_sample": False}))


def test_seeds_with_greedy_decoding_or_a_predictions_file_are_refused(fixture_benchmark, tmp_path, capsys):
    assert main(_args(fixture_benchmark, tmp_path / "g", "--seeds", "0,1")) == 2
    assert "decodes greedily" in capsys.readouterr().err
    assert not (tmp_path / "g").exists()  # refused before anything was written
    path = tmp_path / "p.jsonl"
    path.write_text('{"id": "context/default/0", "prediction": "yes"}\n')
    assert main(["run", "--benchmark", "context", "--predictions", str(path), "--output", str(tmp_path / "p"),
                 "--data-dir", fixture_benchmark["data_dir"], "--allow-missing-predictions", "--seeds", "0"]) == 2
    assert "does not generate with a seed" in capsys.readouterr().err


def test_seeds_reproducible_batch_invariant_and_resumable(fixture_benchmark, tmp_path, capsys):
    one = tmp_path / "bs1"
    assert main(_args(fixture_benchmark, one, *SAMPLING, "--seeds", "0,1", "--batch-size", "1")) == 0
    assert json.loads((one / "seeds.json").read_text()) == {"seeds": [0, 1]}
    combined = json.loads((one / "results.json").read_text())
    assert combined["seeds"] == [0, 1] and [r["settings"]["seed"] for r in combined["runs"]] == [0, 1]
    assert combined["over_seeds"]["rows"][0]["cells"][0]["text"] == "2 (0, 1)"
    assert "Over sampling seeds" in (one / "results.md").read_text()
    seed0, seed1 = _predictions(one / "none__seed-0"), _predictions(one / "none__seed-1")
    assert len(seed0) == 4 and sum(seed0[k] != seed1[k] for k in seed0) >= 3  # 4 of 4 differ on this tiny model

    # batch size never changes a sample; the same seed repeats its answers
    four = tmp_path / "bs4"
    assert main(_args(fixture_benchmark, four, *SAMPLING, "--seeds", "0,1", "--batch-size", "4")) == 0
    for seed in (0, 1):
        assert _predictions(four / f"none__seed-{seed}") == _predictions(one / f"none__seed-{seed}")

    # a run killed in seed 1's pass: seed 0 done, seed 1 with one record logged and no results yet
    killed = tmp_path / "killed"
    shutil.copytree(one, killed)
    log = killed / "none__seed-1" / "predictions.jsonl"
    log.write_text(log.read_text().splitlines(keepends=True)[0])
    for leftover in ("results.json", "results.md", "none__seed-1/results.json", "none__seed-1/scored.jsonl"):
        (killed / leftover).unlink()
    assert main(_args(fixture_benchmark, killed, *SAMPLING, "--seeds", "0,1", "--batch-size", "1")) == 0
    assert _generated(killed / "none__seed-0") == 0 and _generated(killed / "none__seed-1") == 3  # not redone
    for seed in (0, 1):
        assert _predictions(killed / f"none__seed-{seed}") == _predictions(one / f"none__seed-{seed}")
    assert json.loads((killed / "results.json").read_text())["over_seeds"] == combined["over_seeds"]

    # other seeds, or none, in a seeded folder are refused
    capsys.readouterr()
    assert main(_args(fixture_benchmark, one, *SAMPLING, "--seeds", "0,2")) == 2
    assert "holds passes for --seeds 0,1" in capsys.readouterr().err
    assert main(_args(fixture_benchmark, one, *SAMPLING)) == 2
    assert "asks for no --seeds" in capsys.readouterr().err


def test_grid_config_seeds_key_and_flag():
    from medheval.cli import build_parser
    from medheval.run.grids import GridConfigError, apply_cli, given_options, parse_grid_config

    base = {"output": "runs/x", "models": ["tiny-random-llava"], "benchmarks": ["context"]}
    assert parse_grid_config({**base, "seeds": [0, 1, 2]}, "g.yaml").get("seeds") == [0, 1, 2]
    assert parse_grid_config(base, "g.yaml").get("seeds") is None
    with pytest.raises(GridConfigError, match="g.yaml: seeds: seed 1 is listed twice"):
        parse_grid_config({**base, "seeds": [1, 1]}, "g.yaml")
    with pytest.raises(GridConfigError, match="g.yaml: seeds: expected a list"):
        parse_grid_config({**base, "seeds": 3}, "g.yaml")
    argv = ["--seeds", "4,5"]
    args = build_parser().parse_args(["run", "--config", "g.yaml", *argv])
    merged = apply_cli(parse_grid_config({**base, "seeds": [0]}, "g.yaml"), args, given_options(argv))
    assert merged.get("seeds") == [4, 5]
