"""Mitigation overhead: time of each method relative to plain greedy ``generate`` and to the 2B-row floor.

    PYTHONPATH=. python benchmarks/bench_mitigations.py [--models tiny small llava-1.5-7b]
        [--batch-size 4] [--prompts 8] [--max-new-tokens 32] [--repeats 5] [--device cpu|cuda]
        [--threads N] [--preset medheval|official|...] [--methods ...] [--json out.json]
        [--compile | --no-compile | --both] [--budget-s SECONDS]

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

Compiled decode steps (``--compile``, ``--no-compile``, ``--both``; default ``--both`` on CUDA and
``--no-compile`` elsewhere): every method also runs as ``<name>@compiled``, its decode steps on a static
cache through ``torch.compile`` (CUDA graphs on CUDA; :mod:`medheval.decoding.compiled`), in the same
process as the eager run; ``none@compiled`` is medheval's loop with no mitigation, compiled (transformers'
``generate`` itself stays eager). ``same_as_eager`` is the share of generated tokens equal to the eager
run's (bfloat16 on GPU may differ in rounding; float32 on CPU should give 1.0). A compiler error is printed
for its method and the run goes on (the method then decodes eagerly on the static cache). The compile time
(first run, untimed) is reported as ``compile_s``. ``--budget-s`` bounds the whole run: methods not started
when it is spent are listed as skipped, and repeats stop early (at least one timed run per method).

Per step: ``ms_per_step`` = (time of the run - time of the same run generating 1 token, i.e. the
prefill) / (batches x (new tokens - 1)). On CUDA the script also measures the achievable memory bandwidth
(a device-to-device copy of 1 GiB: 2 bytes moved per byte copied) and the **weight-read floor** of one
step, ``floor_ms`` = bytes of the language model's weights / bandwidth (a step reads every weight once);
``x_weight_floor`` = ``ms_per_step`` / ``floor_ms``.

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
from medheval.decoding import compiled as compiled_steps
from medheval.decoding.hooks import language_model
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


def run(model, batches, method, max_new_tokens: int, device: str, compile: bool = False):
    """Generate every batch with ``method``; ``compile``: its decode steps compiled (plain greedy and the
    2B-row floor then go through medheval's loop, which compiles, instead of ``generate``'s own)."""
    outputs = []
    for inputs in batches:
        inputs = inputs.to(device)
        kwargs = dict(max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens, do_sample=False)
        if isinstance(method, PlainBeams):
            kwargs.update(method.generate_kwargs)
        elif isinstance(method, Floor2B):
            inputs = doubled(inputs)
            if compile:
                kwargs["custom_generate"] = Loop()
        elif method is not None:
            kwargs["custom_generate"] = method
        elif compile:
            kwargs["custom_generate"] = Loop()
        with torch.inference_mode(), compiled_steps.compiled_decoding(compile):
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


def memory_bandwidth(device: str, gib: float = 1.0, repeats: int = 10) -> float:
    """Achievable device memory bandwidth in bytes/s: a device-to-device copy (reads and writes each byte)."""
    source = torch.empty(int(gib * 2**30), dtype=torch.uint8, device=device)
    target = torch.empty_like(source)
    target.copy_(source)
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        target.copy_(source)
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    del source, target
    return 2 * int(gib * 2**30) / best


def weight_bytes(model) -> int:
    """Bytes of the weights one decode step reads: the language model and its output head."""
    seen, total = set(), 0
    modules = [language_model(model)]
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None:
        modules.append(head)
    for module in modules:
        for parameter in module.parameters():
            if id(parameter) not in seen:
                seen.add(id(parameter))
                total += parameter.numel() * parameter.element_size()
    return total


def compile_modes(args) -> list[bool]:
    if args.compile_mode == "both":
        return [False, True]
    if args.compile_mode == "compile":
        return [True]
    if args.compile_mode == "eager":
        return [False]
    return [False, True] if args.device.startswith("cuda") else [False]


def bench_model(name: str, args, clock_start: float) -> dict | None:
    device = args.device
    if name == "llava-1.5-7b" and not (device.startswith("cuda") and torch.cuda.is_available()):
        print(f"model={name}: skipped (needs a CUDA device; this run has device={device})")
        return None
    model, processor = load_model(name, device)
    batches = make_batches(processor, args.prompts, args.batch_size, MODEL_IMAGE_SIZES[name])
    methods = build_methods(args.methods, args.preset)
    cuda = device.startswith("cuda")

    def over_budget() -> bool:
        return args.budget_s is not None and time.perf_counter() - clock_start > args.budget_s

    # variants: (key, method, compiled?)
    variants = []
    for compile in compile_modes(args):
        for key, method in methods.items():
            if compile and isinstance(method, PlainBeams):
                continue  # transformers' beam search: never compiled by medheval
            if compile and not getattr(method, "compiles", True):
                print(f"{key}@compiled: skipped ({type(method).__name__} runs its own loop, which stays eager)")
                continue
            variants.append((f"{key}@compiled" if compile else key, method, compile))

    tokens = args.prompts * args.max_new_tokens
    runnable, skipped, errors, compile_seconds = [], [], {}, {}
    for key, method, compile in variants:  # warm-up (compiled: the full length, so the buckets are the timed ones)
        if over_budget():
            skipped.append(key)
            continue
        failures = len(compiled_steps.STATS.failures)
        start = time.perf_counter()
        try:
            run(model, batches if compile else batches[:1], method, args.max_new_tokens if compile else 2, device,
                compile)
        except Exception as error:  # noqa: BLE001 - report the method's error and go on with the others
            errors[key] = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
            print(f"{key}: ERROR {errors[key]}", flush=True)
            continue
        print(f"{key}: warm-up {time.perf_counter() - start:.1f} s", flush=True)  # progress (compiling: minutes)
        if compile:
            compile_seconds[key] = round(time.perf_counter() - start, 2)
            if len(compiled_steps.STATS.failures) > failures:
                errors[key] = "compile failed, ran eagerly: " + compiled_steps.STATS.failures[-1]
                print(f"{key}: {errors[key]}", flush=True)
        runnable.append((key, method, compile))
    if skipped:
        print(f"budget of {args.budget_s} s spent: skipped {skipped}", flush=True)

    times: dict[str, list[float]] = {key: [] for key, _, _ in runnable}
    outputs = {}
    for repeat in range(args.repeats):
        if repeat > 0 and over_budget():
            print(f"budget of {args.budget_s} s spent: {repeat} timed repeat(s)", flush=True)
            break
        for key, method, compile in runnable:
            start = time.perf_counter()
            outputs[key] = run(model, batches, method, args.max_new_tokens, device, compile)
            times[key].append(time.perf_counter() - start)
    results: dict[str, dict] = {}
    steps = len(batches) * max(args.max_new_tokens - 1, 1)
    for key, method, compile in runnable:
        start = time.perf_counter()
        run(model, batches, method, 1, device, compile)  # the prefill alone (1 new token)
        prefill = time.perf_counter() - start
        with PeakMemory(device) as memory:
            run(model, batches, method, args.max_new_tokens, device, compile)
        median = float(np.median(times[key]))
        results[key] = {"seconds": round(median, 4), "min_seconds": round(min(times[key]), 4),
                        "tokens_per_s": round(tokens / median, 1), "peak_mem_mb": round(memory.peak_bytes / 2**20, 1),
                        "prefill_seconds": round(prefill, 4),
                        "ms_per_step": round(1000 * max(median - prefill, 0.0) / steps, 3), "compiled": compile}
        if key in compile_seconds:
            results[key]["compile_s"] = compile_seconds[key]
        if key in errors:
            results[key]["error"] = errors[key]
        if hasattr(method, "PRESETS"):
            results[key]["settings"] = method.spec()
    for key, entry in results.items():
        suffix = "@compiled" if entry["compiled"] else ""
        for base, field in (("none", "x_greedy"), ("floor2B", "x_floor")):
            reference = results.get(base + suffix) or results.get(base)
            if reference:
                entry[field] = round(entry["seconds"] / reference["seconds"], 3)
    if "beam5" in results:
        for key, method, _ in runnable:
            if isinstance(method, OPERA):
                results[key]["vs_beam5"] = round(results[key]["tokens_per_s"] / results["beam5"]["tokens_per_s"], 3)

    def same(a: str, b: str) -> bool:
        return all(torch.equal(x, y) for x, y in zip(outputs[a], outputs[b]))

    def share(a: str, b: str) -> float:
        equal = sum(int((x == y).sum()) for x, y in zip(outputs[a], outputs[b]))
        return round(equal / max(sum(x.numel() for x in outputs[a]), 1), 4)

    for key in results:
        base = key.split("@")[0]
        if base in ("loop", "floor2B"):
            results[key]["same_tokens_as_none"] = same(key, "none" + key[len(base):] if "@" in key else "none")
        if base.endswith("-2pass") and base[: -len("-2pass")] + key[len(base):] in outputs:
            results[key]["same_tokens_as_one_pass"] = same(key, base[: -len("-2pass")] + key[len(base):])
        if key.endswith("@compiled") and base in outputs:
            results[key]["same_as_eager"] = share(key, base)

    floor_ms = bandwidth = None
    weights = weight_bytes(model)
    if cuda:
        bandwidth = memory_bandwidth(device)
        floor_ms = 1000 * weights / bandwidth
        for entry in results.values():
            entry["x_weight_floor"] = round(entry["ms_per_step"] / floor_ms, 3)

    prompt_len = int(batches[0]["input_ids"].shape[1])
    threads = torch.get_num_threads()
    print(f"\nmodel={name} device={device} threads={threads} prompts={args.prompts} batch={args.batch_size} "
          f"new_tokens={args.max_new_tokens} prompt_len(batch 0)={prompt_len} preset={args.preset} "
          f"repeats={args.repeats} (median)")
    if cuda:
        print(f"memory bandwidth (device copy): {bandwidth / 1e12:.2f} TB/s; language-model weights "
              f"{weights / 1e9:.2f} GB; weight-read floor {floor_ms:.2f} ms/step")
    width = max(12, *(len(key) for key in results)) if results else 12
    print(f"{'method':<{width}} {'seconds':>8} {'ms/step':>8} {'tokens/s':>9} {'x greedy':>9} {'x floor':>8} "
          f"{'x wfloor':>8} {'peak MB':>8} {'compile s':>9}  same tokens")
    for key, entry in results.items():
        check = entry.get("same_tokens_as_one_pass", entry.get("same_tokens_as_none", ""))
        if "same_as_eager" in entry:
            check = f"{check} eager-share={entry['same_as_eager']:.3f}".strip()
        wfloor = f"{entry['x_weight_floor']:>8.2f}" if "x_weight_floor" in entry else f"{'-':>8}"
        print(f"{key:<{width}} {entry['seconds']:>8.3f} {entry['ms_per_step']:>8.2f} {entry['tokens_per_s']:>9.1f} "
              f"{entry.get('x_greedy', float('nan')):>9.3f} {entry.get('x_floor', float('nan')):>8.3f} {wfloor} "
              f"{entry['peak_mem_mb']:>8.1f} {entry.get('compile_s', float('nan')):>9.1f}  {check}")
    for key, entry in results.items():
        if "vs_beam5" in entry:
            print(f"{key} vs plain 5-beam generate: {entry['vs_beam5']:.3f}x the tokens/s")
    for key, error in errors.items():
        print(f"{key}: {error}")
    summary = {"model": name, "device": device, "torch_threads": threads, "versions": stack_versions(),
               "machine": platform.machine(), "prompts": args.prompts, "batch_size": args.batch_size,
               "max_new_tokens": args.max_new_tokens, "repeats": args.repeats, "preset": args.preset,
               "dtype": str(next(model.parameters()).dtype), "weight_bytes": weights, "results": results,
               "errors": errors, "skipped": skipped}
    if cuda:
        summary["gpu"] = torch.cuda.get_device_name()
        summary["bandwidth_bytes_per_s"] = bandwidth
        summary["weight_floor_ms"] = round(floor_ms, 4)
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
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--compile", dest="compile_mode", action="store_const", const="compile",
                      help="only the compiled decode steps")
    mode.add_argument("--no-compile", dest="compile_mode", action="store_const", const="eager",
                      help="only eager (the default off CUDA)")
    mode.add_argument("--both", dest="compile_mode", action="store_const", const="both",
                      help="eager and compiled, in this process (the default on CUDA)")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="stop starting methods (and repeats) after this many seconds in all (compiling counts)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    models = args.models or (["tiny", "small"] + (["llava-1.5-7b"] if args.device.startswith("cuda") else []))
    stack = stack_versions()
    print("stack: " + ", ".join(f"{package} {version}" for package, version in stack.items()), flush=True)

    clock_start = time.perf_counter()
    summaries = [summary for name in models if (summary := bench_model(name, args, clock_start)) is not None]
    print(json.dumps(summaries, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summaries, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
