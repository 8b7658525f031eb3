"""Data-parallel runs (``accelerate launch``, :mod:`medheval.run.distributed`): sharding, merging, resume, errors.

The launches run 2 CPU processes (gloo) on the offline fixture split with the tiny random LLaVA."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO

from medheval.cli import main
from medheval.run.distributed import (SOLO, Group, RankFailed, device_for, group, merge_parts, part_log_path,
                                  shard_batches)
from medheval.run.predictions_log import read_log

ACCELERATE = Path(sys.executable).with_name("accelerate")
needs_accelerate = pytest.mark.skipif(not ACCELERATE.exists(), reason="accelerate is not installed (extra: multi)")
SPLITS = "mm_vishal,context"
LIMIT = 7  # 7 records of each split in batches of 2: rank 0 gets batches 0 and 2, rank 1 batches 1 and 3


# -- sharding, merging, sync points (no processes launched) ------------------------------------------
def test_shards_are_whole_batches_of_a_single_process_run_and_cover_every_record_once():
    indices = [3, 4, 8, 9, 10, 15, 16]  # what is left of a split, in record order
    shards = [shard_batches(indices, 2, rank, 2) for rank in range(2)]
    assert shards == [[3, 4, 10, 15], [8, 9, 16]]
    three = [shard_batches(indices, 3, rank, 3) for rank in range(3)]
    assert three == [[3, 4, 8], [9, 10, 15], [16]]
    for batch_size, world in [(1, 2), (2, 3), (4, 2), (8, 2)]:
        parts = [shard_batches(indices, batch_size, rank, world) for rank in range(world)]
        assert sorted(i for part in parts for i in part) == indices
        single = [indices[s:s + batch_size] for s in range(0, len(indices), batch_size)]
        rebatched = [part[s:s + batch_size] for part in parts for s in range(0, len(part), batch_size)]
        assert sorted(rebatched) == sorted(single)  # each process calls generate on the same batches
    assert shard_batches(indices, 2, 0, 1) == indices


def _entry(rid: str, prediction: str = "p") -> dict:
    return {"id": rid, "prediction": prediction, "model": "m", "mitigation": "none"}


def _write(path: Path, entries: list[dict], torn: str = "") -> None:
    path.write_text("".join(json.dumps(entry) + "\n" for entry in entries) + torn)


def test_merge_orders_by_record_drops_duplicates_and_torn_lines_and_removes_the_parts(tmp_path):
    log = tmp_path / "predictions.jsonl"
    order = ["a", "b", "c", "d", "e", "f"]
    _write(log, [_entry("a"), _entry("d")])
    _write(part_log_path(log, 0), [_entry("e"), _entry("b")])
    _write(part_log_path(log, 1), [_entry("c"), _entry("d")], torn='{"id": "f", "predic')
    assert part_log_path(log, 1).name == "predictions.rank1.jsonl"
    assert merge_parts(log, order) == 3  # b, c, e; d was merged already (an exact copy), f was torn mid-write
    assert [(e["id"], e["prediction"]) for e in read_log(log)] == [("a", "p"), ("b", "p"), ("c", "p"), ("d", "p"),
                                                                  ("e", "p")]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["predictions.jsonl"]
    # killed between the atomic write and the deletion: merging the same part again adds nothing
    _write(part_log_path(log, 0), [_entry("e"), _entry("b"), _entry("zz")])
    before = [e["id"] for e in read_log(log)]
    assert merge_parts(log, order) == 1 and [e["id"] for e in read_log(log)] == [*before, "zz"]
    assert merge_parts(log, order) == 0  # no part logs: nothing to do


def _fake_group(rank: int, statuses: list) -> tuple[Group, list]:
    sent: list = []

    def gather(value):
        sent.append(value)
        return [value if r == rank else status for r, status in enumerate(statuses)]

    return Group(rank=rank, world_size=len(statuses), gather=gather), sent


def test_a_failure_on_one_process_is_an_error_on_every_process():
    ok, sent = _fake_group(0, [None, None])
    with ok.together("generating x"):
        pass
    assert sent == [None]
    healthy, _ = _fake_group(0, [None, "BackendError: CUDA out of memory"])
    with pytest.raises(RankFailed, match=r"process 1 of 2 failed while generating x: BackendError: CUDA out"):
        with healthy.together("generating x"):
            pass
    failing, sent = _fake_group(1, [None, None])
    with pytest.raises(ValueError, match="bad record"):  # the failing process keeps its own error ...
        with failing.together("generating x"):
            raise ValueError("bad record")
    assert sent == ["ValueError: bad record"]  # ... and tells the others


def test_the_main_process_prepares_first_and_the_others_after_it():
    for rank in (0, 1):
        member, sent = _fake_group(rank, [None, None])
        calls: list[int] = []
        assert member.main_first("preparing", lambda: calls.append(len(sent)) or "prepared") == "prepared"
        assert calls == [0 if rank == 0 else 1] and sent == [None, None]  # before the first meeting, or after it
    other, _ = _fake_group(1, ["RunError: different settings", None])
    ran: list[bool] = []
    with pytest.raises(RankFailed, match="process 0 of 2 failed while preparing: RunError: different settings"):
        other.main_first("preparing", lambda: ran.append(True))
    assert ran == []  # nothing prepared, nothing written, after the main process refused the run


def test_without_a_launcher_a_run_is_one_process_on_its_own_device(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert group() is SOLO and SOLO.is_main and SOLO.world_size == 1
    assert device_for(None) is None and device_for("cpu") == "cpu"
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert group() is SOLO and device_for("cuda:1") == "cuda:1"



_ENDING = """
import atexit, importlib, sys
from pathlib import Path
from medheval.run import distributed
from medheval.cli import entry_point
from medheval.run.distributed import Group, end_process

