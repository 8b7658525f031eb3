"""ClinHallu trace generation through the API backend (``--model openai:<model>@<base_url>``) against a
loopback OpenAI-compatible server that answers each request after 200 ms (a stand-in for vLLM).

    python benchmarks/bench_clinhallu_api.py [--items 96] [--concurrency 32] [--latency 0.2]
                                             [--sequential-subset 8]

Each item has one 64x64 image and a gold trace; the scripted model writes an invalid ORG trace for one
seed in three (so re-asks happen) and valid traces otherwise, its text depending on the request's seed.
Reports items/s of ``ClinHalluRun.generate`` (all four settings; judges are not part of it):

- concurrency 1 (on ``--sequential-subset`` items);
- concurrency ``--concurrency``, requests one at a time (``per_request_seed`` off: the call pattern
  before chunked generation);
- concurrency ``--concurrency``, whole chunks per call (the default);
- the ratio of the last to concurrency 1, and whether its log equals the one-at-a-time log.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the loopback fake servers live with the tests

from clinhallu_fixture import scripted_trace_reply  # noqa: E402
from judge_servers import JudgeServer  # noqa: E402
from PIL import Image  # noqa: E402

from medheval.backends.api import APIBackend  # noqa: E402
from medheval.families.clinhallu.prompts import prompt_set  # noqa: E402
from medheval.families.clinhallu.protocol import GENERATIONS, LOG_FIELDS, ClinHalluRun  # noqa: E402
from medheval.run.predictions_log import read_log  # noqa: E402


def make_items(n: int) -> list[dict]:
    gold = {"visual_recognition": "A rounded opacity in the right lower zone of the chest.",
            "knowledge_recall": "Rounded basal opacities are often consolidation or a mass.",
            "reasoning": "The opacity with air bronchograms fits a consolidation here.", "answer": "yes"}
    return [{"id": f"bench/{i}", "question": f"Is finding {i} present?", "answer": "yes", "answer_type": "yes_no",
             "choices": [], "config": "vqa_rad", "meta": {"credentialed": False, "gold_trace": gold,
                                                          "shade": i % 256}} for i in range(n)]


def images_for(record: dict) -> list:
    return [Image.new("RGB", (64, 64), (record["meta"]["shade"], 90, 160))]




def timed(backend: APIBackend, items: list[dict], out: Path) -> tuple[float, list[str]]:
    run = ClinHalluRun(backend, None, prompt_set("own"), out, images_for=images_for, progress=False)
    began = time.perf_counter()
    run.generate(items)
    seconds = time.perf_counter() - began
    return seconds, sorted(str(sorted(e.items())) for e in read_log(out / GENERATIONS, required=LOG_FIELDS))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=96)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--latency", type=float, default=0.2)
    parser.add_argument("--sequential-subset", type=int, default=8)
    args = parser.parse_args()

    items = make_items(args.items)
    subset = items[:args.sequential_subset]
    reply = lambda body: scripted_trace_reply(body, answer_of=lambda seed: "yes")  # noqa: E731
    with JudgeServer("openai", reply=reply, latency=args.latency) as server, \
            tempfile.TemporaryDirectory() as tmp:
        spec = f"openai:bench-model@{server.base_url}"
        seq_time, _ = timed(APIBackend(spec, concurrency=1, cache_dir=False), subset, Path(tmp) / "seq")
        seq_requests = server.request_count
        server.reset_counts()
        old = APIBackend(spec, concurrency=args.concurrency, cache_dir=False)
        old.per_request_seed = False  # one request per generate_chat call
        old_time, old_log = timed(old, items, Path(tmp) / "old")
        old_peak = server.max_in_flight
        server.reset_counts()
        new_time, new_log = timed(APIBackend(spec, concurrency=args.concurrency, cache_dir=False), items,
                                  Path(tmp) / "new")
        new_requests, new_peak = server.request_count, server.max_in_flight

    seq_rate, old_rate, new_rate = (len(subset) / seq_time, len(items) / old_time, len(items) / new_time)
    print(f"server latency {args.latency * 1000:.0f} ms per request; one 64x64 image per item; "
          f"ClinHalluRun.generate (ORG + re-asks, Rep-V, Rep-K, Rep-VK)")
    print(f"concurrency 1: {len(subset)} items ({seq_requests} requests) in {seq_time:.2f} s = {seq_rate:.2f} items/s")
    print(f"concurrency {args.concurrency}, one request per call: {len(items)} items in {old_time:.2f} s = "
          f"{old_rate:.2f} items/s (at most {old_peak} in flight)")
    print(f"concurrency {args.concurrency}, whole chunks: {len(items)} items ({new_requests} requests) in "
          f"{new_time:.2f} s = {new_rate:.2f} items/s (at most {new_peak} in flight)")
    print(f"speed-up over concurrency 1: {new_rate / seq_rate:.1f}x; over one request per call: "
          f"{new_rate / old_rate:.1f}x; same log as one request per call: {new_log == old_log}")


if __name__ == "__main__":
    main()
