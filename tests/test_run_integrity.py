"""Integrity of a run's output folder: the user's files are never written into, nothing is mixed silently."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

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


def test_an_undecodable_image_is_named_before_generation_and_skipped_and_counted(fixture_benchmark, tmp_path,
                                                                                 capsys):
    import shutil

    root = tmp_path / "mimic"
    shutil.copytree(fixture_benchmark["image_roots"]["mimic_cxr"], root)
    rows = load_benchmark("context", data_dir=fixture_benchmark["data_dir"]).to_list()
    victim = rows[0]["images"][0]
    (root / victim).write_bytes(b"not an image")
    affected = sorted(r["id"] for r in rows if victim in r["images"])
    base = ["run", "--benchmark", "context", "--model", "tiny-random-llava", "--data-dir",
            fixture_benchmark["data_dir"], "--image-root", f"mimic_cxr={root}", "--max-new-tokens", "4"]
    assert main([*base, "--output", str(tmp_path / "strict")]) == 2
    err = capsys.readouterr().err
    assert "undecodable" in err and f"{affected[0]}: {victim}" in err and "--on-missing skip" in err
    assert not (tmp_path / "strict" / "predictions.jsonl").exists()  # stopped before the first generation
    assert main([*base, "--output", str(tmp_path / "skip"), "--on-missing", "skip"]) == 0
    entry = json.loads((tmp_path / "skip" / "results.json").read_text())["benchmarks"]["context:default"]
    assert entry["skipped_undecodable_images"] == {"count": len(affected), "examples": affected}
    assert entry["skipped_missing_images"]["count"] == 0
    assert entry["n_scored"] == len(rows) - len(affected)
    caveats = (tmp_path / "skip" / "results.md").read_text()
    assert f"{len(affected)} record(s) skipped for an undecodable image" in caveats


def _scores(out: Path) -> dict:
    """Per split, what was scored (not how much of it this run generated)."""
    benchmarks = json.loads((out / "results.json").read_text())["benchmarks"]
    return {split: {k: v for k, v in entry.items() if k != "generated_this_run"} for split, entry in benchmarks.items()}


def test_conflicting_duplicates_in_the_log_are_refused_and_identical_ones_change_nothing(fixture_benchmark,
                                                                                          tmp_path, capsys):
    _, args = _predictions(fixture_benchmark, tmp_path / "mine.jsonl")
    out = tmp_path / "run"
    assert main([*args, "--output", str(out)]) == 0
    log = out / "predictions.jsonl"
    lines = log.read_text().splitlines(keepends=True)
    results = _scores(out)

    log.write_text("".join(lines) + lines[1])  # an identical copy: tolerated, nothing changes
    assert main([*args, "--output", str(out)]) == 0
    assert _scores(out) == results

    changed = json.loads(lines[1])
    changed["prediction"] = "no" if changed["prediction"] != "no" else "yes"
    log.write_text("".join(lines) + json.dumps(changed) + "\n")
    before = log.read_bytes()
    assert main([*args, "--output", str(out)]) == 2
    err = capsys.readouterr().err
    assert str(log) in err and "lines 2 and 5" in err and changed["id"] in err and "Remove the line" in err
    assert log.read_bytes() == before  # nothing rewritten or lost
    assert _scores(out) == results


def test_a_part_log_that_contradicts_the_main_log_is_refused(tmp_path):
    import pytest

    from medheval.run.distributed import merge_parts
    from medheval.run.predictions_log import CorruptLogError

    entry = {"id": "a", "prediction": "yes", "model": "m"}
    (tmp_path / "predictions.jsonl").write_text(json.dumps(entry) + "\n")
    (tmp_path / "predictions.rank1.jsonl").write_text(json.dumps(entry) + "\n")
    assert merge_parts(tmp_path / "predictions.jsonl", ["a"]) == 0  # merged twice: dropped
    (tmp_path / "predictions.rank1.jsonl").write_text(json.dumps({**entry, "prediction": "no"}) + "\n")
    with pytest.raises(CorruptLogError, match=r"predictions.rank1.jsonl and .*predictions.jsonl .* 'a'"):
        merge_parts(tmp_path / "predictions.jsonl", ["a"])
    assert (tmp_path / "predictions.rank1.jsonl").exists()


def test_an_empty_question_is_flagged_and_counted(fixture_benchmark, tmp_path):
    import shutil

    data = tmp_path / "benchmark_data"
    shutil.copytree(fixture_benchmark["data_dir"], data)
    pairs = data / "Visual_Misinterpretation_Hallucination" / "close-ended" / "fine-grained" / "slake_qa_pairs.json"
    records = json.loads(pairs.read_text())
    records[4]["question"] = " "
    pairs.write_text(json.dumps(records, indent=4))
    rows = load_benchmark("mm_vishal", data_dir=str(data)).to_list()
    empty = [r["id"] for r in rows if not r["question"].strip()]
    assert len(empty) == 1
    path = tmp_path / "mine.jsonl"
    path.write_text("".join(json.dumps({"id": r["id"], "prediction": "yes"}) + "\n" for r in rows))
    out = tmp_path / "run"
    assert main(["run", "--benchmark", "mm_vishal", "--predictions", str(path), "--data-dir", str(data),
                 "--output", str(out)]) == 0
    quality = json.loads((out / "results.json").read_text())["benchmarks"]["mm_vishal:all"]["data_quality"]
    assert quality["flags"]["empty_question"] == 1 and quality["examples"]["empty_question"] == empty
    assert sum(flags.get("empty_question", 0) for flags in quality["flags_by_config"].values()) == 1


def test_a_folder_with_results_or_a_log_but_no_run_json_is_refused_untouched(fixture_benchmark, tmp_path, capsys):
    _, args = _predictions(fixture_benchmark, tmp_path / "mine.jsonl")
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "results.json").write_text('{"mine": 1}')
    (foreign / "results.md").write_text("# my notes\n")
    assert main([*args, "--output", str(foreign)]) == 2
    err = capsys.readouterr().err
    assert str(foreign) in err and "results.json, results.md" in err and "no run.json" in err
    assert "another --output" in err
    assert (foreign / "results.json").read_text() == '{"mine": 1}'
    assert (foreign / "results.md").read_text() == "# my notes\n"
    assert not (foreign / "run.json").exists()

    out = tmp_path / "run"  # a run folder whose run.json was deleted: its log is no longer known to be this run's
    assert main([*args, "--output", str(out)]) == 0
    (out / "run.json").unlink()
    (out / "results.json").unlink()
    log = (out / "predictions.jsonl").read_bytes()
    assert main([*args, "--output", str(out)]) == 2
    assert "predictions.jsonl" in capsys.readouterr().err
    assert (out / "predictions.jsonl").read_bytes() == log


def test_a_reused_prediction_made_with_other_generation_settings_is_refused(fixture_benchmark, tmp_path, capsys):
    out = tmp_path / "run"
    args = ["run", "--benchmark", "context", "--model", "tiny-random-llava", "--output", str(out), "--data-dir",
            fixture_benchmark["data_dir"], "--limit", "2", "--max-new-tokens", "4"]
    args += [a for s, r in fixture_benchmark["image_roots"].items() for a in ("--image-root", f"{s}={r}")]
    assert main(args) == 0
    assert main(args) == 0  # resumes: the same settings
    log = out / "predictions.jsonl"
    entries = [json.loads(line) for line in log.read_text().splitlines()]
    assert entries[1]["generation"]["max_new_tokens"] == 4
    entries[1]["generation"]["max_new_tokens"] = 16  # e.g. a log carried over from another run
    log.write_text("".join(json.dumps(entry) + "\n" for entry in entries))
    assert main(args) == 2
    err = capsys.readouterr().err
    assert str(log) in err and entries[1]["id"] in err and "max_new_tokens 16 → 4" in err
    assert [json.loads(line) for line in log.read_text().splitlines()] == entries  # nothing appended or lost


def test_re_running_a_grid_with_other_axes_is_refused_naming_the_change(fixture_benchmark, tmp_path, capsys):
    out = tmp_path / "grid"
    args = ["run", "--benchmark", "context", "--model", "tiny-random-llava", "--output", str(out), "--data-dir",
            fixture_benchmark["data_dir"], "--limit", "2", "--max-new-tokens", "4"]
    args += [a for s, r in fixture_benchmark["image_roots"].items() for a in ("--image-root", f"{s}={r}")]
    assert main([*args, "--control", "none", "--control", "no_image"]) == 0
    assert main([*args, "--control", "none", "--control", "no_image"]) == 0  # the same axes resume
    combined = (out / "results.json").read_bytes()
    assert len(json.loads(combined)["runs"]) == 2
    assert main([*args, "--control", "none", "--mitigation", "none"]) == 2  # one cell: no longer a grid there
    assert main([*args, "--control", "none", "--control", "blank"]) == 2
    err = capsys.readouterr().err
    assert str(out) in err and "controls none, no_image → none, blank" in err and "same axes" in err
    assert (out / "results.json").read_bytes() == combined


@pytest.mark.parametrize("edit", [
    lambda rid: rid.rsplit("/", 1)[0] + "/no-such-record",  # a record the annotation files do not hold
    lambda rid: "edited-by-hand/" + rid.rsplit("/", 1)[1],  # edited in its benchmark/config part
], ids=["record", "prefix"])
def test_a_log_line_whose_id_names_no_record_is_warned_about(edit, fixture_benchmark, tmp_path, capsys):
    """A line of the run's own predictions.jsonl whose id was edited (or whose record the annotation files no longer
    hold) was left out of the scores without a word: the record was answered again and the line ignored. An id
    edited in its benchmark/config part was not looked at either (only ids with a split's own prefix were), though
    the run's own log holds nothing but its splits' records."""
    _, args = _predictions(fixture_benchmark, tmp_path / "mine.jsonl")
    out = tmp_path / "run"
    assert main([*args, "--output", str(out)]) == 0
    log = out / "predictions.jsonl"
    lines = log.read_text().splitlines(keepends=True)
    edited = json.loads(lines[1])
    edited["id"] = edit(edited["id"])
    log.write_text("".join([lines[0], json.dumps(edited) + "\n", *lines[2:]]))
    capsys.readouterr()
    assert main([*args, "--output", str(out)]) == 0
    said = (f"1 line(s) of {log} answer no record of the split(s) in this run and are not scored (first ids: "
            f"[{edited['id']!r}])")
    assert said in capsys.readouterr().err
    assert any(said in warning for warning in json.loads((out / "results.json").read_text())["warnings"])
    # a resume of an untouched log says nothing
    log.write_text("".join(lines))
    capsys.readouterr()
    assert main([*args, "--output", str(out)]) == 0
    assert "answer no record" not in capsys.readouterr().err
