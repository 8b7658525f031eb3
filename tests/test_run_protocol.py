"""The split protocol interface: a dataset unit's declared protocol is found by name and drives the runner.

The runner has no benchmark-specific branch: every split goes through ``check`` -> ``prepare`` ->
``run_split`` -> ``score_split`` of its protocol (standard QA unless the unit declares one).
"""

from __future__ import annotations

import json
import sys
import types

import pytest

from medheval.cli import main
from medheval.run import protocol as protocol_module
from medheval.run.protocol import RunError, SplitJob, SplitProtocol, protocol_for, split_entry
from medheval.run.runner import QAProtocol


class Recording(SplitProtocol):
    """A protocol that scores every record "seen" without a model, and records the calls it got."""

    name = "recording"
    calls: list[str] = []

    def check(self, benchmark, backend, spec):
        type(self).calls.append(f"check {benchmark}")

    def prepare(self, loaded, backend, spec):
        type(self).calls.append(f"prepare {loaded.name}:{loaded.config} ({len(loaded.dataset)})")
        return ["close_ended_accuracy"]

    def run_split(self, job: SplitJob):
        type(self).calls.append(f"run {job.split} main={job.group.is_main}")
        return len(job.loaded.dataset)

    def score_split(self, job: SplitJob, generated):
        type(self).calls.append(f"score {job.split} {generated} {sorted(job.options)}")
        items = [{"id": rid, "split": job.split, "prediction": "seen"} for rid in job.loaded.dataset["id"]]
        return split_entry(job.loaded, n_scored=generated, metrics={"recording": {"n": generated}}), items


@pytest.fixture
def recording_unit(monkeypatch):
    """``context`` declares the recording protocol (as ``datasets/clinhallu`` declares ClinHallu's)."""
    module = types.ModuleType("recording_protocol")
    module.Recording = Recording
    monkeypatch.setitem(sys.modules, "recording_protocol", module)
    real = protocol_module._unit

    def unit(name):
        found = real(name)
        if name != "context":
            return found
        return types.SimpleNamespace(**{**vars(found), "PROTOCOLS": {"generate": "recording_protocol:Recording"}})

    monkeypatch.setattr(protocol_module, "_unit", unit)
    Recording.calls = []
    return Recording


def test_declared_protocols_are_found_by_name():
    clinhallu = protocol_for("clinhallu")
    assert type(clinhallu).__name__ == "ClinHalluProtocol" and type(clinhallu).__module__ == (
        "medheval.families.clinhallu.task")
    detection = protocol_for("med_hallmark", "detection")
    assert type(detection).__name__ == "DetectionProtocol"
    assert protocol_for("med_hallmark") is None  # generate: the standard QA protocol
    assert protocol_for("mm_vishal") is None and protocol_for("mm_vishal", "detection") is None
    with pytest.raises(RunError, match="unknown task 'judge'"):
        protocol_for("mm_vishal", "judge")


def test_a_bad_declaration_names_the_unit(monkeypatch):
    monkeypatch.setattr(protocol_module, "_unit", lambda name: types.SimpleNamespace(PROTOCOLS={"generate": "nowhere:X"}))
    with pytest.raises(RunError, match=r"datasets/x/x.py declares protocol 'nowhere:X' .* cannot be imported"):
        protocol_for("x")
    monkeypatch.setattr(protocol_module, "_unit", lambda name: types.SimpleNamespace(
        PROTOCOLS={"generate": "medheval.run.protocol:SplitJob"}))
    with pytest.raises(RunError, match="is not a SplitProtocol"):
        protocol_for("x")


def test_the_runner_runs_a_declared_protocol(recording_unit, fixture_benchmark, tmp_path):
    from medheval.data.benchmarks import load_benchmark

    ids = load_benchmark("context", data_dir=fixture_benchmark["data_dir"])["id"]
    predictions = tmp_path / "p.jsonl"
    predictions.write_text("".join(json.dumps({"id": rid, "prediction": "x"}) + "\n" for rid in ids))
    out = tmp_path / "run"
    assert main(["run", "--benchmark", "context", "--predictions", str(predictions), "--output", str(out),
                 "--data-dir", fixture_benchmark["data_dir"]]) == 0
    n = len(ids)
    assert recording_unit.calls == ["check context", f"prepare context:default ({n})", "run context:default main=True",
                                    f"score context:default {n} ['close_ended_accuracy']"]
    results = json.loads((out / "results.json").read_text())
    entry = results["benchmarks"]["context:default"]
    assert entry["metrics"] == {"recording": {"n": n}} and entry["n_records"] == n
    scored = [json.loads(line) for line in (out / "scored.jsonl").read_text().splitlines()]
    assert [row["prediction"] for row in scored] == ["seen"] * n
    assert not (out / "predictions.jsonl").exists()  # the protocol generated nothing through the log


def test_undeclared_benchmarks_run_the_standard_protocol(fixture_benchmark, tmp_path):
    from medheval.run.runner import RunSpec, _prepare_split

    class Files:  # a backend that is a predictions file for every record
        name, needs_images = "file", False

    prepared = _prepare_split(RunSpec(benchmarks=["context"], output=tmp_path, data_dir=fixture_benchmark["data_dir"]),
                              Files(), "context", [])
    assert isinstance(prepared.protocol, QAProtocol)
    assert prepared.metric_names == ["close_ended_accuracy"]  # the per-answer-type default for context
