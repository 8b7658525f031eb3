"""Fault injection on the runner (issue 9, parts 7, 9, 10, 11): each case reproduced, then held fixed."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

from medheval.data.benchmarks import load_benchmark
from medheval.cli import main
from medheval.run.predictions_log import CorruptLogError, LogWriter, read_log

RUN_EVAL = str(REPO / "run_eval.py")
ENV = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1", "TQDM_DISABLE": "1",
       "HF_EVALUATE_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _ids(fixture: dict, name: str, config: str | None = None) -> list[str]:
    return list(load_benchmark(name, config, data_dir=fixture["data_dir"])["id"])


def _roots(fixture: dict) -> list[str]:
    return [arg for source, root in fixture["image_roots"].items() for arg in ("--image-root", f"{source}={root}")]


def _scored(output: Path) -> dict[str, dict]:
    lines = (output / "scored.jsonl").read_text(encoding="utf-8").split("\n")
    return {row["id"]: row for row in map(json.loads, filter(None, lines))}


# -- part 7: typed metric options ------------------------------------------------------------------


def _metric(name: str):
    from medheval.run.protocol import load_metric

    return load_metric(name)


@pytest.mark.parametrize("raw, expected", [("False", False), ("false", False), ("0", False), ("no", False),
                                           ("TRUE", True), ("yes", True), (" on ", True), (True, True)])
def test_boolean_options_are_parsed_by_type(raw, expected):
    from medheval.scoring.metric_options import check_options

    checked = check_options("close_ended_accuracy", _metric("close_ended_accuracy"), {"upstream_compat": raw})
    assert checked == {"upstream_compat": expected}


@pytest.mark.parametrize("metric, key, raw, expected", [
    ("close_ended_accuracy", "threshold", "0.5", 0.5),
    ("close_ended_accuracy", "threshold", 1, 1.0),
    ("text_generation", "bertscore_num_layers", "12", 12),
    ("text_generation", "bertscore_num_layers", "null", None),
    ("text_generation", "bertscore_model", "/models/roberta", "/models/roberta"),
    ("chair", "findings", '["Edema", "Atelectasis"]', ["Edema", "Atelectasis"]),
    ("chair", "findings", "Edema,Atelectasis", "Edema,Atelectasis"),
    ("chair", "variant", "1", "1"),  # a string option keeps digits as text
    ("ratescore", "affinity_matrix", '{"a": 1}', {"a": 1}),
    ("sh_judge", "allow_remote_credentialed", "judge.example", "judge.example"),
    ("sh_judge", "judge", '{"backend": "openai", "model": "m"}', {"backend": "openai", "model": "m"}),
    ("sh_judge", "judge", "openai:m@http://127.0.0.1:1/v1", "openai:m@http://127.0.0.1:1/v1"),
    ("sh_judge", "cache_dir", "false", False),
])
def test_options_take_their_declared_type(metric, key, raw, expected):
    from medheval.scoring.metric_options import check_options

    assert check_options(metric, _metric(metric), {key: raw}) == {key: expected}


@pytest.mark.parametrize("metric, key, raw, expected_type", [
    ("close_ended_accuracy", "upstream_compat", "Flase", "a boolean"),
    ("close_ended_accuracy", "upstream_compat", 1, "a boolean"),
    ("close_ended_accuracy", "threshold", "high", "a number"),
    ("text_generation", "bertscore_num_layers", "1.5", "an integer"),
    ("text_generation", "bertscore_idf", "maybe", "a boolean"),
    ("chair", "findings", 3, "a string or a JSON list of strings or null"),
])
def test_values_of_the_wrong_type_are_refused_naming_option_value_and_type(metric, key, raw, expected_type):
    from medheval.scoring.metric_options import MetricOptionError, check_options

    with pytest.raises(MetricOptionError) as excinfo:
        check_options(metric, _metric(metric), {key: raw})
    message = str(excinfo.value)
    assert f"{metric}.{key}={raw!r}" in message and f"expected {expected_type}" in message


def test_every_option_of_every_metric_has_a_type():
    """A new option whose default is None must be declared in its module's OPTION_TYPES."""
    import inspect

    from medheval.scoring.metric_options import NOT_OPTIONS, option_types
    from medheval.data.registry import list_units
    from medheval.run.protocol import RECORD_INPUTS

    for name in list_units("metrics"):
        metric = _metric(name)
        options = [p for p in inspect.signature(metric._compute).parameters
                   if p not in NOT_OPTIONS and p not in RECORD_INPUTS]
        assert sorted(set(options) - set(option_types(metric))) == [], name


