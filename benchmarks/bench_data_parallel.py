"""Data parallel: ``accelerate launch`` with 2 processes vs 1 process, and the cost of merging part logs.

    PYTHONPATH=. python benchmarks/bench_data_parallel.py [--max-new-tokens 32] [--batch-size 4] \
        [--repeats 2] [--merge-records 200000]

1. The whole MedHEval fixture (every split, synthetic images; :mod:`medheval.families.medheval.fixtures`) through
   ``run_eval.py`` with the tiny random LLaVA on the CPU, once in one process and once with
   ``accelerate launch --multi_gpu --num_processes 2`` (torchrun + gloo on a machine without CUDA),
   each into a fresh folder, best of ``--repeats`` wall-clock times (process start, model build,
   generation, merge and scoring included). Prints the ratio and checks that both
   ``predictions.jsonl`` are equal (timing field aside).
2. :func:`medheval.run.distributed.merge_parts` on ``--merge-records`` synthetic entries spread over two
   part logs plus a merged log holding half of them (what the main process does after a split).

Numbers depend on the cores free at the time: 2 processes can only beat 1 when 2 cores are free.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SPLITS = "mm_vishal,cxr_vishal,vishal_report,knowledge:closed,knowledge:open,context"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _run(fixture: dict, output: Path, processes: int, args: argparse.Namespace) -> float:
    run_args = ["--benchmark", SPLITS, "--model", "tiny-random-llava", "--output", str(output), "--data-dir",
                fixture["data_dir"], "--batch-size", str(args.batch_size), "--max-new-tokens",
                str(args.max_new_tokens), "--device", "cpu"]
    for source, root in fixture["image_roots"].items():
        run_args += ["--image-root", f"{source}={root}"]
    if processes == 1:
        cmd = [sys.executable, str(REPO / "run_eval.py"), *run_args]
    else:
        accelerate = str(Path(sys.executable).with_name("accelerate"))
        cmd = [accelerate, "launch", "--multi_gpu", "--num_processes", str(processes), "--num_machines", "1",
               "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(_free_port()),
               str(REPO / "run_eval.py"), *run_args]
    env = {**os.environ, "PYTHONPATH": str(REPO), "TQDM_DISABLE": "1", "HF_HUB_OFFLINE": "1",
           "HF_EVALUATE_OFFLINE": "1"}
    began = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - began
    if done.returncode != 0:
        raise SystemExit(f"{processes}-process run failed:\n{done.stderr[-3000:]}")
    return seconds


def _predictions(output: Path) -> list[dict]:
    from medheval.run.predictions_log import read_log

    return [{k: v for k, v in entry.items() if k != "seconds"} for entry in read_log(output / "predictions.jsonl")]


def bench_merge(n: int, folder: Path) -> dict:
    """Time ``merge_parts`` on ``n`` entries: half already merged, a quarter in each part log."""
    from medheval.run.distributed import merge_parts, part_log_path
    from medheval.run.predictions_log import jsonl_line

    order = [f"bench/split/{i}" for i in range(n)]
    entries = [{"id": rid, "prediction": f"there is no pleural effusion {i}", "model": "m", "mitigation": "none",
                "seconds": 0.1} for i, rid in enumerate(order)]
    log = folder / "predictions.jsonl"
    log.write_text("".join(jsonl_line(e) for e in entries[: n // 2]))
    rest = entries[n // 2:]
    part_log_path(log, 0).write_text("".join(jsonl_line(e) for e in rest[0::2]))
    part_log_path(log, 1).write_text("".join(jsonl_line(e) for e in rest[1::2]))
    began = time.perf_counter()
    merged = merge_parts(log, order)
    seconds = time.perf_counter() - began
    assert merged == len(rest) and log.read_text().count("\n") == n
    return {"records": n, "seconds": round(seconds, 3), "us_per_record": round(seconds / n * 1e6, 2),
            "log_mib": round(log.stat().st_size / 2**20, 1)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2, help="runs per process count (best is reported)")
    parser.add_argument("--merge-records", type=int, default=200_000)
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO))
    from medheval.families.medheval.fixtures import write_fixture_benchmark

    with tempfile.TemporaryDirectory(prefix="bench-dp-") as tmp:
        folder = Path(tmp)
        fixture = write_fixture_benchmark(folder / "fixture")
        times: dict[int, list[float]] = {1: [], 2: []}
        for repeat in range(args.repeats):
            for processes in (1, 2):
                times[processes].append(_run(fixture, folder / f"run{processes}_{repeat}", processes, args))
        one, two = _predictions(folder / "run1_0"), _predictions(folder / "run2_0")
        assert one == two, "2-process predictions differ from the 1-process run"
        best = {p: min(t) for p, t in times.items()}
        merge = bench_merge(args.merge_records, folder)
    report = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "records": len(one), "batch_size": args.batch_size, "max_new_tokens": args.max_new_tokens,
        "seconds_1_process": [round(t, 2) for t in times[1]], "seconds_2_processes": [round(t, 2) for t in times[2]],
        "speedup_2_vs_1": round(best[1] / best[2], 2), "predictions_equal": True, "merge": merge,
    }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
