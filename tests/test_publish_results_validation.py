"""``publish --results`` copies fields of ``results.json`` into ``.eval_results`` notes, file names and provenance
files: a run folder edited by hand must not smuggle an image (a base64 JPEG made here by PIL) or a right-to-left
override through them. Each field is checked first; the error names the file and the field. A predictions file
whose lines carry an unknown image control is refused when read (the control names grid folders)."""

from __future__ import annotations

import base64
import copy
import io
import json
from pathlib import Path

import numpy as np
import pytest

from medheval.backends.base import BackendError
from medheval.backends.predictions import PredictionsFileBackend
from medheval.publish import hub, results_check
from medheval.run.control import CONTROLS, ControlError, cell_slug, control_slug
from medheval.run.grid_plan import cell_folder
from report_runs import export_results_json

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _payload() -> str:
    from PIL import Image

    buffer = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (64, 64), dtype=np.uint8)).save(buffer, "JPEG")
    return base64.encodebytes(buffer.getvalue()).decode()  # 76-char lines


def _results() -> dict:
    return {"settings": {"model": "org/m", "mitigation": "vcd:alpha=1,beta=0.1", "control": "blank", "limit": None},
            "protocol": {"name": "clean"},
            "provenance": {"model_revision": {"kind": "hub", "id": "org/m", "commit": COMMIT},
                           "made_with": {"seed": 0, "versions": {"transformers": "5.0.0"}}},
            "benchmarks": {"vqa_rad:all": {"n_scored": 2, "n_records": 2, "annotation_files": [
                {"relpath": "test.json", "sha256": "a" * 64, "verified": True}],
                "metrics": {"close_ended_accuracy": {"accuracy": 0.5, "n": 2}}}}}


def _export(tmp_path: Path, results: dict) -> hub.RepoFolder:
    return export_results_json(tmp_path, results, "org/m")


def test_valid_results_publish_with_the_control_and_mitigation_in_the_name(tmp_path):
    repo = _export(tmp_path, _results())
    assert sorted(repo.files) == [".eval_results/vqa_rad_all_vcd_alpha_1_beta_0_1_blank.yaml",
                                  ".eval_results_provenance/vqa_rad_all_vcd_alpha_1_beta_0_1_blank.json"]
    hub.check_recorded_files(repo)
    hub.check_no_credentialed_bytes(repo)


HOSTILE = {
    "benchmarks['vqa_rad:all'].n_scored": lambda r: r["benchmarks"]["vqa_rad:all"].update(n_scored=_payload()),
    "benchmarks['vqa_rad:all'].n_records": lambda r: r["benchmarks"]["vqa_rad:all"].update(n_records="2, x"),
    "benchmarks['vqa_rad:all'].data_quality.n_records": lambda r: r["benchmarks"]["vqa_rad:all"].update(
        data_quality={"n_records": 2.5}),
    "settings.control": lambda r: r["settings"].update(control="x y\u202e"),
    "settings.mitigation": lambda r: r["settings"].update(mitigation="vcd\n" + _payload()),
    "settings.limit": lambda r: r["settings"].update(limit="all"),
    "protocol.name": lambda r: r.update(protocol={"name": _payload()}),
    "provenance.protocol": lambda r: r["provenance"].update(protocol="evil\u202e"),
    "provenance.model_revision.commit": lambda r: r["provenance"]["model_revision"].update(commit=_payload()),
    "provenance.model_revision.id": lambda r: r["provenance"]["model_revision"].update(id="org/m@x y"),
    "provenance.model_revision": lambda r: r["provenance"]["model_revision"].update(note="hello"),
    "provenance.made_with.versions.transformers": lambda r: r["provenance"]["made_with"]["versions"].update(
        transformers=_payload()),
    "dataset_revision['vqa_rad:all'].files[0].sha256": lambda r: r["benchmarks"]["vqa_rad:all"][
        "annotation_files"][0].update(sha256=_payload()[:64]),
}


@pytest.mark.parametrize("field", sorted(HOSTILE))
def test_a_hostile_field_is_refused_naming_the_file_and_the_field(tmp_path, field):
    results = copy.deepcopy(_results())
    HOSTILE[field](results)
    with pytest.raises(hub.PublishError) as caught:
        _export(tmp_path, results)
    message = str(caught.value)
    assert str(tmp_path / "run" / "results.json") in message and field in message
    assert len(message) < 600  # the payload is named by its first characters, never echoed back whole
    assert not (tmp_path / "out" / "results").exists() or not any((tmp_path / "out" / "results").rglob("*.yaml"))


def test_each_run_of_a_combined_file_is_checked(tmp_path):
    bad = copy.deepcopy(_results())
    bad["settings"]["control"] = "sepia"
    with pytest.raises(hub.PublishError, match=r"runs\[1\]\.settings\.control 'sepia'"):
        _export(tmp_path, {"runs": [_results(), bad]})


def test_written_files_are_bounded(monkeypatch, tmp_path):
    monkeypatch.setattr(results_check, "MAX_FILE_BYTES", 200)
    with pytest.raises(hub.PublishError, match=r"\.eval_results/vqa_rad_all_.*\.yaml would be \d+ bytes"):
        _export(tmp_path, _results())
    assert not any((tmp_path / "out").rglob("*.yaml"))


def test_a_control_names_a_folder_or_file_only_when_known():
    assert control_slug("no_image") == "no_image" and cell_slug("vcd", "noise") == "vcd__noise"
    assert all(control_slug(kind) == kind and kind.replace("_", "").isalnum() for kind in CONTROLS)  # name-safe
    assert cell_folder("vcd:alpha=1", "blank", 3).startswith("vcd_alpha-1__blank")
    for bad in ("x y\u202e", "../up", "none/x", 3):
        with pytest.raises(ControlError):
            cell_slug("vcd", bad)


def test_a_predictions_file_with_an_unknown_control_is_refused(tmp_path):
    path = tmp_path / "predictions.jsonl"
    path.write_text(json.dumps({"id": "vqa_rad/all/1", "prediction": "yes", "control": "x y\u202e"}) + "\n")
    with pytest.raises(BackendError, match="'control' 'x y"):
        PredictionsFileBackend(path)
    path.write_text(json.dumps({"id": "vqa_rad/all/1", "prediction": "yes", "control": "noise"}) + "\n")
    assert PredictionsFileBackend(path).carried_control == "noise"
