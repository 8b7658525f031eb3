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
