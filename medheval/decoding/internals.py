"""The one module that knows transformers' generation internals.

The decoding core and the mitigations lean on parts of transformers that are not a stable API:
the name of the cache argument, the cache classes and their layers, ``prepare_inputs_for_generation``,
``_update_model_kwargs_for_generation``, the private tensors of a prepared ``GenerationConfig``, the
output classes of ``generate`` and the attention interface. They move every few releases (5.24
renamed the cache argument of ``forward``, ``generate`` and ``prepare_inputs_for_generation`` from
``past_key_values`` to ``cache``; the old name only warns, and passing both silently drops one).

Everything else in medheval calls the functions here and never names those internals itself, so the
next rename is a change to this file. Supported: transformers ``>= 5.18`` (the first release that
hands ``custom_generate`` pre-encoded ``mm_encoder_outputs``) through the newest tested release
(:data:`medheval.versions.TESTED`).
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

import torch

# -----------------------------------------------------------------------------------------------
# argument names
# -----------------------------------------------------------------------------------------------
# every name a caller may hand the KV cache over under (the current one first)
_CACHE_NAMES = ("cache", "past_key_values")
# what generate hands a custom_generate method when it pre-encoded the images (transformers >= 5.18):
# ``{"image": encoder output, ...}``; the methods that edit image features read and replace it
ENCODED_IMAGES = "mm_encoder_outputs"


@functools.cache
def cache_argument() -> str:
    """The keyword under which the installed transformers' ``forward``, ``generate`` and
    ``prepare_inputs_for_generation`` take the KV cache: ``"cache"`` (5.24+) or ``"past_key_values"``."""
    from transformers.generation.utils import GenerationMixin

    parameters = inspect.signature(GenerationMixin.prepare_inputs_for_generation).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def pop_cache(kwargs: dict[str, Any]) -> Any:
    """Remove the cache from ``kwargs`` under any name a caller may have used, and return it (or ``None``).

    Raises:
        ValueError: two different caches under two names.
    """
    found = [kwargs.pop(name) for name in _CACHE_NAMES if name in kwargs]
    found = [value for value in found if value is not None]
    if len(found) > 1 and found[0] is not found[1]:
        raise ValueError("two caches were passed (as `cache` and as `past_key_values`); pass one")
    return found[0] if found else None


def cache_in(kwargs: dict[str, Any]) -> Any:
    """The cache held in model kwargs (``None`` if none)."""
    return kwargs.get(cache_argument())


def with_cache(kwargs: dict[str, Any], cache: Any) -> dict[str, Any]:
    """``kwargs`` with ``cache`` set under the installed transformers' argument name (in place; returned)."""
    for name in _CACHE_NAMES:
        kwargs.pop(name, None)
    kwargs[cache_argument()] = cache
    return kwargs


def cache_keyword(cache: Any) -> dict[str, Any]:
    """``{name: cache}`` to splat into ``model(...)`` or ``model.generate(...)``."""
    return {cache_argument(): cache}


def output_cache(outputs: Any) -> Any:
    """The cache a forward (or ``generate`` with ``return_dict_in_generate``) returned."""
    return getattr(outputs, cache_argument(), None)


def is_cache_key(key: str) -> bool:
    """Whether a model kwarg name is the KV cache (under any name)."""
    return key in _CACHE_NAMES


# -----------------------------------------------------------------------------------------------
# caches
# -----------------------------------------------------------------------------------------------
def new_cache(model=None):
    """An empty ``DynamicCache``: with the model's layer types (sliding-window layers for Gemma 3) when
    ``model`` is given, else lazily filled with full-length layers."""
    from transformers import DynamicCache

    return DynamicCache(config=model.config) if model is not None else DynamicCache()


def cache_length(cache) -> int:
    """Tokens held by ``cache`` (0 for ``None``)."""
    return int(cache.get_seq_length()) if cache is not None else 0


