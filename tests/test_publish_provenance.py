"""Issue 32, point 5: provenance (random weights, fixture data, --limit, protocol, source model) survives
re-scoring, and `publish --results` refuses such results unless the matching --allow-* flag is given."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from medheval.cli import main
from medheval.publish import hub
from medheval.run import provenance

SPLIT = "context"


def _roots(fixture: dict) -> list[str]:
    return [arg for source, root in fixture["image_roots"].items() for arg in ("--image-root", f"{source}={root}")]


def _entries(folder: Path) -> list[dict]:
    return [entry for path in sorted((folder / "results" / "org--model" / ".eval_results").iterdir())
            for entry in yaml.safe_load(path.read_text())]


@pytest.fixture(scope="module")
def rescored(fixture_benchmark, tmp_path_factory) -> dict[str, Path]:
    """A random-weight run on the fixture with --limit 2; its predictions copied away from their folder and
    re-scored (without --limit); that re-score's predictions re-scored again."""
    root = tmp_path_factory.mktemp("provenance")
    assert main(["run", "--benchmark", SPLIT, "--model", "tiny-random-llava", "--output", str(root / "source"),
                 "--data-dir", fixture_benchmark["data_dir"], "--max-new-tokens", "3", "--limit", "2",
                 *_roots(fixture_benchmark)]) == 0
    (root / "elsewhere").mkdir()
    copy = root / "elsewhere" / "answers.jsonl"  # no results.json beside it: the lines alone carry provenance
    shutil.copy(root / "source" / "predictions.jsonl", copy)
    assert main(["run", "--benchmark", SPLIT, "--predictions", str(copy), "--output", str(root / "rescore"),
                 "--data-dir", fixture_benchmark["data_dir"], "--allow-missing-predictions"]) == 0
    assert main(["run", "--benchmark", SPLIT, "--predictions", str(root / "rescore" / "predictions.jsonl"),
                 "--output", str(root / "again"), "--data-dir", fixture_benchmark["data_dir"],
                 "--allow-missing-predictions"]) == 0
    return {"root": root, "source": root / "source", "rescore": root / "rescore", "again": root / "again"}


def test_the_source_run_writes_its_provenance_into_results_and_every_line(rescored):
    expected = {"random_weights": True, "fixture": True, "limit": 2, "protocol": "clean",
                "source_model": "tiny-random-llava"}
    recorded = json.loads((rescored["source"] / "results.json").read_text())["provenance"]
    assert recorded.pop("model_revision") == {"kind": "in_memory", "name": "tiny-random-llava"}  # built in-process
    assert set(recorded.pop("dataset_revision")) == {"context:default"}  # the annotation files read
    assert recorded == expected
    lines = [json.loads(line) for line in (rescored["source"] / "predictions.jsonl").read_text().splitlines()]
    assert len(lines) == 2 and all(line["provenance"] == expected for line in lines)


@pytest.mark.parametrize("folder", ["rescore", "again"])
def test_a_rescore_of_the_answers_carries_it(rescored, folder):
    results = json.loads((rescored[folder] / "results.json").read_text())
    # the answers' annotation files are unknown (a copy, no results.json beside it): only those scored against
    assert set(results["provenance"].pop("scoring_dataset_revision")) == {"context:default"}
    assert results["settings"]["limit"] is None  # this run had no --limit: the 2 comes from the source run
    made = {"generation": {"do_sample": False, "max_new_tokens": 3, "temperature": None, "top_p": None}}
    assert results["provenance"] == {"random_weights": True, "fixture": True, "limit": 2, "protocol": "clean",
                                     "source_model": "tiny-random-llava", "made_with": made}  # the source's decoding


@pytest.mark.parametrize("folder", ["source", "rescore", "again"])
def test_publish_refuses_them_naming_every_missing_flag(rescored, folder, capsys):
    out = rescored["root"] / f"refused_{folder}"
    code = main(["publish", "--results", str(rescored[folder]), "--model-repo", "org/model", "--to", str(out)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "random-weight" in err and "embedded fixture" in err and "--limit 2" in err
    assert "--allow-random-weights --allow-fixture --allow-limit" in err
    assert not (out / "results").exists()
    code = main(["publish", "--results", str(rescored[folder]), "--model-repo", "org/model", "--to", str(out),
                 "--allow-random-weights", "--allow-fixture"])
    err = capsys.readouterr().err
    assert code == 2 and "pass --allow-limit to publish" in err and "--allow-fixture" not in err


def test_the_flags_publish_them_and_are_written_into_every_entry(rescored, capsys):
    out = rescored["root"] / "allowed"
    assert main(["publish", "--results", str(rescored["again"]), "--model-repo", "org/model", "--to", str(out),
                 "--allow-random-weights", "--allow-fixture", "--allow-limit"]) == 0
    err = capsys.readouterr().err
    assert "generated by 'tiny-random-llava', published for 'org/model'" in err
    entries = _entries(out)
    assert entries
    for entry in entries:
        assert entry["notes"].endswith("random-weight model (published with --allow-random-weights), fixture data "
                                       "(published with --allow-fixture), limit=2 (published with --allow-limit)")


def _clean_results(**run: object) -> dict:
    return {"settings": {"model": "org/model", "mitigation": "none", "limit": None}, "labels": {},
            "benchmarks": {"cxr_vishal:mimic_cxr": {"n_scored": 4, "metrics": {"close_ended_accuracy": {
                "accuracy": 0.75, "n": 4}}}}, **run}


def test_a_clean_run_publishes_as_before_and_a_protocol_is_named():
    [entry] = hub.eval_results_entries(_clean_results(), date="2026-11-27")["cxr_vishal_mimic_cxr.yaml"]
    assert entry["notes"] == "n=4, unit=fraction (0-1)"
    [entry] = hub.eval_results_entries(_clean_results(protocol={"name": "med-hallmark"}),
                                       date="2026-11-27")["cxr_vishal_mimic_cxr.yaml"]
    assert entry["notes"] == "n=4, unit=fraction (0-1), protocol=med-hallmark"


def test_results_written_before_provenance_existed_are_still_read():
    """labels.random_weights, settings.limit and the fixture warning of older results.json files."""
    old = _clean_results(labels={"random_weights": "demo"}, warnings=[f"x: {provenance.FIXTURE_MARK} ..."])
    old["settings"]["limit"] = 5
    assert provenance.of_run(old) == {"random_weights": True, "fixture": True, "limit": 5, "protocol": "clean",
                                      "source_model": "org/model"}
    with pytest.raises(hub.PublishError, match="--allow-random-weights --allow-fixture --allow-limit"):
        hub.eval_results_entries(old)


def test_merge_keeps_every_flag_the_smallest_limit_and_the_first_model():
    merged = provenance.merge({"limit": 5, "source_model": "a"}, {"fixture": True, "limit": 3, "source_model": "b"},
                              {"protocol": "blind"}, None)
    assert merged == {"random_weights": False, "fixture": True, "limit": 3, "protocol": "blind", "source_model": "a"}
    assert provenance.for_log({**provenance.empty(), "source_model": "m"}) == {}  # a clean run adds nothing to lines
