"""Static cache and compiled forward for the decode steps of :func:`~medheval.decoding.loop.decode`.

A decode step reads every weight once; on a GPU an eager step is bound by Python and kernel launches,
not by that read. After the prefill (and after contrast streams have joined the clean group, so every
stream group has its final rows), each group's ``DynamicCache`` is copied into a ``StaticCache`` of a
fixed capacity and every later step runs ``torch.compile(model)`` (``mode="reduce-overhead"`` on CUDA:
CUDA graphs) on one token per row. The prefill stays eager: it runs once per batch, at the prompt's
length, and joins, crops and row edits need the dynamic cache.

Shape buckets (one compilation per bucket, not per batch):

- **capacity** = ``prompt columns + new tokens``, rounded up to a multiple of :data:`CAPACITY_STEP`
  (128): the mask and keys span the capacity, the unwritten columns are masked;
- **rows** = the group's rows (``B``, or ``S*B`` for ``S`` streams in one group) rounded up to a power of
  two up to 16, then to a multiple of 16 (:func:`row_bucket`); the padding rows copy row 0 and their
  outputs are dropped. A last, smaller batch of a split therefore reuses the graph of the full batches.

Inside the compiled forward nothing may change shape or value from step to step, or dynamo recompiles
(guards on every tensor's shape and every Python number it reads): attention hooks read the group's image
columns built once at the capacity (``StreamGroup.image_columns``) and PAI's α as a tensor, and positions
given for one row are expanded to the bucket's rows. Per bucket, one graph serves plain decoding and the
two-stream methods; DoLa (hidden states out) and the hooked methods add one each.

The static caches are kept per model, bucket and group slot (:func:`static_cache`) and refilled in place,
so a compiled graph sees the same tensor addresses batch after batch.

Where the compiled path does not apply, decoding stays eager and the reason is kept in
``ctx.state["compile_refusal"]`` (:func:`refusal`): a cache that is not a dynamic cache of dynamic layers,
unknown ``max_length``, or a method that opts out (``compiles = False``: OPERA's beam search).

A compiler error (``torch._dynamo`` exceptions, e.g. an older torch that cannot trace the model) is
warned about once per model, kept in :data:`STATS`, and the steps go on eagerly on the static cache.

``compiled_decoding(True | False | None)`` sets the policy for the calls inside it; ``None`` (the default)
compiles on CUDA and stays eager elsewhere. ``medheval run --no-compile`` switches it off.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import warnings
from collections import OrderedDict
from typing import Any, Iterator

import torch

from medheval.decoding import internals

CAPACITY_STEP = 128
ROW_STEP = 16
MIN_ROWS = 1  # smallest row bucket (tests raise it so that every method shares one graph per family)
POOL_SIZE = 4  # static caches kept per model (least recently used dropped)
RECOMPILE_LIMIT = 64  # dynamo's default (8) is too few for buckets x methods x attention kinds

_POLICY: contextvars.ContextVar[bool | None] = contextvars.ContextVar("medheval_compile", default=None)


@contextlib.contextmanager
def compiled_decoding(enabled: bool | None) -> Iterator[None]:
    """Compile the decode steps of the calls inside (``True``), never (``False``), or on CUDA only (``None``)."""
    token = _POLICY.set(enabled)
    try:
        yield
    finally:
        _POLICY.reset(token)


def wanted(model) -> bool:
    """Whether the current policy compiles decode steps of ``model``."""
    policy = _POLICY.get()
    if policy is None:
        return next(model.parameters()).device.type == "cuda"
    return bool(policy)


def mode_for(model) -> str | None:
    """``"reduce-overhead"`` (CUDA graphs) on CUDA, inductor's default elsewhere."""
    return "reduce-overhead" if next(model.parameters()).device.type == "cuda" else None