def is_dynamic_cache(cache) -> bool:
    from transformers import DynamicCache

    return isinstance(cache, DynamicCache)


def is_plain_dynamic_cache(cache) -> bool:
    """Exactly a ``DynamicCache`` (not a subclass such as an offloaded or quantized cache)."""
    from transformers import DynamicCache

    return type(cache) is DynamicCache


def is_full_length_cache(cache) -> bool:
    """A ``DynamicCache`` whose layers all keep every key (plain ``DynamicLayer``\\ s): it can be cropped,
    reordered and edited token by token."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer

    return type(cache) is DynamicCache and all(type(layer) is DynamicLayer for layer in cache.layers)


def layer_kinds(cache) -> list[str]:
    """The class name of each layer of ``cache`` (e.g. ``DynamicLayer``, ``DynamicSlidingWindowLayer``)."""
    return [type(layer).__name__ for layer in getattr(cache, "layers", [])]


def non_full_layer_kinds(cache) -> list[str]:
    """Sorted layer class names of ``cache`` other than the full-length ``DynamicLayer``."""
    return sorted(set(layer_kinds(cache)) - {"DynamicLayer"})


def is_user_cache(cache) -> bool:
    """Whether ``generate`` marked ``cache`` as the caller's own (not one it prepared)."""
    return bool(getattr(cache, "_is_user_defined", False))


def join_refusal(cache, expected_length: int) -> str | None:
    """Why ``cache`` cannot take part in :func:`append_rows_left_padded` (``None`` if it can).

    It must be a ``DynamicCache`` of initialised full or sliding-window dynamic layers, not recording its
    past (assisted decoding), each holding ``expected_length`` tokens.
    """
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

    if type(cache) is not DynamicCache or not all(
        type(layer) in (DynamicLayer, DynamicSlidingWindowLayer) and layer.is_initialized
        and not getattr(layer, "record_past", False)
        for layer in cache.layers
    ):
        return f"{type(cache).__name__} is not a DynamicCache of full or sliding-window dynamic layers"
    if any(layer.get_seq_length() != expected_length for layer in cache.layers):
        return "the cache length does not follow the tokens"
    return None


def layer_signature(cache) -> list[tuple[str, int | None]]:
    """(layer class, sliding window) per layer: two caches can be joined only when these match."""
    return [(type(layer).__name__, getattr(layer, "sliding_window", None)) for layer in cache.layers]


def append_rows_left_padded(cache, other) -> None:
    """Append ``other``'s rows to ``cache``, each layer's keys/values left-padded with zeros to ``cache``'s length.

    A sliding-window layer holds the last ``min(T - 1, W - 1)`` keys of each row, right-aligned like the
    tokens, so a shorter window is left-padded to the longer one. Both caches must pass :func:`join_refusal`.
    """
    for mine, theirs in zip(cache.layers, other.layers):
        short = int(mine.keys.shape[-2] - theirs.keys.shape[-2])
        mine.keys = torch.cat([mine.keys, torch.nn.functional.pad(theirs.keys, (0, 0, short, 0))], dim=0)
        mine.values = torch.cat([mine.values, torch.nn.functional.pad(theirs.values, (0, 0, short, 0))], dim=0)


def crop(cache, tokens_to_remove: int) -> None:
    """Drop the last ``tokens_to_remove`` tokens of every layer (transformers' ``crop`` takes a negative count)."""
    if tokens_to_remove > 0:
        cache.crop(-int(tokens_to_remove))


def select_rows(cache, rows: torch.Tensor) -> None:
    """Keep only ``rows`` of ``cache`` (in place, in that order)."""
    cache.batch_select_indices(rows)


def reorder_rows(cache, rows: torch.Tensor) -> None:
    """Beam reordering: row ``i`` becomes old row ``rows[i]`` (in place)."""
    cache.reorder_cache(rows)


