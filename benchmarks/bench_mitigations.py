"""Mitigation overhead: time of each method relative to plain greedy ``generate`` and to the 2B-row floor.

    PYTHONPATH=. python benchmarks/bench_mitigations.py [--models tiny small llava-1.5-7b]
        [--batch-size 4] [--prompts 8] [--max-new-tokens 32] [--repeats 5] [--device cpu|cuda]
        [--threads N] [--preset medheval|official|...] [--methods ...] [--json out.json]

One process per run, the same random-weight LLaVA, prompts and images for every method:

- ``none``       plain greedy ``model.generate`` over the B rows (the baseline, ``x greedy`` = 1.00);
- ``floor2B``    plain greedy ``generate`` over the same batch given twice (2B rows): what one
                 forward over 2B rows per step costs, the floor of every two-stream method
                 (``x floor`` = time / this time);
- ``loop``       medheval's decoding loop with no mitigation (the loop's own overhead);
- ``vcd``, ``m3id``, ``pai``, ``avisc``, ``damro``  the two-stream methods, one forward of 2B rows
                 per step (the default), and ``<name>-2pass`` the same method with
                 ``two_pass()``: each contrast stream in its own cache and forward (the previous
                 design of M3ID/PAI/AvisC and of DAMRO's ``drop``; the same tokens, checked);
- ``dola``       DoLa (one stream, early-exit heads);
- ``beam5``      plain 5-beam ``model.generate(num_beams=5)``, the baseline of OPERA's row;
- ``opera``      OPERA at its preset (5 beams, 5 candidates); ``vs_beam5`` is its speed
                 relative to ``beam5`` on the same prompts.

Models (``--models``): ``tiny`` is the test model (a few ms per step: Python overhead dominates);
``small`` is a larger random LLaVA (8 x 512 text layers, 224 px CLIP, 256 image tokens) where the
forward work dominates; ``llava-1.5-7b`` has LLaVA-1.5-7B's shapes (32 x 4096 Vicuna layers, CLIP
ViT-L/14 at 336 px, 576 image tokens) in bfloat16 and runs only on CUDA (skipped otherwise). The
default is ``tiny small`` on CPU, plus ``llava-1.5-7b`` when CUDA is available.

Timing: ``--repeats`` timed runs per method, round-robin over the methods in every repeat (load
from other processes then hits every method alike); the **median** is reported (``min`` too in
the JSON). Every row generates exactly ``--max-new-tokens`` tokens (special tokens can never win),
so times are comparable. Peak memory: CUDA's ``max_memory_allocated`` on GPU; on CPU the peak
resident set size above the pre-run level, sampled every millisecond (after returning freed heap to
the OS with ``malloc_trim``), so it is an estimate good to about 1 MB.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import sys
import threading
import time

import numpy as np
import torch
from PIL import Image

from medheval.backends.tiny import build_random_llava, build_tiny_llava
from medheval.decoding import DecodingMethod
from medheval.mitigations import DAMRO, AvisC, DoLa, M3ID, OPERA, PAI, VCD, get_mitigation
from medheval.versions import stack_versions

WORDS = (
    "is there a pleural effusion in the left lower lobe of this chest x ray with cardiomegaly "
    "and pulmonary edema or a fracture of the rib near the right hilum"
).split()


class Loop(DecodingMethod):
    """The shared loop without a mitigation."""

    name = "loop"


class PlainBeams:
    """Plain ``generate(num_beams=5)``: the baseline of OPERA's row (not a custom_generate method)."""

    generate_kwargs = {"num_beams": 5}


class Floor2B:
    """Plain greedy ``generate`` over the batch given twice: one forward over 2B rows per step."""


TWO_STREAM = ("vcd", "m3id", "pai", "avisc", "damro")
MODEL_IMAGE_SIZES = {"tiny": 30, "small": 224, "llava-1.5-7b": 336}


def doubled(inputs):
    """The batch given twice along the rows (``pixel_values``/``image_sizes`` too)."""
    return {k: torch.cat([v, v]) if torch.is_tensor(v) else v for k, v in inputs.items()}


