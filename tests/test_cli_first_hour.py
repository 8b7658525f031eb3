"""The first hour as a new user meets it, through the real CLI and its exit codes: an unusable ``--output``
is refused in one line before any model loads, and Ctrl-C prints one line (what is saved, how to resume)
and exits 130, after which the same command finishes the run without redoing a record."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from judge_servers import JudgeServer
from medheval.cli import main
from medheval.run.outputs import OutputFolderUnusable, check_output_folder, saved_predictions

REPO = Path(__file__).resolve().parents[1]
SPLIT = "mm_vishal:slake"


def _cli(*args: str, env: dict | None = None, **kwargs) -> subprocess.Popen:
    environment = {**os.environ, "OPENAI_API_KEY": "sk-test", "PYTHONUNBUFFERED": "1", **(env or {})}
    # SIGINT back to its default in the child, so Python installs its Ctrl-C handler even where the launching
    # shell ignores SIGINT (a background job without job control: the ignored disposition is inherited)
    return subprocess.Popen([sys.executable, "-m", "medheval.cli", *args], cwd=REPO, env=environment,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL), **kwargs)


@pytest.mark.parametrize("kind", ["file", "below_a_file", "read_only_fs"])
def test_unusable_output_is_refused_in_one_line_before_the_model_loads(kind, tmp_path, capsys):
    """The model path does not exist: had the model loaded first, the error would name the model."""
    existing_file = tmp_path / "results.txt"
    existing_file.write_text("not a folder")
    output = {"file": existing_file, "below_a_file": existing_file / "run",
              "read_only_fs": Path("/proc/medheval-cannot-write-here")}[kind]
    code = main(["run", "--benchmark", SPLIT, "--model", str(tmp_path / "no-such-model"), "--output", str(output)])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and str(output) in err and "no-such-model" not in err
    assert existing_file.read_text() == "not a folder"


def test_a_writable_output_is_checked_without_creating_anything(tmp_path):
    folder = check_output_folder(tmp_path / "a" / "b")
    assert not (tmp_path / "a").exists() and list(tmp_path.iterdir()) == []  # checked, nothing created
    (tmp_path / "a").mkdir()
    assert check_output_folder(tmp_path / "a") == tmp_path / "a" and list((tmp_path / "a").iterdir()) == []
    with pytest.raises(OutputFolderUnusable, match="is a file"):
        check_output_folder(Path(__file__))


def test_saved_predictions_counts_complete_lines_only(tmp_path):
    (tmp_path / "x").mkdir()
    (tmp_path / "predictions.jsonl").write_text('{"id": 1}\n{"id": 2}\n{"id": 3')  # the last line torn
    (tmp_path / "x" / "predictions.part1.jsonl").write_text('{"id": 4}\n')
    assert saved_predictions(tmp_path) == 3
    assert saved_predictions(tmp_path / "missing") == 0


def test_ctrl_c_prints_one_line_exits_130_and_the_same_command_resumes(fixture_benchmark, tmp_path):
    """A slow loopback model; SIGINT once a prediction is on disk; the rerun completes every record once."""
    with JudgeServer("openai", reply=lambda body: "Yes", latency=0.4) as server:
        output = tmp_path / "run"
        roots = [a for s, r in fixture_benchmark["image_roots"].items() for a in ("--image-root", f"{s}={r}")]
        args = ["run", *roots, "--benchmark", SPLIT, "--model", f"openai:served@{server.base_url}",
                "--data-dir", str(fixture_benchmark["data_dir"]), "--limit", "6", "--batch-size", "1",
                "--api-concurrency", "1", "--max-new-tokens", "4", "--output", str(output)]
        process = _cli(*args)
        log = output / "predictions.jsonl"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and process.poll() is None:
            if log.exists() and log.read_text().count("\n") >= 1:
                break
            time.sleep(0.05)
        assert process.poll() is None, process.communicate()
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=60)
        assert process.returncode == 130, err
        lines = [line for line in err.splitlines() if line.strip()]
        interrupted = [line for line in lines if line.startswith("interrupted:")]
        assert len(interrupted) == 1 and "Traceback" not in err and "KeyboardInterrupt" not in err, err
        saved = saved_predictions(output)
        assert f"{saved} prediction(s) are saved" in interrupted[0] and 1 <= saved < 6
        assert "resume with the same command" in interrupted[0] and "--limit 6" in interrupted[0]
        before = server.request_count

        again = _cli(*args)
        out, err = again.communicate(timeout=180)
        assert again.returncode == 0, err
        ids = [json.loads(line)["id"] for line in log.read_text().splitlines()]
        assert len(ids) == len(set(ids)) == 6
        assert server.request_count - before <= 6 - saved  # done records were not asked again (the API cache may
        # hold the answer of the request in flight at Ctrl-C)


def test_an_api_option_that_has_its_own_flag_names_the_flag(capsys):
    """Was a TypeError traceback (``got multiple values for keyword argument 'concurrency'``)."""
    code = main(["run", "--benchmark", SPLIT, "--model", "openai:served@http://127.0.0.1:9/v1", "--output",
                 "/tmp/unused", "--api-option", "concurrency=1"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "--api-concurrency" in err


def test_the_demo_hint_names_a_medheval_the_shell_can_run(tmp_path, monkeypatch):
    """Without an activated venv the bare name is not found: the hint gives the venv's entry point."""
    from medheval.cli import demo

    venv_bin = tmp_path / ".venv" / "bin"
    venv_bin.mkdir(parents=True)
    (venv_bin / "python").write_text("")
    entry = venv_bin / "medheval"
    entry.write_text("#!/bin/sh\n")
    entry.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(venv_bin / "python"))
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    assert demo.medheval_command() == ".venv/bin/medheval"
    monkeypatch.setenv("PATH", f"{venv_bin}:/usr/bin:/bin")  # activated
    assert demo.medheval_command() == "medheval"