def repeat_rows(cache, repeats: int) -> None:
    """Repeat every row ``repeats`` times in place (``[a, b] -> [a, a, b, b]``)."""
    cache.batch_repeat_interleave(repeats)


def copy_selected_rows(cache, rows: torch.Tensor):
    """A cache holding only ``rows`` of ``cache`` (which is left untouched).

    The layers are shallow-copied and each copy rebinds its own tensors, so only the selected rows are
    copied (``copy.deepcopy`` would copy the whole batch).
    """
    import copy

    new = copy.copy(cache)
    new.layers = [copy.copy(layer) for layer in cache.layers]
    for layer in new.layers:
        layer.batch_select_indices(rows.to(layer.keys.device) if getattr(layer, "is_initialized", False) else rows)
    return new


def keep_appended_tokens(cache, prefix_length: int, source_rows: torch.Tensor, appended_index: torch.Tensor) -> None:
    """After a forward appended ``A`` tokens per row to a ``prefix_length`` cache, keep for each new
    row ``r`` the prefix of row ``source_rows[r]`` followed by its appended token ``appended_index[r]``.

    Beam reordering plus dropping all but one look-ahead token, with one copy of the cache per layer
    (the reorder's ``index_select``; the kept token is moved to position ``prefix_length`` in that copy,
    which is then narrowed). Only for :func:`is_full_length_cache` caches.
    """
    for layer in cache.layers:
        if not getattr(layer, "is_initialized", False) or layer.keys.numel() == 0:
            continue
        src = source_rows.to(layer.keys.device)
        index = (prefix_length + appended_index.to(layer.keys.device)).view(-1, 1, 1, 1)
        for name in ("keys", "values"):
            states = getattr(layer, name).index_select(0, src)
            gather_index = index.expand(states.shape[0], states.shape[1], 1, states.shape[3])
            states[:, :, prefix_length : prefix_length + 1] = states.gather(2, gather_index)
            setattr(layer, name, states[:, :, : prefix_length + 1])


def first_layer_keys(cache) -> torch.Tensor:
    """Layer 0's key tensor ``[B, heads, T, dim]`` (for shape checks)."""
    return cache.layers[0].keys


# -----------------------------------------------------------------------------------------------
# static cache and compiled forward (the decode steps after the prefill; see medheval.decoding.compiled)
# -----------------------------------------------------------------------------------------------
def static_refusal(cache) -> str | None:
    """Why the prefilled ``cache`` cannot be copied into a static cache (``None`` if it can): it must be a
    ``DynamicCache`` of initialised full or sliding-window dynamic layers (what :func:`new_cache` makes)."""
    from transformers import DynamicCache
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

    if type(cache) is not DynamicCache:
        return f"{type(cache).__name__} is not a DynamicCache"
    if not all(type(layer) in (DynamicLayer, DynamicSlidingWindowLayer) and layer.is_initialized
               and not getattr(layer, "record_past", False) for layer in cache.layers):
        return f"cache layers {sorted(set(layer_kinds(cache)))} are not initialised full or sliding dynamic layers"
    return None


def new_static_cache(model, capacity: int):
    """An empty ``StaticCache`` of ``capacity`` tokens whose layers all keep every token (``StaticLayer``).

    Sliding-window layers (Gemma 3) get a full-length layer too: the sliding-window *mask*
    (``kv > q - W``, from the config) hides the keys outside the window, so the layer needs no rolling
    buffer, whose Python-int length would make a compiled forward recompile at every step.
    """
    from transformers import StaticCache
    from transformers.cache_utils import StaticLayer

    cache = StaticCache(config=model.config, max_cache_len=int(capacity))
    cache.layers = [StaticLayer(max_cache_len=int(capacity)) for _ in cache.layers]
    return cache


