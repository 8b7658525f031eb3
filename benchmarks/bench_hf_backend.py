"""HFBackend throughput: batch size 1 vs 8 on the tiny random LLaVA (CPU, offline).

    PYTHONPATH=. python benchmarks/bench_hf_backend.py [--records 48] [--max-new-tokens 16] [--repeats 3]

Prints samples/s per batch size, the speed-up ratio, and checks that the outputs are
identical across batch sizes (left padding must not change greedy answers).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time

import numpy as np
import torch
from PIL import Image

from medheval.backends.hf import HFBackend
from medheval.backends.tiny import build_tiny_llava

ANSWER_TYPES = ["yes_no", "open", "multiple_choice", "report", "statement"]
WORDS = (
    "is there a pleural effusion in the left lower lobe of this chest x ray with cardiomegaly "
    "and pulmonary edema or a fracture of the rib near the right hilum"
).split()


def make_records(n: int, seed: int = 0):
    rs = np.random.RandomState(seed)
    records, images = [], []
    for i in range(n):
        answer_type = ANSWER_TYPES[i % len(ANSWER_TYPES)]
        records.append(
            {
                "id": f"bench/cfg/{i}",
                "question": " ".join(rs.choice(WORDS, rs.randint(3, 24))) + "?",
                "answer_type": answer_type,
                "choices": ["liver", "spleen", "kidney", "heart"] if answer_type == "multiple_choice" else [],
            }
        )
        h, w = rs.randint(24, 96, size=2)
        images.append([Image.fromarray((rs.rand(h, w, 3) * 255).astype("uint8"))])
    return records, images


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=48)
    parser.add_argument("--max-new-tokens", type=int, default=16)
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per batch size (best is reported)")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    model, processor = build_tiny_llava(seed=0)
    records, images = make_records(args.records)
    HFBackend(model, processor, batch_size=2, max_new_tokens=2).generate(records[:4], images[:4])  # warm-up

    results, outputs = {}, {}
    for bs in args.batch_sizes:
        backend = HFBackend(model, processor, batch_size=bs, max_new_tokens=args.max_new_tokens)
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            out = backend.generate(records, images)
            times.append(time.perf_counter() - start)
            if bs in outputs and out != outputs[bs]:
                raise SystemExit(f"batch_size={bs}: outputs changed between repeats")
            outputs[bs] = out
        best = min(times)
        results[bs] = {"seconds": round(best, 4), "samples_per_s": round(len(records) / best, 2)}
        print(f"batch_size={bs:>2}: {best:.3f} s for {len(records)} records -> {len(records) / best:.1f} samples/s")

    base = args.batch_sizes[0]
    identical = all(outputs[bs] == outputs[base] for bs in args.batch_sizes)
    for bs in args.batch_sizes[1:]:
        ratio = results[bs]["samples_per_s"] / results[base]["samples_per_s"]
        results[bs]["speedup_vs_bs%d" % base] = round(ratio, 2)
        print(f"speed-up batch_size={bs} vs {base}: {ratio:.2f}x")
    print(f"outputs identical across batch sizes: {identical}")
    print(
        json.dumps(
            {
                "records": len(records),
                "max_new_tokens": args.max_new_tokens,
                "torch_threads": torch.get_num_threads(),
                "torch": torch.__version__,
                "machine": platform.machine(),
                "results": results,
                "outputs_identical": identical,
                "example_output": outputs[base][0],
            },
            indent=2,
        )
    )
    if not identical:
        diff = [r["id"] for r, *outs in zip(records, *outputs.values()) if len(set(outs)) > 1]
        print(f"outputs differ for {len(diff)} record(s): {diff[:10]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
