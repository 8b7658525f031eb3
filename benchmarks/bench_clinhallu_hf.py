"""ClinHallu's sampled traces on a local (HF) model: one request per ``generate`` call against whole chunks.

ClinHallu samples every trace (temperature 0.7, top-p 0.9), each attempt with its own seed. ``HFBackend`` draws each
sampled row from a generator seeded by its request's seed and id (``per_request_seed``), so a reply does not depend
on the rows beside it and ``ClinHalluRun`` hands it whole chunks; before, it got one request per call. This times
``ClinHalluRun.generate`` (ORG and its re-asks, Rep-V with Rep-VK, Rep-K; judges are not part of it) both ways on the
tiny random LLaVA (``--model`` takes a Hub id or local folder instead) and checks the two logs are equal.

    PYTHONPATH=. python benchmarks/bench_clinhallu_hf.py [--items 16] [--batch-size 8] [--max-new-tokens 16]
        [--model tiny-random-llava] [--device cpu]

Reports items/s each way and their ratio, measured in one run (a ratio, not a time to compare across machines).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from bench_clinhallu_api import images_for, make_items  # noqa: E402

from medheval.backends.hf import HFBackend  # noqa: E402
from medheval.families.clinhallu.prompts import prompt_set  # noqa: E402
from medheval.families.clinhallu.protocol import GENERATIONS, LOG_FIELDS, ClinHalluRun, ProtocolConfig  # noqa: E402
from medheval.run.predictions_log import read_log  # noqa: E402


class OneRequestPerCall:
    """``backend`` as ClinHallu saw it before per-request seeds: it then sends one sampled request per call."""

    per_request_seed = False

    def __init__(self, backend: HFBackend):
        self.backend = backend

    def __getattr__(self, name: str):
        return getattr(self.backend, name)


def timed(backend, items: list[dict], out: Path, config: ProtocolConfig) -> tuple[float, list[str]]:
    run = ClinHalluRun(backend, None, prompt_set("own"), out, config=config, images_for=images_for, progress=False)
    began = time.perf_counter()
    run.generate(items)
    seconds = time.perf_counter() - began
    return seconds, sorted(str(sorted(e.items())) for e in read_log(out / GENERATIONS, required=LOG_FIELDS))


def build_backend(model: str, batch_size: int, max_new_tokens: int, device: str) -> HFBackend:
    if model == "tiny-random-llava":
        from medheval.backends.tiny import build_tiny_llava

        tiny, processor = build_tiny_llava(seed=0)
        return HFBackend(tiny.to(device), processor, batch_size=batch_size, max_new_tokens=max_new_tokens,
                         device=device)
    return HFBackend(model, batch_size=batch_size, max_new_tokens=max_new_tokens, device=device)


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", type=int, default=16)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--model", default="tiny-random-llava")
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args(argv)

    backend = build_backend(args.model, args.batch_size, args.max_new_tokens, args.device)
    config = ProtocolConfig(max_new_tokens=args.max_new_tokens, max_attempts=2, seed=0)
    items = make_items(args.items)
    with tempfile.TemporaryDirectory() as tmp:
        timed(backend, items[:1], Path(tmp) / "warm", config)  # first-call costs out of both timings
        old_time, old_log = timed(OneRequestPerCall(backend), items, Path(tmp) / "old", config)
        new_time, new_log = timed(backend, items, Path(tmp) / "new", config)
    old_rate, new_rate = len(items) / old_time, len(items) / new_time
    print(f"{args.model} on {args.device}, batch size {args.batch_size}, {args.max_new_tokens} new tokens, sampled "
          f"(T 0.7, top-p 0.9); ClinHalluRun.generate over {len(items)} items (ORG + re-asks, Rep-V, Rep-VK, Rep-K)")
    print(f"one request per call: {old_time:.2f} s = {old_rate:.2f} items/s")
    print(f"whole chunks:         {new_time:.2f} s = {new_rate:.2f} items/s")
    print(f"speed-up {new_rate / old_rate:.2f}x; same log both ways: {new_log == old_log}")
    return {"one_per_call_items_per_s": old_rate, "chunks_items_per_s": new_rate, "same_log": float(new_log == old_log)}


if __name__ == "__main__":
    main()