def fill_static_cache(static, dynamic, length: int, rows: int) -> None:
    """Copy the prefilled ``dynamic`` cache (``R`` rows, ``length`` columns so far) into ``static`` (``rows >= R``).

    Each layer's keys land at their columns (a sliding layer holds only its last ``n`` columns: they go to
    ``[length - n, length)``, the older ones are zeros that the window mask hides); rows ``R..rows-1`` copy
    row 0 (batch-bucket padding: a valid row whose outputs are dropped). The static tensors are allocated on
    the first fill and overwritten in place afterwards (a compiled forward keeps their addresses).
    """
    for mine, theirs in zip(static.layers, dynamic.layers):
        keys, values = theirs.keys, theirs.values
        real, heads, held, _ = keys.shape
        if not mine.is_initialized:
            pad = (0, 0, 0, 0, 0, 0, 0, rows - real)
            mine.lazy_initialization(torch.nn.functional.pad(keys[:, :, :0], pad),
                                     torch.nn.functional.pad(values[:, :, :0], pad))
        else:
            mine.keys.zero_()
            mine.values.zero_()
        mine.keys[:real, :, length - held:length] = keys
        mine.values[:real, :, length - held:length] = values
        if rows > real:
            mine.keys[real:] = mine.keys[:1]
            mine.values[real:] = mine.values[:1]
        mine.cumulative_length.fill_(int(length))


def dynamic_from_static(static, rows: int | torch.Tensor, length: int):
    """A ``DynamicCache`` of full layers holding ``length`` columns of the first ``rows`` rows of ``static`` (or of
    the rows a tensor ``rows`` lists), for ``generate``'s return value and OPERA's group splits; the static cache
    itself is reused by the next batch."""
    from transformers import DynamicCache

    cache = DynamicCache()
    for index, layer in enumerate(static.layers):
        if torch.is_tensor(rows):
            picked = rows.to(layer.keys.device)
            keys, values = layer.keys.index_select(0, picked), layer.values.index_select(0, picked)
        else:
            keys, values = layer.keys[:rows], layer.values[:rows]
        cache.update(keys[:, :, :length].clone(), values[:, :, :length].clone(), index)
    return cache


def set_static_length(static, length: int) -> None:
    """Columns ``[0, length)`` of every layer count as written; the next forward writes from column ``length``
    (a rollback or a look-ahead drop is this, the keys beyond stay and the masks hide them). One fused operation for
    every layer's length (on a GPU one launch, not one per layer)."""
    lengths = [layer.cumulative_length for layer in static.layers]
    torch._foreach_zero_(lengths)
    torch._foreach_add_(lengths, int(length))


def static_select_rows(static, rows: torch.Tensor, length: int, start: int = 0) -> None:
    """Row ``i < len(rows)`` of ``static`` becomes its old row ``rows[i]`` (columns ``[start, length)``), in place:
    beam reordering and dropping rows without moving the tensors a compiled forward reads. ``start``: the columns
    before it are already equal in every pair of rows (a prompt's beams share its prompt's keys), so only the
    columns after are copied. Rows past ``len(rows)`` keep stale but finite keys (bucket padding: their outputs
    are dropped)."""
    columns = torch.arange(start, length, device=rows.device).expand(int(rows.numel()), -1)
    _move_static_columns(static, rows, columns, columns)


def static_keep_appended_tokens(static, prefix_length: int, source_rows: torch.Tensor,
                                appended_index: torch.Tensor, start: int = 0) -> None:
    """:func:`keep_appended_tokens` on a static cache, in place: row ``r`` becomes the ``prefix_length`` columns of
    row ``source_rows[r]`` followed by its appended column ``prefix_length + appended_index[r]``; the length is
    then ``prefix_length + 1``. ``start``: the columns before it are equal in each row and its source (a
    prompt's keys, shared by its beams) and are not copied, so a beam step moves only the generated columns."""
    device = source_rows.device
    columns = torch.arange(start, prefix_length + 1, device=device).expand(int(source_rows.numel()), -1)
    sources = torch.cat([columns[:, :-1], (prefix_length + appended_index.to(device))[:, None]], dim=1)
    _move_static_columns(static, source_rows, sources, columns)
    set_static_length(static, prefix_length + 1)


