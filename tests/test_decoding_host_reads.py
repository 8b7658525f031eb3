"""A decode step reads no tensor value on the host but the "every row finished" flag, and reading that flag one
step late (what the loop does on CUDA, so the host queues step n+1 while the GPU runs step n) gives the
synchronous loop's sequences.

On a GPU a host read (``.item()``, ``bool(t)``, ``int(t)``, a boolean-mask index, ``nonzero``) waits for every
queued kernel; a decode step with one cannot overlap its host work with the GPU's. So does a tensor made in host
memory and copied to the GPU (a blocking host-to-device copy synchronises the stream). These tests count such reads
on CPU with a dispatch mode (:class:`HostReads`) and tensors made without a device (:class:`HostMade`: on CUDA they
would be host tensors), outside the model's forward (on CUDA one graph replay), on the static-cache path of every
family, for plain decoding and every one-pass method.
"""

from __future__ import annotations

import math
import os
import traceback
from collections import Counter
from pathlib import Path

import pytest
import torch
import transformers
from torch.overrides import TorchFunctionMode
from torch.utils._device import _device_constructors
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from conftest import load_benchmark
from transformers import StoppingCriteria, StoppingCriteriaList

import medheval
from medheval.decoding import compiled, internals, stopping
from medheval.decoding.loop import DecodingMethod
from medheval.decoding.sampling import RowSampler
from medheval.mitigations import get_mitigation, selftest

aten = torch.ops.aten
# ops whose result (a Python number, or an output shape) needs the tensor's values on the host
READS = {aten._local_scalar_dense.default, aten.nonzero.default, aten.masked_select.default, aten.equal.default,
         aten.is_nonzero.default}


MEDHEVAL_DIR = str(Path(medheval.__file__).resolve().parent) + os.sep
TRANSFORMERS_DIR = str(Path(transformers.__file__).resolve().parent) + os.sep


def _innermost_frame() -> traceback.FrameSummary | None:
    """The innermost frame of the current stack in medheval's or transformers' package."""
    frames = [f for f in traceback.extract_stack() if f.filename.startswith((MEDHEVAL_DIR, TRANSFORMERS_DIR))]
    return frames[-1] if frames else None


def _where() -> str:
    """:func:`_innermost_frame` as ``file.py:line``."""
    frame = _innermost_frame()
    return f"{frame.filename.rsplit('/', 1)[-1]}:{frame.lineno}" if frame else "?"


class HostReads(TorchDispatchMode):
    """Counts host reads of tensor values by where they happen (the innermost medheval or transformers frame)."""

    def __init__(self):
        super().__init__()
        self.reads: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        boolean_index = func is aten.index.Tensor and any(
            t is not None and t.dtype == torch.bool for t in args[1])
        if func in READS or boolean_index:
            self.reads[_where()] += 1
        return func(*args, **(kwargs or {}))


class HostCopies(TorchFunctionMode):
    """Counts reads of tensor values that do not dispatch an op on a CPU tensor (``.tolist()``, ``.numpy()``,
    ``.cpu()``): on a GPU each copies to the host and waits for the GPU. (``.to(device)`` is not counted: on a CPU
    run "the device" is the host, so it cannot tell a copy to the host from a move to the tensor's own device.)"""

    COPIES = (torch.Tensor.tolist, torch.Tensor.numpy, torch.Tensor.cpu)

    def __init__(self):
        super().__init__()
        self.reads: Counter = Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in self.COPIES:
            self.reads[_where()] += 1
        return func(*args, **(kwargs or {}))