def capacity_bucket(columns: int) -> int:
    """``columns`` rounded up to a multiple of :data:`CAPACITY_STEP`."""
    return -(-int(columns) // CAPACITY_STEP) * CAPACITY_STEP


def row_bucket(rows: int) -> int:
    """1, 2, 4, 8, 16, then multiples of 16 (``rows`` rounded up)."""
    rows = max(int(rows), MIN_ROWS)
    if rows <= ROW_STEP:
        return 1 << (rows - 1).bit_length()
    return -(-rows // ROW_STEP) * ROW_STEP


@dataclasses.dataclass
class CompileStats:
    """Per-process counts: ``buckets`` = distinct (mode, slot, rows, capacity, inputs) shapes run compiled."""

    buckets: set = dataclasses.field(default_factory=set)
    steps: int = 0
    failures: list = dataclasses.field(default_factory=list)  # compiler errors (decoding went on eagerly)


STATS = CompileStats()


def static_cache(model, slot: int, rows: int, capacity: int):
    """The static cache of ``model`` for (group slot, row bucket, capacity bucket), created once and reused."""
    pool: OrderedDict = model.__dict__.setdefault("_medheval_static_caches", OrderedDict())
    key = (slot, rows, capacity, next(model.parameters()).device)
    if key in pool:
        pool.move_to_end(key)
    else:
        pool[key] = internals.new_static_cache(model, capacity)
        while len(pool) > POOL_SIZE:
            pool.popitem(last=False)
    return pool[key]


class StaticStep:
    """One stream group's decode steps on a static cache through the compiled forward.

    Built after the group's prefill: copies its cache into the pooled static cache of its bucket and
    swaps it into the group's kwargs, so ``prepare_inputs_for_generation`` builds the fixed-size 4-D mask
    (outside the compiled graph, as ``generate`` does for static caches).
    """

    def __init__(self, model, group, slot: int, remaining: int):
        self.model = model
        self.real = int(group.input_ids.shape[0])
        self.rows = row_bucket(self.real)
        self.length = int(group.input_ids.shape[1]) - 1  # columns in the cache (the last token is not fed yet)
        self.capacity = capacity_bucket(self.length + 1 + max(int(remaining), 0))
        self.mode = mode_for(model)
        self.cuda = next(model.parameters()).device.type == "cuda"
        self.slot = slot
        self.cache = static_cache(model, slot, self.rows, self.capacity)
        internals.fill_static_cache(self.cache, group.cache, self.length, self.rows)
        self.forward = internals.compiled_forward(model, self.mode)
        if torch._dynamo.config.recompile_limit < RECOMPILE_LIMIT:
            torch._dynamo.config.recompile_limit = RECOMPILE_LIMIT

    def __call__(self, inputs: dict[str, Any]):
        inputs = internals.pad_step_rows(inputs, self.real, self.rows)
        signature = tuple(sorted(k for k, v in inputs.items() if v is not None and not internals.is_cache_key(k)))
        STATS.buckets.add((self.mode, self.slot, self.rows, self.capacity, signature))
        STATS.steps += 1
        if self.cuda:
            torch.compiler.cudagraph_mark_step_begin()
        broken = self.model.__dict__.get("_medheval_compile_failed")
        if broken is None:
            try:
                outputs = self.forward(**inputs, return_dict=True)
            except torch._dynamo.exc.TorchDynamoException as error:  # the compiler failed, not the model
                broken = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
                self.model.__dict__["_medheval_compile_failed"] = broken
                STATS.failures.append(broken)
                warnings.warn(f"torch.compile failed ({broken}); decoding continues eagerly on the static cache",
                              RuntimeWarning, stacklevel=2)
        if broken is not None:
            outputs = self.model(**inputs, return_dict=True)
        return internals.keep_output_rows(outputs, self.real, clone=self.cuda)

    def final_cache(self, rows: int, length: int):
        """The first ``rows`` rows of the static cache as a ``DynamicCache`` (for ``return_dict_in_generate``)."""
        return internals.dynamic_from_static(self.cache, rows, length)


def refusal(method, ctx, max_length: int | None) -> str | None:
    """Why the decode steps of this call stay eager (``None``: they can be compiled)."""
    if not getattr(method, "compiles", True):
        return f"{method.name} runs its own decoding loop"
    if not max_length:
        return "generation_config.max_length is unknown (the static cache needs a capacity)"
    for group in ctx.groups:
        reason = internals.static_refusal(group.cache)
        if reason is not None:
            return reason
    return None


def attach(method, ctx, max_length: int | None) -> bool:
    """After the first step: move every group of ``ctx`` onto a static cache and the compiled forward.

    Returns whether it did; when not, ``ctx.state["compile_refusal"]`` says why.
    """
    reason = refusal(method, ctx, max_length)
    if reason is not None:
        ctx.state["compile_refusal"] = reason
        return False
    remaining = int(max_length) - int(ctx.input_ids.shape[1])
    for slot, group in enumerate(ctx.groups):
        group.use_static(StaticStep(ctx.model, group, slot, remaining))
    ctx.state["compiled"] = True
    return True


__all__ = ["CAPACITY_STEP", "STATS", "StaticStep", "attach", "capacity_bucket", "compiled_decoding", "mode_for",
           "refusal", "row_bucket", "static_cache", "wanted"]