def _flat_positions(rows: torch.Tensor, columns: torch.Tensor, heads: int, capacity: int) -> torch.Tensor:
    """Flat indices of ``(rows[i], h, columns[i, j])`` for every head ``h`` in a ``[R, heads, capacity, D]`` tensor
    viewed as ``[R * heads * capacity, D]``: ``(row * heads + h) * capacity + column``, flattened."""
    head = torch.arange(heads, device=rows.device)[None, :, None]
    return ((rows[:, None, None] * heads + head) * capacity + columns[:, None, :]).reshape(-1)


def _move_static_columns(static, source_rows: torch.Tensor, sources: torch.Tensor, columns: torch.Tensor) -> None:
    """In every layer's keys and values, row ``i`` column ``columns[i, j]`` becomes the old row ``source_rows[i]``
    column ``sources[i, j]`` (all heads), in place.

    Each (row, head, column) is one row of the tensor viewed as ``[rows * heads * capacity, head_dim]``, so a tensor
    moves in one gather and one scatter, with the indices built once for all layers of one shape and device: on a
    GPU 2 launches per tensor, where a copy per column range and an indexed read of single columns take 4 to 5."""
    n = int(source_rows.numel())
    indices: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
    for layer in static.layers:
        for states in (layer.keys, layer.values):
            _, heads, capacity, dim = states.shape
            key = (heads, capacity, states.device)
            if key not in indices:  # once per shape and device (a model split over devices has a few)
                at = states.device
                indices[key] = (_flat_positions(source_rows.to(at), sources.to(at), heads, capacity),
                                _flat_positions(torch.arange(n, device=at), columns.to(at), heads, capacity))
            read, write = indices[key]
            if read.numel():
                flat = states.view(-1, dim)
                flat.index_copy_(0, write, flat.index_select(0, read))


@functools.lru_cache(maxsize=64)
def _padding_index(real: int, rows: int, device: torch.device) -> torch.Tensor:
    """``[0, 1, ..., real - 1, 0, ..., 0]`` (``rows`` long) on ``device``: the real rows, then copies of row 0.

    Built once per shape and device: a host tensor copied to a GPU at every step would make the host wait for
    every queued kernel (a blocking host-to-device copy synchronises the stream)."""
    return torch.cat([torch.arange(real, device=device), torch.zeros(rows - real, dtype=torch.long, device=device)])


def pad_step_rows(inputs: dict[str, Any], real: int, rows: int) -> dict[str, Any]:
    """One decode step's forward inputs with every per-row tensor padded from ``real`` to ``rows`` rows
    (copies of row 0): ``input_ids``, 2-D or M-RoPE ``[axes, R, 1]`` positions, token types, the 4-D mask
    (or a dict of them, one per attention kind). Positions given for one row and broadcast to every row
    are expanded to ``rows`` (the same values), so they do not make a graph of their own."""
    if rows == real:
        return inputs

    def pad(value: Any, key: str) -> Any:
        if isinstance(value, dict):
            return {k: pad(v, key) for k, v in value.items()}
        if not torch.is_tensor(value) or value.dim() == 0:
            return value
        if key == "position_ids" and value.dim() == 3 and value.shape[1] in (real, 1):
            return value.index_select(1, _padding_index(real, rows, value.device)) if value.shape[1] == real else \
                value.expand(-1, rows, -1).contiguous()
        if key == "position_ids" and value.dim() == 2 and value.shape[0] == 1:  # one row broadcast to every row
            return value.expand(rows, -1).contiguous()
        if value.shape[0] == real:
            return value.index_select(0, _padding_index(real, rows, value.device))
        return value

    return {key: (value if is_cache_key(key) else pad(value, key)) for key, value in inputs.items()}


