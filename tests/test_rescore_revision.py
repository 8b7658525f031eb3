"""A re-score records what it scored against: the annotation files its answers were generated from stay
``provenance.dataset_revision``; files that differ (a corrected reference) are added as
``scoring_dataset_revision`` with a warning naming the split, the file and both sha256 prefixes; answers to
other questions (changed ids or question text) are refused; answers whose files are unknown say so."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import yaml

from medheval.cli import main
from medheval.publish import hub
from medheval.publish.results_check import ResultsError, check_results
from medheval.run import provenance

SPLIT = "context:default"
FILE = "Context_Misalignment_Hallucination/MIMIC-CXR_pairs.json"  # the split's one annotation file
ALLOW = ["--allow-random-weights", "--allow-fixture"]
CHANGED = "scored against other annotation files than the answers were generated from"


def _results(folder: Path) -> dict:
    return json.loads((folder / "results.json").read_text())


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _edited(source: Path, target: Path, edit) -> Path:
    """A copy of the fixture's annotation folder whose context file's records went through ``edit``."""
    shutil.copytree(source, target)
    path = target / FILE
    records = json.loads(path.read_text())
    edit(records)
    path.write_text(json.dumps(records, indent=4) + "\n")
    return target


def _rescore(answers: Path, out: Path, data_dir: Path) -> int:
    return main(["run", "--benchmark", "context", "--predictions", str(answers), "--output", str(out),
                 "--data-dir", str(data_dir)])


def _published(folder: Path, out: Path) -> tuple[list[dict], dict]:
    """The ``.eval_results`` entries and the provenance record of a published run folder (one split)."""
    assert main(["publish", "--results", str(folder), "--model-repo", "org/model", "--to", str(out), *ALLOW]) == 0
    root = out / "results" / "org--model"
    [entries] = [yaml.safe_load(path.read_text()) for path in (root / ".eval_results").iterdir()]
    [record] = [json.loads(path.read_text()) for path in (root / hub.PROVENANCE_DIR).iterdir()]
    return entries, record


@pytest.fixture(scope="module")
def source(fixture_benchmark, tmp_path_factory) -> dict[str, Path]:
    """A run of the tiny random model on the fixture's context split (its predictions.jsonl records prompts),
    and a corrected copy of the annotation files: record 0's reference answer flipped."""
    root = tmp_path_factory.mktemp("rescore_revision")
    data = Path(fixture_benchmark["data_dir"])
    roots = [arg for key, value in fixture_benchmark["image_roots"].items() for arg in ("--image-root", f"{key}={value}")]
    assert main(["run", "--benchmark", "context", "--model", "tiny-random-llava", "--output", str(root / "source"),
                 "--max-new-tokens", "3", "--data-dir", str(data), *roots]) == 0

    def flip(records: list[dict]) -> None:
        records[0]["answer"] = {"Yes": "No", "No": "Yes"}[records[0]["answer"]]

    return {"root": root, "data": data, "answers": root / "source" / "predictions.jsonl",
            "corrected": _edited(data, root / "corrected", flip)}


def test_a_rescore_on_the_same_files_keeps_the_revision_and_warns_nothing(source):
    out = source["root"] / "same"
    assert _rescore(source["answers"], out, source["data"]) == 0
    recorded = _results(out)
    assert recorded["provenance"]["dataset_revision"] == _results(source["root"] / "source")["provenance"]["dataset_revision"]
    assert "scoring_dataset_revision" not in recorded["provenance"]
    assert not [text for text in recorded["warnings"] if CHANGED in text]


def test_a_rescore_on_a_corrected_file_records_both_revisions_and_warns(source, capsys):
    out = source["root"] / "corrected_rescore"
    assert _rescore(source["answers"], out, source["corrected"]) == 0
    recorded = _results(out)
    generated = _results(source["root"] / "source")["provenance"]["dataset_revision"][SPLIT]
    assert recorded["provenance"]["dataset_revision"] == {SPLIT: generated}  # the answers' questions: unchanged
    [scoring_file] = recorded["provenance"]["scoring_dataset_revision"][SPLIT]["files"]
    assert (scoring_file["relpath"], scoring_file["sha256"]) == (FILE, _sha(source["corrected"] / FILE))
    old, new = _sha(source["data"] / FILE)[:12], _sha(source["corrected"] / FILE)[:12]
    assert generated["files"][0]["sha256"][:12] == old != new
    [warning] = [text for text in recorded["warnings"] if CHANGED in text]
    assert warning.startswith(f"{SPLIT}: ") and f"{FILE} sha256 {old} → {new} (answers → now)" in warning
    assert "the answered ids and recorded prompts match them" in warning
    assert warning in capsys.readouterr().err
    # the scores use the corrected reference
    [first] = [json.loads(line) for line in (out / "scored.jsonl").read_text().splitlines()
               if json.loads(line)["id"] == "context/default/0"]
    assert first["reference"] == json.loads((source["corrected"] / FILE).read_text())[0]["answer"]

    entries, record = _published(out, source["root"] / "pub_corrected")
    assert record["dataset_revision"] == generated
    assert record["scoring_dataset_revision"] == recorded["provenance"]["scoring_dataset_revision"][SPLIT]
    note = (f"rescored against annotation files sha256={record['scoring_dataset_revision']['sha256'][:12]} "
            f"(answers generated from sha256={generated['sha256'][:12]})")
    assert entries and all(note in entry["notes"] for entry in entries)