def make_batches(processor, n: int, batch_size: int, image_size: int, seed: int = 0):
    rs = np.random.RandomState(seed)
    prompts = [" ".join(rs.choice(WORDS, rs.randint(3, 20))) + " ?" for _ in range(n)]
    images = [Image.fromarray((rs.rand(image_size, image_size, 3) * 255).astype("uint8")) for _ in range(n)]
    batches = []
    for start in range(0, n, batch_size):
        texts = [f"USER: <image>\n{p} ASSISTANT:" for p in prompts[start : start + batch_size]]
        batches.append(processor(text=texts, images=images[start : start + batch_size], padding=True,
                                 return_tensors="pt"))
    return batches


class PeakMemory:
    """Peak memory during a block: CUDA allocator stats, or sampled RSS above the start on CPU."""

    def __init__(self, device: str):
        self.device = device
        self.peak_bytes = 0

    @staticmethod
    def _rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def __enter__(self):
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self._base = torch.cuda.memory_allocated()
            return self
        try:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        except OSError:  # pragma: no cover - not glibc
            pass
        self._base = self._peak = self._rss()
        self._stop = threading.Event()

        def sample():
            while not self._stop.is_set():
                self._peak = max(self._peak, self._rss())
                time.sleep(0.001)

        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        if self.device.startswith("cuda"):
            torch.cuda.synchronize()
            self.peak_bytes = torch.cuda.max_memory_allocated() - self._base
        else:
            self._stop.set()
            self._thread.join()
            self._peak = max(self._peak, self._rss())
            self.peak_bytes = self._peak - self._base