def _answer_all_but_blank(fixture_benchmark, tmp_path) -> Path:
    """A predictions file: context's 8 yes/no items and knowledge:open's 6 items answered with their
    references, except that the first item of each is "" and the second "  " (whitespace only)."""
    from medheval.data.benchmarks import load_benchmark

    lines = []
    for benchmark in ("context", "knowledge:open"):
        rows = load_benchmark(benchmark, data_dir=fixture_benchmark["data_dir"]).to_list()
        lines += [{"id": row["id"], "prediction": ["", "  "][k] if k < 2 else row["answer"]}
                  for k, row in enumerate(rows)]
    path = tmp_path / "blank.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_empty_predictions_are_counted_said_and_scored_not_skipped(fixture_benchmark, tmp_path, capsys):
    """By hand: context has 8 items, 6 answered right and 2 blank (unparsed, wrong): accuracy 6/8; knowledge:open
    has 6 items, 4 equal to their reference (ROUGE 100) and 2 blank (ROUGE 0): the mean is 4/6 of 100."""
    predictions = _answer_all_but_blank(fixture_benchmark, tmp_path)
    out = tmp_path / "run"
    code = main(["run", "--benchmark", "context", "--benchmark", "knowledge:open", "--predictions", str(predictions),
                 "--data-dir", str(fixture_benchmark["data_dir"]), "--output", str(out)])
    printed = capsys.readouterr().out
    assert code == 0
    results = json.loads((out / "results.json").read_text())
    closed, opened = results["benchmarks"]["context:default"], results["benchmarks"]["knowledge:open"]
    assert (closed["n_scored"], closed["n_empty_predictions"]) == (8, 2)
    assert (opened["n_scored"], opened["n_empty_predictions"]) == (6, 2)
    accuracy = closed["metrics"]["close_ended_accuracy"]
    assert (accuracy["accuracy"], accuracy["n"], accuracy["n_unparsed"]) == (0.75, 8, 2)
    text = opened["metrics"]["text_generation"]
    assert (text["n"], text["n_empty_predictions"]) == (6, 2)
    assert text["rouge1"] == pytest.approx(400 / 6) and text["rougeL"] == pytest.approx(400 / 6)
    how = ("scored as wrong/0, not skipped (close-ended: unparsed; text overlap: 0; each metric's card says how it "
           "reads a blank answer)")
    said = [f"`context:default`: 2 of 8 prediction(s) are empty; {how}", f"`knowledge:open`: 2 of 6 prediction(s) "
            f"are empty; {how}"]
    md = (out / "results.md").read_text()
    assert all(line in md and line in printed for line in said)
    assert "text_generation: 2 empty prediction(s)" not in md  # said once, for the split
    assert "| context:default | 8 | 8 | 2 | 2 |" in md  # the counts table: records, scored, empty, unparsed
    assert main(["report", str(out), "--output", str(tmp_path / "report")]) == 0
    report = "\n".join(path.read_text() for path in (tmp_path / "report").glob("*.md"))
    assert all(line in report for line in said)


