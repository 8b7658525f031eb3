"""Throughput of the API backend (``--model openai:<model>@<base_url>``) against a loopback
OpenAI-compatible server that answers each request after 200 ms (a stand-in for a vLLM server).

    python benchmarks/bench_api_backend.py [--records 320] [--concurrency 32] [--latency 0.2]
                                           [--sequential-subset 24]

Each record carries one 64x64 image (sent as a base64 PNG data URL) and a yes/no question. Reports:

- sequential throughput (concurrency 1, on ``--sequential-subset`` records);
- throughput at ``--concurrency`` on ``--records`` records, and the ratio to sequential;
- a second run of the same records (a new backend, same cache folder): wall time and the number of
  HTTP requests it sent (must be 0).

Target: ratio >= 20x at concurrency 32.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the loopback fake servers live with the tests

from judge_servers import JudgeServer  # noqa: E402
from PIL import Image  # noqa: E402

from medheval.backends.api import APIBackend  # noqa: E402


def make_records(n: int) -> tuple[list[dict], list[list]]:
    records = [{"id": f"bench/{i}", "question": f"Is finding {i} present?", "answer_type": "yes_no",
                "source": "slake", "meta": {"credentialed": False}} for i in range(n)]
    images = [[Image.new("RGB", (64, 64), (i % 256, (7 * i) % 256, 90))] for i in range(n)]
    return records, images


def timed(backend: APIBackend, records: list[dict], images: list[list]) -> float:
    began = time.perf_counter()
    outputs = backend.generate(records, images)
    assert len(outputs) == len(records)
    return time.perf_counter() - began


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=320)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--sequential-subset", type=int, default=24)
    args = parser.parse_args()

    records, images = make_records(args.records)
    with JudgeServer("openai", reply=lambda body: "Yes", latency=args.latency) as server, \
            tempfile.TemporaryDirectory() as tmp:
        spec = f"openai:bench-model@{server.base_url}"
        subset = args.sequential_subset
        sequential = timed(APIBackend(spec, concurrency=1, cache_dir=Path(tmp) / "seq"), records[:subset],
                           images[:subset])
        seq_rate = subset / sequential
        backend = APIBackend(spec, concurrency=args.concurrency, cache_dir=Path(tmp) / "par")
        parallel = timed(backend, records, images)
        par_rate = args.records / parallel
        requests_first = server.request_count - subset
        peak = server.max_in_flight
        server.reset_counts()
        cached_backend = APIBackend(spec, concurrency=args.concurrency, cache_dir=Path(tmp) / "par")
        cached = timed(cached_backend, records, images)
        usage = cached_backend.usage()

    print(f"server latency {args.latency * 1000:.0f} ms per request; one 64x64 image per record")
    print(f"sequential (concurrency 1): {subset} records in {sequential:.2f} s = {seq_rate:.2f} records/s")
    print(f"concurrency {args.concurrency}: {args.records} records in {parallel:.2f} s = {par_rate:.1f} records/s "
          f"({requests_first} requests, at most {peak} in flight)")
    print(f"speed-up over sequential: {par_rate / seq_rate:.1f}x (target >= 20x)")
    print(f"second run from the cache: {cached:.3f} s, {server.request_count} HTTP requests "
          f"(usage: requests={usage['requests']}, cached={usage['cached']})")


if __name__ == "__main__":
    main()