def run(model, batches, method, max_new_tokens: int, device: str):
    outputs = []
    for inputs in batches:
        inputs = inputs.to(device)
        kwargs = dict(max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens, do_sample=False)
        if isinstance(method, PlainBeams):
            kwargs.update(method.generate_kwargs)
        elif isinstance(method, Floor2B):
            inputs = doubled(inputs)
        elif method is not None:
            kwargs["custom_generate"] = method
        with torch.inference_mode():
            out = model.generate(**inputs, **kwargs)
        outputs.append(out[: len(out) // 2 if isinstance(method, Floor2B) else len(out), inputs["input_ids"].shape[1]:].cpu())
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return outputs


def build_methods(names: list[str] | None, preset_name: str) -> dict:
    def preset(cls):
        return cls(preset=preset_name if preset_name in cls.PRESETS else "medheval")

    singles = {"vcd": VCD, "m3id": M3ID, "pai": PAI, "avisc": AvisC, "damro": DAMRO, "dola": DoLa, "opera": OPERA}
    methods: dict = {"none": None, "floor2B": Floor2B(), "loop": Loop()}
    for name, cls in singles.items():
        if name == "opera":
            methods["beam5"] = PlainBeams()
        methods[name] = preset(cls)
        if name in TWO_STREAM:
            methods[f"{name}-2pass"] = preset(cls).two_pass()
    if names:
        extra = {spec: get_mitigation(spec) for spec in names if ":" in spec}
        methods = {k: v for k, v in methods.items() if k in names or k in ("none", "floor2B")} | extra
    return methods


def load_model(name: str, device: str):
    if name == "tiny":
        model, processor = build_tiny_llava(seed=0)
    elif name == "small":
        model, processor = build_random_llava("small", seed=0)
    else:
        model, processor = build_random_llava(name, seed=0, dtype=torch.bfloat16, device=device)
    return model.to(device), processor


def bench_model(name: str, args) -> dict | None:
    device = args.device
    if name == "llava-1.5-7b" and not (device.startswith("cuda") and torch.cuda.is_available()):
        print(f"model={name}: skipped (needs a CUDA device; this run has device={device})")
        return None
    model, processor = load_model(name, device)
    batches = make_batches(processor, args.prompts, args.batch_size, MODEL_IMAGE_SIZES[name])
    methods = build_methods(args.methods, args.preset)

    tokens = args.prompts * args.max_new_tokens
    for method in methods.values():  # warm-up
        run(model, batches[:1], method, 2, device)
    times: dict[str, list[float]] = {key: [] for key in methods}
    outputs = {}
    for _ in range(args.repeats):
        for key, method in methods.items():
            start = time.perf_counter()
            outputs[key] = run(model, batches, method, args.max_new_tokens, device)
            times[key].append(time.perf_counter() - start)
    results: dict[str, dict] = {}
    for key, method in methods.items():
        with PeakMemory(device) as memory:
            run(model, batches, method, args.max_new_tokens, device)
        median = float(np.median(times[key]))
        results[key] = {"seconds": round(median, 4), "min_seconds": round(min(times[key]), 4),
                        "tokens_per_s": round(tokens / median, 1), "peak_mem_mb": round(memory.peak_bytes / 2**20, 1)}
        if hasattr(method, "PRESETS"):
            results[key]["settings"] = method.spec()
    for entry in results.values():
        entry["x_greedy"] = round(entry["seconds"] / results["none"]["seconds"], 3)
        entry["x_floor"] = round(entry["seconds"] / results["floor2B"]["seconds"], 3)
    if "beam5" in results:
        for key, method in methods.items():
            if isinstance(method, OPERA):
                results[key]["vs_beam5"] = round(results[key]["tokens_per_s"] / results["beam5"]["tokens_per_s"], 3)

    def same(a: str, b: str) -> bool:
        return all(torch.equal(x, y) for x, y in zip(outputs[a], outputs[b]))

    for key in results:
        if key in ("loop", "floor2B"):
            results[key]["same_tokens_as_none"] = same(key, "none")
        if key.endswith("-2pass") and key[: -len("-2pass")] in outputs:
            results[key]["same_tokens_as_one_pass"] = same(key, key[: -len("-2pass")])

    prompt_len = int(batches[0]["input_ids"].shape[1])
    threads = torch.get_num_threads()
    print(f"\nmodel={name} device={device} threads={threads} prompts={args.prompts} batch={args.batch_size} "
          f"new_tokens={args.max_new_tokens} prompt_len(batch 0)={prompt_len} preset={args.preset} "
          f"repeats={args.repeats} (median)")
    width = max(12, *(len(key) for key in results))
    print(f"{'method':<{width}} {'seconds':>8} {'tokens/s':>9} {'x greedy':>9} {'x floor':>8} {'peak MB':>8}  same tokens")
    for key, entry in results.items():
        check = entry.get("same_tokens_as_one_pass", entry.get("same_tokens_as_none", ""))
        print(f"{key:<{width}} {entry['seconds']:>8.3f} {entry['tokens_per_s']:>9.1f} {entry['x_greedy']:>9.3f} "
              f"{entry['x_floor']:>8.3f} {entry['peak_mem_mb']:>8.1f}  {check}")
    for key, entry in results.items():
        if "vs_beam5" in entry:
            print(f"{key} vs plain 5-beam generate: {entry['vs_beam5']:.3f}x the tokens/s")
    summary = {"model": name, "device": device, "torch_threads": threads, "versions": stack_versions(),
               "machine": platform.machine(), "prompts": args.prompts, "batch_size": args.batch_size,
               "max_new_tokens": args.max_new_tokens, "repeats": args.repeats, "preset": args.preset,
               "dtype": str(next(model.parameters()).dtype), "results": results}
    if device.startswith("cuda"):
        summary["gpu"] = torch.cuda.get_device_name()
    del model
    return summary


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", choices=sorted(MODEL_IMAGE_SIZES), default=None,
                        help="default: tiny small, plus llava-1.5-7b on CUDA")
    parser.add_argument("--model", dest="models", action="append", choices=sorted(MODEL_IMAGE_SIZES),
                        help="one model (repeatable; same as --models)")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per method (the median is reported)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    parser.add_argument("--methods", nargs="+", default=None,
                        help="subset of the methods to run (none and floor2B always run); a spec such as "
                             "opera:preset=official adds that variant")
    parser.add_argument("--json", default=None, help="also write the results here")
    parser.add_argument("--preset", default="medheval", help="the methods' preset (medheval, official, ...)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    models = args.models or (["tiny", "small"] + (["llava-1.5-7b"] if args.device.startswith("cuda") else []))
    stack = stack_versions()
    print("stack: " + ", ".join(f"{package} {version}" for package, version in stack.items()), flush=True)

    summaries = [summary for name in models if (summary := bench_model(name, args)) is not None]
    print(json.dumps(summaries, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summaries, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
