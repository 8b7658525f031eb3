"""run_eval.py end to end: predictions files, resumability after SIGKILL, clear errors."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO

from medheval.data.benchmarks import load_benchmark
from medheval.cli import main
from medheval.run.predictions_log import CorruptLogError, LogWriter, read_log

RUN_EVAL = str(REPO / "run_eval.py")


def _write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _strip_timing(entries: list[dict]) -> list[dict]:
    return [{k: v for k, v in entry.items() if k != "seconds"} for entry in entries]


def test_scoring_a_predictions_file(fixture_benchmark, tmp_path):
    ds = load_benchmark("mm_vishal", data_dir=fixture_benchmark["data_dir"])
    rows = ds.to_list()
    # answer every yes/no item "Yes" and every multiple-choice item with its reference
    preds = [{"id": r["id"], "prediction": "Yes." if r["answer_type"] == "yes_no" else r["answer"]} for r in rows]
    path = _write_jsonl(tmp_path / "mine.jsonl", preds)
    out = tmp_path / "run"
    code = main(["run", "--benchmark", "mm_vishal", "--predictions", str(path), "--output", str(out),
                 "--data-dir", fixture_benchmark["data_dir"]])
    assert code == 0
    results = json.loads((out / "results.json").read_text())
    metric = results["benchmarks"]["mm_vishal:all"]["metrics"]["close_ended_accuracy"]
    scored = [json.loads(line) for line in (out / "scored.jsonl").read_text().splitlines()]
    assert len(scored) == len(rows) == metric["n"]
    expected_correct = sum(
        1 for r in rows
        if "binary_answer_not_yes_no" not in r["meta"]["quality_flags"]
        and "answer_not_in_choices" not in r["meta"]["quality_flags"]
        and "choices_are_bare_letters" not in r["meta"]["quality_flags"]
        and (r["answer_type"] == "multiple_choice" or r["answer"].strip(". ").lower() == "yes")
    )
    assert metric["accuracy"] == pytest.approx(expected_correct / len(rows))
    assert set(metric["accuracy_by_category"]) <= {"anatomy", "measurement", "symptom", "radiology"}
    table = (out / "results.md").read_text()
    assert "Acc-A" in table and "mm_vishal:all" in table


def test_predictions_file_with_wrong_ids_is_a_clear_error(fixture_benchmark, tmp_path, capsys):
    ds = load_benchmark("context", data_dir=fixture_benchmark["data_dir"])
    preds = [{"id": rid, "prediction": "yes"} for rid in ds["id"][:-2]]
    path = _write_jsonl(tmp_path / "partial.jsonl", preds)
    args = ["run", "--benchmark", "context", "--predictions", str(path), "--data-dir",
            fixture_benchmark["data_dir"]]
    assert main([*args, "--output", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert "2 record(s)" in err and ds["id"][-1] in err and "--allow-missing-predictions" in err
    assert f"This split's ids look like {ds['id'][0]!r}, {ds['id'][1]!r}." in err  # real ids, not a pattern
    assert main([*args, "--output", str(tmp_path / "b"), "--allow-missing-predictions"]) == 0
    results = json.loads((tmp_path / "b" / "results.json").read_text())
    entry = results["benchmarks"]["context:default"]
    assert entry["n_scored"] == len(ds) - 2 and entry["data_quality"]["missing_predictions"] == 2


def test_predictions_with_padded_ids_say_so(fixture_benchmark, tmp_path, capsys):
    """Ids with spaces around them (a spreadsheet's export) matched nothing, and the error named only the split's
    ids and --allow-missing-predictions: not the file's ids, nor that stripping them was the fix."""
    ds = load_benchmark("context", data_dir=fixture_benchmark["data_dir"])
    path = _write_jsonl(tmp_path / "padded.jsonl", [{"id": f" {rid}\t", "prediction": "yes"} for rid in ds["id"]])
    assert main(["run", "--benchmark", "context", "--predictions", str(path), "--data-dir",
                 fixture_benchmark["data_dir"], "--output", str(tmp_path / "a")]) == 2
    err = capsys.readouterr().err
    assert f"{len(ds)} id(s) of the file match no record of this split, e.g. {' ' + ds['id'][0] + chr(9)!r}" in err
    assert f"({len(ds)} match a record once the spaces around them are removed: ids must be exact, strip them" in err


def test_empty_predictions_file_is_refused(fixture_benchmark, tmp_path, capsys):
    path = tmp_path / "empty.jsonl"
    path.write_text("")
    code = main(["run", "--benchmark", "context", "--predictions", str(path), "--output", str(tmp_path / "o"),
                 "--data-dir", fixture_benchmark["data_dir"]])
    assert code == 2 and "empty" in capsys.readouterr().err.lower()


def test_unknown_benchmark_and_metric_names(fixture_benchmark, tmp_path, capsys):
    path = _write_jsonl(tmp_path / "p.jsonl", [{"id": "x", "prediction": "y"}])
    base = ["run", "--predictions", str(path), "--data-dir", fixture_benchmark["data_dir"]]
    assert main([*base, "--benchmark", "cxr_visha", "--output", str(tmp_path / "a")]) == 2
    assert "cxr_vishal" in capsys.readouterr().err  # suggests the close match
    ids = load_benchmark("context", data_dir=fixture_benchmark["data_dir"])["id"]
    _write_jsonl(path, [{"id": rid, "prediction": "no"} for rid in ids])
    assert main([*base, "--benchmark", "context", "--metrics", "bleuu", "--output", str(tmp_path / "b")]) == 2
    assert "unknown metric" in capsys.readouterr().err
    # a near miss names the metric it was meant to be (the list alone left the user to spot it)
    assert main([*base, "--benchmark", "context", "--metrics", "text_generaton", "--output", str(tmp_path / "c")]) == 2
    assert "unknown metric(s) ['text_generaton'] (did you mean 'text_generation'?)" in capsys.readouterr().err


def test_torn_last_line_is_repaired_and_corruption_elsewhere_is_refused(tmp_path):
    path = tmp_path / "predictions.jsonl"
    with LogWriter(path) as writer:
        writer.write({"id": "a", "prediction": "yes"})
        writer.write({"id": "b", "prediction": "no"})
    with open(path, "a") as handle:
        handle.write('{"id": "c", "predic')  # a kill mid-write
    assert [e["id"] for e in read_log(path)] == ["a", "b"]
    assert path.read_text().endswith('"no"}\n')
    path.write_text('{"id": "a"}\nnot json\n{"id": "b"}\n')
    with pytest.raises(CorruptLogError, match="line 2"):
        read_log(path)


def _run_eval_cmd(fixture: dict, output: Path, *extra: str) -> list[str]:
    cmd = [sys.executable, RUN_EVAL, "--benchmark", "mm_vishal,cxr_vishal,context,knowledge:closed",
           "--model", "tiny-random-llava", "--output", str(output), "--data-dir", fixture["data_dir"],
           "--batch-size", "1", "--max-new-tokens", "8", *extra]
    for source, root in fixture["image_roots"].items():
        cmd += ["--image-root", f"{source}={root}"]
    return cmd


@pytest.mark.slow
def test_resume_after_sigkill_equals_an_uninterrupted_run(fixture_benchmark, tmp_path):
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TQDM_DISABLE": "1"}
    full = tmp_path / "full"
    subprocess.run(_run_eval_cmd(fixture_benchmark, full), check=True, env=env, capture_output=True, timeout=600)
    expected = _strip_timing(read_log(full / "predictions.jsonl"))

    killed = tmp_path / "killed"
    process = subprocess.Popen(_run_eval_cmd(fixture_benchmark, killed), env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    log = killed / "predictions.jsonl"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and process.poll() is None:
        if log.exists() and log.read_bytes().count(b"\n") >= 3:
            process.send_signal(signal.SIGKILL)
            break
        time.sleep(0.002)
    process.wait(timeout=60)
    assert process.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    partial = read_log(log, repair=False) if log.read_bytes().endswith(b"\n") else None
    assert partial is None or 0 < len(partial) < len(expected)

    subprocess.run(_run_eval_cmd(fixture_benchmark, killed), check=True, env=env, capture_output=True, timeout=600)
    resumed = _strip_timing(read_log(killed / "predictions.jsonl"))
    assert [e["id"] for e in resumed] == [e["id"] for e in expected]  # no duplicate, none lost, same order
    assert resumed == expected
    assert _benchmark_results(killed) == _benchmark_results(full)


def _benchmark_results(output: Path) -> dict:
    """results.json's per-split results without the field that differs by design."""
    benchmarks = json.loads((output / "results.json").read_text())["benchmarks"]
    return {split: {k: v for k, v in entry.items() if k != "generated_this_run"} for split, entry in benchmarks.items()}


def test_resuming_with_other_settings_is_refused(fixture_benchmark, tmp_path, capsys):
    out = tmp_path / "run"
    args = ["run", "--benchmark", "context", "--model", "tiny-random-llava", "--output", str(out), "--data-dir",
            fixture_benchmark["data_dir"], "--limit", "2", "--max-new-tokens", "4"]
    roots = [a for s, r in fixture_benchmark["image_roots"].items() for a in ("--image-root", f"{s}={r}")]
    assert main([*args, *roots]) == 0
    assert main([*args[:-1], "6", *roots]) == 2
    assert "different settings" in capsys.readouterr().err
    # a folder whose device carries an index (an earlier data-parallel process's cuda:N) resumes by device type
    recorded = json.loads((out / "run.json").read_text())
    recorded["backend"]["device"] = "cpu:0"
    (out / "run.json").write_text(json.dumps(recorded))
    assert main([*args, *roots]) == 0


def test_a_run_resumes_at_another_batch_size_with_a_warning(fixture_benchmark, tmp_path, capsys):
    """The way out of an out-of-memory error: resume at a smaller batch. Nothing is lost or repeated, the answers
    equal an uninterrupted run's (float32), run.json keeps the first batch size and results.json says so."""
    args = ["run", "--benchmark", "context", "--model", "tiny-random-llava", "--data-dir",
            fixture_benchmark["data_dir"], "--limit", "4", "--max-new-tokens", "4"]
    args += [a for s, r in fixture_benchmark["image_roots"].items() for a in ("--image-root", f"{s}={r}")]
    longer = [("5" if before == "--max-new-tokens" else a) for before, a in zip(["", *args], args)]
    full, cut = tmp_path / "full", tmp_path / "cut"
    assert main([*args, "--output", str(full), "--batch-size", "4"]) == 0
    assert main([*args, "--output", str(cut), "--batch-size", "4"]) == 0
    log = (cut / "predictions.jsonl").read_text().splitlines(keepends=True)
    (cut / "predictions.jsonl").write_text("".join(log[:2]))  # killed after two records
    capsys.readouterr()
    assert main([*args, "--output", str(cut), "--batch-size", "1"]) == 0
    err = capsys.readouterr().err
    assert f"resuming {cut} made at batch size 4; this run uses 1" in err
    results = json.loads((cut / "results.json").read_text())
    assert any("made at batch size 4; this run uses 1" in w for w in results["warnings"])
    assert results["benchmarks"]["context:default"]["generated_this_run"] == 2
    assert json.loads((cut / "run.json").read_text())["backend"]["batch_size"] == 4
    assert _strip_timing(read_log(cut / "predictions.jsonl")) == _strip_timing(read_log(full / "predictions.jsonl"))
    assert _benchmark_results(cut) == _benchmark_results(full)
    # --batch-size auto is a batch size too; any other change is still refused, naming it
    assert main([*args, "--output", str(cut), "--batch-size", "auto"]) == 0
    assert "made at batch size 4; this run uses auto" in capsys.readouterr().err
    assert main([*longer, "--output", str(cut), "--batch-size", "1"]) == 2
    err = capsys.readouterr().err
    assert "max_new_tokens 4 → 5" in err and "batch_size" not in err


def test_unloadable_model_is_a_clear_error(fixture_benchmark, tmp_path, capsys):
    missing = tmp_path / "no-such-model"
    code = main(["run", "--benchmark", "context", "--model", str(missing), "--output", str(tmp_path / "o"),
                 "--data-dir", fixture_benchmark["data_dir"]])
    assert code == 2 and str(missing) in capsys.readouterr().err


def test_model_run_without_image_roots_names_the_sources(fixture_benchmark, tmp_path, capsys):
    code = main(["run", "--benchmark", "cxr_vishal", "--model", "tiny-random-llava", "--output",
                 str(tmp_path / "o"), "--data-dir", fixture_benchmark["data_dir"]])
    err = capsys.readouterr().err
    assert code == 2 and "iu_xray=PATH" in err and "mimic_cxr=PATH" in err


def test_upstream_compat_rescoring_reads_abnormal_as_yes(fixture_benchmark, tmp_path):
    """MedHEval's scorer reads the reference "Abnormal" as yes; ours reports it as unusable."""
    ds = load_benchmark("mm_vishal", "vqa_rad", data_dir=fixture_benchmark["data_dir"])
    abnormal = [r["id"] for r in ds.to_list() if r["answer"] == "Abnormal"]
    assert abnormal, "the fixture has a binary item answered 'Abnormal'"
    path = _write_jsonl(tmp_path / "p.jsonl", [{"id": rid, "prediction": "Yes."} for rid in ds["id"]])
    out = tmp_path / "run"
    base = ["run", "--benchmark", "mm_vishal:vqa_rad", "--predictions", str(path), "--output", str(out),
            "--data-dir", fixture_benchmark["data_dir"]]
    assert main(base) == 0
    native = {json.loads(line)["id"]: json.loads(line) for line in (out / "scored.jsonl").read_text().splitlines()}
    assert main([*base, "--upstream-compat"]) == 0  # same predictions, re-scored: no refusal
    upstream = {json.loads(line)["id"]: json.loads(line) for line in (out / "scored.jsonl").read_text().splitlines()}
    for rid in abnormal:
        assert native[rid]["correct"] is False and upstream[rid]["correct"] is True
    assert json.loads((out / "results.json").read_text())["scoring"]["upstream_compat"] is True


def test_credentialed_url_images_never_leak_the_password(fixture_benchmark, tmp_path, monkeypatch):
    """A run fetching MIMIC images over HTTP basic auth writes no credential anywhere in its output."""
    import base64
    import http.server
    import threading

    root = Path(fixture_benchmark["image_roots"]["mimic_cxr"])
    user, password = "reader", "s3cret-Pa55word"
    expected = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()

    class Handler(http.server.BaseHTTPRequestHandler):
        def _serve(self, body: bool) -> None:
            if self.headers.get("Authorization") != expected:
                self.send_response(401)
                self.send_header("WWW-Authenticate", 'Basic realm="test"')
                self.end_headers()
                return
            path = root / self.path.removeprefix("/files/")
            if not path.is_file():
                self.send_response(404)
                self.end_headers()
                return
            data = path.read_bytes()
            self.send_response(200)
            self.send_header("Content-Type", "image/jpeg")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if body:
                self.wfile.write(data)

        def do_GET(self):  # noqa: N802
            self._serve(True)

        def do_HEAD(self):  # noqa: N802
            self._serve(False)

        def log_message(self, *args):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        monkeypatch.setenv("MEDHEVAL_IMAGE_USERNAME", user)
        monkeypatch.setenv("MEDHEVAL_IMAGE_PASSWORD", password)
        monkeypatch.setenv("MEDHEVAL_IMAGE_HOST", "127.0.0.1")  # the one image server they belong to
        out = tmp_path / "run"
        url = f"http://127.0.0.1:{httpd.server_address[1]}/files/{{path}}"
        code = main(["run", "--benchmark", "context", "--model", "tiny-random-llava", "--output", str(out),
                     "--data-dir", fixture_benchmark["data_dir"], "--image-root", f"mimic_cxr={url}",
                     "--limit", "3", "--max-new-tokens", "4"])
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert code == 0
    results = json.loads((out / "results.json").read_text())
    assert results["benchmarks"]["context:default"]["n_scored"] == 3
    assert "127.0.0.1" in json.dumps(results["benchmarks"]["context:default"]["image_roots"])
    for path in out.rglob("*"):
        if path.is_file():
            assert password not in path.read_text(errors="replace"), path


def test_metric_options_reach_the_metric_and_unknown_ones_are_refused(fixture_benchmark, tmp_path, capsys):
    ids = load_benchmark("context", data_dir=fixture_benchmark["data_dir"])["id"]
    path = _write_jsonl(tmp_path / "p.jsonl", [{"id": rid, "prediction": "yes"} for rid in ids])
    base = ["run", "--benchmark", "context", "--predictions", str(path), "--data-dir", fixture_benchmark["data_dir"]]
    assert main([*base, "--output", str(tmp_path / "a"), "--metric-option",
                 "close_ended_accuracy.upstream_compat=true"]) == 0
    saved = json.loads((tmp_path / "a" / "results.json").read_text())
    assert saved["benchmarks"]["context:default"]["metrics"]["close_ended_accuracy"]["n_skipped_upstream"] == 0
    assert main([*base, "--output", str(tmp_path / "b"), "--metric-option", "close_ended_accuracy.colour=1"]) == 2
    assert "takes no option 'colour'" in capsys.readouterr().err
    assert main([*base, "--output", str(tmp_path / "c"), "--metric-option", "chair.variant=paper"]) == 2
    assert "does not compute" in capsys.readouterr().err


def test_missing_images_are_skipped_and_counted_in_results(fixture_benchmark, tmp_path, capsys):
    import shutil

    root = tmp_path / "mimic"
    shutil.copytree(fixture_benchmark["image_roots"]["mimic_cxr"], root)
    rows = load_benchmark("context", data_dir=fixture_benchmark["data_dir"]).to_list()
    victim = rows[0]["images"][0]
    (root / victim).unlink()
    affected = sorted(r["id"] for r in rows if r["images"][0] == victim)
    base = ["run", "--benchmark", "context", "--model", "tiny-random-llava", "--data-dir",
            fixture_benchmark["data_dir"], "--image-root", f"mimic_cxr={root}", "--max-new-tokens", "4"]
    assert main([*base, "--output", str(tmp_path / "strict")]) == 2
    assert affected[0] in capsys.readouterr().err
    assert main([*base, "--output", str(tmp_path / "skip"), "--on-missing", "skip"]) == 0
    entry = json.loads((tmp_path / "skip" / "results.json").read_text())["benchmarks"]["context:default"]
    assert entry["skipped_missing_images"]["count"] == len(affected)
    assert sorted(entry["skipped_missing_images"]["examples"]) == affected
    assert entry["n_scored"] == len(rows) - len(affected)
    assert "| context:default | 8 |" not in (tmp_path / "skip" / "results.md").read_text()


def test_recorded_scoring_options_carry_no_secret():
    from medheval.run.protocol import safe_options
    from medheval.run.runner import RunSpec

    spec = RunSpec(benchmarks=[], output="unused", judge="openai:gpt-4o@https://reader:pw-123@judge.example/v1",
                   metric_options={"sh_judge": {"judge": {"backend": "openai", "api_key": "sk-live-123"}}})
    recorded = json.dumps(safe_options(spec))
    assert "pw-123" not in recorded and "sk-live-123" not in recorded and "judge.example" in recorded


def test_mitigation_grid_runs_side_by_side_and_vcd_alpha0_equals_plain(fixture_benchmark, tmp_path):
    out = tmp_path / "grid"
    roots = [a for s, r in fixture_benchmark["image_roots"].items() for a in ("--image-root", f"{s}={r}")]
    code = main(["run", "--benchmark", "context", "--model", "tiny-random-llava", "--output", str(out),
                 "--data-dir", fixture_benchmark["data_dir"], "--max-new-tokens", "6", "--batch-size", "4",
                 "--mitigation", "none", "--mitigation", "vcd:alpha=0", "--mitigation", "m3id", *roots])
    assert code == 0
    folders = sorted(p.name for p in out.iterdir() if p.is_dir())
    assert len(folders) == 3 and "none" in folders
    plain = {e["id"]: e["prediction"] for e in read_log(out / "none" / "predictions.jsonl")}
    vcd_folder = next(f for f in folders if f.startswith("vcd"))
    vcd = read_log(out / vcd_folder / "predictions.jsonl")
    assert {e["id"]: e["prediction"] for e in vcd} == plain  # α = 0 contrast is plain greedy
    assert all(e["mitigation"].startswith("vcd") for e in vcd)
    combined = json.loads((out / "results.json").read_text())
    assert [r["settings"]["mitigation"].split(":")[0] for r in combined["runs"]] == ["none", "vcd", "m3id"]
    table = (out / "results.md").read_text()
    assert table.count("| tiny-random-llava |") == 3


def test_unknown_mitigation_and_mitigation_on_a_predictions_file_are_refused(fixture_benchmark, tmp_path, capsys):
    ids = load_benchmark("context", data_dir=fixture_benchmark["data_dir"])["id"]
    path = _write_jsonl(tmp_path / "p.jsonl", [{"id": rid, "prediction": "no"} for rid in ids])
    base = ["run", "--benchmark", "context", "--data-dir", fixture_benchmark["data_dir"]]
    assert main([*base, "--predictions", str(path), "--output", str(tmp_path / "a"), "--mitigation", "vcd"]) == 2
    assert "predictions file" in capsys.readouterr().err
    assert main([*base, "--model", "tiny-random-llava", "--output", str(tmp_path / "b"), "--mitigation", "vcdd"]) == 2
    assert "unknown mitigation" in capsys.readouterr().err


NEWER = "is newer than this medheval release was tested with"


def _context_predictions(fixture: dict, tmp_path: Path, answer: str = "no") -> tuple[list[str], list[str]]:
    """A predictions file answering every context item ``answer``; returns (its ids, the run's base args)."""
    ids = load_benchmark("context", data_dir=fixture["data_dir"])["id"]
    path = _write_jsonl(tmp_path / "p.jsonl", [{"id": rid, "prediction": answer} for rid in ids])
    return ids, ["run", "--benchmark", "context", "--predictions", str(path), "--data-dir", fixture["data_dir"]]


def test_newer_than_tested_warns_once_per_process(fixture_benchmark, tmp_path, monkeypatch, capsys):
    from medheval import versions

    monkeypatch.setattr(versions, "_warned_newer", False)
    monkeypatch.setitem(versions.TESTED, "transformers", "0.1")  # the installed transformers is newer
    installed = versions.installed_version("transformers")
    _, base = _context_predictions(fixture_benchmark, tmp_path)
    assert main([*base, "--output", str(tmp_path / "a")]) == 0
    assert main([*base, "--output", str(tmp_path / "b")]) == 0
    err = capsys.readouterr().err
    assert err.count(NEWER) == 1
    assert f"transformers {installed} (tested up to 0.1)" in err and "medheval selftest" in err
    first = json.loads((tmp_path / "a" / "results.json").read_text())["warnings"]
    second = json.loads((tmp_path / "b" / "results.json").read_text())["warnings"]
    assert [text for text in first if NEWER in text] == [next(line for line in err.splitlines()
                                                              if NEWER in line).removeprefix("warning: ")]
    assert not [text for text in second if NEWER in text]  # it fired in the first run of this process only


def test_nothing_newer_than_tested_no_warning(fixture_benchmark, tmp_path, monkeypatch, capsys):
    from medheval import versions

    monkeypatch.setattr(versions, "_warned_newer", False)
    for package in versions.WATCHED_PACKAGES:
        monkeypatch.setitem(versions.TESTED, package, "999")
    _, base = _context_predictions(fixture_benchmark, tmp_path)
    assert main([*base, "--output", str(tmp_path / "a")]) == 0
    assert NEWER not in capsys.readouterr().err
    assert not [t for t in json.loads((tmp_path / "a" / "results.json").read_text())["warnings"] if NEWER in t]
    assert versions._warned_newer is False


def _set_recorded(out: Path, **recorded: str | None) -> None:
    """Edit run.json's recorded versions (``None``: remove the whole ``versions`` key)."""
    settings = json.loads((out / "run.json").read_text())
    if any(value is None for value in recorded.values()):
        settings.pop("versions")
    else:
        settings["versions"].update(recorded)
    (out / "run.json").write_text(json.dumps(settings))


def test_run_json_and_results_json_record_the_stack(fixture_benchmark, tmp_path):
    from medheval.versions import stack_versions

    _, base = _context_predictions(fixture_benchmark, tmp_path)
    out = tmp_path / "run"
    assert main([*base, "--output", str(out)]) == 0
    expected = stack_versions()
    recorded = json.loads((out / "run.json").read_text())["versions"]
    results = json.loads((out / "results.json").read_text())["versions"]
    for package in ("medheval", "transformers", "torch", "datasets", "evaluate", "huggingface_hub"):
        assert expected[package] and recorded[package] == results[package] == expected[package], package


def test_resume_under_another_transformers_or_torch_warns_and_keeps_predictions(fixture_benchmark, tmp_path,
                                                                                 capsys):
    from medheval.versions import stack_versions

    now = stack_versions()
    ids, base = _context_predictions(fixture_benchmark, tmp_path)
    out = tmp_path / "run"
    assert main([*base, "--output", str(out)]) == 0
    # an interrupted run made with another transformers: 2 predictions (unlike the file's) and no more
    earlier = [{**entry, "prediction": "yes"} for entry in read_log(out / "predictions.jsonl")[:2]]
    _write_jsonl(out / "predictions.jsonl", earlier)
    _set_recorded(out, transformers="4.0.0")
    capsys.readouterr()
    assert main([*base, "--output", str(out)]) == 0
    err = capsys.readouterr().err
    expected = (f"resuming {out} made with transformers 4.0.0; this process runs transformers "
                f"{now['transformers']}: outputs may differ from the earlier predictions")
    assert f"warning: {expected}" in err and "made with torch" not in err
    results = json.loads((out / "results.json").read_text())
    assert expected in results["warnings"]
    assert results["benchmarks"]["context:default"]["generated_this_run"] == len(ids) - 2
    scored = {row["id"]: row["prediction"] for row in map(json.loads, (out / "scored.jsonl").read_text().splitlines())}
    assert scored == {rid: "yes" if rid in {e["id"] for e in earlier} else "no" for rid in ids}
    assert json.loads((out / "run.json").read_text())["versions"]["transformers"] == "4.0.0"  # not rewritten

    _set_recorded(out, transformers=now["transformers"], torch="1.0.0")
    assert main([*base, "--output", str(out)]) == 0
    err = capsys.readouterr().err
    assert f"made with torch 1.0.0; this process runs torch {now['torch']}" in err
    assert "made with transformers" not in err
    assert any("made with torch 1.0.0" in text for text in json.loads((out / "results.json").read_text())["warnings"])


def test_older_folder_resumes_silently_and_other_settings_are_still_refused(fixture_benchmark, tmp_path, capsys):
    _, base = _context_predictions(fixture_benchmark, tmp_path)
    out = tmp_path / "run"
    assert main([*base, "--output", str(out)]) == 0
    _set_recorded(out, transformers=None)  # run.json as written before versions were recorded
    assert main([*base, "--output", str(out)]) == 0
    assert "resuming" not in capsys.readouterr().err
    assert "versions" not in json.loads((out / "run.json").read_text())  # left as it was
    assert not [t for t in json.loads((out / "results.json").read_text())["warnings"] if "resuming" in t]

    assert main([*base, "--output", str(tmp_path / "new")]) == 0
    _set_recorded(tmp_path / "new", transformers="4.0.0", torch="1.0.0")
    assert main([*base, "--output", str(tmp_path / "new"), "--limit", "3"]) == 2
    err = capsys.readouterr().err
    assert "different settings (changed: limit null → 3)" in err and "versions" not in err and "resuming" not in err


# -- issue 23, points 7, 10 and 11 ------------------------------------------------------------------------------
def test_results_follow_the_umask_and_a_killed_writes_leftovers_are_removed(fixture_benchmark, tmp_path):
    """Orphaned ``.*.medheval.tmp`` files (a kill during an atomic write) go when the folder is next locked, except in a
    sub-folder that is another run's (its own lock); every file follows the umask (0644 under 022, 0664 under 002)."""
    import stat

    ids, rows = _context_predictions(fixture_benchmark, tmp_path)
    path = _write_jsonl(tmp_path / "p.jsonl", [{"id": i, "prediction": "no"} for i in ids])
    out = tmp_path / "run"
    (out / "clinhallu" / "default").mkdir(parents=True)
    (out / "other_run").mkdir()
    orphans = [out / ".results.json.k3j2x_ab.medheval.tmp",
               out / "clinhallu" / "default" / ".clinhallu_run.json.a1b2c3d4.medheval.tmp"]
    kept = [out / "other_run" / ".medheval.lock", out / "other_run" / ".results.json.zz12ab34.medheval.tmp",
            out / "notes.tmp", out / ".results.json.k3j2x.tmp"]  # not named as ours: another tool's
    for file in orphans + kept:
        file.write_bytes(b"x" * 1000)
    previous = os.umask(0o002)
    try:
        assert main(["run", "--benchmark", "context", "--predictions", str(path), "--output", str(out),
                     "--data-dir", fixture_benchmark["data_dir"]]) == 0
    finally:
        os.umask(previous)
    assert not any(file.exists() for file in orphans) and all(file.exists() for file in kept)
    modes = {name: stat.S_IMODE((out / name).stat().st_mode) for name in
             ("predictions.jsonl", "results.json", "results.md", "scored.jsonl", "report.html", "run.json")}
    assert set(modes.values()) == {0o664}, modes
    from medheval.run.outputs import atomic_write_text

    previous = os.umask(0o022)
    try:
        atomic_write_text(tmp_path / "x.txt", "x")
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "x.txt").stat().st_mode) == 0o644


