"""The compiled decode steps (static cache + torch.compile) give the eager tokens, float32 on CPU.

Compiling costs tens of seconds per graph on CPU, so each tiny family is built and compiled once per test
process and shared by its method checks (:func:`tiny`), and every call lands in one row bucket
(``MIN_ROWS = 8``) and one capacity bucket (128): per family one graph serves plain decoding and every
two-stream method (VCD, M3ID, DAMRO); DoLa (hidden states out) and the hooked methods (PAI, AvisC: medheval's
eager attention, α a tensor input) add one graph each. ``test_graphs_per_family`` counts them. ``make
test`` runs LLaVA's plain, VCD and DoLa cases; ``make test-compiled`` (``MEDHEVAL_COMPILE_MATRIX=1``) all. Under
pytest-xdist a family's checks share an ``xdist_group`` (``--dist loadgroup`` keeps them on one worker; other
modes compile a family once per worker that runs it).
"""

from __future__ import annotations

import os
import shutil
import warnings

import pytest
import torch

from medheval.decoding import compiled, internals
from medheval.decoding.loop import DecodingMethod
from medheval.mitigations import selftest
from medheval.mitigations.opera import OPERA
from medheval.mitigations.vcd import VCD

needs_compiler = pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                                    reason="torch's CPU inductor needs a C++ compiler")

# the graph each method runs its decode steps through (methods of one kind share a family's graph)
GRAPH_KIND = {"plain": "plain", "vcd": "plain", "m3id": "plain", "damro": "plain", "dola": "hidden states",
              "pai": "hooked", "avisc": "hooked"}
# every method of the shared decoding loop on every tiny family the eager self-test runs it on (DAMRO: the
# CLIP families); per family one graph per graph kind
MATRIX = {family: tuple(["plain", *(name for name, case in selftest.METHODS.items()
                                    if name != "opera" and family in case.families)])
          for family in selftest.FAMILIES}
# `make test` runs LLaVA's plain, VCD and DoLa checks (two graphs); `make test-compiled`
# (MEDHEVAL_COMPILE_MATRIX=1) the whole matrix (15 graphs; CI runs it): about 20 s of compiling per graph on a
# quiet 2-core machine, a minute on a busy one
DEFAULT = {"llava": ("plain", "vcd", "dola")}
RUN = MATRIX if os.environ.get("MEDHEVAL_COMPILE_MATRIX") == "1" else DEFAULT
CASES = [pytest.param(family, name, marks=pytest.mark.xdist_group(f"compiled-{family}"), id=f"{family}-{name}")
         for family, names in RUN.items() for name in names]


@pytest.fixture(scope="module")
def one_row_bucket():
    before = compiled.MIN_ROWS
    compiled.MIN_ROWS = 8
    yield
    compiled.MIN_ROWS = before


_MODELS: dict = {}
_GRAPHS: dict = {}  # family -> (graph kinds run, graphs compiled) in this process


def tiny(family: str):
    """The tiny ``family`` model and processor, built once per test process (its compiled graphs with it)."""
    if family not in _MODELS:
        _MODELS[family] = selftest._build(family)
    return _MODELS[family]


def graphs() -> int:
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def new_tokens(model, inputs, method, *, compile: bool, max_new_tokens: int = selftest.NEW_TOKENS) -> torch.Tensor:
    with compiled.compiled_decoding(compile):
        out = model.generate(**inputs, max_new_tokens=max_new_tokens, do_sample=False, custom_generate=method)
    return out[:, inputs["input_ids"].shape[1]:]


# -- buckets (no compiling) ----------------------------------------------------------------------
def test_buckets_round_up():
    assert [compiled.row_bucket(n) for n in (1, 2, 3, 5, 8, 9, 16, 17, 33)] == [1, 2, 4, 8, 8, 16, 16, 32, 48]
    assert [compiled.capacity_bucket(n) for n in (1, 128, 129, 633)] == [128, 128, 256, 640]