assert end_process(5) == 5  # not launched: the status back, nothing else
distributed._GROUP = Group(rank=1, world_size=2, gather=lambda value: [value, value])
atexit.register(lambda: (Path(sys.argv[1]).write_text("handlers ran"), sys.stdout.write(" / said at exit")))
sys.stdout.write("buffered, no newline")
sys.stderr.write("and on stderr")


class Teardown:  # collected only by the interpreter's teardown, which a launched process must not reach
    def __del__(self, write=Path(sys.argv[1] + ".teardown").write_text):  # bound now: globals go first
        write("the interpreter tore down")


witness = Teardown()
how = sys.argv[2]
if how == "direct":
    end_process(3)
elif how == "user error":  # the command line's entry: main's status (a user error: 2), then end_process
    entry_point(["run", "--benchmark", "no_such_benchmark", "--model", "tiny-random-llava", "--output", sys.argv[1]])
elif how == "crash":  # main raises: traceback, status 1, still no interpreter teardown
    def crashing(argv):
        raise RuntimeError("a bug in the run")
    importlib.import_module("medheval.cli.main").main = crashing
    entry_point([])
elif how == "exit":  # argparse's SystemExit(2) on a bad flag, or any SystemExit inside main
    entry_point(["run", "--no-such-flag"])
