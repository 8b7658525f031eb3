"""Fail fast and say so (issue 13 part 5): a CUDA device that is not there, an ``hf://`` image root that
cannot be opened, a metric that failed on every item — one-line errors and a non-zero exit."""

from __future__ import annotations

import json

import pytest
import torch
from judge_servers import judge_server_factory  # noqa: F401 - fixture

from medheval.cli import main
from medheval.data.images import ImageRootUnavailable, parse_image_root
from medheval.run.runner import failed_on_every_item


def _roots(fixture: dict) -> list[str]:
    return [arg for source, root in fixture["image_roots"].items() for arg in ("--image-root", f"{source}={root}")]


def test_a_cuda_device_that_is_not_there_is_a_one_line_error(fixture_benchmark, tmp_path, capsys):
    device = f"cuda:{torch.cuda.device_count()}" if torch.cuda.is_available() else "cuda"
    out = tmp_path / "run"
    code = main(["run", "--benchmark", "context", "--model", "tiny-random-llava", "--output", str(out),
                 "--data-dir", fixture_benchmark["data_dir"], "--limit", "1", "--device", device,
                 *_roots(fixture_benchmark)])
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and "Traceback" not in err
    assert errors[0].startswith(f"error: --device {device}: ")
    assert "--device cpu" in err or "visible" in err
    assert not out.exists()  # refused before the output folder was touched


def test_an_hf_image_root_that_cannot_be_opened_is_a_one_line_error(fixture_benchmark, tmp_path, capsys,
                                                                      monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ImageRootUnavailable, match=r"hf://nobody/no-such-images:test: cannot open the dataset"):
        parse_image_root("hf://nobody/no-such-images:test").exists("x.png")
    with pytest.raises(ImageRootUnavailable, match=r"FileNotFoundError"):
        parse_image_root(f"hf://{tmp_path / 'absent'}").exists("x.png")
    out = tmp_path / "run"
    code = main(["run", "--benchmark", "context", "--model", "tiny-random-llava", "--output", str(out),
                 "--data-dir", fixture_benchmark["data_dir"], "--limit", "1", "--device", "cpu",
                 "--image-root", "mimic_cxr=hf://nobody/no-such-images"])
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]  # (stderr also has progress bars)
    assert code == 2 and len(errors) == 1 and "Traceback" not in err
    assert errors[0].startswith("error: context:default: image root hf://nobody/no-such-images: cannot open the dataset "
                                "(ConnectionError")
    assert not (out / "predictions.jsonl").exists()


def test_failed_on_every_item_reads_the_metrics_counts():
    assert failed_on_every_item({"n": 0, "n_failed": 3})
    assert failed_on_every_item({"n": {"m1": 0, "m2": 0}, "n_failed": 4})
    assert not failed_on_every_item({"n": 2, "n_failed": 1})  # some items scored
    assert not failed_on_every_item({"n": {"m1": 0, "m2": 1}, "n_failed": 3})
    assert not failed_on_every_item({"n": 0, "n_failed": 0})  # nothing to score is not a failure
    assert not failed_on_every_item({"accuracy": 0.0, "n": 0})  # a metric without failure counts
    assert not failed_on_every_item(0.5)


def test_a_metric_that_failed_on_every_item_is_reported_and_exits_non_zero(fixture_benchmark, judge_server_factory,
                                                                           tmp_path, capsys):
    from medheval import load_benchmark

    rows = load_benchmark("knowledge", config="open", data_dir=fixture_benchmark["data_dir"]).to_list()
    preds = tmp_path / "preds.jsonl"
    preds.write_text("".join(json.dumps({"id": r["id"], "prediction": r["answer"]}) + "\n" for r in rows))
    server = judge_server_factory("openai", lambda request: "I would rather not score this.")  # never valid JSON
    out = tmp_path / "run"
    args = ["run", "--benchmark", "knowledge:open", "--predictions", str(preds), "--output", str(out),
            "--data-dir", fixture_benchmark["data_dir"], "--metrics", "sh_judge,text_generation",
            "--judge", f"openai:local-judge@{server.base_url}"]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert "error: metric(s) failed on every item: knowledge:open sh_judge" in err
    results = json.loads((out / "results.json").read_text())
    assert results["failed_metrics"] == ["knowledge:open sh_judge"]  # text_generation worked
    assert results["benchmarks"]["knowledge:open"]["metrics"]["sh_judge"]["n_failed"] == len(rows)
    table = (out / "results.md").read_text()
    assert f"knowledge:open: metric sh_judge failed on every item ({len(rows)} failure(s), reasons in" in table
    scored = [json.loads(line) for line in (out / "scored.jsonl").read_text().splitlines()]
    assert all("no JSON object" in item["failed"]["reason"] for item in scored)
    assert server.request_count >= len(rows)