class HostMade(TorchFunctionMode):
    """Counts tensors made in host memory: by a constructor given no device (``torch.arange(n)``, ``torch.zeros(2)``...;
    on a GPU run they are host tensors, and using them with the GPU's copies them there, waiting for the GPU), and
    from Python data (``torch.tensor([...], device=...)`` copies that data to the device, also waiting)."""

    CONSTRUCTORS = _device_constructors()
    FROM_DATA = (torch.tensor, torch.as_tensor, torch.asarray)

    def __init__(self, only: str | None = None):
        """``only``: count only tensors made in files under that folder (:data:`MEDHEVAL_DIR`: the loop's own, not
        transformers', whose per-step mask code differs between releases: 5.18 makes a 0-d constant per step)."""
        super().__init__()
        self.only = only
        self.made: Counter = Counter()

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in self.FROM_DATA:
            host = not (args and torch.is_tensor(args[0]))  # from a tensor: where that tensor is
        else:
            host = func in self.CONSTRUCTORS and kwargs.get("device") is None
        frame = _innermost_frame() if host else None
        if host and (self.only is None or (frame is not None and frame.filename.startswith(self.only))):
            self.made[_where()] += 1
        return func(*args, **kwargs)


def replay_compiler(model, mode):
    """An eager "compiler" whose forward is not counted (on CUDA the compiled forward is one graph replay)."""
    def forward(*args, **kwargs):
        with _disable_current_modes(), torch._C.DisableTorchFunction():
            return model(*args, **kwargs)
    return forward


_MODELS: dict = {}


def tiny(family: str):
    if family not in _MODELS:
        _MODELS[family] = selftest._build(family)
    return _MODELS[family]


def method(name: str) -> DecodingMethod:
    return DecodingMethod() if name == "plain" else get_mitigation(name)


def host_work_per_run(model, batch, name: str, new_tokens: int) -> tuple[Counter, Counter]:
    """(host reads, tensors made without a device) of one ``generate`` call, by where they happen."""
    return host_work(lambda: model.generate(**batch, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                            do_sample=False, custom_generate=method(name)))


def host_work(run) -> tuple[Counter, Counter]:
    """(host reads and copies, tensors made without a device in medheval's files) of ``run()``, by where."""
    reads, copies, made = HostReads(), HostCopies(), HostMade(only=MEDHEVAL_DIR)
    with compiled.compiled_decoding(True), made, copies, reads:
        run()
    return reads.reads + copies.reads, made.made


def _difference(long: Counter, short: Counter) -> dict[str, int]:
    return {where: long[where] - short[where] for where in long if long[where] != short[where]}


ONE_PASS = ("plain", "vcd", "m3id", "pai", "avisc", "damro", "dola")
CASES = [("llava", name) for name in ONE_PASS] + [(family, name) for family in selftest.FAMILIES[1:]
                                                   for name in ("plain", "pai", "dola")]


@pytest.mark.parametrize("family,name", CASES, ids=[f"{f}-{n}" for f, n in CASES])
def test_a_decode_step_reads_only_the_finished_flag(family, name, monkeypatch):
    """Four more decode steps add four host reads, all of them the flag (``stopping.py``), and no tensor made in
    host memory, on the static path (3 rows padded to a bucket of 4)."""
    monkeypatch.setattr(internals, "compiled_forward", replay_compiler)
    monkeypatch.setattr(compiled, "MIN_ROWS", 1)
    model, processor = tiny(family)
    batch = selftest._inputs(processor, range(3))
    (short, short_made), (long, long_made) = (host_work_per_run(model, batch, name, n) for n in (3, 7))
    extra = _difference(long, short)
    flag = {where: count for where, count in extra.items() if where.startswith("stopping.py")}
    assert extra == flag, f"host reads per decode step outside the finished flag: {extra}"
    assert sum(flag.values()) == 4
    assert _difference(long_made, short_made) == {}, "tensors made in host memory at every decode step"


@pytest.mark.parametrize("threshold,per_step", [(15, 1), (2, 2)])
def test_an_opera_step_reads_the_host_once_before_its_trigger_can_fire_then_twice(threshold, per_step, monkeypatch):
    """OPERA (3 prompts x 5 beams, static path): one read per step for every prompt's "done" flag and the reuse of the
    look-ahead together; once a rollback can be due (more than ``threshold`` steps recorded), one more for every
    prompt's trigger together (it decides the step, so it cannot be read late). No tensor made in host memory."""
    monkeypatch.setattr(internals, "compiled_forward", replay_compiler)
    monkeypatch.setattr(compiled, "MIN_ROWS", 1)
    model, processor = tiny("llava")
    batch = selftest._inputs(processor, range(3))

    def run(new_tokens: int):
        return host_work(lambda: model.generate(**batch, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                                do_sample=False, custom_generate=get_mitigation("opera", threshold=threshold)))

    (short, short_made), (long, long_made) = run(4), run(8)  # steps 4..7: before a rollback can target (>= 10)
    extra = _difference(long, short)
    assert all(where.startswith("opera.py") for where in extra), extra
    assert sum(extra.values()) == 4 * per_step and len(extra) == per_step, extra
    assert _difference(long_made, short_made) == {}


