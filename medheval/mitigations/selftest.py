"""``medheval selftest``: the decoding invariants of every mitigation, on the installed stack, in under a minute.

The mitigations lean on transformers' generation internals (:mod:`medheval.decoding.internals`), which
move from release to release; a change there can alter mitigation outputs with no error at all. Before
a long run, this checks on tiny random-weight models of each family (built in-process, no download):

- ``neutral``: the method's neutral setting (α = 0, λ = 0, ...) gives plain greedy ``generate``'s
  tokens on a left-padded batch (OPERA with its penalty off: transformers' beam search);
- ``one=two pass``: every contrast stream in the clean stream's batch and cache gives the tokens of
  each stream in its own cache and forward (two-stream methods);
- ``batch=single``: a left-padded batch gives each prompt's tokens decoded alone (at a setting that
  moves the output);
- ``hooks gone``: no attention hook and no switched attention implementation is left on the model;
- ``compiled`` (``medheval selftest --compiled``; needs a C++ compiler on CPU): the decode steps on a static
  cache through ``torch.compile`` give the eager tokens and keep the checks above (compiling takes a few
  seconds per family and graph, so it is not part of the default run).

A family whose model classes the installed transformers lacks is reported as skipped. The checks are
the same as the test suite's (``tests/test_mitigations.py``, ``tests/test_decoding_one_pass.py``,
``tests/test_mitigations_families.py``), at fewer tokens.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable, Iterable, Sequence

import numpy as np
import torch

from medheval.decoding import internals
from medheval.decoding.hooks import hooks_installed
from medheval.decoding.loop import DecodingMethod
from medheval.mitigations.avisc import AvisC
from medheval.mitigations.damro import DAMRO
from medheval.mitigations.dola import DoLa
from medheval.mitigations.m3id import M3ID
from medheval.mitigations.opera import OPERA
from medheval.mitigations.pai import PAI
from medheval.mitigations.vcd import VCD

FAMILIES = ("llava", "llava_next", "qwen2_5_vl", "qwen3_vl", "gemma3")
PROMPTS = ("is there a pleural effusion ?", "lung", "what is the size of the heart in this chest image ?")
NEW_TOKENS = 10  # past the tiny Gemma 3's sliding window (8)
NEVER = 10**9  # an OPERA threshold no location count reaches: no rollback


@dataclasses.dataclass(frozen=True)
class MethodCase:
    """How to check one method: its neutral and moving settings, and where it runs."""

    neutral: Callable[[int], DecodingMethod]  # vocabulary size -> method
    moving: Callable[[], DecodingMethod]
    two_stream: bool = True
    families: tuple[str, ...] = FAMILIES
    beams: int = 1  # the plain generate its neutral setting equals (1: greedy)


# strong settings: the tiny models' 4-16 image tokens weigh little, so the defaults may keep greedy's tokens
METHODS: dict[str, MethodCase] = {
    "vcd": MethodCase(lambda vocab: VCD(alpha=0.0), lambda: VCD(alpha=3.0, beta=0.0)),
    "m3id": MethodCase(lambda vocab: M3ID(lam=0.0), lambda: M3ID(lam=1.0, beta=0.0)),
    "pai": MethodCase(lambda vocab: PAI(alpha=0.0, gamma=1.0), lambda: PAI(alpha=0.5, gamma=3.0)),
    "dola": MethodCase(lambda vocab: DoLa(relative_top=1.0), lambda: DoLa(), two_stream=False),
    "avisc": MethodCase(lambda vocab: AvisC(alpha=0.0), lambda: AvisC(alpha=3.0, beta=0.0, top_k=2)),
    # DAMRO needs a vision tower with a [CLS] token (CLIP): LLaVA-1.5 / LLaVA-NeXT
    "damro": MethodCase(lambda vocab: DAMRO(alpha=0.0), lambda: DAMRO(alpha=2.0, beta=0.0, top_k=2),
                        families=("llava", "llava_next")),
    "opera": MethodCase(
        lambda vocab: OPERA(num_beams=3, penalty_weights=0.0, threshold=NEVER, num_attn_candidates=vocab),
        lambda: OPERA(num_beams=3, scale_factor=25.0, threshold=0), two_stream=False, beams=3),
}
CHECKS = ("neutral", "one=two pass", "batch=single", "hooks gone")


@dataclasses.dataclass
class CheckResult:
    """One method on one family: each check's outcome (``True``/``False``; ``None``: not applicable)."""

    family: str
    method: str
    checks: dict[str, bool | None] = dataclasses.field(default_factory=dict)
    error: str | None = None  # an exception a check raised
    skipped: str | None = None  # why the family was not checked

    @property
    def ok(self) -> bool:
        return self.skipped is not None or (self.error is None and all(v is not False for v in self.checks.values()))

    def failures(self) -> list[str]:
        failed = [name for name, value in self.checks.items() if value is False]
        return failed + ([f"error: {self.error}"] if self.error else [])