def keep_output_rows(outputs, real: int, clone: bool):
    """``outputs`` with ``logits``/``hidden_states``/``attentions`` cut to the first ``real`` rows, and every
    output tensor copied when ``clone`` (a CUDA-graph replay overwrites its outputs)."""
    def cut(value: Any) -> Any:
        if torch.is_tensor(value):
            value = value[:real]
            return value.clone() if clone else value
        if isinstance(value, tuple):
            return tuple(cut(v) for v in value)
        return value

    for key in list(outputs.keys()):
        if key in ("logits", "hidden_states", "attentions"):
            outputs[key] = cut(outputs[key])
        elif clone and torch.is_tensor(outputs[key]):  # e.g. Qwen-VL's rope_deltas, kept for the next steps
            outputs[key] = outputs[key].clone()
    return outputs


def compiled_forward(model, mode: str | None) -> Callable:
    """``torch.compile(model.__call__, mode=mode, dynamic=False)``, built once per model and mode
    (transformers' own ``get_compiled_call`` does the same; ``"reduce-overhead"`` captures CUDA graphs)."""
    store = model.__dict__.setdefault("_medheval_compiled", {})
    if mode not in store:
        store[mode] = torch.compile(model.__call__, mode=mode, dynamic=False, fullgraph=False)
    return store[mode]


# -----------------------------------------------------------------------------------------------
# the generation loop's helpers
# -----------------------------------------------------------------------------------------------
# model kwargs a decode step's inputs are built without (see prepare_step_inputs)
DECODE_STEP_UNUSED = ("token_type_ids",)


def prepare_step_inputs(model, input_ids: torch.Tensor, model_kwargs: dict[str, Any], *, first: bool) -> dict[str, Any]:
    """The forward inputs of one decoding step, as ``generate``'s own loop builds them
    (``prepare_inputs_for_generation``): the whole prompt when ``first``, else the last token.

    After the first step the query is one generated (text) token, and Gemma 3 passes no ``token_type_ids`` to its
    forward then; but ``generate``'s helper still hands them to Gemma 3's mask builder for a static cache, which then
    overlays the image blocks (bidirectional attention inside an image) through ``vmap``: the same masks, since a text
    query is in no image block, at about 15 ms of host time a step on a 2-core CPU, where every other step of the
    loop takes about 1 ms. Those steps are built without :data:`DECODE_STEP_UNUSED` (the model kwargs keep them);
    ``tests/test_decoding_host_reads.py`` checks that the inputs are equal."""
    if not first:
        model_kwargs = {k: v for k, v in model_kwargs.items() if k not in DECODE_STEP_UNUSED}
    return model.prepare_inputs_for_generation(
        input_ids, next_sequence_length=None if first else 1, is_first_iteration=first, **model_kwargs
    )


def prefill_inputs(model, input_ids: torch.Tensor, *, cache, **model_kwargs: Any) -> dict[str, Any]:
    """The forward inputs of a prompt's prefill into ``cache`` (``prepare_inputs_for_generation``)."""
    return model.prepare_inputs_for_generation(input_ids, is_first_iteration=True, **cache_keyword(cache),
                                               **model_kwargs)


def update_model_kwargs(model, outputs, model_kwargs: dict[str, Any]) -> dict[str, Any]:
    """Model kwargs for the next step after ``outputs`` (cache, mask, positions, token types), as ``generate``
    advances them (``_update_model_kwargs_for_generation``)."""
    return model._update_model_kwargs_for_generation(outputs, model_kwargs, is_encoder_decoder=False)


def supports_logits_to_keep(model) -> bool:
    return bool(model._supports_logits_to_keep())


def generic_position_ids(attention_mask: torch.Tensor | None, input_ids: torch.Tensor) -> torch.Tensor:
    """As ``generate``: cumulative sum of the mask (0 on padding), or ``arange`` without a mask."""
    if attention_mask is None:
        return torch.arange(input_ids.shape[1], dtype=torch.long, device=input_ids.device).unsqueeze(0)
    position_ids = attention_mask.long().cumsum(-1) - 1
    return position_ids.masked_fill(attention_mask == 0, 0)


