"""Host time of one compiled decode step, per method and family: the work a GPU step has to hide.

With CUDA graphs the forward of a decode step is one graph replay. Everything else in the step is host work:
the step's inputs (``prepare_inputs_for_generation``: positions, the 4-D mask over the static cache), the
method's rule on the logits, the logits processors, the token choice, the stop flag, bucket padding. The loop
reads the stop flag one step late on CUDA, so the host prepares step n+1 while the GPU runs step n; a step then
costs about ``max(host time, GPU time)``, and a method whose host time is above the GPU's time per step is
bound by the host, however fast the graph is. At LLaVA-1.5-7B's shapes the GPU's floor is one read of the
weights: about 14 GB at the measured copy bandwidth (``bench_mitigations.py`` on CUDA prints it, ``x wfloor``).

This measures the host part on CPU: each tiny family on the static-cache path, with the compiled forward
replaced by a replay of outputs recorded once per input shape (no model time at all), so the time per step is
the decoding loop's own. On a GPU machine the same loop also pays the graph launch and the compiler's guards,
which this leaves out; the ops of the loop (arg-max, the methods' log-softmax) run synchronously here and are
queued there. Read the numbers as the host time a step needs at least, next to each other (``x plain``).

    PYTHONPATH=. python benchmarks/bench_host_step.py [--families llava gemma3] [--methods none vcd dola]
        [--tokens 64] [--repeats 9] [--batch 3] [--sample] [--json out.json]

ms per step = (time of ``tokens`` new tokens - time of 1 new token) / (tokens - 1), median of ``repeats`` pairs.
The replay also hands the attention hooks what they observed (OPERA's recorder of the last layer's attention).
OPERA runs its own beam search (5 beams per prompt) with every rollback declined: a replayed forward gives the same
attention at every step, which would trigger rollbacks, and a rollback's forward runs eagerly (model time). Its trigger
is still computed and read at every step past the threshold, as in a real run without rollbacks.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from medheval.decoding import compiled, hooks, internals  # noqa: E402
from medheval.decoding.loop import DecodingMethod  # noqa: E402
from medheval.decoding.visual_tokens import MissingInternalError  # noqa: E402
from medheval.mitigations import get_mitigation, opera, selftest  # noqa: E402

METHODS = ("none", "vcd", "m3id", "pai", "avisc", "damro", "dola", "opera")


def _shape_key(inputs: dict[str, Any]) -> tuple:
    """What distinguishes one recorded forward from another: each input's name and shape (or plain value)."""
    key = []
    for name, value in sorted(inputs.items()):
        if internals.is_cache_key(name):
            continue
        if torch.is_tensor(value):
            key.append((name, tuple(value.shape)))
        elif isinstance(value, dict):
            key.append((name, tuple(sorted((k, tuple(v.shape)) for k, v in value.items() if torch.is_tensor(v)))))
        elif value is None or isinstance(value, (bool, int, float, str)):
            key.append((name, value))
    return tuple(key)


def _attached_hooks(modules: list[torch.nn.Module]) -> dict[tuple[int, int], Any]:
    """(layer, position) -> the attention hook attached there now."""
    return {(i, j): hook for i, module in enumerate(modules) for j, hook in enumerate(hooks.attached_hooks(module))}


def replay_compiler(model, mode) -> Callable:
    """A stand-in for ``torch.compile`` whose forward costs nothing after its first call per input shape: the
    outputs recorded then are handed back (in a new output object, which the loop may cut), and the attention hooks
    attached at the same places are handed the weights observed then."""
    recorded: dict[tuple, tuple[Any, list]] = {}
    try:
        modules = hooks.attention_modules(model)
    except MissingInternalError:  # no decoder layers to hook (a stand-in model): nothing to hand over
        modules = []

    def forward(**inputs):
        key = _shape_key(inputs)
        attached = _attached_hooks(modules)
        if key not in recorded:
            seen: list[tuple[tuple[int, int], int, torch.Tensor]] = []
            for at, hook in attached.items():
                def observe(layer_idx, weights, at=at, real=hook.observe):
                    seen.append((at, layer_idx, weights))
                    real(layer_idx, weights)
                hook.observe = observe
            try:
                recorded[key] = (model(**inputs), seen)
            finally:
                for hook in attached.values():
                    del hook.observe
        else:
            for at, layer_idx, weights in recorded[key][1]:
                attached[at].observe(layer_idx, weights)
        outputs = recorded[key][0]
        return type(outputs)(**{k: v for k, v in outputs.items()})

    return forward