def test_the_counter_sees_a_tensor_made_in_host_memory():
    """:class:`HostMade` counts constructors given no device or Python data, not those made on a device (so the test
    above can fail)."""
    x = torch.ones(3)
    mode = HostMade()
    with mode:
        torch.arange(4)
        torch.tensor([1, 2])
        torch.zeros(2, dtype=torch.long)
        torch.tensor(0.5, device=x.device)  # Python data copied to the device
        torch.arange(4, device=x.device)  # made where x lives: not counted
        x.new_zeros(2)
        torch.as_tensor(x)
    assert sum(mode.made.values()) == 4


def test_padding_rows_makes_its_index_once():
    """3 rows padded to a bucket of 4 (copies of row 0): the index is built once per shape and device, not per step."""
    inputs = {"input_ids": torch.tensor([[5], [6], [7]]), "position_ids": torch.tensor([[9], [9], [8]])}
    internals.pad_step_rows(inputs, 3, 4)
    mode = HostMade()
    with mode:
        padded = internals.pad_step_rows(inputs, 3, 4)
    assert padded["input_ids"].tolist() == [[5], [6], [7], [5]]
    assert padded["position_ids"].tolist() == [[9], [9], [8], [9]]
    assert sum(mode.made.values()) == 0


def test_the_counter_sees_a_host_read():
    """The dispatch mode counts the reads a step must not make (so the test above can fail), and the function mode the
    copies to the host that dispatch nothing on a CPU tensor."""
    mode, copies = HostReads(), HostCopies()
    x = torch.arange(4.0)
    with mode:
        int(x.max())
        bool((x > 1).any())
        x[x > 1]
        torch.nonzero(x)
        x.sum() * 2  # no read
    assert sum(mode.reads.values()) == 4
    with copies:
        x.tolist()
        x.numpy()
        x.cpu()
        x.to(torch.float64)  # no read
        x.sum() * 2
    assert sum(copies.reads.values()) == 3


# ---------------------------------------------------------------------------------------
# the flag read late
# ---------------------------------------------------------------------------------------
def test_flags_known_answers():
    flags = stopping.FinishedFlags(lag=1)
    answers = []
    for done in (False, False, True, True):
        flags.push(torch.tensor([0 if done else 1, 0]))
        answers.append(flags.steps_to_drop())
    assert answers == [None, None, None, 1]  # finished at step 3, read at step 4: step 4 is dropped
    flags = stopping.FinishedFlags(lag=1)
    flags.push(torch.tensor([1]))
    assert flags.steps_to_drop() is None
    flags.push(torch.tensor([0]))
    assert flags.steps_to_drop(last=True) == 0  # the last step: read now, nothing to drop
    flags = stopping.FinishedFlags(lag=0)
    flags.push(torch.tensor([1, 1]))
    assert flags.steps_to_drop() is None and flags.reads == 1
    flags.push(torch.tensor([0, 0]))
    assert flags.steps_to_drop() == 0


def test_lag_rule():
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert stopping.lag_for(cuda, streamer=False, return_dict=False, global_sampling=False) == 1
    assert stopping.lag_for(cpu, streamer=False, return_dict=False, global_sampling=False) == 0
    for kept in ("streamer", "return_dict", "global_sampling"):
        flags = {**dict(streamer=False, return_dict=False, global_sampling=False), kept: True}
        with stopping.finished_flag_lag(1):
            assert stopping.lag_for(cuda, **flags) == 0, kept
    with stopping.finished_flag_lag(1):
        assert stopping.lag_for(cpu, streamer=False, return_dict=False, global_sampling=False) == 1
    with pytest.raises(ValueError, match="0 or more"):
        with stopping.finished_flag_lag(-1):
            pass


