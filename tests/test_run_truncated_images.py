"""An image cut short after a valid header passes the up-front header check and fails only when its batch is
prepared: ``--on-missing skip`` leaves its record out of the batch (counted), the default names it and the fix."""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageFile

from judge_servers import JudgeServer, judge_server_factory, user_text  # noqa: F401 - a fixture
from medheval.cli import main

CONTEXT = "Context_Misalignment_Hallucination/MIMIC-CXR_pairs.json"
FOLDER = "p19/p19999901/s59999901"
NAMES = [f"{FOLDER}/f1c00001-00000000-00000000-00000000-0000000{n}.jpg" for n in (1, 2, 3)]
BAD = "context/default/1"  # the record of NAMES[1], the truncated image


def _encoded(seed: int, fmt: str) -> bytes:
    """A small random image encoded as ``fmt`` (PNG or JPEG)."""
    pixels = np.random.default_rng(seed).integers(0, 256, (48, 48, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format=fmt)
    return buffer.getvalue()


def _split(fixture: dict, folder: Path, qids: list[int]) -> str:
    """A copy of the fixture's annotation files whose context split holds records ``qids`` of three, record
    ``q`` on its own image ``NAMES[q]``; returns the data folder."""
    data = folder / "benchmark_data"
    shutil.copytree(fixture["data_dir"], data)
    raw = json.loads((data / CONTEXT).read_text())[:3]
    for qid, record in enumerate(raw):
        record.update(qid=qid, img_name=NAMES[qid], img_id=NAMES[qid])
    (data / CONTEXT).write_text(json.dumps([raw[qid] for qid in qids]))
    return str(data)


@pytest.fixture(params=["PNG", "JPEG"])
def truncated_root(request, tmp_path) -> tuple[Path, bytes]:
    """An image root with NAMES[0] and NAMES[2] whole and NAMES[1] cut short after its header; returns it and
    NAMES[1]'s whole bytes."""
    root = tmp_path / "mimic"
    (root / FOLDER).mkdir(parents=True)
    for seed, name in enumerate(NAMES):
        (root / name).write_bytes(_encoded(seed, request.param))
    whole = (root / NAMES[1]).read_bytes()
    (root / NAMES[1]).write_bytes(whole[: len(whole) // 2])
    with Image.open(root / NAMES[1]) as opened:  # the header still reads: only decoding finds the cut
        assert opened.size == (48, 48)
    return root, whole


def _answers(out: Path) -> dict[str, str]:
    return {entry["id"]: entry["prediction"] for entry in map(json.loads, (out / "predictions.jsonl").open())}


def _entry(out: Path) -> dict:
    return json.loads((out / "results.json").read_text())["benchmarks"]["context:default"]


def test_a_truncated_image_is_left_out_of_its_batch_counted_once_and_named_without_skip(
        fixture_benchmark, truncated_root, tmp_path, capsys):
    assert not ImageFile.LOAD_TRUNCATED_IMAGES  # a truncated image is never read half-decoded
    root, whole = truncated_root
    args = ["run", "--benchmark", "context", "--model", "tiny-random-llava", "--image-root", f"mimic_cxr={root}",
            "--max-new-tokens", "4", "--batch-size", "3"]
    three = [*args, "--data-dir", _split(fixture_benchmark, tmp_path / "three", [0, 1, 2])]
    clean = [*args, "--data-dir", _split(fixture_benchmark, tmp_path / "two", [0, 2])]

    assert main([*three, "--output", str(tmp_path / "strict")]) == 2
    err = capsys.readouterr().err
    assert BAD in err and str(root / NAMES[1]) in err and "truncated" in err
    assert "re-download" in err and "--on-missing skip" in err
    assert not _answers(tmp_path / "strict")  # the batch of three failed as a whole: nothing half-written

    skipped = tmp_path / "skip"
    assert main([*three, "--output", str(skipped), "--on-missing", "skip"]) == 0
    assert BAD in capsys.readouterr().err  # said on the console, not only in the files
    assert main([*clean, "--output", str(tmp_path / "clean")]) == 0
    answers = _answers(skipped)
    assert sorted(answers) == ["context/default/0", "context/default/2"]
    assert answers == _answers(tmp_path / "clean")  # the other two answer as they do in a batch of their own
    entry = _entry(skipped)
    assert entry["skipped_undecodable_images"] == {"count": 1, "examples": [BAD]}
    assert entry["n_records"] == entry["n_scored"] == 2 and entry["generated_this_run"] == 2
    results = json.loads((skipped / "results.json").read_text())
    assert any(BAD in warning and "skipped during generation" in warning for warning in results["warnings"])
    assert "1 record(s) skipped for an undecodable image" in (skipped / "results.md").read_text()

    # a resume tries the record again: still truncated, it is counted once more in this run's results, not twice
    assert main([*three, "--output", str(skipped), "--on-missing", "skip"]) == 0
    entry = _entry(skipped)
    assert entry["skipped_undecodable_images"] == {"count": 1, "examples": [BAD]}
    assert entry["generated_this_run"] == 0 and _answers(skipped) == answers

    # re-downloaded, the same command answers it and nothing is skipped any more
    (root / NAMES[1]).write_bytes(whole)
    assert main([*three, "--output", str(skipped), "--on-missing", "skip"]) == 0
    entry = _entry(skipped)
    assert "skipped_undecodable_images" not in entry
    assert entry["n_records"] == entry["n_scored"] == 3 and entry["generated_this_run"] == 1
    assert {rid: _answers(skipped)[rid] for rid in answers} == answers



def test_collect_gives_every_process_value_in_rank_order():
    from medheval.run.distributed import SOLO, Group

    assert SOLO.collect(["a"]) == [["a"]]
    two = Group(rank=1, world_size=2, gather=lambda value: [["from 0"], value])
    assert two.collect(["from 1"]) == [["from 0"], ["from 1"]]


@pytest.mark.slow
def test_a_record_skipped_on_another_process_is_counted_by_the_main_one(fixture_benchmark, tmp_path):
    """Batches of one over 2 processes: the truncated record's batch runs on rank 1, the main process counts it."""
    import os
    import subprocess

    from conftest import REPO
    from test_run_data_parallel import ACCELERATE, LAUNCH_ENV, _free_port

    if not ACCELERATE.exists():
        pytest.skip("accelerate is not installed (extra: multi)")
    root = tmp_path / "mimic"
    (root / FOLDER).mkdir(parents=True)
    for seed, name in enumerate(NAMES):
        (root / name).write_bytes(_encoded(seed, "JPEG"))
    whole = (root / NAMES[1]).read_bytes()
    (root / NAMES[1]).write_bytes(whole[: len(whole) // 2])
    args = ["--benchmark", "context", "--model", "tiny-random-llava", "--image-root", f"mimic_cxr={root}",
            "--max-new-tokens", "4", "--batch-size", "1", "--device", "cpu", "--on-missing", "skip",
            "--data-dir", _split(fixture_benchmark, tmp_path / "three", [0, 1, 2])]
    assert main(["run", *args, "--output", str(tmp_path / "single")]) == 0
    launch = [str(ACCELERATE), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
              "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(_free_port()),
              "-m", "medheval.cli", "run", *args, "--output", str(tmp_path / "dp")]
    done = subprocess.run(launch, env={**os.environ, **LAUNCH_ENV}, capture_output=True, text=True, timeout=600,
                          cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    assert _answers(tmp_path / "dp") == _answers(tmp_path / "single")
    for out in ("single", "dp"):
        entry = _entry(tmp_path / out)
        assert entry["skipped_undecodable_images"] == {"count": 1, "examples": [BAD]}
        assert entry["n_records"] == entry["n_scored"] == 2


# -- the paths that decode images outside generation: Med-HallMark detection, ClinHallu's traces and judges --


def _noise_jpeg(path: Path, seed: int) -> bytes:
    """``path`` rewritten as a 48x48 noise JPEG (large enough that half of it still has a whole header)."""
    path.write_bytes(_encoded(seed, "JPEG"))
    return path.read_bytes()


def _cut(path: Path) -> None:
    """Cut ``path`` short after its header, as an interrupted download leaves it."""
    whole = path.read_bytes()
    path.write_bytes(whole[: len(whole) // 2])
    with Image.open(path) as opened:
        assert opened.size == (48, 48)


def test_detection_skips_a_truncated_image_counted_like_generation_or_names_it(judge_server_factory, tmp_path,
                                                                                capsys):
    """Med-HallMark detection with a judge that looks: 5 labelled records, one image truncated. Skip: 4 judged
    (each given its human level, so accuracy 1), 1 counted in skipped_undecodable_images and warned; the
    default: an error naming the record, the file and --on-missing skip, before any judge call."""
    from test_med_hallmark import CONVENTIONAL, _write_fixtures

    from medheval.families.med_hallmark import LEVEL_NAMES, LEVELS

    data = _write_fixtures(tmp_path / "hallmark")
    images = tmp_path / "vqa_rad"
    images.mkdir()
    for rid, _, _, _, _, image in CONVENTIONAL:
        _noise_jpeg(images / Path(image).name, rid)
    _cut(images / "synpic102.jpg")  # record 3's image
    human = {response: LEVEL_NAMES[LEVELS[label]] for _, _, response, _, label, _ in CONVENTIONAL}
    server = judge_server_factory("openai", lambda request: json.dumps(
        {"level": next(name for response, name in human.items() if f"answer: {response}" in user_text(request))}))
    args = ["run", "--task", "detection", "--benchmark", "med_hallmark:conventional", "--data-dir", str(data),
            "--judge", f"openai:judge@{server.base_url}", "--image-root", f"vqa_rad={images}"]

    assert main([*args, "--output", str(tmp_path / "strict")]) == 2
    err = capsys.readouterr().err
    assert "record 'med_hallmark/conventional/3'" in err and str(images / "synpic102.jpg") in err
    assert "truncated" in err and "--on-missing skip" in err
    assert server.request_count == 0 and not (tmp_path / "strict" / "results.json").exists()

    out = tmp_path / "skip"
    assert main([*args, "--output", str(out), "--on-missing", "skip"]) == 0
    assert "med_hallmark/conventional/3" in capsys.readouterr().err  # said on the console
    results = json.loads((out / "results.json").read_text())
    entry = results["benchmarks"]["med_hallmark:conventional"]
    assert entry["skipped_undecodable_images"] == {"count": 1, "examples": ["med_hallmark/conventional/3"]}
    assert entry["n_records"] == entry["n_with_human_level"] == 4 and entry["n_without_human_level"] == 0
    detection = entry["metrics"]["medihall_detection"]
    assert detection["n"] == 4 and detection["n_failed"] == 0 and detection["accuracy"] == 1.0
    assert server.request_count == 4
    scored = [json.loads(line)["id"] for line in (out / "scored.jsonl").read_text().splitlines()]
    assert scored == [f"med_hallmark/conventional/{n}" for n in (1, 2, 4, 6)]
    [warning] = results["warnings"]
    assert "med_hallmark/conventional/3" in warning and "skipped during scoring" in warning
    assert "## Warnings" in (out / "results.md").read_text()


def test_scoring_skips_a_reference_free_record_whose_image_no_longer_decodes(judge_server_factory, tmp_path,
                                                                              capsys):
    """MediHall Score's judge looks at the image of an item without ground truth, decoded when scoring. A resumed
    run (every answer logged, nothing generated) whose image was cut short since: skip leaves that record out
    of the scores and counts it; the default names it and the fix."""
    from test_med_hallmark import CONVENTIONAL, _write_fixtures

    data = _write_fixtures(tmp_path / "hallmark")
    images = tmp_path / "vqa_rad"
    images.mkdir()
    for rid, _, _, _, _, image in CONVENTIONAL:
        _noise_jpeg(images / Path(image).name, rid)
    server = judge_server_factory("openai", lambda request: json.dumps({"level": "Correct Statements"}))
    ids = [f"med_hallmark/conventional/{rid}" for rid, *_ in CONVENTIONAL]
    answers = tmp_path / "answers.jsonl"
    answers.write_text("".join(json.dumps({"id": rid, "prediction": "No."}) + "\n" for rid in ids))
    out = tmp_path / "run"
    args = ["run", "--benchmark", "med_hallmark:conventional", "--predictions", str(answers), "--data-dir", str(data),
            "--judge", f"openai:judge@{server.base_url}", "--image-root", f"vqa_rad={images}", "--metrics",
            "medihall_score", "--output", str(out)]

    def entry() -> dict:
        return json.loads((out / "results.json").read_text())["benchmarks"]["med_hallmark:conventional"]

    assert main(args) == 0 and entry()["metrics"]["medihall_score"]["n"] == 5
    _cut(images / "synpic104.jpg")  # record 6: no ground truth, so judged with its image
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "record 'med_hallmark/conventional/6'" in err and str(images / "synpic104.jpg") in err
    assert "--on-missing skip" in err

    assert main([*args, "--on-missing", "skip"]) == 0
    result = entry()
    assert result["generated_this_run"] == 0  # every answer was logged: the image is decoded only to score
    assert result["skipped_undecodable_images"] == {"count": 1, "examples": ["med_hallmark/conventional/6"]}
    assert result["n_records"] == result["n_scored"] == 4
    medihall = result["metrics"]["medihall_score"]
    assert medihall["n"] == 4 and medihall["n_failed"] == 0 and medihall["medihall_score"] == 1.0
    assert [json.loads(line)["id"] for line in (out / "scored.jsonl").read_text().splitlines()] == ids[:4]
    warnings = json.loads((out / "results.json").read_text())["warnings"]
    assert any("conventional/6" in warning and "skipped during scoring" in warning for warning in warnings)


def _model_or_judge(body: dict) -> str:
    """One loopback server: ClinHallu traces for model ``vlm`` (seeded, :func:`scripted_trace_reply`), else a
    judge reply that depends on the request only."""
    from clinhallu_fixture import scripted_trace_reply

    if body["model"] == "vlm":
        return scripted_trace_reply(body)
    return json.dumps({"hallucinated": len(json.dumps(body)) % 2, "reason": "parity", "answer_correct": 1,
                       "answer_reasoning": "r"})


def _clinhallu_roots(snapshot: dict, folder: Path) -> tuple[dict[str, str], Path]:
    """Image roots: a copy of the snapshot's images whose vqarad_00009.jpg (item 9's image) is noise; returns
    them and that file."""
    roots = {}
    for source, path in snapshot["image_roots"].items():
        shutil.copytree(path, folder / source)
        roots[source] = str(folder / source)
    image = folder / "clinhallu_vqa_rad" / "vqarad_00009.jpg"
    _noise_jpeg(image, 9)
    return roots, image


def test_clinhallu_skips_a_truncated_image_counted_like_generation_or_names_it(snapshot, tmp_path, capsys):
    """ClinHallu's three VQA-RAD items through the runner, item 9's image truncated. Skip: the other two get the
    traces and judgments a whole run gives them, item 9 none, counted in skipped_undecodable_images; the image
    replaced, the same command generates item 9 only. The default: an error naming it, before any model call."""
    from medheval.families.clinhallu.protocol import GENERATIONS, JUDGMENTS, LOG_FIELDS
    from medheval.families.clinhallu.task import CLUSTERS
    from medheval.run.predictions_log import read_log

    roots, image = _clinhallu_roots(snapshot, tmp_path / "images")
    whole = image.read_bytes()
    bad = "clinhallu/vqa_rad/9"

    def logged(out: Path, name: str) -> dict[tuple[str, str], dict]:
        return {(e["id"], e["setting"]): e for e in read_log(out / "clinhallu" / "vqa_rad" / name,
                                                              required=LOG_FIELDS)}

    with JudgeServer("openai", reply=_model_or_judge) as server:
        args = ["run", "--benchmark", "clinhallu:vqa_rad", "--data-dir", snapshot["data_dir"],
                *[arg for source, path in roots.items() for arg in ("--image-root", f"{source}={path}")],
                "--model", f"openai:vlm@{server.base_url}", "--judge", f"openai:judge@{server.base_url}"]
        assert main([*args, "--output", str(tmp_path / "whole")]) == 0
        _cut(image)
        sent = server.request_count
        assert main([*args, "--output", str(tmp_path / "strict")]) == 2
        err = capsys.readouterr().err
        assert f"record '{bad}'" in err and str(image) in err and "--on-missing skip" in err
        assert server.request_count == sent  # refused before any model or judge call

        out = tmp_path / "skip"
        assert main([*args, "--output", str(out), "--on-missing", "skip"]) == 0
        assert bad in capsys.readouterr().err
        results = json.loads((out / "results.json").read_text())
        entry = results["benchmarks"]["clinhallu:vqa_rad"]
        assert entry["skipped_undecodable_images"] == {"count": 1, "examples": [bad]}
        assert entry["n_records"] == entry["n_scored"] == 2 and entry["generated_this_run"] == 8
        assert entry["metrics"]["clinhallu"]["counts"]["n"] == 2
        assert sum(count["n"] for count in entry["clinhallu_run"]["counts"].values()) == 8
        assert any(bad in warning and "skipped during generation" in warning for warning in results["warnings"])
        assert "1 record(s) skipped for an undecodable image" in (out / "results.md").read_text()
        full = logged(tmp_path / "whole", GENERATIONS)
        assert logged(out, GENERATIONS) == {key: entry for key, entry in full.items() if key[0] != bad}
        assert {key[0] for key in logged(out, JUDGMENTS)} == {"clinhallu/vqa_rad/5", "clinhallu/vqa_rad/12"}
        assert bad not in json.loads((out / "clinhallu" / "vqa_rad" / CLUSTERS).read_text())

        image.write_bytes(whole)  # replaced: the same command generates and judges item 9 only
        assert main([*args, "--output", str(out), "--on-missing", "skip"]) == 0
    entry = json.loads((out / "results.json").read_text())["benchmarks"]["clinhallu:vqa_rad"]
    assert "skipped_undecodable_images" not in entry
    assert entry["n_records"] == entry["n_scored"] == 3 and entry["generated_this_run"] == 4
    assert logged(out, GENERATIONS) == full


def test_clinhallu_skips_an_image_truncated_between_generation_and_judging(snapshot, loaded, tmp_path):
    """A resumed ClinHallu run whose traces were logged before the image was cut short: the ORG judge (which
    sees the image) skips the item, which leaves the judgments and the metric inputs; its traces stay logged."""
    from medheval.backends.api import APIBackend
    from medheval.data.images import ImageDecodeError, ImageResolver
    from medheval.families.clinhallu.prompts import prompt_set
    from medheval.families.clinhallu.protocol import GENERATIONS, JUDGMENTS, LOG_FIELDS, ClinHalluRun, clinhallu_judge
    from medheval.run.predictions_log import read_log

    roots, image = _clinhallu_roots(snapshot, tmp_path / "images")
    resolver = ImageResolver(roots)
    records = [row for row in loaded.dataset.to_list() if row["config"] == "vqa_rad"]
    bad = "clinhallu/vqa_rad/9"
    with JudgeServer("openai", reply=_model_or_judge) as server:
        def protocol(skip: bool) -> ClinHalluRun:
            judge = clinhallu_judge(f"openai:judge@{server.base_url}", cache_dir=False, progress=False)
            return ClinHalluRun(APIBackend(f"openai:vlm@{server.base_url}", cache_dir=False), judge,
                                prompt_set("own"), tmp_path / "out", images_for=resolver.load_record_images,
                                progress=False, skip_undecodable=skip)

        protocol(False).generate(records)  # the traces, logged while the image was whole
        _cut(image)
        with pytest.raises(ImageDecodeError, match=f"record '{bad}'.*--on-missing skip"):
            protocol(False).run(records)
        run = protocol(True)
        result = run.run(records)
    assert [skipped.record_id for skipped in result["skipped"]] == [bad] == [s.record_id for s in run.skipped]
    assert "truncated" in result["skipped"][0].reason
    assert result["metric_inputs"]["sources"] == ["vqa_rad", "vqa_rad"] and result["counts"]["org"]["n"] == 2
    judged = {entry["id"] for entry in read_log(tmp_path / "out" / JUDGMENTS, required=LOG_FIELDS)}
    assert judged == {"clinhallu/vqa_rad/5", "clinhallu/vqa_rad/12"}
    assert {entry["id"] for entry in read_log(tmp_path / "out" / GENERATIONS, required=LOG_FIELDS)} == judged | {bad}