def test_nothing_scored_exits_1_with_the_reason(fixture_benchmark, tmp_path, capsys):
    """Every id of the predictions file belongs to another benchmark: with --allow-missing-predictions the run
    scores nothing, and says so (exit 1), instead of a silent success."""
    ds = load_benchmark("mm_vishal", data_dir=fixture_benchmark["data_dir"])
    path = _write_jsonl(tmp_path / "p.jsonl", [{"id": rid, "prediction": "yes"} for rid in ds["id"]])
    code = main(["run", "--benchmark", "context", "--predictions", str(path), "--output", str(tmp_path / "run"),
                 "--data-dir", fixture_benchmark["data_dir"], "--allow-missing-predictions"])
    err = capsys.readouterr().err
    n = len(load_benchmark("context", data_dir=fixture_benchmark["data_dir"]))
    assert code == 1
    assert f"nothing was scored (context:default: 0 of {n} record(s) scored, {n} without a prediction)" in err


def test_a_predictions_file_given_relative_then_absolute_is_the_same_setting(fixture_benchmark, tmp_path,
                                                                               monkeypatch):
    ids, rows = _context_predictions(fixture_benchmark, tmp_path)
    _write_jsonl(tmp_path / "p.jsonl", [{"id": i, "prediction": "no"} for i in ids])
    monkeypatch.chdir(tmp_path)
    base = ["run", "--benchmark", "context", "--output", str(tmp_path / "run"), "--data-dir",
            fixture_benchmark["data_dir"]]
    assert main([*base, "--predictions", "p.jsonl"]) == 0
    assert json.loads((tmp_path / "run" / "run.json").read_text())["backend"]["path"] == str(tmp_path / "p.jsonl")
    assert main([*base, "--predictions", str(tmp_path / "p.jsonl")]) == 0
    run_json = json.loads((tmp_path / "run" / "run.json").read_text())  # a folder of an earlier version: as typed
    run_json["backend"]["path"] = "p.jsonl"
    (tmp_path / "run" / "run.json").write_text(json.dumps(run_json))
    assert main([*base, "--predictions", "./p.jsonl"]) == 0