def test_a_rescore_of_that_rescore_on_the_original_files_is_the_original_again(source):
    first = source["root"] / "chain_first"
    assert _rescore(source["answers"], first, source["corrected"]) == 0
    again = source["root"] / "chain_again"
    assert _rescore(first / "predictions.jsonl", again, source["data"]) == 0
    recorded = _results(again)
    assert recorded["provenance"]["dataset_revision"] == _results(source["root"] / "source")["provenance"]["dataset_revision"]
    assert "scoring_dataset_revision" not in recorded["provenance"]
    assert not [text for text in recorded["warnings"] if CHANGED in text]


def test_answers_without_recorded_prompts_say_the_questions_were_not_compared(source):
    folder = source["root"] / "no_prompts"
    folder.mkdir()
    shutil.copy(source["root"] / "source" / "results.json", folder / "results.json")
    lines = [json.loads(line) for line in source["answers"].read_text().splitlines()]
    (folder / "predictions.jsonl").write_text("".join(json.dumps({k: v for k, v in line.items() if k != "prompt"})
                                                      + "\n" for line in lines))
    out = source["root"] / "no_prompts_rescore"
    assert _rescore(folder / "predictions.jsonl", out, source["corrected"]) == 0
    [warning] = [text for text in _results(out)["warnings"] if CHANGED in text]
    assert "the questions could not be compared (the answers record no prompt)" in warning


@pytest.mark.parametrize("edit, why", [
    (lambda records: records[0].update(qid=900), "1 answered record id(s) are not in them (first: "
                                                 "['context/default/0'])"),
    (lambda records: records[2].update(question="Is there a rib fracture?"),
     "1 record(s) ask another question or choices than the prompt their answer recorded (first: "
     "['context/default/2'])"),
], ids=["changed_id", "changed_question"])
def test_answers_to_other_questions_are_refused(source, tmp_path, capsys, edit, why):
    data = _edited(source["data"], tmp_path / "data", edit)
    out = tmp_path / "out"
    assert _rescore(source["answers"], out, data) == 2
    err = capsys.readouterr().err
    old, new = _sha(source["data"] / FILE)[:12], _sha(data / FILE)[:12]
    assert (f"error: {SPLIT}: the annotation files differ from those the answers in {source['answers']} were "
            f"generated from ({FILE} sha256 {old} → {new}), and {why}: the answers are to other questions") in err
    assert "Re-score with the files the answers were generated from (--data-dir)" in err
    assert not (out / "results.json").exists()


def test_a_rescore_carries_the_prompts_so_a_rescore_of_it_still_compares_the_questions(source, tmp_path, capsys):
    """The first re-score writes each answer's recorded prompt into its predictions.jsonl; a re-score of that
    against files whose question 2 changed is refused as the first level would be, not waved through on ids."""
    first = tmp_path / "first"
    assert _rescore(source["answers"], first, source["data"]) == 0
    recorded = {line["id"]: line["prompt"] for line in map(json.loads, source["answers"].read_text().splitlines())}
    carried = {line["id"]: line.get("prompt") for line in map(json.loads, (first / "predictions.jsonl").read_text()
                                                                   .splitlines())}
    assert carried == recorded and len(carried) >= 3
    data = _edited(source["data"], tmp_path / "data", lambda records: records[2].update(question="Is there a rib "
                                                                                                   "fracture?"))
    capsys.readouterr()
    assert _rescore(first / "predictions.jsonl", tmp_path / "second", data) == 2
    assert ("1 record(s) ask another question or choices than the prompt their answer recorded (first: "
            "['context/default/2'])") in capsys.readouterr().err
    assert not (tmp_path / "second" / "results.json").exists()