def _method(name: str) -> DecodingMethod:
    return DecodingMethod() if name == "none" else get_mitigation(name)


def host_ms_per_step(model, batch, method: DecodingMethod, *, tokens: int, repeats: int, sample: bool) -> float:
    """Median over ``repeats`` of (t(tokens) - t(1)) / (tokens - 1), in ms, with the forward replayed."""
    settings = dict(do_sample=True, temperature=0.7, top_p=0.9) if sample else dict(do_sample=False)

    def run(new_tokens: int) -> float:
        start = time.perf_counter()
        with compiled.compiled_decoding(True), torch.inference_mode():
            model.generate(**batch, max_new_tokens=new_tokens, min_new_tokens=new_tokens, custom_generate=method,
                           **settings)
        return time.perf_counter() - start

    before = compiled.STATS.steps
    run(tokens)  # records the forwards of every shape this call meets
    if compiled.STATS.steps - before < tokens - 1:
        raise RuntimeError(f"{method.name}: the decode steps did not run on the static path "
                           f"({compiled.STATS.steps - before} of {tokens - 1}); nothing to measure")
    steps = []
    for _ in range(repeats):
        one = run(1)
        steps.append((run(tokens) - one) / (tokens - 1) * 1e3)
    return statistics.median(steps)


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", nargs="+", default=list(selftest.FAMILIES), choices=selftest.FAMILIES)
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--batch", type=int, default=3, help="prompts per batch (3: padded to a bucket of 4)")
    parser.add_argument("--sample", action="store_true", help="sample with temperature 0.7 and top-p 0.9")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.tokens < 2:
        parser.error("--tokens must be at least 2")

    torch.set_num_threads(args.threads)
    opera.RollbackTracker.decide = lambda *args, **kwargs: None  # OPERA: every rollback declined (see above)
    internals.compiled_forward = replay_compiler  # the compiled forward of every static step: a replay
    compiled.MIN_ROWS = 1
    rows = []
    print(f"host ms per decode step (forward replayed), {args.tokens} tokens, batch {args.batch}, "
          f"{'sampling' if args.sample else 'greedy'}, threads {args.threads}, torch {torch.__version__}")
    print(f"{'family':12} {'method':8} {'ms/step':>8} {'x plain':>8}")
    for family in args.families:
        model, processor = selftest._build(family)
        batch = selftest._inputs(processor, [i % len(selftest.PROMPTS) for i in range(args.batch)])
        plain = None
        for name in args.methods:
            try:
                ms = host_ms_per_step(model, batch, _method(name), tokens=args.tokens, repeats=args.repeats,
                                      sample=args.sample)
            except MissingInternalError as error:  # e.g. DAMRO on a vision tower without [CLS]
                rows.append({"family": family, "method": name, "skipped": str(error).split(":")[0]})
                print(f"{family:12} {name:8} {'n/a':>8}  ({str(error).split(':')[0]})")
                continue
            plain = ms if name == "none" else plain
            ratio = ms / plain if plain else float("nan")
            rows.append({"family": family, "method": name, "host_ms_per_step": round(ms, 3),
                         "x_plain": round(ratio, 3) if plain else None})
            print(f"{family:12} {name:8} {ms:8.3f} {ratio:8.2f}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return rows


if __name__ == "__main__":
    main()