def test_a_metric_signature_is_read_once_for_every_question_about_it(monkeypatch):
    """takes / compute_parameters answer what the runner, the option checks and the results' option list ask
    of a metric's ``_compute`` from one reading of its signature."""
    import inspect

    from medheval.scoring import metric_options

    class Metric:
        def _compute(self, predictions, references, images=None, threshold: float = 0.5):
            return {}

    real, read = inspect.signature, []
    monkeypatch.setattr(inspect, "signature", lambda function, *args, **kwargs: read.append(function)
                        or real(function, *args, **kwargs))
    metric = Metric()
    assert metric_options.takes(metric, "images") and not metric_options.takes(metric, "run_results")
    assert metric_options.check_options("m", metric, {"threshold": "0.2"}) == {"threshold": 0.2}
    assert metric_options.option_types(metric) == {"threshold": float}
    assert metric_options.non_default_options(metric, {"threshold": 0.5, "images": [1]}) == {"images": [1]}
    assert read == [metric._compute]


def test_capital_false_really_turns_upstream_compat_off(fixture_benchmark, tmp_path):
    """Reproduction: "False" was the truthy string "False", so upstream scoring ran while results said false."""
    ds = load_benchmark("mm_vishal", "vqa_rad", data_dir=fixture_benchmark["data_dir"])
    abnormal = [r["id"] for r in ds.to_list() if r["answer"] == "Abnormal"]
    assert abnormal
    path = _write_jsonl(tmp_path / "p.jsonl", [{"id": rid, "prediction": "Yes."} for rid in ds["id"]])
    base = ["run", "--benchmark", "mm_vishal:vqa_rad", "--predictions", str(path), "--data-dir",
            fixture_benchmark["data_dir"]]
    assert main([*base, "--output", str(tmp_path / "off"), "--metric-option",
                 "close_ended_accuracy.upstream_compat=False"]) == 0
    assert main([*base, "--output", str(tmp_path / "on"), "--metric-option",
                 "close_ended_accuracy.upstream_compat=TRUE"]) == 0
    off, on = _scored(tmp_path / "off"), _scored(tmp_path / "on")
    for rid in abnormal:  # MedHEval's scorer reads "Abnormal" as yes; ours calls the reference unusable
        assert off[rid]["correct"] is False and on[rid]["correct"] is True
    recorded = json.loads((tmp_path / "off" / "results.json").read_text())["scoring"]["metric_options"]
    assert recorded == {"close_ended_accuracy": {"upstream_compat": False}}


def test_option_errors_come_before_any_generation(fixture_benchmark, tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["run", "--benchmark", "context,vishal_report", "--model", "tiny-random-llava", "--output", str(out),
                 "--data-dir", fixture_benchmark["data_dir"], "--max-new-tokens", "4", *_roots(fixture_benchmark),
                 "--metric-option", "chair.uncertain_as_positive=perhaps"])
    err = capsys.readouterr().err
    assert code == 2 and "chair.uncertain_as_positive='perhaps'" in err and "a boolean" in err
    assert not (out / "predictions.jsonl").exists() and not (out / "run.json").exists()