raise SystemExit("end_process returned in a launched process")
"""


@pytest.mark.parametrize("how, status, on_stderr", [
    ("direct", 3, ""),
    ("user error", 2, "error: unknown dataset 'no_such_benchmark'"),
    ("crash", 1, "Traceback (most recent call last):"),
    ("exit", 2, "usage: medheval "),
])
def test_a_launched_process_ends_with_its_status_its_output_and_its_exit_handlers(tmp_path, how, status, on_stderr):
    """A launched process leaves through ``os._exit`` (no interpreter teardown, where gloo's C++ threads can abort a
    finished process), however ``main`` ends: its status is the exit code, buffered output (also what an exit handler
    prints) still arrives, exit handlers ran. Unbuffered output would hide a missing flush: the child runs without
    PYTHONUNBUFFERED."""
    marker = tmp_path / "marker"
    env = {key: value for key, value in os.environ.items() if key != "PYTHONUNBUFFERED"} | {"PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", _ENDING, str(marker), how], capture_output=True, text=True,
                          timeout=120, cwd=REPO, env=env)
    assert (done.returncode, done.stdout) == (status, "buffered, no newline / said at exit"), done.stderr
    assert done.stderr.startswith("and on stderr" + on_stderr), done.stderr
    assert "Fatal Python error" not in done.stderr and marker.read_text() == "handlers ran"
    assert not marker.with_name("marker.teardown").exists()
    if how == "crash":
        assert "RuntimeError: a bug in the run" in done.stderr


def test_every_command_line_entry_ends_a_launched_process_through_end_process():
    """The console script, ``python -m medheval``, ``python -m medheval.cli`` and ``run_eval.py`` call
    ``entry_point`` (``main`` then ``end_process``); ``main`` itself returns, for callers in Python."""
    import configparser

    scripts = configparser.ConfigParser()
    scripts.read(REPO / "setup.cfg")
    assert "medheval = medheval.cli:entry_point" in scripts["options.entry_points"]["console_scripts"]
    for path in ("medheval/__main__.py", "medheval/cli/__main__.py", "run_eval.py"):
        assert "sys.exit(entry_point(" in (REPO / path).read_text(), path


# -- 2 processes through `accelerate launch` ---------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _run_args(fixture: dict, output: Path, *extra: str) -> list[str]:
    args = ["--benchmark", SPLITS, "--model", "tiny-random-llava", "--output", str(output), "--data-dir",
            fixture["data_dir"], "--batch-size", "2", "--max-new-tokens", "4", "--limit", str(LIMIT), *extra]
    for source, root in fixture["image_roots"].items():
        args += ["--image-root", f"{source}={root}"]
    return args


def _launch_cmd(fixture: dict, output: Path, *extra: str, module: bool = False) -> list[str]:
    """``accelerate launch`` with 2 CPU processes (torchrun + gloo: ``--multi_gpu`` is accelerate's
    multi-process launcher; on a machine without CUDA the processes use the CPU)."""
    target = ["-m", "medheval.cli", "run"] if module else [str(REPO / "run_eval.py")]
    return [str(ACCELERATE), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
            "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(_free_port()),
            *target, *_run_args(fixture, output, "--device", "cpu", *extra)]


LAUNCH_ENV = {"PYTHONPATH": str(REPO), "TQDM_DISABLE": "1", "OMP_NUM_THREADS": "1", "MEDHEVAL_DP_TIMEOUT": "300"}


def _launch(fixture: dict, output: Path, *extra: str, module: bool = False) -> subprocess.CompletedProcess:
    return subprocess.run(_launch_cmd(fixture, output, *extra, module=module), env={**os.environ, **LAUNCH_ENV},
                          capture_output=True, text=True, timeout=600, cwd=REPO)


def _without_timing(path: Path) -> list[dict]:
    return [{k: v for k, v in entry.items() if k != "seconds"} for entry in read_log(path)]


def _scores(output: Path) -> dict:
    benchmarks = json.loads((output / "results.json").read_text())["benchmarks"]
    return {split: entry["metrics"] for split, entry in benchmarks.items()}


@pytest.fixture(scope="module")
def single_run(fixture_benchmark, tmp_path_factory) -> Path:
    """The reference: the same run in one process (``--device cpu``, like the launches)."""
    output = tmp_path_factory.mktemp("single") / "run"
    assert main(["run", *_run_args(fixture_benchmark, output, "--device", "cpu")]) == 0
    return output


@pytest.mark.slow
@needs_accelerate
def test_two_processes_give_the_single_process_predictions_and_scores(fixture_benchmark, single_run, tmp_path):
    output = tmp_path / "dp"
    launched = _launch(fixture_benchmark, output, module=True)
    assert launched.returncode == 0, launched.stderr[-3000:]
    expected = _without_timing(single_run / "predictions.jsonl")
    assert len(expected) == 2 * LIMIT
    assert _without_timing(output / "predictions.jsonl") == expected  # same ids, predictions and order
    assert sorted(p.name for p in output.iterdir()) == sorted(p.name for p in single_run.iterdir())  # no part logs
    assert _scores(output) == _scores(single_run)
    results = json.loads((output / "results.json").read_text())
    assert results["world_size"] == 2 and json.loads((single_run / "results.json").read_text())["world_size"] == 1
    assert {split: entry["generated_this_run"] for split, entry in results["benchmarks"].items()} == {
        "mm_vishal:all": LIMIT, "context:default": LIMIT}
    assert launched.stdout.count("# MedHEval-HF results") == 1  # the main process reports, once


@pytest.mark.slow
@needs_accelerate
def test_resume_from_part_logs_of_a_killed_launch_equals_the_uninterrupted_run(fixture_benchmark, single_run,
                                                                                tmp_path):
    expected = read_log(single_run / "predictions.jsonl")  # mm_vishal: entries 0-6, context: 7-13
    output = tmp_path / "resumed"
    output.mkdir()
    shutil.copy(single_run / "run.json", output / "run.json")
    log = output / "predictions.jsonl"
    _write(log, expected[:2])  # merged by an earlier launch
    _write(part_log_path(log, 0), [expected[4], expected[5]])  # what each process had appended when killed
    _write(part_log_path(log, 1), [expected[2], expected[9]], torn=json.dumps(expected[3])[:25])
    launched = _launch(fixture_benchmark, output)
    assert launched.returncode == 0, launched.stderr[-3000:]
    assert _without_timing(log) == _without_timing(single_run / "predictions.jsonl")
    assert not list(output.glob("predictions.rank*"))
    results = json.loads((output / "results.json").read_text())
    # mm_vishal: 3 and 6 were left (3 was torn); context: all but one (entry 9)
    assert {split: entry["generated_this_run"] for split, entry in results["benchmarks"].items()} == {
        "mm_vishal:all": 2, "context:default": LIMIT - 1}
    assert _scores(output) == _scores(single_run)


@pytest.mark.slow
@needs_accelerate
def test_a_launch_killed_mid_run_resumes_to_the_uninterrupted_run(fixture_benchmark, tmp_path):
    """SIGKILL to the launcher and the processes it started once the part logs have lines, then launch again."""
    psutil = pytest.importorskip("psutil")  # (an accelerate dependency) lists the processes to kill
    extra = ("--batch-size", "1", "--max-new-tokens", "12", "--limit", "12")  # slower: time to kill it
    full = tmp_path / "full"
    assert main(["run", *_run_args(fixture_benchmark, full, "--device", "cpu", *extra)]) == 0
    output = tmp_path / "killed"
    process = subprocess.Popen(_launch_cmd(fixture_benchmark, output, *extra), env={**os.environ, **LAUNCH_ENV},
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO)
    deadline = time.monotonic() + 300
    killed = False
    while time.monotonic() < deadline and process.poll() is None:
        parts = list(output.glob("predictions.rank*.jsonl"))
        if sum(part.read_bytes().count(b"\n") for part in parts) >= 2:
            launched = [process.pid, *(child.pid for child in psutil.Process(process.pid).children(recursive=True))]
            for pid in launched:  # torchrun starts its workers in sessions of their own: kill each by pid
                os.kill(pid, signal.SIGKILL)
            killed = True
            break
        time.sleep(0.005)
    process.wait(timeout=60)
    assert killed, "the launch finished before it could be killed"
    def dead(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    settle = time.monotonic() + 30  # SIGKILL is delivered asynchronously: give a loaded machine a moment
    while not all(dead(pid) for pid in launched[1:]) and time.monotonic() < settle:
        time.sleep(0.05)
    assert all(dead(pid) for pid in launched[1:])
    assert list(output.glob("predictions.rank*.jsonl"))  # left for the next launch to merge
    relaunched = subprocess.run(_launch_cmd(fixture_benchmark, output, *extra), env={**os.environ, **LAUNCH_ENV},
                                capture_output=True, text=True, timeout=600, cwd=REPO)
    assert relaunched.returncode == 0, relaunched.stderr[-3000:]
    assert _without_timing(output / "predictions.jsonl") == _without_timing(full / "predictions.jsonl")
    generated = sum(entry["generated_this_run"]
                    for entry in json.loads((output / "results.json").read_text())["benchmarks"].values())
    assert 0 < generated < 24 and not list(output.glob("predictions.rank*"))


def test_a_single_process_run_merges_part_logs_left_by_a_launch(fixture_benchmark, single_run, tmp_path):
    expected = read_log(single_run / "predictions.jsonl")
    output = tmp_path / "after_launch"
    output.mkdir()
    shutil.copy(single_run / "run.json", output / "run.json")
    log = output / "predictions.jsonl"
    _write(part_log_path(log, 1), expected[1:], torn='{"id"')
    assert main(["run", *_run_args(fixture_benchmark, output, "--device", "cpu")]) == 0
    resumed = _without_timing(log)
    assert resumed[0]["id"] == expected[1]["id"]  # a single process appends what it generates (entry 0) ...
    assert sorted(resumed, key=lambda e: e["id"]) == sorted(_without_timing(single_run / "predictions.jsonl"),
                                                            key=lambda e: e["id"])  # ... the same entries
    results = json.loads((output / "results.json").read_text())
    assert results["benchmarks"]["mm_vishal:all"]["generated_this_run"] == 1  # only entry 0 was missing
    assert not list(output.glob("predictions.rank*"))


@pytest.mark.slow
@needs_accelerate
def test_a_launch_with_other_settings_is_refused_on_every_process(fixture_benchmark, single_run, tmp_path):
    output = tmp_path / "other"
    shutil.copytree(single_run, output)
    before = (output / "predictions.jsonl").read_bytes()
    launched = _launch(fixture_benchmark, output, "--max-new-tokens", "6")
    assert launched.returncode != 0
    assert "error: " in launched.stderr and "different settings" in launched.stderr  # the main process
    assert "error: process 0 of 2 failed while preparing the run: RunError:" in launched.stderr  # the other one
    assert (output / "predictions.jsonl").read_bytes() == before and not list(output.glob("predictions.rank*"))