def prompt_position_ids(model, input_ids: torch.Tensor, attention_mask, inputs: dict) -> torch.Tensor:
    """The prompt's position ids as ``generate`` computes them: the model's own
    ``_prepare_position_ids_for_generation`` where it overrides the generic one (Qwen-VL's M-RoPE:
    ``[4, B, T]`` text + 3-D vision positions from ``image_grid_thw``/``mm_token_type_ids``),
    otherwise ``cumsum(mask) - 1``."""
    from transformers.generation.utils import GenerationMixin

    own = getattr(type(model), "_prepare_position_ids_for_generation", None)
    if own is None or own is GenerationMixin._prepare_position_ids_for_generation:
        return generic_position_ids(attention_mask, input_ids)
    mask = attention_mask if attention_mask is not None else torch.ones_like(input_ids)
    kwargs = {**inputs, "input_ids": input_ids, "attention_mask": mask}
    return model._prepare_position_ids_for_generation(input_ids, kwargs)


def processor_chain(processors) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """``processors(input_ids, scores)`` (a ``LogitsProcessorList``) with each processor's signature read once.

    The list reads every processor's signature with ``inspect`` at every call (about 0.1 ms per processor and
    step on a 2-core CPU: host time that a graph-replayed step on a GPU must also wait for);
    the chain reads them here, once per ``generate`` call, then calls ``p_n(ids, ... p_1(ids, scores))``.
    A processor that needs more than ``(input_ids, scores)`` keeps the list's own call (and its error: the
    loop passes nothing more).
    """
    from transformers import LogitsProcessorList

    if not isinstance(processors, LogitsProcessorList):
        return processors
    chain = list(processors)
    if any(len(inspect.signature(processor.__call__).parameters) > 2 for processor in chain):
        return processors

    def apply(input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        for processor in chain:
            scores = processor(input_ids, scores)
        return scores

    return apply


def pad_token_tensor(generation_config) -> torch.Tensor | None:
    """The prepared config's pad id as a tensor (``generate`` sets it), else from ``pad_token_id``."""
    pad = getattr(generation_config, "_pad_token_tensor", None)
    if pad is None and getattr(generation_config, "pad_token_id", None) is not None:
        pad = torch.tensor(generation_config.pad_token_id)
    return pad


def eos_token_tensor(generation_config) -> torch.Tensor | None:
    """The prepared config's EOS ids as a 1-D tensor (``generate`` sets it), or ``None``."""
    return getattr(generation_config, "_eos_token_tensor", None)


def max_length_criteria(max_length: int):
    from transformers.generation.stopping_criteria import MaxLengthCriteria

    return MaxLengthCriteria(max_length=max_length)


def decoder_only_output(*, sequences, scores=None, logits=None, cache=None):
    """What ``generate(return_dict_in_generate=True)`` returns for greedy/sampling."""
    from transformers.generation.utils import GenerateDecoderOnlyOutput

    return GenerateDecoderOnlyOutput(sequences=sequences, scores=scores, logits=logits, attentions=None,
                                     hidden_states=None, **cache_keyword(cache))


def beam_output(*, sequences, sequences_scores=None, beam_indices=None):
    """What ``generate(return_dict_in_generate=True)`` returns for beam search (no cache)."""
    from transformers.generation.utils import GenerateBeamDecoderOnlyOutput

    return GenerateBeamDecoderOnlyOutput(sequences=sequences, sequences_scores=sequences_scores, scores=None,
                                         logits=None, beam_indices=beam_indices, attentions=None,
                                         hidden_states=None, **cache_keyword(None))


def generate_entry() -> Callable:
    """``GenerationMixin.generate`` (for a Hub ``custom_generate/generate.py`` that calls back into it)."""
    from transformers import GenerationMixin

    return GenerationMixin.generate


# -----------------------------------------------------------------------------------------------
# attention interface
# -----------------------------------------------------------------------------------------------
def register_attention_function(name: str, compute: Callable) -> None:
    """Register attention implementation ``name``: transformers' calling convention unpacked into
    ``compute(module, query, key, value, additive_mask, scaling, dropout, softcap) -> (output, weights)``,
    with the eager mask builder (otherwise it would receive ``attention_mask=None`` and lose the causal and
    padding masks).

    Raises (at call time):
        MissingInternalError: the layer uses attention sinks, which ``compute`` does not implement.
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, eager_mask

    def attention(module, query, key, value, attention_mask, scaling, dropout=0.0, **kwargs):
        if getattr(module, "sinks", None) is not None or kwargs.get("s_aux") is not None:
            from medheval.decoding.visual_tokens import MissingInternalError

            raise MissingInternalError(
                f"{type(module).__name__} uses attention sinks, which medheval's eager attention does not implement"
            )
        return compute(module, query, key, value, attention_mask, scaling, dropout, kwargs.get("softcap"))

    AttentionInterface.register(name, attention)
    AttentionMaskInterface.register(name, eager_mask)


def text_attention_implementation(model) -> str | None:
    """The attention implementation the language model runs (``config._attn_implementation``)."""
    return model.config.get_text_config()._attn_implementation


def _text_config_key(model) -> str | None:
    """The sub-config key holding the language model's config (``"text_config"`` for LLaVA; ``None`` when
    the model's config is its text config)."""
    from medheval.decoding.visual_tokens import MissingInternalError

    text_config = model.config.get_text_config()
    if text_config is model.config:
        return None
    for key in getattr(model.config, "sub_configs", {}) or {}:
        if getattr(model.config, key, None) is text_config:
            return key
    raise MissingInternalError(
        f"{type(model).__name__}: cannot find which sub-config is the text config, to switch only the "
        "language model's attention implementation"
    )


def set_text_attention_implementation(model, implementation: str) -> None:
    """Switch the language model's attention implementation, and only its (the vision tower keeps its own);
    nothing happens when it already runs ``implementation``."""
    if text_attention_implementation(model) == implementation:
        return
    key = _text_config_key(model)
    model.set_attn_implementation(implementation if key is None else {key: implementation})


__all__ = [
    "DECODE_STEP_UNUSED",
    "ENCODED_IMAGES",
    "append_rows_left_padded",
    "beam_output",
    "cache_argument",
    "compiled_forward",
    "dynamic_from_static",
    "fill_static_cache",
    "keep_output_rows",
    "new_static_cache",
    "pad_step_rows",
    "static_refusal",
    "cache_in",
    "cache_keyword",
    "cache_length",
    "copy_selected_rows",
    "crop",
    "decoder_only_output",
    "eos_token_tensor",
    "first_layer_keys",
    "generate_entry",
    "generic_position_ids",
    "is_cache_key",
    "is_dynamic_cache",
    "is_full_length_cache",
    "is_plain_dynamic_cache",
    "is_user_cache",
    "join_refusal",
    "keep_appended_tokens",
    "set_static_length",
    "static_keep_appended_tokens",
    "static_select_rows",
    "layer_kinds",
    "layer_signature",
    "max_length_criteria",
    "new_cache",
    "non_full_layer_kinds",
    "output_cache",
    "pad_token_tensor",
    "pop_cache",
    "prefill_inputs",
    "processor_chain",
    "prepare_step_inputs",
    "prompt_position_ids",
    "register_attention_function",
    "repeat_rows",
    "reorder_rows",
    "select_rows",
    "set_text_attention_implementation",
    "supports_logits_to_keep",
    "text_attention_implementation",
    "update_model_kwargs",
    "with_cache",
]
