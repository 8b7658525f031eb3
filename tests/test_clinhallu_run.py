"""``run_eval --benchmark clinhallu``: the runner drives the ClinHallu protocol end to end (tiny random
LLaVA, a judge server on 127.0.0.1, the fixture snapshot), writes the metrics and the Table 2/3-shaped
tables, resumes without new model or judge calls, and refuses a run it cannot do."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from clinhallu_fixture import shared_upstream
from judge_servers import JudgeServer, user_text
from medheval.data.benchmarks import prepare_benchmark
from medheval.families.clinhallu.protocol import GENERATIONS, JUDGMENTS, LOG_FIELDS, metric_inputs
from medheval.report.tables import CLINHALLU_STAGE_NOTES
from medheval.run.predictions_log import read_log

REPO = Path(__file__).resolve().parents[1]


def _args(snapshot, out, *extra):
    roots = [arg for key, path in snapshot["image_roots"].items() for arg in ("--image-root", f"{key}={path}")]
    return ["run", "--benchmark", "clinhallu:vqa_rad", "--data-dir", snapshot["data_dir"], *roots,
            "--output", str(out), "--max-new-tokens", "8", *extra]


def _reply(request_json):
    # VR judged hallucinated, every other stage not; answers judged wrong
    hallucinated = int("Section checked: Visual Recognition" in user_text(request_json))
    return json.dumps({"hallucinated": hallucinated, "reason": "checked", "answer_correct": 0,
                       "answer_reasoning": "compared"})


def test_run_eval_drives_the_protocol_and_resumes(snapshot, tmp_path):
    import evaluate

    from medheval.cli import main

    out = tmp_path / "run"
    with JudgeServer("openai", reply=_reply) as server:
        judge = f"openai:fake-judge@{server.base_url}"
        assert main(_args(snapshot, out, "--model", "tiny-random-llava", "--judge", judge,
                          "--benchmark-option", "clinhallu.prompts=own")) == 0
        first_requests = server.request_count
        results = json.loads((out / "results.json").read_text())
        entry = results["benchmarks"]["clinhallu:vqa_rad"]
        logs = Path(entry["logs"])
        generations = read_log(logs / GENERATIONS, required=LOG_FIELDS)
        n = entry["n_records"]
        assert n >= 2 and entry["generated_this_run"] == len(generations) == 4 * n
        assert entry["run_options"] == {"prompts": "own", "temperature": 0.7}
        assert entry["clinhallu_run"]["protocol"]["max_new_tokens"] == 8  # --max-new-tokens

        # the metric in results.json is metrics/clinhallu on the judged columns of the logs
        records = prepare_benchmark("clinhallu", "vqa_rad", data_dir=snapshot["data_dir"]).dataset.to_list()
        columns = metric_inputs(records, read_log(logs / JUDGMENTS, required=LOG_FIELDS))
        expected = evaluate.load(str(REPO / "metrics" / "clinhallu"), keep_in_memory=True).compute(**columns)
        metric = entry["metrics"]["clinhallu"]
        assert json.loads(json.dumps(expected)) == metric
        assert metric["counts"]["n"] == n and metric["acc"] == 0.0  # the judge calls every answer wrong
        judged_vr = [value for value in columns["h_v"] if value is not None]
        # Eq. 13: every VR judged is hallucinated and an unjudged one counts as hallucinated too
        assert metric["h_v"] == 1.0 and set(judged_vr) <= {1} and metric["stage_denominator"] == "all_items"
        # temperatures and counts of the protocol are recorded with the split
        info = entry["clinhallu_run"]
        assert info["protocol"]["temperature"] == 0.7 and info["judge"]["temperature"] == 0.01
        assert info["protocol"]["max_new_tokens"] == 8
        assert sum(c["n"] for c in info["counts"].values()) == 4 * n
        assert info["counts"]["org"]["n_invalid"] == n  # random weights write no valid trace

        md = (out / "results.md").read_text()
        assert "| Model | Split | Source | n | Acc | H^V | H^K | H^R |" in md
        assert "| Acc | Δ^V | Δ^K | Δ^VK | Rep-V Fix | Rep-V Break | Rep-K Fix |" in md
        assert f"| tiny-random-llava | clinhallu:vqa_rad | all | {n} | 0.0 | 100.0 |" in md
        assert CLINHALLU_STAGE_NOTES["all_items"] in md  # results.md says which reading H uses
        assert f"| tiny-random-llava | clinhallu:vqa_rad | vqa_rad | {n} | 0.0 |" in md
        # `medheval report` (and the run's report.html) read the per-item values back from the protocol logs:
        # they reproduce the figures; the run recorded each item's image, and two of the fixture's VQA-RAD
        # questions ask about vqarad_00005.jpg, so its items fall in 2 clusters: too few for a bootstrap interval
        from medheval.families.clinhallu.task import CLUSTERS
        from medheval.report.collect import find_runs
        from medheval.report.paper import build_tables
        from medheval.report.stats import FEW_CLUSTERS, zero_bound

        assert entry["cluster_unit"] == "image"
        assert sorted(json.loads((logs / CLUSTERS).read_text()).values()) == [
            "image:vqarad_00005.jpg", "image:vqarad_00005.jpg", "image:vqarad_00009.jpg"]
        stage = next(t for t in build_tables(find_runs([out])) if t.key == "clinhallu_stages")
        (labels, cells), *_ = stage.rows
        assert labels[2] == "all"
        # every stage rate is 0 or 100% (the judge calls every answer wrong): below 6 clusters, only the exact
        # bound of no success (or failure) over the 2 images, of 2 and 1 items (stats.zero_bound)
        assert (cells[0].value, cells[0].low, cells[0].n, cells[0].n_clusters) == (0.0, 0.0, n, 2)
        assert cells[0].high == pytest.approx(100 * zero_bound([2.0, 1.0])) and cells[0].note is None
        assert {cell.note for _, row in stage.rows for cell in row if cell.value is not None} == {None}
        by_item = next(t for t in build_tables(find_runs([out], cluster="none")) if t.key == "clinhallu_stages")
        item_cell = by_item.rows[0][1][0]  # by item: 3 items, 0 of 3 (and no unit named)
        assert (item_cell.value, item_cell.low, item_cell.note, item_cell.unit) == (0.0, 0.0, None, None)
        assert item_cell.high == pytest.approx(100 * (1 - 0.025 ** (1 / 3)))
        replacement = next(t for t in build_tables(find_runs([out])) if t.key == "clinhallu_replacement")
        delta = dict(zip([c.label for c in replacement.columns], replacement.rows[0][1]))["Δ^V"]
        assert (delta.low, delta.note) == (None, FEW_CLUSTERS)  # a difference has no exact bound: too few
        assert f'title="{FEW_CLUSTERS[:40]}' in (out / "report.html").read_text()  # the cell says why

        # a second identical run: no model generation, no judge call, same metrics
        log_before = (logs / GENERATIONS).read_text()
        assert main(_args(snapshot, out, "--model", "tiny-random-llava", "--judge", judge,
                          "--benchmark-option", "clinhallu.prompts=own")) == 0
        assert server.request_count == first_requests
        again = json.loads((out / "results.json").read_text())["benchmarks"]["clinhallu:vqa_rad"]
        assert again["generated_this_run"] == 0 and (logs / GENERATIONS).read_text() == log_before
        assert again["metrics"]["clinhallu"] == metric and metric["denominator"] == "all_items"
        # metric options reach metrics/clinhallu (rescored from the logs, still no call)
        assert main(_args(snapshot, out, "--model", "tiny-random-llava", "--judge", judge,
                          "--benchmark-option", "clinhallu.prompts=own",
                          "--metric-option", "clinhallu.upstream_compat=true")) == 0
        assert server.request_count == first_requests
        rescored = json.loads((out / "results.json").read_text())
        assert rescored["benchmarks"]["clinhallu:vqa_rad"]["metrics"]["clinhallu"]["denominator"] == "valid_only"
        # the other stage reading is a named metric option, and results.md says it was used
        assert main(_args(snapshot, out, "--model", "tiny-random-llava", "--judge", judge,
                          "--benchmark-option", "clinhallu.prompts=own",
                          "--metric-option", "clinhallu.stage_denominator=judged")) == 0
        assert server.request_count == first_requests
    judged = json.loads((out / "results.json").read_text())["benchmarks"]["clinhallu:vqa_rad"]["metrics"]["clinhallu"]
    assert judged["stage_denominator"] == "judged" and judged["h_v"] == (1.0 if judged_vr else None)
    assert CLINHALLU_STAGE_NOTES["judged"] in (out / "results.md").read_text()
    # a local snapshot has no published checksum: nothing to warn about
    assert rescored["warnings"] == []


def test_run_eval_refuses_without_judge_or_with_a_predictions_file(snapshot, tmp_path, capsys):
    from medheval.cli import main

    assert main(_args(snapshot, tmp_path / "a", "--model", "tiny-random-llava")) == 2
    err = capsys.readouterr().err
    assert "needs --judge" in err and "clinhallu" in err
    predictions = tmp_path / "p.jsonl"
    predictions.write_text(json.dumps({"id": "clinhallu/vqa_rad/5", "prediction": "yes"}) + "\n")
    assert main(_args(snapshot, tmp_path / "b", "--predictions", str(predictions),
                      "--judge", "openai:m@http://127.0.0.1:9/v1")) == 2
    err = capsys.readouterr().err
    assert "generate_chat" in err and "--model, not --predictions" in err
    assert main(_args(snapshot, tmp_path / "c", "--model", "tiny-random-llava", "--judge",
                      "openai:m@http://127.0.0.1:9/v1", "--benchmark-option", "clinhallu.prompts=mine")) == 2
    assert "clinhallu.prompts='mine'" in capsys.readouterr().err
    assert main(_args(snapshot, tmp_path / "d", "--model", "tiny-random-llava", "--judge",
                      "openai:m@http://127.0.0.1:9/v1", "--metric-option", "clinhallu.bogus=1")) == 2
    assert "bogus" in capsys.readouterr().err
    assert not any((tmp_path / name / "clinhallu").exists() for name in "abcd")


def test_the_protocols_inputs_are_checked_before_the_model_loads(snapshot, tmp_path, capsys, monkeypatch):
    """--protocol clinhallu with --data-dir a Hub snapshot and no ClinHallu code around: the error names the
    prompt file, where it was looked for and how to provide it, before any model loads; likewise a judge that
    cannot take ClinHallu's request."""
    import sys

    from medheval.cli import main
    from medheval.families.clinhallu.prompts import CODE_DIR_ENV

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("MEDHEVAL_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(CODE_DIR_ENV, raising=False)
    monkeypatch.setattr(sys.modules["medheval.cli.main"], "build_backend",
                        lambda args: pytest.fail("the model loaded before the check"))
    judge = ("--judge", "openai:m@http://127.0.0.1:9/v1")
    assert main(_args(snapshot, tmp_path / "a", "--model", "tiny-random-llava", *judge, "--protocol", "clinhallu")) == 2
    err = capsys.readouterr().err
    assert "benchmark clinhallu: ClinHallu file" in err and "'prompts/cot_generation.py' is not available" in err
    assert f"set {CODE_DIR_ENV}=<folder>" in err and f"{snapshot['data_dir']}/prompts/cot_generation.py" in err
    upstream = shared_upstream() / "clinhallu"
    if upstream.is_dir():  # the files found: the judge is checked next, still before the model
        monkeypatch.setenv(CODE_DIR_ENV, str(upstream))
        assert main(_args(snapshot, tmp_path / "b", "--model", "tiny-random-llava", "--protocol", "clinhallu",
                          "--judge", "anthropic:claude@http://127.0.0.1:9")) == 2
        assert "judge backend 'anthropic' cannot take it" in capsys.readouterr().err
    assert not any((tmp_path / name).exists() for name in "ab")
    # a grid checks them once, before its first model loads
    from medheval.run.grids import load_grid_config, run_config
    from medheval.run.protocol import RunError

    monkeypatch.delenv(CODE_DIR_ENV, raising=False)
    grid = tmp_path / "grid.yaml"
    grid.write_text(json.dumps({"output": str(tmp_path / "g"), "protocol": "clinhallu", "models": ["tiny-random-llava"],
                                "benchmarks": ["clinhallu:vqa_rad"], "data_dir": snapshot["data_dir"],
                                "judge": "openai:m@http://127.0.0.1:9/v1"}))
    with pytest.raises(RunError, match="'prompts/cot_generation.py' is not available"):
        run_config(load_grid_config(grid), build_backend=lambda args: pytest.fail("a model loaded before the check"))
    assert not (tmp_path / "g").exists()


def test_tables_shaped_like_the_papers_tables_2_and_3():
    from medheval.report.tables import clinhallu_replacement_table, clinhallu_stage_table

    part = {"acc": 0.5, "h_v": 0.25, "h_k": None, "h_r": 0.125, "delta_v": 0.1, "delta_k": -0.05, "delta_vk": None,
            "fix_rate": {"rep_v": 0.4, "rep_k": None, "rep_vk": 1.0}, "break_rate": {"rep_v": 0.0, "rep_k": 0.5},
            "counts": {"n": 4}}
    run = {"settings": {"model": "m"}, "benchmarks": {
        "clinhallu:all": {"metrics": {"clinhallu": {**part, "per_source": {"pathvqa": {**part, "counts": {"n": 1}}}}}},
        "other:x": {"metrics": {"close_ended_accuracy": {"accuracy": 1.0}}}}}
    assert clinhallu_stage_table([run]).splitlines()[2:] == [
        "| m | clinhallu:all | all | 4 | 50.0 | 25.0 | – | 12.5 |",
        "| m | clinhallu:all | pathvqa | 1 | 50.0 | 25.0 | – | 12.5 |"]
    assert clinhallu_replacement_table([run]).splitlines()[2] == (
        "| m | clinhallu:all | all | 4 | 50.0 | +10.0 | -5.0 | – | 40.0 | 0.0 | – | 50.0 | 100.0 | – |")
    assert clinhallu_stage_table([{"settings": {"model": "m"}, "benchmarks": {}}]) == ""


@pytest.mark.parametrize("option, message", [
    ("clinhallu.top_p=5", "clinhallu.top_p='5': must be between 0 and 1"),
    ("clinhallu.temperature=nan", "clinhallu.temperature='nan': must be a finite number"),
    ("clinhallu.temperature=inf", "clinhallu.temperature='inf': must be a finite number"),
    ("clinhallu.top_p=nan", "clinhallu.top_p='nan': must be a finite number"),
])
def test_out_of_range_sampling_options_are_refused_before_the_model_loads(snapshot, tmp_path, capsys, monkeypatch,
                                                                          option, message):
    """Were accepted and recorded: top_p=5 (which the decoders ignore without a word, as --top-p 2 was) and a NaN or
    infinite temperature, which failed only in the first generation."""
    import sys

    from medheval.cli import main

    monkeypatch.setattr(sys.modules["medheval.cli.main"], "build_backend",
                        lambda args: pytest.fail("the model loaded before the check"))
    assert main(_args(snapshot, tmp_path / "out", "--model", "tiny-random-llava", "--judge",
                      "openai:m@http://127.0.0.1:9/v1", "--benchmark-option", option)) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_fractional_max_attempts_is_refused_not_truncated():
    from medheval.families.clinhallu.task import apply_run_options

    with pytest.raises(ValueError, match=r"clinhallu\.max_attempts=2\.5: expected an integer >= 1"):
        apply_run_options(None, {"max_attempts": 2.5})
    assert apply_run_options(None, {"max_attempts": 3.0, "top_p": "0.9"})[1] == {
        "prompts": "own", "temperature": 0.7, "max_attempts": 3, "top_p": 0.9}