def test_the_upstream_scorers_caveat_says_how_they_read_a_blank_answer():
    from medheval.report.tables import caveats

    run = {"settings": {"model": "m", "mitigation": "none", "backend": {}}, "scoring": {"upstream_compat": True},
           "benchmarks": {"mm_vishal:all": {"n_records": 5, "n_scored": 4, "n_empty_predictions": 1,
                                            "metrics": {"text_generation": {"n_empty_predictions": 1}}}}}
    lines = caveats(run)
    assert lines[1] == ("`mm_vishal:all`: 1 of 4 prediction(s) are empty; scored as the released scorers read "
                        "them (MedHEval's yes/no scorer reads a blank answer as yes)")
    assert not any("empty prediction(s), scored 0" in line for line in lines)


@pytest.mark.parametrize("command", [["report", "RUN", "--output", "OUT"],
                                     ["publish", "--kind", "metrics", "--name", "chair", "--to", "OUT"]])
@pytest.mark.parametrize("kind", ["file", "below_a_file"])
def test_report_and_publish_refuse_an_unusable_output_in_one_line(command, kind, tmp_path, capsys):
    """Was a FileExistsError traceback and exit 1 (the output lock's mkdir)."""
    existing_file = tmp_path / "notes.txt"
    existing_file.write_text("not a folder")
    output = existing_file if kind == "file" else existing_file / "sub"
    argv = [{"RUN": str(tmp_path / "run"), "OUT": str(output)}.get(arg, arg) for arg in command]
    code = main(argv)
    err = capsys.readouterr().err.strip()
    flag = "--output" if command[0] == "report" else "--to"
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.startswith(f"error: {flag} {output} ") and ("is a file" in err or "which is a file" in err)
    assert existing_file.read_text() == "not a folder"


def test_help_names_the_first_command_without_markup():
    help_text = subprocess.run([sys.executable, "-m", "medheval.cli", "--help"], cwd=REPO, capture_output=True,
                               text=True, timeout=120)
    assert help_text.returncode == 0
    assert "medheval demo --output runs/demo" in help_text.stdout and "``" not in help_text.stdout


def test_a_data_dir_one_level_too_high_names_the_subfolder_to_pass(fixture_benchmark, tmp_path, capsys):
    """The demo writes ``fixture_data/benchmark_data/``; passing ``fixture_data`` printed where the file was not."""
    predictions = tmp_path / "p.jsonl"
    predictions.write_text(json.dumps({"id": "context/default/0", "prediction": "Yes"}) + "\n")
    too_high = Path(fixture_benchmark["data_dir"]).parent
    code = main(["run", "--benchmark", "context", "--predictions", str(predictions), "--data-dir", str(too_high),
                 "--output", str(tmp_path / "run")])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1, err
    assert err.endswith(f"pass --data-dir {fixture_benchmark['data_dir']}")


def test_blank_answers_of_an_api_model_are_counted_as_empty(fixture_benchmark, tmp_path, capsys):
    """A served model that answers only whitespace: every item is scored (unparsed, wrong), and said empty."""
    with JudgeServer("openai", reply=lambda body: " \n ") as server:
        roots = [a for s, r in fixture_benchmark["image_roots"].items() for a in ("--image-root", f"{s}={r}")]
        code = main(["run", *roots, "--benchmark", "context", "--model", f"openai:served@{server.base_url}",
                     "--data-dir", str(fixture_benchmark["data_dir"]), "--limit", "3", "--max-new-tokens", "4",
                     "--output", str(tmp_path / "run")])
    capsys.readouterr()
    assert code == 0
    entry = json.loads((tmp_path / "run" / "results.json").read_text())["benchmarks"]["context:default"]
    accuracy = entry["metrics"]["close_ended_accuracy"]
    assert (entry["n_scored"], entry["n_empty_predictions"]) == (3, 3)
    assert (accuracy["accuracy"], accuracy["n_unparsed"]) == (0.0, 3)
    assert "`context:default`: 3 of 3 prediction(s) are empty" in (tmp_path / "run" / "results.md").read_text()


