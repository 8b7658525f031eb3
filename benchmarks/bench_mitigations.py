"""Mitigation overhead: tokens/s of each method relative to plain greedy ``generate``, and peak memory.

    PYTHONPATH=. python benchmarks/bench_mitigations.py [--model tiny|small] [--batch-size 4]
        [--prompts 8] [--max-new-tokens 32] [--repeats 3] [--device cpu|cuda] [--threads N]
        [--preset medheval|official|...]

One process, the same random-weight LLaVA, the same prompts and images for every row:

- ``none``       plain greedy ``model.generate`` (the baseline, 1.00x);
- ``loop``       medheval's decoding loop with no mitigation (the loop's own overhead);
- ``vcd``        VCD, noised stream sharing the clean batch and cache (2B rows per forward);
- ``vcd-2pass``  VCD with the noised stream in its own cache (two forwards per step), to show
                 what batching the equal-length stream buys;
- ``m3id``, ``pai``, ``dola``, ``avisc``, ``damro``  the other methods at their ``--preset``
                 (default ``medheval``; a preset a method lacks falls back to ``medheval``).
- ``beam5``      plain 5-beam ``model.generate(num_beams=5)``, the baseline of OPERA's row;
- ``opera``      OPERA at its preset (5 beams, 5 candidates); ``vs_beam5`` is its speed
                 relative to ``beam5`` on the same prompts.

``--model tiny`` is the test model (a few ms per step: Python overhead dominates);
``--model small`` is a larger random LLaVA (8 x 512 text layers, 224 px CLIP, 256 image
tokens) where the forward work dominates, closer to what the ratios mean on a real model.
Every row generates exactly ``--max-new-tokens`` tokens (special tokens can never win), so
tokens/s are comparable. Peak memory: CUDA's ``max_memory_allocated`` on GPU; on CPU the
peak resident set size above the pre-run level, sampled every millisecond (after returning
freed heap to the OS with ``malloc_trim``), so it is an estimate good to about 1 MB.
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

from medheval.backends.tiny import SPECIAL_TOKENS, build_tiny_llava, build_tiny_tokenizer, CHAT_TEMPLATE
from medheval.decoding import DecodingMethod
from medheval.mitigations import DAMRO, AvisC, DoLa, M3ID, OPERA, PAI, VCD, get_mitigation

WORDS = (
    "is there a pleural effusion in the left lower lobe of this chest x ray with cardiomegaly "
    "and pulmonary edema or a fracture of the rib near the right hilum"
).split()


class Loop(DecodingMethod):
    """The shared loop without a mitigation."""

    name = "loop"


class VCDTwoPass(VCD):
    """VCD with the noised stream in its own cache: two forwards per step instead of one 2B batch."""

    def contrast_streams(self, ctx):
        streams = super().contrast_streams(ctx)
        for stream in streams:
            stream.share_batch = False
        return streams


class PlainBeams:
    """Plain ``generate(num_beams=5)``: the baseline of OPERA's row (not a custom_generate method)."""

    generate_kwargs = {"num_beams": 5}