def test_a_judge_endpoint_failing_every_request_stops_after_eight_records_in_a_row(judge_server_factory):
    """Issue 13 part 5: a dead judge endpoint stops the run (JudgeError: the CLI's one-line error, exit 2)
    after 8 records whose calls failed for good, instead of trying all of them; a judge that answers,
    even unusably, is working and never stops the run."""
    from judge_servers import Reply

    from medheval.judges import JudgeError, JudgeRequest, make_judge

    requests = [JudgeRequest(f"r{i}", user=f"item {i}") for i in range(20)]
    dead = judge_server_factory("openai", lambda request: Reply(503, {"error": {"message": "overloaded"}}))
    judge = make_judge(f"openai:j@{dead.base_url}", cache_dir=False, concurrency=1, max_retries=0, progress=False)
    with pytest.raises(JudgeError, match=r"8 records in a row failed for good .* overloaded"):
        judge.run(requests)
    assert dead.request_count == 8
    unusable = judge_server_factory("openai", lambda request: "no JSON here")
    judge = make_judge(f"openai:j@{unusable.base_url}", cache_dir=False, concurrency=1, max_invalid_retries=0,
                       progress=False)
    results = judge.run(requests)
    assert [r.ok for r in results] == [False] * 20 and unusable.request_count == 20


def test_image_root_problems_of_every_split_are_reported_at_once(fixture_benchmark, tmp_path, capsys):
    """Issue 23, point 15: two splits without roots and a mistyped source give one error naming all three;
    a root folder that does not exist is named before anything is loaded; a root for a source this run does
    not read is a note, not an error."""
    base = ["run", "--model", "tiny-random-llava", "--data-dir", fixture_benchmark["data_dir"], "--limit", "1",
            "--device", "cpu"]
    slake = fixture_benchmark["image_roots"]["slake"]
    out = tmp_path / "run"
    code = main([*base, "--benchmark", "mm_vishal:vqa_rad,cxr_vishal:iu_xray", "--output", str(out),
                 "--image-root", f"vqarad={slake}", "--image-root", f"slake={slake}"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert "mm_vishal:vqa_rad: no image root for source(s) vqa_rad" in err
    assert "cxr_vishal:iu_xray: no image root for source(s) iu_xray" in err
    assert "--image-root vqarad=…: no split of this run has images from source 'vqarad'" in err
    assert "Pass --image-root iu_xray=PATH_OR_URL --image-root vqa_rad=PATH_OR_URL." in err
    assert not (out / "predictions.jsonl").exists()

    fresh = tmp_path / "fresh"
    code = main([*base, "--benchmark", "mm_vishal:slake", "--output", str(fresh),
                 "--image-root", f"slake={tmp_path / 'no_such_folder'}"])
    err = capsys.readouterr().err
    assert code == 2
    assert f"error: --image-root slake={tmp_path / 'no_such_folder'}: the folder " in err and "does not exist" in err
    assert not fresh.exists()

    roots = [arg for source, root in fixture_benchmark["image_roots"].items() for arg in ("--image-root",
                                                                                           f"{source}={root}")]
    from medheval.run import runner

    runner._NOTED.clear()  # the note is said once per process: an earlier test may have said it
    code = main([*base, "--benchmark", "mm_vishal:slake", "--output", str(out), *roots])
    err = capsys.readouterr().err
    assert code == 0, err
    notes = [line for line in err.splitlines() if line.startswith("note: --image-root ")]
    assert len(notes) == 1 and "no split of this run has images from these sources (its image sources: slake)" \
        in notes[0] and all(source in notes[0].split(":")[1] for source in ("iu_xray", "vqa_rad", "mimic_cxr"))
