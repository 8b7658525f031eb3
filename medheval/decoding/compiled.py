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

OPERA runs its own beam loop on :class:`StaticRows`: its look-ahead forward (``N`` candidates per beam, a
4-D mask over the capacity) is its one compiled graph per bucket, whose rows are the *prompts'* bucket times the
beams (4 prompts x 5 beams: 20 rows, where rounding the 20 rows would give 32); its rows move in place (beam
reordering, the kept candidate's column, finished prompts leaving), and a prompt that rolls back continues on a
static cache of its own (one prompt's bucket times the beams).

The static caches are kept per model, bucket and group slot (:func:`static_cache`) and refilled in place,
so a compiled graph sees the same tensor addresses batch after batch.

Where the compiled path does not apply, decoding stays eager and the reason is kept in
``ctx.state["compile_refusal"]`` (:func:`refusal`): a cache that is not a dynamic cache of dynamic layers,
unknown ``max_length``, or a method that opts out (``compiles = False``).

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


def run_padded(model, forward, inputs: dict[str, Any], real: int, rows: int, *, bucket: tuple, cuda: bool,
               compile: bool = True):
    """One forward of ``real`` rows padded to the bucket's ``rows`` through the compiled ``forward`` (``compile``)
    or the eager model, on a static cache; the outputs cut back to ``real`` rows.

    A compiler error (the compiler failed, not the model) is warned about once per model and kept in
    :data:`STATS`; that model's forwards then run eagerly on the static cache.
    """
    inputs = internals.pad_step_rows(inputs, real, rows)
    broken = model.__dict__.get("_medheval_compile_failed")
    if compile:
        signature = tuple(sorted(k for k, v in inputs.items() if v is not None and not internals.is_cache_key(k)))
        STATS.buckets.add((*bucket, signature))
        STATS.steps += 1
    if compile and broken is None:
        if cuda:
            torch.compiler.cudagraph_mark_step_begin()
        try:
            return internals.keep_output_rows(forward(**inputs, return_dict=True), real, clone=cuda)
        except torch._dynamo.exc.TorchDynamoException as error:
            broken = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
            model.__dict__["_medheval_compile_failed"] = broken
            STATS.failures.append(broken)
            warnings.warn(f"torch.compile failed ({broken}); decoding continues eagerly on the static cache",
                          RuntimeWarning, stacklevel=3)
    return internals.keep_output_rows(model(**inputs, return_dict=True), real, clone=False)


class StaticRows:
    """Rows that a decoding loop of its own arranges (OPERA's beams) on the pooled static cache of one row and
    capacity bucket, with the compiled forward.

    Built from the loop's prefilled ``DynamicCache``; afterwards the loop moves rows and columns in place
    (:meth:`select`, :meth:`keep_appended`, :meth:`set_length`), so the compiled graph reads the same tensors
    throughout. The real rows may shrink (finished prompts leave); the bucket stays, padding rows are dropped.

    Args:
        model: the model.
        dynamic: the prefilled cache (its rows and length are taken over).
        slot: the pool slot: groups alive at the same time need different slots.
        capacity: the most columns the loop will write (rounded up to :data:`CAPACITY_STEP`).
        length: the columns the prefilled cache holds (default: its length).
        rows: the row bucket (default :func:`row_bucket` of the rows; OPERA buckets its prompts and multiplies
            by the beams, so 4 prompts x 5 beams run 20 rows, not 32).
    """

    def __init__(self, model, dynamic, *, slot: Any, capacity: int, rows: int | None = None,
                 length: int | None = None):
        self.model = model
        self.real = int(internals.first_layer_keys(dynamic).shape[0])
        self.rows = int(rows) if rows is not None else row_bucket(self.real)
        if self.rows < self.real:
            raise ValueError(f"a bucket of {self.rows} rows cannot hold {self.real} rows")
        self.length = int(length) if length is not None else internals.cache_length(dynamic)
        self.capacity = capacity_bucket(capacity)
        self.slot = slot
        self.mode = mode_for(model)
        self.cuda = next(model.parameters()).device.type == "cuda"
        self.cache = static_cache(model, slot, self.rows, self.capacity)
        internals.fill_static_cache(self.cache, dynamic, self.length, self.rows)
        self.forward_fn = internals.compiled_forward(model, self.mode)
        if torch._dynamo.config.recompile_limit < RECOMPILE_LIMIT:
            torch._dynamo.config.recompile_limit = RECOMPILE_LIMIT

    def set_length(self, length: int) -> None:
        """Columns ``[0, length)`` are the cache; the next forward writes from ``length``."""
        self.length = int(length)
        internals.set_static_length(self.cache, self.length)

    def select(self, rows: torch.Tensor, shared: int = 0) -> None:
        """Keep ``rows`` (reordered, fewer or the same number), in place; ``shared``: the first columns, equal in
        each row and its source (a beam reorder within a prompt's beams: the prompt's), are not copied."""
        internals.static_select_rows(self.cache, rows, self.length, start=shared)
        self.real = int(rows.numel())

    def keep_appended(self, prefix_length: int, source_rows: torch.Tensor, appended_index: torch.Tensor,
                      shared: int = 0) -> None:
        """After a forward appended tokens to ``prefix_length`` columns: row ``r`` keeps the prefix of row
        ``source_rows[r]`` and its appended token ``appended_index[r]`` (length ``prefix_length + 1``);
        ``shared`` as in :meth:`select` (OPERA: the prompt's columns, so a step copies only the generated ones)."""
        internals.static_keep_appended_tokens(self.cache, prefix_length, source_rows, appended_index, start=shared)
        self.real = int(source_rows.numel())
        self.length = int(prefix_length) + 1

    def split(self, rows: torch.Tensor, slot: Any, bucket: int | None = None) -> "StaticRows":
        """``rows`` on a static cache of their own (pool ``slot``, row bucket ``bucket``; this one is left
        untouched)."""
        part = internals.dynamic_from_static(self.cache, rows, self.length)
        return StaticRows(self.model, part, slot=slot, capacity=self.capacity, rows=bucket)

    def forward(self, inputs: dict[str, Any], *, compile: bool = True, advance: int = 0):
        """One forward of the real rows (``inputs`` without the cache), ``advance`` tokens written after
        ``length``; compiled when ``compile``, else eager (a query count the loop needs rarely)."""
        inputs = {**inputs, **internals.cache_keyword(self.cache)}
        outputs = run_padded(self.model, self.forward_fn, inputs, self.real, self.rows,
                             bucket=(self.mode, self.slot, self.rows, self.capacity), cuda=self.cuda, compile=compile)
        self.length += int(advance)
        return outputs


class StaticStep(StaticRows):
    """One stream group's decode steps on a static cache through the compiled forward.

    Built after the group's prefill: copies its cache into the pooled static cache of its bucket and
    swaps it into the group's kwargs, so ``prepare_inputs_for_generation`` builds the fixed-size 4-D mask
    (outside the compiled graph, as ``generate`` does for static caches).
    """

    def __init__(self, model, group, slot: int, remaining: int):
        length = int(group.input_ids.shape[1]) - 1  # columns in the cache (the last token is not fed yet)
        super().__init__(model, group.cache, slot=slot, capacity=length + 1 + max(int(remaining), 0), length=length)

    def __call__(self, inputs: dict[str, Any]):
        """One decode step (``inputs`` from ``prepare_inputs_for_generation``, the static cache in them)."""
        return run_padded(self.model, self.forward_fn, inputs, self.real, self.rows,
                          bucket=(self.mode, self.slot, self.rows, self.capacity), cuda=self.cuda)

    def final_cache(self, rows: int, length: int):
        """The first ``rows`` rows of the static cache as a ``DynamicCache`` (for ``return_dict_in_generate``)."""
        return internals.dynamic_from_static(self.cache, rows, length)


def refusal(method, ctx, max_length: int | None) -> str | None:
    """Why the decode steps of this call stay eager (``None``: they can be compiled)."""
    if not getattr(method, "compiles", True):
        return f"{method.name} opts out of compiled decoding (compiles = False)"
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


__all__ = ["CAPACITY_STEP", "STATS", "StaticRows", "StaticStep", "attach", "capacity_bucket", "compiled_decoding", "mode_for",
           "refusal", "row_bucket", "run_padded", "static_cache", "wanted"]