def test_fixture_data_is_said_once_and_a_modified_copy_once_per_file(fixture_benchmark, tmp_path, capsys,
                                                                        monkeypatch):
    """Issue 23 point 16: the embedded fixture differs from every pin by design: one warning per run, none per
    file, and on the console once per process (a grid's runs each list it); a real modified copy warns per file
    once, and a report over several runs lists it once with its runs."""
    import shutil

    from medheval.run import runner
    from medheval.run.runner import FIXTURE_WARNING

    monkeypatch.setattr(runner, "_NOTED", set())  # said once per process: forget what earlier tests said
    ds = load_benchmark("mm_vishal", data_dir=fixture_benchmark["data_dir"])
    path = _write_jsonl(tmp_path / "p.jsonl", [{"id": rid, "prediction": "yes"} for rid in ds["id"]])
    base = ["run", "--benchmark", "mm_vishal", "--predictions", str(path)]
    capsys.readouterr()
    for name in ("a", "a2"):
        assert main([*base, "--output", str(tmp_path / name), "--data-dir", fixture_benchmark["data_dir"]]) == 0
        warnings = json.loads((tmp_path / name / "results.json").read_text())["warnings"]
        assert warnings == [FIXTURE_WARNING]
    assert capsys.readouterr().err.count(FIXTURE_WARNING) == 1
    copy = tmp_path / "copy" / "benchmark_data"
    shutil.copytree(fixture_benchmark["data_dir"], copy)
    (copy / ".medheval-fixture").unlink()  # now "a modified copy" of the released files
    for name in ("b", "c"):
        assert main([*base, "--output", str(tmp_path / "grid" / name), "--data-dir", str(copy)]) == 0
    warnings = json.loads((tmp_path / "grid" / "b" / "results.json").read_text())["warnings"]
    assert len(warnings) == 2 and all("not the pinned" in text for text in warnings)  # slake and vqa_rad files
    assert main(["report", str(tmp_path / "grid"), "--output", str(tmp_path / "report"), "--no-plots"]) == 0
    caveats = (tmp_path / "report" / "report.md").read_text().split("## Caveats")[1].split("\n## ")[0]
    pinned = [line for line in caveats.splitlines() if "not the pinned" in line]
    assert len(pinned) == 2 and all(line.endswith("(all runs)") for line in pinned)


