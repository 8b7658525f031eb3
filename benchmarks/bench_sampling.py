"""Cost of the paper protocols' decoding against ours: longer lengths and sampling, in one run.

    PYTHONPATH=. python benchmarks/bench_sampling.py [--records 10] [--cap 1024] [--temperature 0.2] [--top-p 0.9]
        [--batch-size 8] [--model tiny|small|llava-1.5-7b] [--device cpu|cuda] [--repeats 1]

Modes, each over the same records (answer types cycling yes/no, open, multiple choice, report, statement):

* ``ours``           greedy, our lengths per answer type (16 / 256 / 32 / 512 / 16, medheval/run/generation.py);
* ``greedy_cap``     greedy, every record capped at ``--cap`` tokens (the papers' 1024): the cost of the length;
* ``sample_cap``     sampling at ``--temperature`` / ``--top-p``, capped at ``--cap``, per-row generators
                     (medheval/decoding/sampling.py, what a paper protocol runs);
* ``sample_global``  the same loop drawing all rows from the global torch RNG (batch-dependent, as
                     ``generate``'s own sampler): ``sample_cap`` against it is the per-row generators' cost.

Prints generated tokens, seconds and tokens/s per mode, the ratios against ``ours`` (tokens/s and wall time
for the same records) and ``sample_cap`` against ``sample_global``. A random-weight model rarely emits EOS,
so every record runs to its cap: the wall-time ratio is the worst case of the length; tokens/s compares the
cost per token. Ratios only; each mode's best of ``--repeats``.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from bench_hf_backend import make_records  # noqa: E402

from medheval.backends.hf import HFBackend  # noqa: E402
from medheval.backends.tiny import build_random_llava, build_tiny_llava  # noqa: E402
from medheval.decoding.loop import DecodingMethod, decode  # noqa: E402
from medheval.run.generation import GenerationPlan, group_by_settings, settings_for  # noqa: E402


class GlobalRNG(DecodingMethod):
    """medheval's plain loop drawing every row from the global torch RNG (the sampler dropped): the same loop
    as ``sample_cap`` but for the draw, so the two isolate the per-row generators' cost."""

    def run_loop(self, model, input_ids, *, synced_gpus: bool = False, **kwargs):
        kwargs.pop("sampler", None)
        return decode(self, model, input_ids, **kwargs)


class TokenCounter:
    """Wraps ``model.generate`` to count the tokens it generates (non-pad tokens after the prompt)."""

    def __init__(self, model, pad_token_id: int):
        self.generate, self.pad, self.tokens = model.generate, pad_token_id, 0
        model.generate = self

    def __call__(self, *args, **kwargs):
        out = self.generate(*args, **kwargs)
        sequences = out.sequences if hasattr(out, "sequences") else out
        prompt = kwargs["input_ids"].shape[1]
        self.tokens += int((sequences[:, prompt:] != self.pad).sum())
        return out


def run_mode(backend: HFBackend, records, images, plan: GenerationPlan | None, counter: TokenCounter,
             overrides: dict) -> tuple[float, int]:
    """(seconds, generated tokens) of one pass over the records, grouped by settings as the runner does."""
    counter.tokens = 0
    start = time.perf_counter()
    settings = settings_for(plan, "bench", "cfg")
    for group, group_images, chosen in group_by_settings(records, images, settings):
        backend.generate(group, group_images, overrides={**chosen, **overrides})
    if str(backend.device).startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - start, counter.tokens


def load(name: str, device: str):
    if name == "tiny":
        return build_tiny_llava(seed=0)
    if name == "small":
        return build_random_llava("small", seed=0)
    return build_random_llava(name, seed=0, dtype=torch.bfloat16, device=device)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=10)
    parser.add_argument("--cap", type=int, default=1024, help="the paper protocols' max_new_tokens")
    parser.add_argument("--temperature", type=float, default=0.2)
    parser.add_argument("--top-p", type=float, default=0.9)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--model", default="tiny", help="tiny, small or a RANDOM_LLAVA_SIZES name (llava-1.5-7b: GPU)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--modes", nargs="+", default=["ours", "greedy_cap", "sample_cap", "sample_global"])
    args = parser.parse_args(argv)

    model, processor = load(args.model, args.device)
    backend = HFBackend(model, processor, batch_size=args.batch_size, device=args.device, seed=0)
    counter = TokenCounter(backend.model, backend.tokenizer.pad_token_id)
    records, images = make_records(args.records)
    backend.generate(records[:2], images[:2], overrides={"max_new_tokens": 2})  # warm-up

    sampling = {"do_sample": True, "temperature": args.temperature, "top_p": args.top_p, "max_new_tokens": args.cap}
    modes = {
        "ours": (GenerationPlan(), {}),
        "greedy_cap": (None, {"max_new_tokens": args.cap}),
        "sample_cap": (None, sampling),
        "sample_global": (None, {**sampling, "custom_generate": GlobalRNG()}),
    }
    results = {}
    for name in args.modes:
        plan, overrides = modes[name]
        runs = [run_mode(backend, records, images, plan, counter, overrides) for _ in range(args.repeats)]
        seconds, tokens = min(runs)
        results[name] = {"seconds": round(seconds, 3), "tokens": tokens, "tokens_per_s": round(tokens / seconds, 1)}
        print(f"{name:>14}: {tokens:>6} tokens in {seconds:8.2f} s -> {tokens / seconds:8.1f} tokens/s")

    ratios = {}
    if "ours" in results:
        for name in results:
            if name != "ours":
                ratios[f"{name}_vs_ours"] = {
                    "tokens_per_s": round(results[name]["tokens_per_s"] / results["ours"]["tokens_per_s"], 2),
                    "wall_time": round(results[name]["seconds"] / results["ours"]["seconds"], 2)}
    if {"sample_cap", "sample_global"} <= set(results):
        ratios["per_row_vs_global_rng"] = {"tokens_per_s": round(
            results["sample_cap"]["tokens_per_s"] / results["sample_global"]["tokens_per_s"], 2)}
    for name, ratio in ratios.items():
        print(f"{name}: " + ", ".join(f"{k} x{v}" for k, v in ratio.items()))
    print(json.dumps({"model": args.model, "device": args.device, "records": len(records), "cap": args.cap,
                      "batch_size": args.batch_size, "temperature": args.temperature, "top_p": args.top_p,
                      "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
                      "machine": platform.machine(), "results": results, "ratios": ratios}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