def test_static_cache_fill_places_sliding_keys_at_their_columns():
    """A sliding layer's last n keys land at columns [length - n, length); padding rows copy row 0."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

    dynamic = DynamicCache()
    dynamic.layers = [DynamicLayer(), DynamicSlidingWindowLayer(sliding_window=3)]
    keys = torch.arange(2 * 1 * 5 * 2, dtype=torch.float32).view(2, 1, 5, 2)
    for index, layer in enumerate(dynamic.layers):
        layer.update(keys, -keys)
    assert dynamic.layers[1].keys.shape[-2] == 2  # a window of 3 keeps the last 2 keys
    static = internals.new_static_cache(tiny("llava")[0], 8)
    static.layers = static.layers[:2]
    internals.fill_static_cache(static, dynamic, length=5, rows=4)
    full, sliding = static.layers
    assert full.keys.shape == (4, 1, 8, 2) and torch.equal(full.keys[:2, :, :5], keys)
    assert torch.equal(sliding.keys[:2, :, 3:5], keys[:, :, 3:]) and not sliding.keys[:, :, :3].any()
    assert torch.equal(full.keys[2], full.keys[0]) and torch.equal(full.values[3, :, :5], -keys[0])
    assert int(full.cumulative_length) == 5
    back = internals.dynamic_from_static(static, rows=2, length=5)
    assert torch.equal(back.layers[0].keys, keys)


def test_compiler_failure_falls_back_to_eager_on_the_static_cache(monkeypatch):
    """A compiler error is warned about once and kept in STATS; decoding goes on (eagerly, on the static cache)
    and gives the eager tokens."""
    model, processor = selftest._build("llava")  # its own model: the failure is remembered per model

    def broken(model, mode):
        def forward(**kwargs):
            raise torch._dynamo.exc.TorchDynamoException("no C++ compiler here")
        return forward

    monkeypatch.setattr(internals, "compiled_forward", broken)
    batch = selftest._inputs(processor, range(3))
    failures = len(compiled.STATS.failures)
    with pytest.warns(RuntimeWarning, match="torch.compile failed"):
        static = new_tokens(model, batch, VCD(alpha=3.0, beta=0.0), compile=True)
    assert len(compiled.STATS.failures) == failures + 1
    assert torch.equal(static, new_tokens(model, batch, VCD(alpha=3.0, beta=0.0), compile=False))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # warned once per model
        new_tokens(model, batch, DecodingMethod(), compile=True)


def test_opera_stays_eager():
    assert OPERA.compiles is False and compiled.refusal(OPERA(), None, 10) == "opera runs its own decoding loop"


# -- compiled == eager ---------------------------------------------------------------------------
@needs_compiler
@pytest.mark.slow
@pytest.mark.parametrize("family,name", CASES)
def test_compiled_gives_eager_tokens_and_keeps_the_invariants(family, name, one_row_bucket):
    """Token for token the eager path's, and every self-test invariant on the compiled path: neutral = plain
    greedy, one = two pass, batch = single, hooks gone."""
    model, processor = tiny(family)
    batch = selftest._inputs(processor, range(len(selftest.PROMPTS)))
    steps, before = compiled.STATS.steps, graphs()
    method = DecodingMethod if name == "plain" else selftest.METHODS[name].moving
    eager = new_tokens(model, batch, method(), compile=False)
    assert torch.equal(new_tokens(model, batch, method(), compile=True), eager), f"{name} on {family}"
    assert compiled.STATS.steps > steps, "the compiled path did not run"
    if name != "plain":
        with compiled.compiled_decoding(True):
            result = selftest.check_method(model, processor, family, name)
        assert result.ok, f"{name} on {family}: {result.failures()}"
    kinds, count = _GRAPHS.get(family, (set(), 0))
    _GRAPHS[family] = (kinds | {GRAPH_KIND[name]}, count + graphs() - before)


@needs_compiler
@pytest.mark.slow
@pytest.mark.parametrize("family", [pytest.param(family, marks=pytest.mark.xdist_group(f"compiled-{family}"))
                                    for family in RUN])
def test_graphs_per_family(family):
    """After a family's checks in this process: one graph per graph kind its methods ran, whatever the
    method's settings (α), rows (1-6), prompt lengths and stream layout (one or two passes)."""
    if family not in _GRAPHS:
        pytest.skip(f"no compiled check of {family} ran in this process")
    kinds, count = _GRAPHS[family]
    assert count <= len(kinds), f"{family}: {count} graphs for the graph kinds {sorted(kinds)}"