def test_a_benchmark_typo_is_one_clean_line_and_leaves_no_folder(tmp_path, capsys):
    path = _write_jsonl(tmp_path / "p.jsonl", [{"id": "mm_vishal/slake/1", "prediction": "yes"}])
    assert main(["run", "--benchmark", "mm_vishl", "--predictions", str(path), "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: unknown dataset 'mm_vishl'. Did you mean mm_vishal") and not err.startswith('error: "')
    assert not (tmp_path / "out").exists()


def test_unknown_ids_of_an_all_config_are_counted_under_their_member_config(fixture_benchmark, tmp_path):
    """``mm_vishal:all`` records carry their member config (``mm_vishal/slake/0``): an answered id of a member
    that names no record is the split's unknown id, not another split's."""
    ids = list(load_benchmark("mm_vishal", "all", data_dir=fixture_benchmark["data_dir"])["id"])
    assert all(not rid.startswith("mm_vishal/all/") for rid in ids)
    rows = [{"id": rid, "prediction": "no"} for rid in ids] + [{"id": "mm_vishal/slake/no-such-qid", "prediction": "no"}]
    out = tmp_path / "o"
    assert main(["run", "--benchmark", "mm_vishal", "--predictions", str(_write_jsonl(tmp_path / "p.jsonl", rows)),
                 "--output", str(out), "--data-dir", fixture_benchmark["data_dir"]]) == 0
    quality = json.loads((out / "results.json").read_text())["benchmarks"]["mm_vishal:all"]["data_quality"]
    assert quality["n_unknown_prediction_ids"] == 1
    assert quality["unknown_prediction_ids"] == ["mm_vishal/slake/no-such-qid"]