def test_predictions_given_a_run_folder_name_its_predictions_file(tmp_path, capsys):
    """Re-scoring a run by its folder gave "does not exist or is not a file" for a folder that exists."""
    run = tmp_path / "run"
    run.mkdir()
    argv = ["run", "--benchmark", "context", "--predictions", str(run), "--output", str(tmp_path / "out")]
    assert main(argv) == 2
    assert capsys.readouterr().err.strip().endswith("is a folder; pass a JSON Lines file of {\"id\", \"prediction\"} "
                                                    "objects")
    (run / "predictions.jsonl").write_text(json.dumps({"id": "context/default/0", "prediction": "Yes"}) + "\n")
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.endswith(f"is a folder; pass its answers: --predictions "
                                                        f"{run / 'predictions.jsonl'}")


def test_report_given_a_runs_results_json_names_its_folder(tmp_path, capsys):
    (tmp_path / "run").mkdir()
    results = tmp_path / "run" / "results.json"
    results.write_text("{}")
    assert main(["report", str(results), "--output", str(tmp_path / "report")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: {results}: a file, not a run folder; pass its folder: {tmp_path / 'run'}"
    assert not (tmp_path / "report").exists()  # nothing written: the runs are read before the output is locked


def test_demo_refuses_an_unusable_output_in_one_line(tmp_path, capsys):
    """Was a NotADirectoryError traceback from writing the fixture files below a file."""
    existing_file = tmp_path / "demo.txt"
    existing_file.write_text("not a folder")
    assert main(["demo", "--output", str(existing_file)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"error: --output {existing_file} is a file, not a folder: give a folder path (it is created "
                   f"when missing)")
    assert existing_file.read_text() == "not a folder"


def test_inputs_without_an_image_root_say_the_model_would_get_images(fixture_benchmark, capsys):
    """``inputs`` without --image-root showed "images: 0 loaded []" for a record with an image, silently."""
    base = ["inputs", "--model", "tiny-random-llava", "--benchmark", "context", "--data-dir",
            str(fixture_benchmark["data_dir"]), "--limit", "1"]
    assert main(base) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("images:"))
    assert line == ("images: 0 loaded [] (the record names 1: pass --image-root mimic_cxr=FOLDER to see the input "
                    "`medheval run` gives the model)")
    assert main([*base, "--image-root", f"mimic_cxr={fixture_benchmark['image_roots']['mimic_cxr']}"]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("images:"))
    assert line.startswith("images: 1 loaded") and "--image-root" not in line


def test_a_reader_that_leaves_early_ends_the_command_quietly():
    """`medheval list --json | head` printed a BrokenPipeError traceback. The reader here closes the pipe before
    anything is written, so the first write fails: exit 141 (128 + SIGPIPE), as a Unix tool, and nothing on stderr."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_EVALUATE_OFFLINE": "1"}
    process = subprocess.Popen([sys.executable, "-m", "medheval.cli", "list", "--json"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, env=env, cwd=Path(__file__).resolve().parents[1])
    process.stdout.close()
    stderr = process.stderr.read().decode()
    assert process.wait(timeout=120) == 141
    assert stderr == ""


def test_a_metric_whose_package_is_missing_is_one_error_line_naming_the_install(fixture_benchmark, tmp_path, capsys,
                                                                               monkeypatch):
    """text_generation without nltk (hidden here): `run` exits 2 with one `error:` line naming the metric, the
    package and the pip command, not evaluate's ImportError traceback."""
    from medheval.run.protocol import load_metric

    predictions = _answer_all_but_blank(fixture_benchmark, tmp_path)
    monkeypatch.setitem(sys.modules, "nltk", None)  # `import nltk` raises ModuleNotFoundError
    load_metric.cache_clear()
    try:
        code = main(["run", "--benchmark", "knowledge:open", "--predictions", str(predictions),
                     "--data-dir", str(fixture_benchmark["data_dir"]), "--output", str(tmp_path / "run")])
    finally:
        load_metric.cache_clear()
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert code == 2
    assert errors == ["error: metric `text_generation` cannot load: it imports nltk, which is not installed; "
                      "install it: pip install medheval (it brings what its metrics import)"]