def test_a_metric_option_applies_to_the_splits_that_compute_that_metric(fixture_benchmark, tmp_path):
    """Reproduction: chair.variant on knowledge:closed + vishal_report was refused (knowledge computes no CHAIR)."""
    ids = _ids(fixture_benchmark, "knowledge", "closed") + _ids(fixture_benchmark, "vishal_report")
    path = _write_jsonl(tmp_path / "p.jsonl", [{"id": rid, "prediction": "No. The lungs are clear."} for rid in ids])
    out = tmp_path / "run"
    assert main(["run", "--benchmark", "knowledge:closed,vishal_report", "--predictions", str(path), "--output",
                 str(out), "--data-dir", fixture_benchmark["data_dir"], "--metric-option",
                 "chair.variant=medheval_code"]) == 0
    benchmarks = json.loads((out / "results.json").read_text())["benchmarks"]
    assert benchmarks["vishal_report:default"]["metrics"]["chair"]["variant"] == "medheval_code"
    assert "chair" not in benchmarks["knowledge:closed"]["metrics"]


def test_empty_metric_list_is_refused(fixture_benchmark, tmp_path, capsys):
    """Reproduction: ``--metrics ,`` computed nothing and exited 0."""
    path = _write_jsonl(tmp_path / "p.jsonl", [{"id": rid, "prediction": "no"}
                                              for rid in _ids(fixture_benchmark, "context")])
    code = main(["run", "--benchmark", "context", "--predictions", str(path), "--output", str(tmp_path / "o"),
                 "--data-dir", fixture_benchmark["data_dir"], "--metrics", ","])
    assert code == 2 and "names no metric" in capsys.readouterr().err
    assert not (tmp_path / "o" / "results.json").exists()


def test_a_malformed_judge_spec_is_refused_before_generation(fixture_benchmark, tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["run", "--benchmark", "knowledge:open", "--model", "tiny-random-llava", "--output", str(out),
                 "--data-dir", fixture_benchmark["data_dir"], "--max-new-tokens", "4", *_roots(fixture_benchmark),
                 "--judge", "gpt-4o"])
    assert code == 2 and "backend:model" in capsys.readouterr().err
    assert not (out / "predictions.jsonl").exists()


# -- part 9: atomic writes -------------------------------------------------------------------------


def test_atomic_write_keeps_the_old_file_when_the_write_fails(tmp_path, monkeypatch):
    from medheval.run import outputs

    target = tmp_path / "results.json"
    outputs.atomic_write_text(target, '{"old": true}')

    def disk_full(descriptor):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(outputs.os, "fsync", disk_full)
    with pytest.raises(OSError, match="No space"):
        outputs.atomic_write_text(target, '{"new": true, "padding": "' + "x" * 100_000 + '"}')
    assert target.read_text() == '{"old": true}'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.json"]  # no temp file left behind


def test_a_rerun_that_dies_while_writing_leaves_the_previous_results_whole(fixture_benchmark, tmp_path,
                                                                           monkeypatch):
    from medheval.run import outputs

    path = _write_jsonl(tmp_path / "p.jsonl", [{"id": rid, "prediction": "yes"}
                                              for rid in _ids(fixture_benchmark, "context")])
    out = tmp_path / "run"
    args = ["run", "--benchmark", "context", "--predictions", str(path), "--output", str(out), "--data-dir",
            fixture_benchmark["data_dir"]]
    assert main(args) == 0
    before = {name: (out / name).read_bytes() for name in ("results.json", "results.md", "scored.jsonl", "run.json")}
    real_replace = os.replace
    calls = []

    def dies_on_second(src, dst):
        calls.append(dst)
        if len(calls) == 2:  # scored.jsonl is in place, results.json is not: a kill at this moment
            raise OSError(28, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(outputs.os, "replace", dies_on_second)
    assert main([*args, "--upstream-compat"]) == 1  # one line naming the file (issue 31), not a traceback
    assert json.loads((out / "results.json").read_bytes()) == json.loads(before["results.json"])
    assert (out / "results.md").read_bytes() == before["results.md"]
    assert not [p for p in out.iterdir() if p.name.endswith(".tmp")]


# -- part 10: one run per output folder ------------------------------------------------------------

HOLD_LOCK = """
import sys
from medheval.run.outputs import OutputLock
with OutputLock(sys.argv[1]):
    print("locked", flush=True)
    sys.stdin.readline()
"""


def _holder(folder: Path) -> subprocess.Popen:
    process = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(folder)], env=ENV, stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "locked"
    return process