class StopRows(StoppingCriteria):
    """Row ``r`` finishes once it has ``ends[r]`` new tokens."""

    def __init__(self, prompt_length: int, ends: list[int]):
        self.prompt_length, self.ends = prompt_length, torch.tensor(ends)

    def __call__(self, input_ids, scores, **kwargs):
        return (input_ids.shape[1] - self.prompt_length) >= self.ends


class CountForwards:
    def __init__(self, model):
        self.count = 0
        self.handle = model.register_forward_pre_hook(self)

    def __call__(self, module, args):
        self.count += 1


LATE_CASES = [("plain", False), ("plain", True), ("vcd", True), ("pai", True), ("dola", True)]


@pytest.mark.parametrize("name,compile", LATE_CASES, ids=[f"{n}-{'static' if c else 'eager'}" for n, c in LATE_CASES])
def test_late_flag_gives_the_synchronous_sequences(name, compile, monkeypatch):
    """Rows finishing at different steps before the length limit, by a criterion and by EOS: the flag read one step
    late gives the same sequences, after one more forward (dropped); at the length limit no extra forward runs."""
    monkeypatch.setattr(internals, "compiled_forward", lambda model, mode: model)
    monkeypatch.setattr(compiled, "MIN_ROWS", 1)
    model, processor = tiny("llava")
    batch = selftest._inputs(processor, range(3))
    prompt = batch["input_ids"].shape[1]
    pad = processor.tokenizer.pad_token_id
    plain = model.generate(**batch, max_new_tokens=8, do_sample=False)
    eos = int(plain[1, prompt + 2])
    settings = [dict(stopping_criteria=StopRows(prompt, [2, 5, 3])),  # all rows done after 5 of 8
                dict(eos_token_id=eos, pad_token_id=pad),  # row 1 at its 3rd token
                dict()]  # the length limit
    for extra in settings:
        kwargs = dict(max_new_tokens=8, do_sample=False, custom_generate=method(name), **extra)
        if "stopping_criteria" in extra:
            kwargs["stopping_criteria"] = StoppingCriteriaList([extra["stopping_criteria"]])
        runs = []
        for lag in (0, 1):
            counter = CountForwards(model)
            try:
                with compiled.compiled_decoding(compile), stopping.finished_flag_lag(lag):
                    runs.append((model.generate(**batch, **kwargs), counter.count))
            finally:
                counter.handle.remove()
        (synchronous, forwards), (late, late_forwards) = runs
        assert torch.equal(late, synchronous), extra
        stopped_early = synchronous.shape[1] < prompt + 8
        assert late_forwards == forwards + (1 if stopped_early else 0), extra  # one forward per step here
    assert synchronous.shape[1] == prompt + 8  # the last setting ran to the length limit


def test_late_flag_with_row_samplers():
    """Per-row samplers (no global RNG draw): the flag is read late and the sampled sequences are unchanged."""
    model, processor = tiny("llava")
    batch = selftest._inputs(processor, range(3))
    prompt = batch["input_ids"].shape[1]
    outputs = []
    for lag in (0, 1):
        with stopping.finished_flag_lag(lag):
            outputs.append(model.generate(
                **batch, max_new_tokens=8, do_sample=True, top_k=20, custom_generate=DecodingMethod(),
                sampler=RowSampler.for_keys(7, ["a", "b", "c"]),
                stopping_criteria=StoppingCriteriaList([StopRows(prompt, [3, 4, 2])])))
    assert torch.equal(*outputs)
    assert outputs[0].shape[1] == prompt + 4


# ---------------------------------------------------------------------------------------
# benchmarks/bench_host_step.py: host time of a step, the forward replayed
# ---------------------------------------------------------------------------------------
def _bench_host_step():
    return load_benchmark("bench_host_step")