@needs_compiler
@pytest.mark.slow
@pytest.mark.xdist_group("compiled-llava")
def test_one_compilation_per_bucket(one_row_bucket):
    """Other batch sizes and prompt lengths inside a bucket reuse its graph; a new capacity bucket compiles once
    (dynamo's graph counter, and the buckets the static step saw)."""
    model, processor = tiny("llava")
    method = DecodingMethod()
    new_tokens(model, selftest._inputs(processor, range(3)), method, compile=True)  # the (8 rows, 128) bucket
    before, buckets = graphs(), set(compiled.STATS.buckets)
    for rows in ([0], [1, 2], [2, 0, 1], [2]):  # 1-3 rows, prompts of other lengths
        new_tokens(model, selftest._inputs(processor, rows), method, compile=True)
    assert graphs() == before and compiled.STATS.buckets == buckets
    long = 150  # prompt + 150 tokens > 128 columns: the 256 bucket
    new_tokens(model, selftest._inputs(processor, [1]), method, compile=True, max_new_tokens=long)
    added = graphs() - before
    assert added >= 1 and len(compiled.STATS.buckets - buckets) == 1
    assert {bucket[3] for bucket in compiled.STATS.buckets - buckets} == {256}
    new_tokens(model, selftest._inputs(processor, [0, 2]), method, compile=True, max_new_tokens=long - 20)
    assert graphs() == before + added and len(compiled.STATS.buckets - buckets) == 1


@needs_compiler
@pytest.mark.slow
@pytest.mark.xdist_group("compiled-llava")
def test_backend_compile_setting(one_row_bucket):
    """HFBackend(compile=True) routes plain greedy through the compiled loop: the eager predictions, recorded."""
    from medheval.backends.hf import HFBackend

    model, processor = tiny("llava")
    records = [{"id": str(i), "question": selftest.PROMPTS[i], "answer": "", "answer_type": "open", "choices": []}
               for i in range(3)]
    images = [[] for _ in records]  # text-only prompts
    eager = HFBackend(model, processor, max_new_tokens=6, compile=False, batch_size=2)
    fast = HFBackend(model, processor, max_new_tokens=6, compile=True, batch_size=2)
    steps = compiled.STATS.steps
    assert fast.generate(records, images) == eager.generate(records, images)
    assert compiled.STATS.steps > steps
    assert fast.settings()["compile"] is True and "compile" not in eager.settings()


def test_selftest_compiled_column(monkeypatch, capsys):
    """``medheval selftest --compiled`` adds a ``compiled`` column (here the static-cache path with an eager
    "compiler", so the test compiles nothing); OPERA's own loop is not applicable."""
    monkeypatch.setattr(internals, "compiled_forward", lambda model, mode: model)
    steps = compiled.STATS.steps
    assert selftest.main(["llava"], ["vcd", "opera"], quiet=True, compiled=True) == 0
    assert compiled.STATS.steps > steps
    lines = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert ["family", "method", *selftest.CHECKS[:1]] == lines[1][:3] and lines[1][-1] == "compiled"
    assert ["llava", "vcd", "ok", "ok", "ok", "ok", "ok"] in lines
    assert ["llava", "opera", "ok", "-", "ok", "ok", "-"] in lines
