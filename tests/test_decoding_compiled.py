"""The compiled decode steps (static cache + torch.compile) give the eager tokens, float32 on CPU.

Compiling costs tens of seconds per graph on CPU, so each tiny family is built and compiled once per test
process and shared by its method checks (:func:`tiny`), and every call lands in one row bucket
(``MIN_ROWS = 16``) and one capacity bucket (128): per family one graph serves plain decoding and every
two-stream method (VCD, M3ID, DAMRO); DoLa (hidden states out) and the hooked methods (PAI, AvisC: medheval's
eager attention, α a tensor input) add one graph each; OPERA's look-ahead forward adds one per candidate count
(5, and the whole vocabulary in its neutral check). ``test_graphs_per_family`` counts them. ``make test`` runs
LLaVA's plain, VCD and DoLa cases and OPERA with rollbacks; ``make test-compiled`` (``MEDHEVAL_COMPILE_MATRIX=1``)
all. Under
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

# the graphs each method runs its decode steps through (methods of one kind share a family's graph)
GRAPH_KINDS = {"plain": ("plain",), "vcd": ("plain",), "m3id": ("plain",), "damro": ("plain",),
               "dola": ("hidden states",), "pai": ("hooked",), "avisc": ("hooked",),
               "opera": ("look-ahead of 5", "look-ahead of the vocabulary")}
# every method on every tiny family the eager self-test runs it on (DAMRO: the CLIP families); per family one
# graph per graph kind
MATRIX = {family: tuple(["plain", *(name for name, case in selftest.METHODS.items() if family in case.families)])
          for family in selftest.FAMILIES}
# `make test` runs LLaVA's plain, VCD and DoLa checks (two graphs) and test_opera_rollbacks_compiled (two);
# `make test-compiled` (MEDHEVAL_COMPILE_MATRIX=1) the whole matrix (25 graphs; CI runs it): about 20 s of
# compiling per graph on a quiet 2-core machine, a minute on a busy one
DEFAULT = {"llava": ("plain", "vcd", "dola")}
RUN = MATRIX if os.environ.get("MEDHEVAL_COMPILE_MATRIX") == "1" else DEFAULT
CASES = [pytest.param(family, name, marks=pytest.mark.xdist_group(f"compiled-{family}"), id=f"{family}-{name}")
         for family, names in RUN.items() for name in names]


@pytest.fixture(scope="module")
def one_row_bucket():
    before = compiled.MIN_ROWS
    compiled.MIN_ROWS = 16
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


def test_refusal_names_a_method_that_opts_out():
    class Eager(DecodingMethod):
        compiles = False

    method = Eager()
    assert OPERA.compiles is True
    assert compiled.refusal(method, None, 10) == f"{method.name} opts out of compiled decoding (compiles = False)"


def test_static_rows_move_in_place():
    """StaticRows (OPERA's beams): reorder/drop rows, keep one appended column per row, split, all on the same
    tensors (a compiled forward keeps reading them); known answers on a hand-filled cache."""
    from transformers import DynamicCache

    model = tiny("llava")[0]
    dynamic = DynamicCache()
    layers = len(internals.new_static_cache(model, 8).layers)
    keys = torch.arange(3 * 1 * 4 * 1, dtype=torch.float32).view(3, 1, 4, 1)  # rows 0-2, 4 columns
    for index in range(layers):
        dynamic.update(keys.clone(), -keys, index)
    rows = compiled.StaticRows(model, dynamic, slot=("test", 0), capacity=6)
    assert (rows.real, rows.rows, rows.length, rows.capacity) == (3, 4, 4, 128)
    layer = rows.cache.layers[0]
    address = layer.keys.data_ptr()
    rows.select(torch.tensor([2, 0]))  # beam reordering and a row leaving
    assert rows.real == 2 and torch.equal(layer.keys[:2, :, :4], keys[[2, 0]])
    layer.keys[:2, :, 4:7] = torch.tensor([[100.0, 101.0, 102.0], [200.0, 201.0, 202.0]])[:, None, :, None]
    rows.keep_appended(4, torch.tensor([1, 1, 0]), torch.tensor([2, 0, 1]))  # 3 appended tokens per row
    assert rows.length == 5 and int(layer.cumulative_length) == 5 and rows.real == 3
    assert layer.keys[:3, 0, :5, 0].tolist() == [[0, 1, 2, 3, 202], [0, 1, 2, 3, 200], [8, 9, 10, 11, 101]]
    assert layer.keys.data_ptr() == address
    rows.select(torch.tensor([1, 0, 2]), shared=2)  # a beam reorder: the first 2 columns are taken as equal
    assert layer.keys[:3, 0, :5, 0].tolist() == [[0, 1, 2, 3, 200], [0, 1, 2, 3, 202], [8, 9, 10, 11, 101]]
    rows.select(torch.tensor([1, 0, 2]), shared=0)
    part = rows.split(torch.tensor([2]), ("test", 1))
    assert (part.real, part.rows, part.length) == (1, 1, 5)
    assert part.cache.layers[0].keys[0, 0, :5, 0].tolist() == [8, 9, 10, 11, 101]
    rows.set_length(3)
    assert int(layer.cumulative_length) == 3 and layer.keys.data_ptr() == address


def test_static_rows_move_every_head_layer_and_values():
    """The flat gather/scatter of :func:`internals.static_keep_appended_tokens` and :func:`internals.static_select_rows`
    against a row-by-row reference on random keys and values (several heads, head dim 3, every layer): the moved
    rows get their source's columns from ``start`` on, the earlier columns and the rows past the moved ones keep
    theirs; the cache's lengths all follow."""
    from transformers import DynamicCache

    generator = torch.Generator().manual_seed(0)
    model = tiny("llava")[0]
    layers = len(internals.new_static_cache(model, 8).layers)
    dynamic = DynamicCache()
    for index in range(layers):
        dynamic.update(torch.randn(4, 2, 9, 3, generator=generator), torch.randn(4, 2, 9, 3, generator=generator),
                       index)
    rows = compiled.StaticRows(model, dynamic, slot=("test", 2), capacity=12)
    before = [(layer.keys.clone(), layer.values.clone()) for layer in rows.cache.layers]
    rows.set_length(6)  # columns 6..8 are three appended candidates
    source, appended = torch.tensor([3, 3, 0]), torch.tensor([2, 0, 1])
    rows.keep_appended(6, source, appended, shared=2)
    for layer, (keys, values) in zip(rows.cache.layers, before):
        for new, old in ((layer.keys, keys), (layer.values, values)):
            for r in range(3):
                assert torch.equal(new[r, :, :2], old[r, :, :2])  # before `shared`: the row's own
                assert torch.equal(new[r, :, 2:6], old[source[r], :, 2:6])
                assert torch.equal(new[r, :, 6], old[source[r], :, 6 + appended[r]])
            assert torch.equal(new[3], old[3])  # not a moved row
            assert torch.equal(new[:3, :, 7:], old[:3, :, 7:])  # past the kept column: untouched
        assert int(layer.cumulative_length) == 7
    before = [(layer.keys.clone(), layer.values.clone()) for layer in rows.cache.layers]
    rows.select(torch.tensor([2, 1]), shared=1)
    for layer, (keys, values) in zip(rows.cache.layers, before):
        for new, old in ((layer.keys, keys), (layer.values, values)):
            assert torch.equal(new[:2, :, 1:7], old[[2, 1], :, 1:7])
            assert torch.equal(new[:2, :, :1], old[:2, :, :1]) and torch.equal(new[:2, :, 7:], old[:2, :, 7:])
            assert torch.equal(new[2:], old[2:])


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
    _GRAPHS[family] = (kinds | set(GRAPH_KINDS[name]), count + graphs() - before)


class _Spy(OPERA):
    """OPERA that keeps the kind of every event of its search."""

    def observe_step(self, event):
        self.__dict__.setdefault("events", []).append(event["kind"])


@needs_compiler
@pytest.mark.slow
@pytest.mark.xdist_group("compiled-llava")
def test_opera_rollbacks_compiled(one_row_bucket):
    """OPERA with rollbacks (prompts leaving the batch for static caches of their own, redone steps, rebuilt
    caches) gives the eager search's events and tokens on the compiled look-ahead, batched and alone, through
    one graph (16 prompts x 3 beams = 48 rows, 128 columns, 5 candidates)."""
    model, processor = tiny("llava")
    rolling = dict(num_beams=3, scale_factor=25.0, threshold=0)
    batch = selftest._inputs(processor, range(3))
    before, steps = graphs(), compiled.STATS.steps
    eager, fast = _Spy(**rolling), _Spy(**rolling)
    tokens = new_tokens(model, batch, eager, compile=False, max_new_tokens=24)
    assert torch.equal(new_tokens(model, batch, fast, compile=True, max_new_tokens=24), tokens)
    assert fast.events == eager.events and fast.events.count("rollback") >= 3
    assert compiled.STATS.steps - steps >= fast.events.count("step")
    slots = {bucket[1] for bucket in compiled.STATS.buckets if isinstance(bucket[1], tuple)}
    assert ("opera", -1) in slots and len(slots) >= 2, slots  # the batch, and a prompt that rolled back alone
    for row in range(3):
        alone = selftest._inputs(processor, [row])
        assert torch.equal(new_tokens(model, alone, _Spy(**rolling), compile=True, max_new_tokens=24),
                           tokens[row:row + 1]), f"row {row}"
    assert graphs() - before <= 1


@pytest.mark.slow
@pytest.mark.parametrize("family", selftest.FAMILIES)
def test_opera_static_path_on_every_family(family, monkeypatch):
    """OPERA's static-cache path with an eager "compiler" (no compiling: ``make test`` checks the path's masks,
    in-place row and column moves, splits and rebuilds on every family): the eager search's events and tokens,
    with rollbacks, and with other generation settings (two sequences per prompt, length penalty, early stop)."""
    monkeypatch.setattr(internals, "compiled_forward", lambda model, mode: model)
    monkeypatch.setattr(compiled, "MIN_ROWS", 1)
    model, processor = tiny(family)
    batch = selftest._inputs(processor, range(3))
    rolling = dict(num_beams=3, scale_factor=25.0, threshold=0)
    eager, static = _Spy(**rolling), _Spy(**rolling)
    steps = compiled.STATS.steps
    tokens = new_tokens(model, batch, eager, compile=False, max_new_tokens=20)
    assert torch.equal(new_tokens(model, batch, static, compile=True, max_new_tokens=20), tokens)
    assert static.events == eager.events and compiled.STATS.steps > steps
    settings = dict(num_beams=3, num_return_sequences=2, length_penalty=0.5, early_stopping=True, max_new_tokens=12,
                    do_sample=False)
    outputs = []
    for compile in (False, True):
        with compiled.compiled_decoding(compile):
            outputs.append(model.generate(**batch, custom_generate=OPERA(num_beams=3), **settings))
    assert torch.equal(*outputs)


def test_opera_row_bucket_is_prompts_times_beams(monkeypatch):
    """OPERA's static rows: the prompts' bucket times the beams (3 prompts -> 4 x 5 = 20 rows, not 15 rounded up to
    16 x ... or 32); the eager tokens (an eager "compiler": nothing is compiled)."""
    monkeypatch.setattr(internals, "compiled_forward", lambda model, mode: model)
    monkeypatch.setattr(compiled, "MIN_ROWS", 1)  # the production buckets (one_row_bucket may be active)
    # this call's buckets only: another test in this process may have run OPERA on the same bucket before
    monkeypatch.setattr(compiled, "STATS", compiled.CompileStats())
    model, processor = tiny("llava")
    batch = selftest._inputs(processor, range(3))
    fast = new_tokens(model, batch, OPERA(), compile=True)
    assert torch.equal(fast, new_tokens(model, batch, OPERA(), compile=False))
    assert {(bucket[1], bucket[2]) for bucket in compiled.STATS.buckets} == {(("opera", -1), 20)}


@needs_compiler
@pytest.mark.slow
@pytest.mark.parametrize("family", [pytest.param(family, marks=pytest.mark.xdist_group(f"compiled-{family}"))
                                    for family in RUN])
def test_graphs_per_family(family):
    """After a family's checks in this process: one graph per graph kind its methods ran, whatever the
    method's settings (α), rows (1-9), prompt lengths and stream layout (one or two passes)."""
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
    new_tokens(model, selftest._inputs(processor, range(3)), method, compile=True)  # the (16 rows, 128) bucket
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
    "compiler", so the test compiles nothing), OPERA's beam loop included."""
    monkeypatch.setattr(internals, "compiled_forward", lambda model, mode: model)
    steps = compiled.STATS.steps
    assert selftest.main(["llava"], ["vcd", "opera"], quiet=True, compiled=True) == 0
    assert compiled.STATS.steps > steps
    lines = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert ["family", "method", *selftest.CHECKS[:1]] == lines[1][:3] and lines[1][-1] == "compiled"
    assert ["llava", "vcd", "ok", "ok", "ok", "ok", "ok"] in lines
    assert ["llava", "opera", "ok", "-", "ok", "ok", "ok"] in lines