def build_small_llava(seed: int = 0):
    """A larger random LLaVA: 8 text layers x 512, CLIP 224 px / 14 px patches (256 image tokens)."""
    from transformers import LlavaConfig, LlavaForConditionalGeneration, LlavaProcessor

    try:
        from transformers import CLIPImageProcessorPil as ImageProcessor
    except ImportError:  # pragma: no cover
        from transformers import CLIPImageProcessor as ImageProcessor

    tokenizer = build_tiny_tokenizer()
    image_size, patch = 224, 14
    processor = LlavaProcessor(
        image_processor=ImageProcessor(size={"shortest_edge": image_size},
                                       crop_size={"height": image_size, "width": image_size}),
        tokenizer=tokenizer, patch_size=patch, vision_feature_select_strategy="default",
        num_additional_image_tokens=1, chat_template=CHAT_TEMPLATE,
    )
    config = LlavaConfig(
        text_config={"model_type": "llama", "vocab_size": len(tokenizer), "hidden_size": 512,
                     "intermediate_size": 1376, "num_hidden_layers": 8, "num_attention_heads": 8,
                     "num_key_value_heads": 8, "max_position_embeddings": 2048, "initializer_range": 0.05,
                     "pad_token_id": tokenizer.pad_token_id, "bos_token_id": tokenizer.bos_token_id,
                     "eos_token_id": tokenizer.eos_token_id, "tie_word_embeddings": False},
        vision_config={"model_type": "clip_vision_model", "image_size": image_size, "patch_size": patch,
                       "hidden_size": 256, "intermediate_size": 1024, "projection_dim": 256,
                       "num_hidden_layers": 4, "num_attention_heads": 4},
        image_token_index=tokenizer.convert_tokens_to_ids("<image>"), image_seq_length=(image_size // patch) ** 2,
        projector_hidden_act="gelu", vision_feature_select_strategy="default", vision_feature_layer=-2,
    )
    torch.manual_seed(seed)
    model = LlavaForConditionalGeneration(config).eval()
    with torch.no_grad():
        head = model.get_output_embeddings().weight
        for token in SPECIAL_TOKENS:
            head[tokenizer.convert_tokens_to_ids(token)].zero_()
    gen = model.generation_config
    gen.bos_token_id, gen.eos_token_id, gen.pad_token_id = (
        tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id)
    gen.do_sample = False
    return model, processor


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
        elif method is not None:
            kwargs["custom_generate"] = method
        with torch.inference_mode():
            out = model.generate(**inputs, **kwargs)
        outputs.append(out[:, inputs["input_ids"].shape[1]:].cpu())
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return outputs


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=["tiny", "small"], default="tiny")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per method (best is reported)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    parser.add_argument("--methods", nargs="+", default=None,
                        help="subset of the methods to run; a spec such as opera:preset=official adds that variant")
    parser.add_argument("--json", default=None, help="also write the results here")
    parser.add_argument("--preset", default="medheval", help="the methods' preset (medheval, official, ...)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    if args.model == "tiny":
        model, processor = build_tiny_llava(seed=0)
        image_size = 30
    else:
        model, processor = build_small_llava(seed=0)
        image_size = 224
    model.to(args.device)
    batches = make_batches(processor, args.prompts, args.batch_size, image_size)
    def preset(cls):
        return cls(preset=args.preset if args.preset in cls.PRESETS else "medheval")

    methods = {
        "none": None, "loop": Loop(), "vcd": preset(VCD), "vcd-2pass": preset(VCDTwoPass), "m3id": preset(M3ID),
        "pai": preset(PAI), "dola": preset(DoLa), "avisc": preset(AvisC), "damro": preset(DAMRO),
        "beam5": PlainBeams(), "opera": preset(OPERA),
    }
    if args.methods:
        extra = {spec: get_mitigation(spec) for spec in args.methods if ":" in spec}
        methods = {k: v for k, v in methods.items() if k in args.methods or k == "none"} | extra

    tokens = args.prompts * args.max_new_tokens
    for method in methods.values():  # warm-up
        run(model, batches[:1], method, 2, args.device)
    # Round-robin over the methods in every repeat, best time per method: load from other
    # processes then hits every method alike instead of whichever ran during a busy spell.
    times: dict[str, list[float]] = {name: [] for name in methods}
    reference_outputs = {}
    for _ in range(args.repeats):
        for name, method in methods.items():
            start = time.perf_counter()
            reference_outputs[name] = run(model, batches, method, args.max_new_tokens, args.device)
            times[name].append(time.perf_counter() - start)
    results: dict[str, dict] = {}
    for name, method in methods.items():
        with PeakMemory(args.device) as memory:
            run(model, batches, method, args.max_new_tokens, args.device)
        best = min(times[name])
        results[name] = {"seconds": round(best, 4), "tokens_per_s": round(tokens / best, 1),
                         "peak_mem_mb": round(memory.peak_bytes / 2**20, 1)}
        if hasattr(method, "PRESETS"):
            results[name]["settings"] = method.spec()
    base = results["none"]["tokens_per_s"]
    for entry in results.values():
        entry["relative_speed"] = round(entry["tokens_per_s"] / base, 3)
        entry["slowdown"] = round(base / entry["tokens_per_s"], 2)
    if "beam5" in results:
        for name, method in methods.items():
            if isinstance(method, OPERA):
                results[name]["vs_beam5"] = round(results[name]["tokens_per_s"] / results["beam5"]["tokens_per_s"], 3)
    if "loop" in reference_outputs:
        same = all(torch.equal(a, b) for a, b in zip(reference_outputs["loop"], reference_outputs["none"]))
        results["loop"]["same_tokens_as_none"] = same
    if "vcd-2pass" in reference_outputs and "vcd" in reference_outputs:
        same = all(torch.equal(a, b) for a, b in zip(reference_outputs["vcd"], reference_outputs["vcd-2pass"]))
        results["vcd-2pass"]["same_tokens_as_vcd"] = same

    prompt_len = int(batches[0]["input_ids"].shape[1])
    print(f"model={args.model} device={args.device} threads={torch.get_num_threads()} prompts={args.prompts} "
          f"batch={args.batch_size} new_tokens={args.max_new_tokens} prompt_len(batch 0)={prompt_len} "
          f"preset={args.preset}")
    width = max(10, *(len(name) for name in results))
    print(f"{'method':<{width}} {'tokens/s':>10} {'x plain':>8} {'slowdown':>9} {'peak MB':>8}")
    for name, entry in results.items():
        print(f"{name:<{width}} {entry['tokens_per_s']:>10.1f} {entry['relative_speed']:>8.3f} "
              f"{entry['slowdown']:>8.2f}x {entry['peak_mem_mb']:>8.1f}")
    for name, entry in results.items():
        if "vs_beam5" in entry:
            print(f"{name} vs plain 5-beam generate: {entry['vs_beam5']:.3f}x the tokens/s")
    summary = {
        "model": args.model, "device": args.device, "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__, "machine": platform.machine(), "prompts": args.prompts,
        "batch_size": args.batch_size, "max_new_tokens": args.max_new_tokens, "preset": args.preset,
        "results": results,
    }
    if args.device.startswith("cuda"):
        summary["gpu"] = torch.cuda.get_device_name()
    print(json.dumps(summary, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