def _inputs(processor, rows: Iterable[int]):
    from PIL import Image

    rows = list(rows)
    texts = [processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": PROMPTS[i]}]}],
        add_generation_prompt=True, tokenize=False) for i in rows]
    images = [[Image.fromarray(np.random.RandomState(i).randint(0, 255, (30, 30, 3), dtype=np.uint8))] for i in rows]
    return processor(text=texts, images=images, padding=True, return_tensors="pt")


def _new(model, inputs, **kwargs) -> torch.Tensor:
    out = model.generate(**inputs, max_new_tokens=NEW_TOKENS, do_sample=False, **kwargs)
    return out[:, inputs["input_ids"].shape[1]:]


def _clean(model, implementation: str | None) -> bool:
    return not hooks_installed(model) and internals.text_attention_implementation(model) == implementation


def check_method(model, processor, family: str, name: str) -> CheckResult:
    """Run every check of method ``name`` on one tiny model."""
    case = METHODS[name]
    result = CheckResult(family, name, {check: None for check in CHECKS})
    implementation = internals.text_attention_implementation(model)
    vocab = int(model.config.get_text_config().vocab_size)
    batch = _inputs(processor, range(len(PROMPTS)))
    clean = True
    try:
        plain = _new(model, batch, **({"num_beams": case.beams} if case.beams > 1 else {}))
        result.checks["neutral"] = torch.equal(_new(model, batch, custom_generate=case.neutral(vocab)), plain)
        clean &= _clean(model, implementation)
        moved = _new(model, batch, custom_generate=case.moving())
        clean &= _clean(model, implementation)
        if case.two_stream:
            reference = _new(model, batch, custom_generate=case.moving().two_pass())
            result.checks["one=two pass"] = torch.equal(moved, reference)
            clean &= _clean(model, implementation)
        singles = []
        for row in range(len(PROMPTS)):
            singles.append(torch.equal(_new(model, _inputs(processor, [row]), custom_generate=case.moving()),
                                       moved[row:row + 1]))
            clean &= _clean(model, implementation)
        result.checks["batch=single"] = all(singles)
    except Exception as error:  # a broken stack raises anywhere; name it and go on with the next method
        result.error = f"{type(error).__name__}: {error}"
        clean &= _clean(model, implementation)
    result.checks["hooks gone"] = clean
    return result


COMPILED = "compiled"  # the extra check of run_selftest(compiled=True)


def compiler_refusal() -> str | None:
    """Why this stack cannot check the compiled path (``None``: it can): CPU inductor needs a C++ compiler."""
    import shutil

    if shutil.which("g++") is None and shutil.which("c++") is None and not torch.cuda.is_available():
        return "no C++ compiler for torch's CPU inductor"
    return None


def check_compiled(model, processor, family: str, name: str) -> bool:
    """The compiled decode steps (static cache + ``torch.compile``) give the eager tokens, and every check of
    :func:`check_method` holds on them. Every call lands in one row bucket (16: OPERA's 3 beams x 3 prompts
    too), so one graph per graph kind serves a family."""
    from medheval.decoding import compiled

    case = METHODS[name]
    batch = _inputs(processor, range(len(PROMPTS)))
    before = compiled.MIN_ROWS
    compiled.MIN_ROWS = 16
    try:
        with compiled.compiled_decoding(False):
            eager = _new(model, batch, custom_generate=case.moving())
        with compiled.compiled_decoding(True):
            same = torch.equal(_new(model, batch, custom_generate=case.moving()), eager)
            return same and check_method(model, processor, family, name).ok
    finally:
        compiled.MIN_ROWS = before


def _build(family: str):
    from medheval.backends.tiny_families import build_tiny

    model, processor = build_tiny(family)
    processor.tokenizer.padding_side = "left"
    return model, processor