def test_answers_of_an_old_run_without_revisions_record_the_scoring_files_only(source, capsys):
    folder = source["root"] / "old"
    folder.mkdir()
    shutil.copy(source["answers"], folder / "predictions.jsonl")
    old = _results(source["root"] / "source")
    del old["provenance"]["dataset_revision"]  # a results.json from before revisions (and annotation sha256s)
    for block in old["benchmarks"].values():
        del block["annotation_files"]
    (folder / "results.json").write_text(json.dumps(old))
    out = source["root"] / "old_rescore"
    assert _rescore(folder / "predictions.jsonl", out, source["corrected"]) == 0
    recorded = _results(out)["provenance"]
    assert SPLIT not in (recorded.get("dataset_revision") or {})  # unknown: not claimed
    assert recorded["scoring_dataset_revision"][SPLIT]["files"][0]["sha256"] == _sha(source["corrected"] / FILE)
    assert (f"note: {SPLIT}: the annotation files the answers in {folder / 'predictions.jsonl'} were generated "
            f"from are not recorded") in capsys.readouterr().err
    entries, record = _published(out, source["root"] / "pub_old")
    assert record["dataset_revision"] is None and record["scoring_dataset_revision"]["files"]
    assert all("(answers generated from unknown annotation files)" in entry["notes"] for entry in entries)


def test_publish_checks_the_scoring_revision(source):
    out = source["root"] / "checked"
    assert _rescore(source["answers"], out, source["corrected"]) == 0
    results = _results(out)
    check_results(results, "results.json")
    results["benchmarks"][SPLIT]["annotation_files"][0]["sha256"] = "not-a-digest"
    with pytest.raises(ResultsError, match=r"scoring_dataset_revision\['context:default'\]\.files\[0\]\.sha256 is "
                                           r"not a sha256 digest"):
        check_results(results, "results.json")


def _revision(**files: str) -> dict:
    return provenance.annotation_revision([{"relpath": name, "sha256": digest} for name, digest in files.items()])


def test_files_changed_names_each_changed_added_or_dropped_file():
    a, b, c = "a" * 64, "b" * 64, "c" * 64
    assert provenance.files_changed(_revision(**{"x.json": a}), _revision(**{"x.json": a})) is None
    assert provenance.files_changed(_revision(**{"x.json": a}), _revision(**{"x.json": b})) == (
        f"x.json sha256 {a[:12]} → {b[:12]}")
    assert provenance.files_changed(_revision(**{"x.json": a, "y.json": c}), _revision(**{"x.json": a, "z.json": c})) == (
        f"y.json sha256 {c[:12]} → absent; z.json sha256 absent → {c[:12]}")


def test_a_fresh_run_never_records_a_scoring_revision():
    run = {"settings": {"model": "m", "backend": {"backend": "hf"}},
           "benchmarks": {SPLIT: {"annotation_files": [{"relpath": FILE, "sha256": "a" * 64}]}}}
    found = provenance.of_run(run)
    assert found["dataset_revision"][SPLIT]["files"][0]["sha256"] == "a" * 64
    assert "scoring_dataset_revision" not in found
    run["settings"]["backend"] = {"backend": "predictions_file"}  # the same files read by a re-score: scoring only
    found = provenance.of_run(run)
    assert "dataset_revision" not in found and found["scoring_dataset_revision"][SPLIT]["sha256"]


def test_answers_to_a_record_gone_from_a_member_of_an_all_config_are_refused(fixture_benchmark, tmp_path, capsys):
    """``mm_vishal:all`` ids carry their member config (``mm_vishal/slake/0``): a SLAKE record deleted from the
    files is still found among the answered ids, not waved through as "the answered ids … match them"."""
    data = Path(fixture_benchmark["data_dir"])
    roots = [arg for key, value in fixture_benchmark["image_roots"].items() for arg in ("--image-root", f"{key}={value}")]
    assert main(["run", "--benchmark", "mm_vishal", "--model", "tiny-random-llava", "--output", str(tmp_path / "run"),
                 "--max-new-tokens", "2", "--data-dir", str(data), *roots]) == 0
    slake = "Visual_Misinterpretation_Hallucination/close-ended/fine-grained/slake_qa_pairs.json"
    shutil.copytree(data, tmp_path / "data")
    path = tmp_path / "data" / slake
    records = json.loads(path.read_text())
    gone = f"mm_vishal/slake/{records.pop(0)['qid']}"
    path.write_text(json.dumps(records, indent=4) + "\n")
    out = tmp_path / "out"
    assert main(["run", "--benchmark", "mm_vishal", "--predictions", str(tmp_path / "run" / "predictions.jsonl"),
                 "--output", str(out), "--data-dir", str(tmp_path / "data")]) == 2
    err = capsys.readouterr().err
    assert "error: mm_vishal:all: the annotation files differ from those the answers in" in err
    assert f"1 answered record id(s) are not in them (first: ['{gone}'])" in err
    assert not (out / "results.json").exists()
