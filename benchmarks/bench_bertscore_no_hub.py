"""Time `metrics/text_generation` on a machine without Hub access and without the offline flags.

    env -u HF_HUB_OFFLINE -u TRANSFORMERS_OFFLINE HF_EVALUATE_OFFLINE=1 python benchmarks/bench_bertscore_no_hub.py

With the default backbone (roberta-large) not cached, BERTScore must be reported unavailable. Prints
seconds per `compute` call (the first also loads WordNet) and, separately, seconds spent deciding
that BERTScore is unavailable (`_bertscore` on a fresh metric instance), for `--calls` calls.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import evaluate

METRIC_DIR = Path(__file__).resolve().parents[1] / "metrics" / "text_generation"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--calls", type=int, default=2)
    args = parser.parse_args()
    if os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE"):
        raise SystemExit("unset HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE: this measures the online-mode path")
    metric = evaluate.load(str(METRIC_DIR))
    for call in range(args.calls):
        began = time.perf_counter()
        out = metric.compute(predictions=["No effusion."], references=["No pleural effusion."])
        print(f"compute call {call + 1}: {time.perf_counter() - began:.2f}s  bertscore={out['bertscore']}")
    print(f"reason: {out['bertscore_unavailable_reason']}")
    fresh = evaluate.load(str(METRIC_DIR))
    for call in range(args.calls):
        began = time.perf_counter()
        fresh._bertscore(["No effusion."], ["No pleural effusion."], None, None, None, False, 16, "cpu")
        print(f"BERTScore step, call {call + 1}: {time.perf_counter() - began:.2f}s")


if __name__ == "__main__":
    main()