def run_selftest(families: Sequence[str] | None = None, methods: Sequence[str] | None = None,
                 progress: Callable[[CheckResult], None] | None = None, compiled: bool = False) -> list[CheckResult]:
    """Every check of ``methods`` (default: all) on ``families`` (default: all the installed transformers has);
    ``compiled``: also :func:`check_compiled` (not applicable to a method with ``compiles = False``).

    Raises:
        ValueError: an unknown family or method name.
    """
    families = list(families or FAMILIES)
    methods = list(methods or METHODS)
    unknown = sorted(set(families) - set(FAMILIES)) + sorted(set(methods) - set(METHODS))
    if unknown:
        raise ValueError(f"unknown family or method {unknown}; families: {list(FAMILIES)}, methods: {list(METHODS)}")
    results = []
    for family in families:
        todo = [m for m in methods if family in METHODS[m].families]
        if not todo:
            continue
        try:
            model, processor = _build(family)
        except (ImportError, AttributeError, ValueError, KeyError) as error:
            reason = f"the installed transformers cannot build it ({type(error).__name__}: {error})"
            results += [CheckResult(family, m, skipped=reason) for m in todo]
            continue
        torch.manual_seed(0)
        for name in todo:
            result = check_method(model, processor, family, name)
            if compiled and getattr(METHODS[name].moving(), "compiles", True):
                try:
                    result.checks[COMPILED] = check_compiled(model, processor, family, name)
                except Exception as error:  # a compiler that breaks on this stack: name it, go on
                    result.checks[COMPILED] = False
                    result.error = result.error or f"compiled: {type(error).__name__}: {error}"
            elif compiled:
                result.checks[COMPILED] = None
            results.append(result)
            if progress is not None:
                progress(result)
    return results


def format_results(results: Sequence[CheckResult]) -> str:
    """A table: one row per (family, method), one column per check (ok / FAIL / -)."""
    def cell(value: bool | None) -> str:
        return "-" if value is None else ("ok" if value else "FAIL")

    checks = list(CHECKS) + ([COMPILED] if any(COMPILED in r.checks for r in results) else [])
    header = ["family", "method", *checks]
    rows = []
    for r in results:
        if r.skipped:
            rows.append([r.family, r.method, f"skipped: {r.skipped}", *[""] * (len(checks) - 1)])
        else:
            rows.append([r.family, r.method, *(cell(r.checks.get(c)) for c in checks)])
            if r.error:
                rows[-1][-1] += f"  ({r.error})"
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header) - 1)]
    lines = ["  ".join(str(v).ljust(w) for v, w in zip(row[:-1], widths)) + "  " + str(row[-1])
             for row in [header, *rows]]
    return "\n".join(line.rstrip() for line in lines)


def verdict(results: Sequence[CheckResult], versions: dict[str, str | None], seconds: float) -> str:
    """One line: PASS or FAIL with the broken (method, family, check) triples and the stack."""
    stack = ", ".join(f"{k} {versions.get(k)}" for k in ("transformers", "torch") if versions.get(k))
    failed = [r for r in results if not r.ok]
    checked = sum(1 for r in results if not r.skipped)
    if not failed:
        return f"selftest PASS: {checked} method x family combinations on {stack} ({seconds:.0f} s)"
    broken = "; ".join(f"{r.method} on {r.family}: {', '.join(r.failures())}" for r in failed)
    return f"selftest FAIL on {stack}: {broken}"


def main(families: Sequence[str] | None = None, methods: Sequence[str] | None = None, quiet: bool = False,
         compiled: bool = False) -> int:
    """The ``medheval selftest`` command: prints a row per check as it finishes, the table and a verdict;
    returns 0 when every invariant holds, 1 otherwise."""
    from medheval.versions import stack_versions

    versions = stack_versions()
    print("stack: " + ", ".join(f"{k} {v}" for k, v in versions.items() if v), flush=True)
    start = time.perf_counter()

    def progress(result: CheckResult) -> None:
        if not quiet:
            status = "ok" if result.ok else "FAIL " + ", ".join(result.failures())
            print(f"  {result.family:<11} {result.method:<6} {status}", flush=True)

    if compiled and (reason := compiler_refusal()) is not None:
        print(f"compiled path not checked: {reason}", flush=True)
        compiled = False
    results = run_selftest(families, methods, progress=progress, compiled=compiled)
    print(format_results(results))
    line = verdict(results, versions, time.perf_counter() - start)
    print(line, flush=True)
    return 0 if all(r.ok for r in results) else 1


__all__ = ["CHECKS", "COMPILED", "check_compiled", "compiler_refusal", "FAMILIES", "METHODS", "CheckResult", "check_method", "format_results", "main",
           "run_selftest", "verdict"]
