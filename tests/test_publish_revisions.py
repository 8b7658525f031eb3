"""Published results keep their provenance: the model revision (a Hub commit, a local folder's name, an API
model's reported version), the dataset revision (the annotation files' sha256) and each value's unit; a
re-score keeps the original run's revisions; no local path or secret is ever published."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest
import yaml

from medheval.backends import revision
from medheval.cli import main
from medheval.publish import hub
from medheval.run import provenance

SPLIT = "context"
FAKE_COMMIT = "0123456789abcdef0123456789abcdef01234567"
SECRET = "hf_" + "S3cr3tT0kenValue" * 2
ALLOW = ["--allow-random-weights", "--allow-fixture"]


def _roots(fixture: dict) -> list[str]:
    return [arg for source, root in fixture["image_roots"].items() for arg in ("--image-root", f"{source}={root}")]


def _published(out: Path) -> dict[str, str]:
    """``{relative path: text}`` of every file of the published results folder."""
    folder = out / "results" / "org--model"
    return {path.relative_to(folder).as_posix(): path.read_text() for path in sorted(folder.rglob("*")) if path.is_file()}


@pytest.fixture(scope="module")
def runs(fixture_benchmark, tmp_path_factory) -> dict[str, Path]:
    """A tiny random-weight LLaVA saved where ``hf download`` puts a Hub snapshot
    (``models--org--tiny/snapshots/<commit>``) under a fake home folder, run on the fixture, then re-scored from
    its own ``predictions.jsonl``; a secret token in the environment all along."""
    from medheval.backends.tiny import build_tiny_llava

    root = tmp_path_factory.mktemp("revisions")
    home = root / "home" / "someone"
    model = home / "hub" / "models--org--tiny" / "snapshots" / FAKE_COMMIT
    build_tiny_llava(seed=0, save_dir=model)
    patch = pytest.MonkeyPatch()
    patch.setenv("HOME", str(home))
    patch.setenv("HF_TOKEN", SECRET)
    try:
        data = ["--data-dir", fixture_benchmark["data_dir"]]
        assert main(["run", "--benchmark", SPLIT, "--model", str(model), "--output", str(root / "source"),
                     "--max-new-tokens", "3", *data, *_roots(fixture_benchmark)]) == 0
        assert main(["run", "--benchmark", SPLIT, "--predictions", str(root / "source" / "predictions.jsonl"),
                     "--output", str(root / "rescore"), *data]) == 0
        for name in ("source", "rescore"):
            assert main(["publish", "--results", str(root / name), "--model-repo", "org/model",
                         "--to", str(root / f"pub_{name}"), *ALLOW]) == 0
    finally:
        patch.undo()
    return {"root": root, "home": home, "model": model, "source": root / "source", "rescore": root / "rescore"}


def test_results_json_records_the_model_and_dataset_revision(runs):
    recorded = json.loads((runs["source"] / "results.json").read_text())["provenance"]
    assert recorded["model_revision"] == {"kind": "local", "name": FAKE_COMMIT, "id": "org/tiny",
                                          "commit": FAKE_COMMIT}
    [files] = [block["files"] for block in recorded["dataset_revision"].values()]
    block = json.loads((runs["source"] / "results.json").read_text())["benchmarks"]["context:default"]
    assert [f["sha256"] for f in files] == [f["sha256"] for f in sorted(block["annotation_files"],
                                                                         key=lambda f: f["relpath"])]
    assert all("origin" not in f and f["fixture"] is True for f in files)


def test_a_rescore_keeps_the_original_revisions(runs):
    source = json.loads((runs["source"] / "results.json").read_text())["provenance"]
    rescore = json.loads((runs["rescore"] / "results.json").read_text())["provenance"]
    assert rescore["model_revision"] == source["model_revision"]
    assert rescore["dataset_revision"] == source["dataset_revision"]
    for name in ("source", "rescore"):
        files = _published(runs["root"] / f"pub_{name}")
        entries = [entry for path, text in files.items() if path.startswith(".eval_results/")
                   for entry in yaml.safe_load(text)]
        assert entries and all(f"model_revision=org/tiny@{FAKE_COMMIT} (local snapshot)" in entry["notes"]
                               for entry in entries)
        [record] = [json.loads(text) for path, text in files.items() if path.startswith(hub.PROVENANCE_DIR)]
        assert record["model_revision"]["commit"] == FAKE_COMMIT
        assert record["dataset_revision"] == source["dataset_revision"]["context:default"]


def test_nothing_published_holds_a_local_path_or_a_secret(runs):
    for name in ("source", "rescore"):
        files = _published(runs["root"] / f"pub_{name}")
        assert sorted(files) == [".eval_results/context_default.yaml", f"{hub.PROVENANCE_DIR}/context_default.json"]
        for text in files.values():
            assert str(runs["root"]) not in text and "someone" not in text and SECRET not in text
            assert "/home/" not in text and str(Path.home()) not in text


def test_a_value_names_its_unit_percent_or_fraction():
    run = {"settings": {"model": "org/model", "mitigation": "none"}, "benchmarks": {"vishal_report:default": {
        "n_scored": 4, "metrics": {"text_generation": {"rougeL": 45.2, "bleu": 12.0},
                                   "chair": {"chair": 0.25}}}}}
    [entries] = hub.eval_results_entries(run).values()
    notes = {entry["dataset"]["task_id"]: entry["notes"] for entry in entries}
    assert notes["default/text_generation/rougeL"] == "n=4, unit=percent (0-100)"
    assert notes["default/chair/chair"] == "n=4, unit=fraction (0-1)"
    [record] = hub.eval_results_provenance(run).values()
    assert record["units"]["default/text_generation/rougeL"] == {"unit": "percent", "range": [0.0, 100.0]}
    assert record["units"]["default/chair/chair"] == {"unit": "fraction", "range": [0.0, 1.0]}
    assert record["model_revision"] is None and record["dataset_revision"] is None  # not known: not claimed


def test_a_config_commit_hash_names_the_hub_commit(tmp_path, monkeypatch):
    """transformers < 5.24 sets ``config._commit_hash``; 5.24 resolves the commit without keeping it, so the
    revision then comes from the local Hub cache (``refs/main`` -> ``snapshots/<commit>``)."""
    config = types.SimpleNamespace(_commit_hash=FAKE_COMMIT)
    assert revision.hf_revision("org/tiny", config) == {"kind": "hub", "id": "org/tiny", "commit": FAKE_COMMIT}
    from huggingface_hub import constants

    snapshot = tmp_path / "models--org--cached" / "snapshots" / FAKE_COMMIT
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")
    (tmp_path / "models--org--cached" / "refs").mkdir()
    (tmp_path / "models--org--cached" / "refs" / "main").write_text(FAKE_COMMIT)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    got = revision.hf_revision("org/cached", types.SimpleNamespace())
    assert got == {"kind": "hub", "id": "org/cached", "commit": FAKE_COMMIT}
    run = {"settings": {"model": "org/cached", "mitigation": "none"}, "provenance": {"model_revision": got},
           "benchmarks": {"cxr_vishal:mimic_cxr": {"n_scored": 4, "metrics": {"close_ended_accuracy": {
               "accuracy": 0.75}}}}}
    [[entry]] = hub.eval_results_entries(run).values()
    assert entry["notes"] == f"n=4, unit=fraction (0-1), model_revision=org/cached@{FAKE_COMMIT}"
    assert revision.hf_revision("org/unknown", types.SimpleNamespace())["commit"] is None
    plain = tmp_path / "my-model"
    plain.mkdir()
    assert revision.hf_revision(plain, types.SimpleNamespace()) == {"kind": "local", "name": "my-model"}
    assert revision.revision_note({"kind": "local", "name": "my-model"}) == "model_revision=local folder my-model"
    assert revision.revision_note({"kind": "hub", "id": "org/unknown", "commit": None}) is None


def test_an_api_model_records_the_version_its_replies_report():
    from judge_servers import JudgeServer, openai_body

    from medheval.backends.api import APIBackend

    def reply(request_json):
        return {**openai_body("yes"), "model": "vlm-2025-01-31"}

    with JudgeServer("openai", reply=reply, latency=0.0) as server:
        backend = APIBackend(f"openai:vlm@{server.base_url}", cache_dir=False)
        backend.generate([{"id": "a", "question": "Is there a fracture?", "answer_type": "yes_no", "choices": []}],
                         [[]])
    assert backend.model_revision() == {"kind": "api", "id": "vlm", "reported": ["vlm-2025-01-31"]}
    assert provenance.model_revision_of(backend) == backend.model_revision()
    assert revision.revision_note(backend.model_revision()) == "model_revision=api vlm (reported vlm-2025-01-31)"


def test_a_provenance_file_with_a_home_path_is_refused(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(hub.PublishError, match="local path or a token"):
        hub._publishable_json({"model_revision": {"name": str(tmp_path / "model")}}, "x.json")