def _predictions_run(fixture: dict, tmp_path: Path, output: Path, *extra: str) -> list[str]:
    path = tmp_path / "p.jsonl"
    if not path.exists():
        _write_jsonl(path, [{"id": rid, "prediction": "yes"} for rid in _ids(fixture, "context")])
    return [sys.executable, RUN_EVAL, "--benchmark", "context", "--predictions", str(path), "--output", str(output),
            "--data-dir", fixture["data_dir"], *extra]


def test_a_second_run_into_a_locked_folder_refuses_and_one_that_waits_goes_on(fixture_benchmark, tmp_path):
    out = tmp_path / "run"
    holder = _holder(out)
    try:
        refused = subprocess.run(_predictions_run(fixture_benchmark, tmp_path, out), env=ENV, capture_output=True,
                                 text=True, timeout=300)
        assert refused.returncode == 2
        assert "in use by another run" in refused.stderr and f"pid {holder.pid}" in refused.stderr
        assert "Traceback" not in refused.stderr and not (out / "predictions.jsonl").exists()
        waiting = subprocess.Popen(_predictions_run(fixture_benchmark, tmp_path, out, "--lock-timeout", "300"),
                                   env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    finally:
        holder.communicate("\n", timeout=60)  # release
    _, err = waiting.communicate(timeout=300)
    assert waiting.returncode == 0, err
    assert len(read_log(out / "predictions.jsonl")) == len(_ids(fixture_benchmark, "context"))


def test_a_lock_left_by_a_killed_run_is_taken_over(fixture_benchmark, tmp_path):
    out = tmp_path / "run"
    holder = _holder(out)
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=60)
    assert (out / ".medheval.lock").exists()  # the file stays; the kernel dropped the lock with the process
    done = subprocess.run(_predictions_run(fixture_benchmark, tmp_path, out), env=ENV, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr


@pytest.mark.slow
def test_two_runs_started_together_never_duplicate_records(fixture_benchmark, tmp_path):
    """Reproduction: two runs into one folder both exited 0 with every record logged twice."""
    out = tmp_path / "run"
    cmd = [sys.executable, RUN_EVAL, "--benchmark", "context,knowledge:closed", "--model", "tiny-random-llava",
           "--output", str(out), "--data-dir", fixture_benchmark["data_dir"], "--batch-size", "1",
           "--max-new-tokens", "8", *_roots(fixture_benchmark)]
    first = subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    second = subprocess.Popen(cmd, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    errors = [first.communicate(timeout=600)[1], second.communicate(timeout=600)[1]]
    codes = sorted([first.returncode, second.returncode])
    assert codes in ([0, 0], [0, 2]), errors  # [0, 0] only when one finished before the other began
    if codes == [0, 2]:
        assert any("in use by another run" in err for err in errors)
    ids = [entry["id"] for entry in read_log(out / "predictions.jsonl")]
    assert len(ids) == len(set(ids)) == len(_ids(fixture_benchmark, "context")) + len(
        _ids(fixture_benchmark, "knowledge", "closed"))


# -- part 11: errors and warnings ------------------------------------------------------------------


def _copy_data(fixture: dict, tmp_path: Path) -> Path:
    data = tmp_path / "data"
    shutil.copytree(fixture["data_dir"], data)
    return data


def test_a_corrupt_annotation_file_gives_the_builders_message(fixture_benchmark, tmp_path):
    from medheval.families.medheval.fixtures import CONTEXT_FILE

    data = _copy_data(fixture_benchmark, tmp_path)
    (data / CONTEXT_FILE).write_text('[{"qid": 1, "question": "truncated')
    path = _write_jsonl(tmp_path / "p.jsonl", [{"id": "context/default/1", "prediction": "yes"}])
    done = subprocess.run([sys.executable, RUN_EVAL, "--benchmark", "context", "--predictions", str(path),
                           "--output", str(tmp_path / "o"), "--data-dir", str(data)],
                          env={**ENV, "MEDHEVAL_CACHE": str(tmp_path / "cache")}, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 2
    assert "not valid JSON" in done.stderr and CONTEXT_FILE in done.stderr and "context:default" in done.stderr
    assert "Traceback" not in done.stderr and "DatasetGenerationError" not in done.stderr
    assert len(done.stderr.strip().splitlines()) <= 3


def test_an_empty_annotation_array_names_its_file(tmp_path):
    """``[]`` (a file cut before its first record) was datasets' "Instruction 'test' corresponds to no data!",
    naming no file; the reader now names the file and what it expected."""
    from medheval.data.builders import read_json_records

    path = tmp_path / "MM-VisHal.json"
    path.write_text("[]")
    with pytest.raises(ValueError, match=r"MM-VisHal\.json: the JSON array holds no records; is this a MedHEval"):
        read_json_records(path, "a MedHEval benchmark_data file")


def test_annotation_files_that_differ_from_the_pin_are_warned_about(fixture_benchmark, tmp_path, capsys):
    """A copy of the files whose sha256 does not match MedHEval's pins (the fixture's, without the marker that
    says it is the fixture: what an edited copy of the release looks like) is warned about, per file."""
    from medheval.data.fetch import FIXTURE_MARKER
    from medheval.families.medheval.fixtures import CONTEXT_FILE

    data = _copy_data(fixture_benchmark, tmp_path)
    (data / FIXTURE_MARKER).unlink()
    path = _write_jsonl(tmp_path / "p.jsonl", [{"id": rid, "prediction": "no"}
                                              for rid in _ids(fixture_benchmark, "context")])
    out = tmp_path / "o"
    assert main(["run", "--benchmark", "context", "--predictions", str(path), "--output", str(out),
                 "--data-dir", str(data)]) == 0
    err = capsys.readouterr().err
    assert "warning:" in err and CONTEXT_FILE in err and "not the pinned" in err
    results = json.loads((out / "results.json").read_text())
    assert any(CONTEXT_FILE in text for text in results["warnings"])
    markdown = (out / "results.md").read_text()
    assert "## Warnings" in markdown and CONTEXT_FILE in markdown


def test_unknown_prediction_ids_are_counted_and_reported(fixture_benchmark, tmp_path, capsys):
    ids = _ids(fixture_benchmark, "context")
    rows = [{"id": rid, "prediction": "no"} for rid in ids]
    rows += [{"id": "context/default/does-not-exist", "prediction": "no"}, {"id": "typo-123", "prediction": "yes"}]
    path = _write_jsonl(tmp_path / "p.jsonl", rows)
    out = tmp_path / "o"
    assert main(["run", "--benchmark", "context", "--predictions", str(path), "--output", str(out),
                 "--data-dir", fixture_benchmark["data_dir"]]) == 0
    results = json.loads((out / "results.json").read_text())
    summary = results["predictions_file"]
    assert summary["n_predictions"] == len(ids) + 2 and summary["n_used"] == len(ids)
    assert summary["n_unknown"] == 2
    assert summary["unknown_examples"] == ["context/default/does-not-exist", "typo-123"]
    assert results["benchmarks"]["context:default"]["data_quality"]["n_unknown_prediction_ids"] == 1
    assert f"2 of {len(ids) + 2} id(s)" in (out / "results.md").read_text()
    assert "typo-123" in capsys.readouterr().err


def test_ids_outside_the_limit_are_not_called_unknown(fixture_benchmark, tmp_path):
    ids = _ids(fixture_benchmark, "context")
    path = _write_jsonl(tmp_path / "p.jsonl", [{"id": rid, "prediction": "no"} for rid in ids])
    out = tmp_path / "o"
    assert main(["run", "--benchmark", "context", "--predictions", str(path), "--output", str(out),
                 "--data-dir", fixture_benchmark["data_dir"], "--limit", "3"]) == 0
    summary = json.loads((out / "results.json").read_text())["predictions_file"]
    assert summary == {"n_predictions": len(ids), "n_used": 3, "n_not_used": len(ids) - 3, "n_unknown": 0,
                       "unknown_examples": []}


def test_missing_predictions_allowed_are_shown_in_results_md(fixture_benchmark, tmp_path):
    ids = _ids(fixture_benchmark, "context")
    path = _write_jsonl(tmp_path / "p.jsonl", [{"id": rid, "prediction": "no"} for rid in ids[:-3]])
    out = tmp_path / "o"
    assert main(["run", "--benchmark", "context", "--predictions", str(path), "--output", str(out),
                 "--data-dir", fixture_benchmark["data_dir"], "--allow-missing-predictions"]) == 0
    markdown = (out / "results.md").read_text()
    assert "context:default: 3 record(s) have no prediction and were not scored" in markdown
    assert ids[-3] in markdown


def test_the_credentialed_refusal_names_a_flag_run_eval_has(fixture_benchmark, tmp_path, capsys, monkeypatch):
    import requests

    from medheval.cli import build_parser

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-real-key")
    sent: list = []

    class Sent(Exception):
        pass

    def send(self, request, **kwargs):
        sent.append(request.url)
        raise Sent(request.url)

    monkeypatch.setattr(requests.Session, "send", send)
    ids = _ids(fixture_benchmark, "knowledge", "open")
    path = _write_jsonl(tmp_path / "p.jsonl", [{"id": rid, "prediction": "An answer."} for rid in ids])
    base = ["run", "--benchmark", "knowledge:open", "--predictions", str(path), "--data-dir",
            fixture_benchmark["data_dir"], "--metrics", "sh_judge", "--judge",
            "openai:judge-model@https://judge.example/v1", "--metric-option", "sh_judge.cache_dir=false"]
    assert main([*base, "--output", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert "--allow-remote-credentialed judge.example" in err and not sent
    flag = "--allow-remote-credentialed"
    assert build_parser().parse_args(["run", "--benchmark", "x", "--predictions", "p", "--output", "o", flag,
                                      "judge.example"]).allow_remote_credentialed == ["judge.example"]
    # the opt-in lifts the refusal: requests reach the transport (which fails here, so each item is reported
    # failed, and a metric that failed on every item makes the run exit 1 after writing its results)
    assert main([*base, "--output", str(tmp_path / "b"), flag, "https://user:pw-1@judge.example/v1"]) == 1
    assert sent and all(url.startswith("https://judge.example/v1") for url in sent)
    results = json.loads((tmp_path / "b" / "results.json").read_text())
    assert results["scoring"]["allow_remote_credentialed"] == ["https://judge.example/v1"]
    assert "pw-1" not in (tmp_path / "b" / "results.json").read_text()


def test_the_opt_in_is_recorded_without_secrets(fixture_benchmark, tmp_path):
    from medheval.run.protocol import safe_options
    from medheval.run.runner import RunSpec, _options_for

    spec = RunSpec(benchmarks=["knowledge:open"], output=tmp_path, judge="openai:m@https://judge.example/v1",
                   allow_remote_credentialed=("https://user:pw-1@judge.example/v1", "other.example"))
    assert _options_for(spec, ["sh_judge"])["sh_judge"]["allow_remote_credentialed"] == list(
        spec.allow_remote_credentialed)
    recorded = safe_options(spec)["allow_remote_credentialed"]
    assert recorded == ["https://judge.example/v1", "other.example"]


def test_the_runs_own_log_with_line_separators_in_answers_can_be_rescored(fixture_benchmark, tmp_path):
    """Reproduction: U+2028 inside an answer split the line (str.splitlines) and the file was refused."""
    ids = _ids(fixture_benchmark, "context")
    answer = "No.\u2028Second line\u0085third\u2029"
    log = tmp_path / "predictions.jsonl"  # as the runner wrote it before (and other tools write it): raw U+2028
    log.write_text("".join(json.dumps({"id": rid, "prediction": answer, "model": "m"}, ensure_ascii=False) + "\n"
                           for rid in ids), encoding="utf-8")
    assert "\u2028" in log.read_text(encoding="utf-8")
    out = tmp_path / "o"
    assert main(["run", "--benchmark", "context", "--predictions", str(log), "--output", str(out),
                 "--data-dir", fixture_benchmark["data_dir"]]) == 0
    assert {row["prediction"] for row in _scored(out).values()} == {answer}
    # what the runner writes now escapes those separators, so even str.splitlines() sees one record per line
    with LogWriter(tmp_path / "new.jsonl") as writer:
        writer.write({"id": "a", "prediction": answer})
    (line,) = (tmp_path / "new.jsonl").read_text(encoding="utf-8").splitlines()
    assert json.loads(line)["prediction"] == answer
    assert len((out / "scored.jsonl").read_text(encoding="utf-8").splitlines()) == len(ids)


def test_a_log_line_without_id_is_named_with_its_line_number(fixture_benchmark, tmp_path, capsys):
    """Reproduction: the run stopped with ``error: 'id'``."""
    log = tmp_path / "predictions.jsonl"
    log.write_text('{"id": "a", "prediction": "yes"}\n{"prediction": "no", "model": "m"}\n')
    with pytest.raises(CorruptLogError, match=r"line 2 has no 'id'"):
        read_log(log)
    out = tmp_path / "o"
    args = ["run", "--benchmark", "context", "--model", "tiny-random-llava", "--output", str(out),
            "--data-dir", fixture_benchmark["data_dir"], "--max-new-tokens", "4", "--limit", "1",
            *_roots(fixture_benchmark)]
    assert main(args) == 0  # a run's folder (run.json), whose log is then damaged
    shutil.copy(log, out / "predictions.jsonl")
    capsys.readouterr()
    code = main(args)
    err = capsys.readouterr().err
    assert code == 2 and "line 2 has no 'id'" in err and "error: 'id'" not in err


def test_skipping_every_record_for_missing_images_is_an_error(fixture_benchmark, tmp_path, capsys):
    empty = tmp_path / "no-images"
    empty.mkdir()
    code = main(["run", "--benchmark", "context", "--model", "tiny-random-llava", "--output", str(tmp_path / "o"),
                 "--data-dir", fixture_benchmark["data_dir"], "--image-root", f"mimic_cxr={empty}",
                 "--on-missing", "skip", "--max-new-tokens", "4"])
    err = capsys.readouterr().err
    n = len(_ids(fixture_benchmark, "context"))
    assert code == 2 and f"all {n} record(s) have a missing image" in err and str(empty) in err


def test_skip_all_through_the_library_api_is_an_error(fixture_benchmark, tmp_path):
    from medheval.data.images import ImageError

    with pytest.raises(ImageError, match="all .* record"):
        load_benchmark("context", data_dir=fixture_benchmark["data_dir"], image_roots={"mimic_cxr": str(tmp_path)},
                       on_missing="skip")


def test_grid_and_single_runs_do_not_overwrite_each_others_results(fixture_benchmark, tmp_path, capsys):
    """Reproduction: a single run into a grid's folder silently replaced the grid's combined results."""
    base = ["run", "--benchmark", "context", "--model", "tiny-random-llava", "--data-dir",
            fixture_benchmark["data_dir"], "--max-new-tokens", "4", "--limit", "2", *_roots(fixture_benchmark)]
    grid = tmp_path / "grid"
    assert main([*base, "--output", str(grid), "--mitigation", "none", "--mitigation", "vcd:alpha=0"]) == 0
    combined = (grid / "results.json").read_bytes()
    capsys.readouterr()
    assert main([*base, "--output", str(grid)]) == 2
    assert "mitigation grid" in capsys.readouterr().err
    assert (grid / "results.json").read_bytes() == combined and not (grid / "predictions.jsonl").exists()
    assert main([*base, "--output", str(grid), "--mitigation", "none", "--mitigation", "vcd:alpha=0"]) == 0  # resume

    single = tmp_path / "single"
    assert main([*base, "--output", str(single)]) == 0
    capsys.readouterr()
    assert main([*base, "--output", str(single), "--mitigation", "none", "--mitigation", "m3id"]) == 2
    assert "holds a single run" in capsys.readouterr().err


def test_a_settings_refusal_names_the_setting_and_both_values(fixture_benchmark, tmp_path, capsys):
    out = tmp_path / "run"
    base = ["run", "--benchmark", "context", "--model", "tiny-random-llava", "--output", str(out), "--data-dir",
            fixture_benchmark["data_dir"], "--limit", "1", *_roots(fixture_benchmark)]
    assert main([*base, "--max-new-tokens", "8"]) == 0
    capsys.readouterr()
    assert main([*base, "--max-new-tokens", "16"]) == 2
    err = capsys.readouterr().err
    assert "backend.max_new_tokens 8 \u2192 16" in err and "limit" not in err.split("changed:")[1].split(")")[0]


def test_the_runner_leaves_os_environ_alone(fixture_benchmark, tmp_path, monkeypatch):
    from medheval.run.protocol import load_metric

    monkeypatch.delenv("HF_EVALUATE_OFFLINE", raising=False)
    load_metric.cache_clear()
    path = _write_jsonl(tmp_path / "p.jsonl", [{"id": rid, "prediction": "no"}
                                              for rid in _ids(fixture_benchmark, "context")])
    before = dict(os.environ)
    assert main(["run", "--benchmark", "context", "--predictions", str(path), "--output", str(tmp_path / "o"),
                 "--data-dir", fixture_benchmark["data_dir"]]) == 0
    assert dict(os.environ) == before


def test_results_md_says_how_items_were_scored(fixture_benchmark, tmp_path, capsys):
    """Issue 23, point 14: results.md states upstream_compat, the metrics' scoring modes (CHAIR's labeler, with
    the paper's CheXbert named when the rule labeler ran) and every option that differs from its default."""
    ids = _ids(fixture_benchmark, "vishal_report")
    path = _write_jsonl(tmp_path / "p.jsonl", [{"id": rid, "prediction": "No pleural effusion."} for rid in ids])
    base = ["run", "--benchmark", "vishal_report", "--predictions", str(path),
            "--data-dir", fixture_benchmark["data_dir"]]
    assert main([*base, "--output", str(tmp_path / "default")]) == 0
    md = (tmp_path / "default" / "results.md").read_text()
    section = md.split("## How items were scored", 1)[1].split("\n## ", 1)[0]
    assert "`upstream_compat=false`: the papers' definitions" in section
    assert "`chair`: labeler `chexpert_rules` (the offline rule labeler; the MedHEval paper labelled" in section
    assert "variant `paper`" in section
    assert "metric options that differ from the defaults: none" in section

    assert main([*base, "--output", str(tmp_path / "changed"), "--upstream-compat",
                 "--metric-option", "chair.variant=medheval_code", "--metric-option", "chair.labeler=rule"]) == 0
    section = (tmp_path / "changed" / "results.md").read_text().split("## How items were scored", 1)[1]
    assert "`upstream_compat=true`" in section and "variant `medheval_code`" in section
    # the option that equals its default (labeler=rule) is not listed; the switched ones are
    assert 'metric options that differ from the defaults: `chair.upstream_compat=true`, `chair.variant="medheval_code"`, ' \
           '`text_generation.upstream_compat=true`' in section
    results = json.loads((tmp_path / "changed" / "results.json").read_text())
    assert results["scoring"]["non_default_options"] == {"chair": {"variant": "medheval_code", "upstream_compat": True},
                                                         "text_generation": {"upstream_compat": True}}