def test_host_step_benchmark_replays_one_forward_per_shape(monkeypatch):
    from transformers.modeling_outputs import CausalLMOutputWithPast

    bench = _bench_host_step()
    calls = []

    def model(**inputs):
        calls.append(tuple(inputs["input_ids"].shape))
        return CausalLMOutputWithPast(logits=inputs["input_ids"].float())

    forward = bench.replay_compiler(model, None)
    first = forward(input_ids=torch.zeros(4, 1, dtype=torch.long), output_hidden_states=False)
    again = forward(input_ids=torch.ones(4, 1, dtype=torch.long), output_hidden_states=False)
    forward(input_ids=torch.zeros(4, 1, dtype=torch.long), output_hidden_states=True)  # another flag: recorded
    forward(input_ids=torch.zeros(8, 1, dtype=torch.long), output_hidden_states=False)  # another shape: recorded
    assert calls == [(4, 1), (4, 1), (8, 1)]
    assert again.logits is first.logits and again is not first  # the loop may cut its own output object

    monkeypatch.setattr(internals, "compiled_forward", bench.replay_compiler)
    monkeypatch.setattr(compiled, "MIN_ROWS", 1)
    model, processor = tiny("llava")
    batch = selftest._inputs(processor, range(3))
    # a time (a difference of two short runs: its sign is noise here), measured on the static path
    assert math.isfinite(bench.host_ms_per_step(model, batch, DecodingMethod(), tokens=4, repeats=1, sample=False))
    # OPERA reads the last layer's attention from a hook inside the forward: the replay hands it what was observed
    # (without it OPERA raises: no attention recorded)
    assert math.isfinite(bench.host_ms_per_step(model, batch, bench._method("opera"), tokens=4, repeats=1,
                                                sample=False))
    monkeypatch.setattr(compiled, "wanted", lambda model: False)  # eager steps: nothing to measure, and it says so
    with pytest.raises(RuntimeError, match="static path"):
        bench.host_ms_per_step(model, batch, DecodingMethod(), tokens=4, repeats=1, sample=False)


def _same(a, b) -> bool:
    if torch.is_tensor(a) or torch.is_tensor(b):
        return torch.is_tensor(a) and torch.is_tensor(b) and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    return a is b or a == b


@pytest.mark.parametrize("family", ["gemma3", "llava"])
def test_decode_step_inputs_without_token_types_are_the_same(family, monkeypatch):
    """A decode step built without ``token_type_ids`` (Gemma 3's mask builder would overlay the image blocks through
    vmap, ~15 ms a step) gets the inputs ``prepare_inputs_for_generation`` builds with them: the same masks (one per
    attention kind, past the sliding window of 8), positions and ids, on the static path (3 rows in a bucket of 4)."""
    monkeypatch.setattr(internals, "compiled_forward", replay_compiler)
    monkeypatch.setattr(compiled, "MIN_ROWS", 1)
    model, processor = tiny(family)
    batch = selftest._inputs(processor, range(3))
    real = internals.prepare_step_inputs
    compared = []

    def checked(model, input_ids, model_kwargs, *, first):
        inputs = real(model, input_ids, model_kwargs, first=first)
        if not first:
            full = model.prepare_inputs_for_generation(input_ids, next_sequence_length=1, is_first_iteration=False,
                                                       **model_kwargs)
            assert inputs.keys() == full.keys()
            different = [k for k in inputs if not internals.is_cache_key(k) and not _same(inputs[k], full[k])]
            assert not different, f"step {len(compared) + 1}: {different} differ"
            compared.append(isinstance(inputs.get("attention_mask"), dict) or torch.is_tensor(inputs.get("attention_mask"))
                            and inputs["attention_mask"].dim() == 4)
        return inputs

    monkeypatch.setattr(internals, "prepare_step_inputs", checked)
    with compiled.compiled_decoding(True):
        model.generate(**batch, max_new_tokens=12, min_new_tokens=12, do_sample=False, custom_generate=DecodingMethod())
    assert len(compared) == 11 and all(compared)  # every decode step, each with a static-cache (4-D) mask
    if family == "gemma3":
        assert "token_type_ids" in batch  # what the step inputs are built without
