"""Our benchmarks as inspect_ai tasks (``medheval/<benchmark>``), run with ``inspect_ai.eval`` against an
OpenAI-compatible server on 127.0.0.1 (tests/judge_servers.py) as the model, offline.

The contract (docs/interop.md, "Use from lmms-eval / inspect"): the split metrics in the inspect log equal what
``medheval run --predictions`` computes from the same completions, and each sample's score is the per-item
value of the run's ``scored.jsonl`` row. Checked on a close-ended split with images (mm_vishal:slake,
accuracy = correct / answered) and a report split with ratio metrics (vishal_report: CHAIR_i, corpus BLEU,
which a mean of per-sample values would get wrong).
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import pytest
import yaml
from interop_support import require_harness

inspect_ai = require_harness("inspect_ai")

from judge_servers import JudgeServer, image_parts, user_text  # noqa: E402
from medheval.cli.main import main  # noqa: E402
from medheval.integrations.inspect.scorers import NO_ITEM_VALUE, headline_values  # noqa: E402
from medheval.integrations.splits import generation_settings, item_value, load_items  # noqa: E402

REPORTS = ("The heart size is normal. There is a small left pleural effusion. No pneumothorax.",
           "Mild cardiomegaly. Right lower lobe opacity, possibly atelectasis. No effusion.",
           "No acute cardiopulmonary process. Lungs are clear.")


def _reply(request_json: dict) -> str:
    """A deterministic model: the answer depends only on the prompt text (so a re-ask answers the same)."""
    text = user_text(request_json)
    pick = int(hashlib.sha256(text.encode()).hexdigest(), 16)
    if "report" in text.lower() or "findings" in text.lower():
        return REPORTS[pick % len(REPORTS)]
    return ("Yes.", "No.", "A")[pick % 3]


def _image_root(fixture: dict) -> str:
    return ",".join(f"{source}={root}" for source, root in fixture["image_roots"].items())


@pytest.fixture(scope="module")
def model_server():
    with JudgeServer("openai", reply=_reply) as server:
        yield server


def _eval(split: str, fixture: dict, server: JudgeServer, log_dir: Path):
    benchmark, config = split.split(":")
    (log,) = inspect_ai.eval(f"medheval/{benchmark}", model="openai-api/loop/tiny-vlm",
                             model_base_url=server.base_url, log_dir=str(log_dir), display="none",
                             task_args={"config": config, "data_dir": fixture["data_dir"],
                                        "image_root": _image_root(fixture), "allow_credentialed": True})
    assert log.status == "success", log.error
    return log


def _medheval_run(split: str, completions: dict[str, str], fixture: dict, tmp_path: Path) -> tuple[dict, dict]:
    """``medheval run --predictions`` on the same completions: (split metrics, scored rows by id)."""
    predictions = tmp_path / f"{split.replace(':', '_')}.jsonl"
    predictions.write_text("".join(json.dumps({"id": rid, "prediction": text}) + "\n"
                                   for rid, text in completions.items()))
    out = tmp_path / f"run_{split.replace(':', '_')}"
    assert main(["run", "--benchmark", split, "--predictions", str(predictions), "--output", str(out),
                 "--data-dir", fixture["data_dir"]]) == 0
    metrics = json.loads((out / "results.json").read_text())["benchmarks"][split]["metrics"]
    rows = {row["id"]: row for row in map(json.loads, (out / "scored.jsonl").read_text().splitlines())}
    return metrics, rows


@pytest.mark.parametrize("split", ["mm_vishal:slake", "vishal_report:default"])
def test_inspect_split_metrics_equal_medheval_run_on_the_same_completions(split, fixture_benchmark, model_server,
                                                                          tmp_path, monkeypatch):
    monkeypatch.setenv("LOOP_API_KEY", "test-key")
    benchmark, config = split.split(":")
    log = _eval(split, fixture_benchmark, model_server, tmp_path / "logs")
    items = load_items(benchmark, config, data_dir=fixture_benchmark["data_dir"],
                       image_roots=_image_root(fixture_benchmark), allow_credentialed=True)
    samples = {sample.id: sample for sample in log.samples}
    assert sorted(samples) == sorted(item.id for item in items)  # every record, by our canonical id

    # what the model was sent: the record's images then medheval run's prompt; greedy, run's length
    sent = {user_text(request.json): request.json for request in model_server.requests}
    for item in items:
        request = sent[item.prompt]
        assert len(image_parts(request)) == len(item.images) >= 1
        assert request["max_tokens"] == generation_settings(benchmark, config)["max_new_tokens"]
        assert request["temperature"] == 0
    assert samples[items[0].id].metadata == {"benchmark": benchmark, "config": config, "record_id": items[0].id,
                                             "answer_type": items[0].record["answer_type"],
                                             "source": items[0].record["source"], "fixture": True}

    completions = {sid: sample.output.completion for sid, sample in samples.items()}
    assert all(completions.values())
    run_metrics, rows = _medheval_run(split, completions, fixture_benchmark, tmp_path)

    (score,) = log.results.scores
    logged = {name: entry.value for name, entry in score.metrics.items()}
    expected = headline_values(run_metrics)
    assert expected and logged.keys() == expected.keys()
    for name, value in expected.items():
        assert logged[name] == pytest.approx(value, abs=1e-12), name

    if benchmark == "vishal_report":
        # CHAIR (paper variant) is a ratio of sums over the split: hallucinated findings / generated findings,
        # from the per-item counts each sample's score carries (MedHEval's CHAIR, Table 7 setting)
        scored = [next(iter(sample.scores.values())).metadata["scored"] for sample in samples.values()]
        ratio = sum(row["n_hallucinated_per_item"] for row in scored) / sum(row["n_generated_per_item"] for row in scored)
        assert logged["chair/chair"] == pytest.approx(ratio, abs=1e-12)

    # each sample's score: the completion, the record id, and the run's per-item value
    for sid, sample in samples.items():
        (sample_score,) = sample.scores.values()
        assert sample_score.answer == completions[sid] and sample_score.metadata["id"] == sid
        value = item_value(rows[sid])
        assert sample_score.value == (NO_ITEM_VALUE if value is None else pytest.approx(value, abs=1e-12)), sid


def test_the_close_ended_split_metric_is_not_an_average_of_logged_values(fixture_benchmark, model_server, tmp_path,
                                                                         monkeypatch):
    """Known answer for accuracy on mm_vishal:slake: correct answers / items, recomputed by hand from the
    per-sample values (1.0/0.0); both outcomes occur, so the check can fail."""
    monkeypatch.setenv("LOOP_API_KEY", "test-key")
    log = _eval("mm_vishal:slake", fixture_benchmark, model_server, tmp_path / "logs")
    values = [next(iter(sample.scores.values())).value for sample in log.samples]
    assert set(values) == {0.0, 1.0}
    accuracy = log.results.scores[0].metrics["close_ended_accuracy/accuracy"].value
    assert math.isclose(accuracy, sum(values) / len(values))


def test_the_entry_point_lists_a_task_per_harness_benchmark():
    """inspect finds every task by its registry name through our entry point; ClinHallu has none."""
    from inspect_ai._util.registry import registry_lookup

    from medheval.integrations.splits import HARNESS_BENCHMARKS

    for benchmark in HARNESS_BENCHMARKS:
        assert registry_lookup("task", f"medheval/{benchmark}") is not None, benchmark
    assert registry_lookup("task", "medheval/clinhallu") is None


def test_a_missing_image_root_names_the_records_and_roots(fixture_benchmark, tmp_path):
    """No image root for the split's source: the task fails before any request, with the runner's message."""
    with pytest.raises(Exception, match=r"slake") as caught:
        inspect_ai.eval("medheval/mm_vishal", model="mockllm/model", log_dir=str(tmp_path), display="none",
                        task_args={"config": "slake", "data_dir": fixture_benchmark["data_dir"],
                                   "image_root": f"vqa_rad={tmp_path}"})
    assert "image" in str(caught.value).lower()


def test_the_inspect_cli_runs_a_task_with_several_image_roots(fixture_benchmark, model_server, tmp_path):
    """``inspect eval medheval/cxr_vishal -T config=iu_xray -T image_root=a=x,b=y`` as a user types it (the
    CLI hands the comma list over as a list); its split metric equals score_split on the logged completions."""
    import os
    import subprocess
    import sys

    from inspect_ai.log import list_eval_logs, read_eval_log

    from medheval.integrations.splits import score_split

    env = {**os.environ, "LOOP_API_KEY": "test-key"}
    command = [sys.executable, "-m", "inspect_ai", "eval", "medheval/cxr_vishal", "-T", "config=iu_xray",
               "-T", f"data_dir={fixture_benchmark['data_dir']}", "-T", f"image_root={_image_root(fixture_benchmark)}",
               "--model", "openai-api/loop/tiny-vlm", "--model-base-url", model_server.base_url,
               "--log-dir", str(tmp_path), "--display", "none"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    (info,) = list_eval_logs(str(tmp_path))
    log = read_eval_log(info)
    assert log.status == "success" and log.eval.task == "medheval/cxr_vishal"
    completions = {sample.id: sample.output.completion for sample in log.samples}
    results, _ = score_split("cxr_vishal", "iu_xray", completions, data_dir=fixture_benchmark["data_dir"])
    assert log.results.scores[0].metrics["close_ended_accuracy/accuracy"].value == pytest.approx(
        results["close_ended_accuracy"]["accuracy"], abs=1e-12)


def _sample_score(record_id: str, answer: str, value=1.0):
    from inspect_ai.scorer import SampleScore, Score

    return SampleScore(score=Score(value=value, answer=answer, metadata={"id": record_id}), sample_id=record_id)


def test_the_split_metric_scores_the_completions_once_and_refuses_two_per_item(fixture_benchmark):
    """The metric alone, on hand-made scores: its numbers are score_split's on the same completions (the
    logged values are ignored: all 1.0 here); two different completions for one record (epochs > 1) stop it."""
    from medheval.integrations.inspect.scorers import split_metrics
    from medheval.integrations.splits import score_split

    items = load_items("mm_vishal", "slake", data_dir=fixture_benchmark["data_dir"],
                       image_roots=_image_root(fixture_benchmark))
    completions = {item.id: ("Yes." if index % 2 else "No.") for index, item in enumerate(items)}
    compute = split_metrics("mm_vishal", "slake", data_dir=fixture_benchmark["data_dir"])
    results, _ = score_split("mm_vishal", "slake", completions, data_dir=fixture_benchmark["data_dir"])
    assert compute([_sample_score(rid, text) for rid, text in completions.items()]) == headline_values(results)
    first = items[0].id
    twice = [_sample_score(first, "Yes."), _sample_score(first, "No.")]
    with pytest.raises(ValueError, match=rf"record '{first}' has several different completions.*--epochs 1"):
        compute(twice)


def _log_holds_image_data(path: str) -> bool:
    import zipfile

    with zipfile.ZipFile(path) as archive:
        return any(b"data:image/" in archive.read(name) for name in archive.namelist())


def test_a_credentialed_split_needs_the_allow_credentialed_task_arg(fixture_benchmark, monkeypatch):
    """inspect sends a task's images to any --model and logs them: a MIMIC split is refused at task build (naming
    the data use agreement and the opt-in) unless ``-T allow_credentialed=true``, which the task records."""
    from medheval.integrations.inspect.tasks import split_task
    from medheval.judges.endpoints import CredentialedDataError

    monkeypatch.delenv("MEDHEVAL_ALLOW_CREDENTIALED", raising=False)
    args = {"data_dir": fixture_benchmark["data_dir"], "image_root": _image_root(fixture_benchmark)}
    with pytest.raises(CredentialedDataError, match=r"(?s)cxr_vishal:mimic_cxr: refusing .*data use agreement.*"
                                                    r"-T allow_credentialed=true"):
        split_task("cxr_vishal", "mimic_cxr", **args)
    assert split_task("cxr_vishal", "mimic_cxr", allow_credentialed="true", **args).metadata["allow_credentialed"]
    assert "allow_credentialed" not in split_task("mm_vishal", "slake", **args).metadata


def test_a_credentialed_split_run_with_no_log_images_keeps_pixels_out_of_the_log(fixture_benchmark, model_server,
                                                                                  tmp_path, monkeypatch):
    """inspect writes each sample's input (our images as data URLs) into the .eval log unless told not to;
    for MIMIC-CXR splits docs/interop.md asks for --no-log-images, which leaves no image bytes in the file."""
    monkeypatch.setenv("LOOP_API_KEY", "test-key")
    common = {"task_args": {"config": "mimic_cxr", "data_dir": fixture_benchmark["data_dir"],
                           "image_root": _image_root(fixture_benchmark), "allow_credentialed": True},
             "model": "openai-api/loop/tiny-vlm", "model_base_url": model_server.base_url, "display": "none", "limit": 2}
    (kept,) = inspect_ai.eval("medheval/cxr_vishal", log_dir=str(tmp_path / "kept"), log_images=True, **common)
    (dropped,) = inspect_ai.eval("medheval/cxr_vishal", log_dir=str(tmp_path / "dropped"), log_images=False, **common)
    assert kept.status == dropped.status == "success"
    assert _log_holds_image_data(kept.location)  # inspect's default (named here: an earlier eval in this process may
    # have changed the process-wide default): pixels in the log
    assert not _log_holds_image_data(dropped.location)


def test_an_inspect_run_of_the_written_eval_yaml_gives_the_published_value(fixture_benchmark, model_server, tmp_path,
                                                                           monkeypatch):
    """Issue 32, point 4: every task entry of the written eval.yaml is one inspect's own reader accepts
    (``inspect eval hf/<repo>``), and running what its ``reproduce`` block names gives, for a task id, the value
    that ``publish --results`` files under that id, which is ``medheval run --predictions``'s."""
    from inspect_ai._eval.task.hf import HFTask

    from medheval.publish import hub
    from medheval.publish.eval_yaml import read_eval_yaml, reproduction

    monkeypatch.setenv("LOOP_API_KEY", "test-key")
    repo = hub.export_dataset("cxr_vishal", tmp_path / "hub", data_dir=fixture_benchmark["data_dir"])
    data = read_eval_yaml(repo.folder)
    for task in data["tasks"]:
        HFTask.model_validate(task)
    task_id = "mimic_cxr/close_ended_accuracy/accuracy"
    recipe = reproduction(data, task_id)
    assert recipe == {"task": "medheval/cxr_vishal", "task_args": {"config": "mimic_cxr"},
                      "metric": "close_ended_accuracy/accuracy"}
    (log,) = inspect_ai.eval(recipe["task"], model="openai-api/loop/tiny-vlm", model_base_url=model_server.base_url,
                             log_dir=str(tmp_path / "logs"), display="none",
                             task_args={**recipe["task_args"], "data_dir": fixture_benchmark["data_dir"],
                                        "image_root": _image_root(fixture_benchmark), "allow_credentialed": True})
    assert log.status == "success", log.error
    (score,) = log.results.scores
    value = score.metrics[recipe["metric"]].value
    assert main(["publish", "--results", str(log.location), "--model-repo", "org/model", "--to", str(tmp_path / "out"),
                 "--allow-fixture"]) == 0
    entries = [entry for path in (tmp_path / "out" / "results" / "org--model" / ".eval_results").iterdir()
               for entry in yaml.safe_load(path.read_text())]
    [published] = [e for e in entries if e["dataset"] == {"id": "medheval/cxr_vishal", "task_id": task_id}]
    completions = {sample.id: sample.output.completion for sample in log.samples}
    run_metrics, _ = _medheval_run("cxr_vishal:mimic_cxr", completions, fixture_benchmark, tmp_path)
    assert published["value"] == value == run_metrics["close_ended_accuracy"]["accuracy"]
    assert 0 < value < 1  # the model got some right and some wrong: the number tells runs apart
