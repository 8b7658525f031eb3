r"""Decoding streams: several views of the same batch decoded in lock-step.

A contrastive mitigation scores each next token from two (or more) forward passes:
the clean prompt and a *contrast* view of it (VCD: the same tokens with a noised
image; M3ID/PAI: the prompt without its image; AvisC: blind image tokens only;
DAMRO: only the outlier image tokens). Every stream receives the *same* chosen token
at every step; only its prompt differs.

- :class:`Stream` describes one view: its prompt ``input_ids``/``attention_mask`` and the
  inputs used only at prefill (``pixel_values``, ``image_sizes``, ``mm_encoder_outputs``,
  ``inputs_embeds``...).
- :class:`StreamGroup` runs streams in one forward: their rows are concatenated along the
  batch (stream ``i`` holds rows ``[iB, (i+1)B)``) and share **one KV cache**.

One forward per step (2B rows) for every two-stream method:

- a stream whose prompt has exactly the clean prompt's tokens (VCD, DAMRO with zeros) is
  prefilled *with* the clean stream, in the same group;
- a stream with another prompt (M3ID/PAI's text-only prompt, DAMRO's ``"drop"``) or one built
  after the clean prefill (AvisC's blind-token stream) is prefilled in its own forward, at its
  own length — no compute spent on padding — and then :meth:`StreamGroup.join`\ s the clean
  group: its cache, mask and positions are left-padded to the clean length and its rows
  appended. Padded key positions carry zero keys/values and mask 0, so they get exactly zero
  attention weight; the position ids of the real tokens are unchanged (``cumsum(mask) - 1``, as
  ``generate``). Each row's logits are therefore those of the stream decoded alone (up to
  float rounding of a wider reduction).

The join covers what the supported families need: full and sliding-window layers of
transformers' ``DynamicCache`` (Gemma 3: a sliding layer keeps the last ``W - 1`` keys of each row,
right-aligned, so the shorter stream's window is left-padded to the clean window), 2-D and
multi-dimensional position ids (Qwen-VL's ``[4, B, T]`` M-RoPE positions, padded on the last axis)
and the per-token type ids of :data:`TOKEN_TYPE_INPUTS` (padded with 0, "text").
:meth:`StreamGroup.join_refusal` says when a stream must keep its own cache and forward: any other
cache (static, quantized, offloaded), a contrast prompt longer than the clean one, or another
per-row input.

A stream prefilled in its own forward gets the per-token type ids of its own prompt
(:func:`token_type_inputs`): the clean ones when its tokens are the clean prompt's (AvisC), else
``1`` at its image tokens and ``0`` elsewhere (a text-only prompt: all ``0``).

The group feeds the model and advances its kwargs with the same helpers ``generate``'s own
sampling loop uses (through :mod:`medheval.decoding.internals`, the one module that names them), so
positions, masks and caches behave exactly as in ``generate``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from medheval.decoding import internals
from medheval.decoding.internals import generic_position_ids as _position_ids
from medheval.decoding.internals import prompt_position_ids
from medheval.decoding.visual_tokens import MitigationError, image_token_mask

# Inputs consumed only by the first forward (the prompt); later steps feed one token.
PREFILL_ONLY_INPUTS = (
    "pixel_values",
    "image_sizes",
    "pixel_mask",
    internals.ENCODED_IMAGES,
    "inputs_embeds",
    "pixel_values_videos",
    "image_grid_thw",
    "video_grid_thw",
)


@dataclass
class Stream:
    """One view of the batch.

    Attributes:
        name: key of this stream's logits in the per-step ``logits`` dict (``"main"`` is the
            clean stream).
        input_ids: ``[B, T]`` prompt, left-padded.
        attention_mask: ``[B, T]`` (``None`` means all ones).
        inputs: model inputs used only at prefill (``pixel_values``, ``image_sizes``,
            ``mm_encoder_outputs``, ``inputs_embeds``...).
        share_batch: ``None`` (default) decodes the stream in the clean stream's batch and
            cache: prefilled together when the prompt tokens and mask are identical, otherwise
            prefilled alone and joined after the first step; ``False`` keeps its own cache and
            forward at every step (the two-pass path).
    """

    name: str
    input_ids: torch.Tensor
    attention_mask: torch.Tensor | None = None
    inputs: dict[str, Any] = field(default_factory=dict)
    share_batch: bool | None = None

    @property
    def batch_size(self) -> int:
        return int(self.input_ids.shape[0])

    def same_prompt_as(self, other: "Stream") -> bool:
        if self.input_ids.shape != other.input_ids.shape or not torch.equal(self.input_ids, other.input_ids):
            return False
        mine = self.attention_mask if self.attention_mask is not None else torch.ones_like(self.input_ids)
        theirs = other.attention_mask if other.attention_mask is not None else torch.ones_like(other.input_ids)
        return torch.equal(mine.to(theirs.device), theirs)

    def replace(self, name: str, **inputs: Any) -> "Stream":
        """A stream with the same prompt and some prefill inputs replaced (e.g. noised ``pixel_values``)."""
        return Stream(name=name, input_ids=self.input_ids, attention_mask=self.attention_mask,
                      inputs={**self.inputs, **inputs}, share_batch=None)


# encoder outputs that are lists over decoder layers of per-image features (Qwen3-VL's DeepStack):
# streams are joined layer by layer, never end to end
PER_LAYER_FEATURES = ("deepstack_features",)


def _concat_per_layer(values: Sequence[Any], what: str) -> Any:
    """``[[a_0, a_1, ...], [b_0, b_1, ...]] -> [concat(a_0, b_0), concat(a_1, b_1), ...]`` (one entry per layer)."""
    if values[0] is None or len(values) == 1:
        return concat_batch(values, what)
    if any(v is None or len(v) != len(values[0]) for v in values):
        raise MitigationError(f"streams sharing a batch disagree on the number of layers of {what!r}")
    return [concat_batch([v[layer] for v in values], f"{what}[{layer}]") for layer in range(len(values[0]))]


def concat_batch(values: Sequence[Any], what: str = "input") -> Any:
    """Concatenate per-stream values along the batch: tensors on dim 0, lists end to end,
    dicts and ``ModelOutput``s key by key (the per-layer lists of :data:`PER_LAYER_FEATURES` layer by
    layer); ``None`` stays ``None``; equal plain values pass."""
    first = values[0]
    if len(values) == 1:
        return first
    given = [v is not None for v in values]
    if any(given) and not all(given):
        raise MitigationError(f"streams sharing a batch disagree on whether {what!r} is given")
    if first is None:
        return None
    if torch.is_tensor(first):
        return torch.cat([v.to(first.device) for v in values], dim=0)
    if isinstance(first, (list, tuple)):
        joined = [item for v in values for item in v]
        return type(first)(joined) if isinstance(first, tuple) else joined
    if isinstance(first, dict):  # also ModelOutput (an OrderedDict)
        keys = list(first.keys())
        merged = {k: (_concat_per_layer([v[k] for v in values], f"{what}.{k}") if k in PER_LAYER_FEATURES
                      else concat_batch([v[k] for v in values], f"{what}.{k}")) for k in keys}
        try:
            return type(first)(**merged)
        except TypeError:
            return type(first)(merged)
    if all(v == first for v in values):
        return first
    raise MitigationError(f"cannot batch {what!r} of type {type(first).__name__} across streams")


# per-token inputs that mark each prompt position's modality (Gemma 3: 1 = image token, for its
# bidirectional image attention; Qwen-VL: 1 = image, 2 = video, for M-RoPE); generate extends them per step
TOKEN_TYPE_INPUTS = ("token_type_ids", "mm_token_type_ids")

# what join() pads and concatenates (or what holds no per-row data); the cache, under any name, too
_JOINED_KWARGS = ("attention_mask", "position_ids", "use_cache", "logits_to_keep", *TOKEN_TYPE_INPUTS)


def token_type_inputs(model, main: "Stream", stream: "Stream", clean_inputs: dict[str, Any]) -> dict[str, Any]:
    """The per-token type ids (:data:`TOKEN_TYPE_INPUTS`) of ``stream``'s own prompt.

    The clean values when ``stream`` has the clean prompt's tokens; otherwise ``1`` at its image
    tokens and ``0`` elsewhere (padding included), the processors' convention for image-only prompts.

    Raises:
        MitigationError: the clean prompt has other types (video tokens) and ``stream`` another prompt.
    """
    given = {k: clean_inputs[k] for k in TOKEN_TYPE_INPUTS if torch.is_tensor(clean_inputs.get(k))}
    if not given or stream.same_prompt_as(main):
        return dict(given)
    out = {}
    for key, value in given.items():
        if bool((value > 1).any()):
            raise MitigationError(
                f"stream {stream.name!r} has another prompt than the clean one, and {key} marks video tokens "
                "(type > 1): contrast prompts of video inputs are not supported"
            )
        image = image_token_mask(stream.input_ids, model.config)
        out[key] = image.to(device=value.device, dtype=value.dtype)
    return out


class StreamGroup:
    """Streams decoded in one forward (rows concatenated along the batch) with one KV cache.

    Attributes:
        streams: the streams, in row order (stream ``i`` holds rows ``[i*B, (i+1)*B)``).
        input_ids: ``[S*B, T]`` prompt + generated tokens of all rows.
        image_mask: ``[S*B, T_prompt]`` True at image-feature positions of the prompt
            (``None`` when the config has no image token id).
        model_kwargs: what the next forward receives (mask, positions, cache, prefill inputs).
    """

    def __init__(self, model, streams: Sequence[Stream], *, cache=None, common_kwargs: dict | None = None):
        if not streams:
            raise MitigationError("a stream group needs at least one stream")
        self.model = model
        self.streams = list(streams)
        self.batch_size = self.streams[0].batch_size
        for stream in self.streams:
            if stream.batch_size != self.batch_size:
                raise MitigationError(
                    f"stream {stream.name!r} has batch {stream.batch_size}, expected {self.batch_size}"
                )
        self.names = [s.name for s in self.streams]
        self.input_ids = concat_batch([s.input_ids for s in self.streams], "input_ids")
        masks = [s.attention_mask for s in self.streams]
        if all(m is None for m in masks):
            attention_mask = None
        else:
            attention_mask = concat_batch(
                [m if m is not None else torch.ones_like(s.input_ids) for m, s in zip(masks, self.streams)],
                "attention_mask",
            )
            if bool((attention_mask == 1).all()):  # generate drops an all-ones mask too
                attention_mask = None
        self.prompt_length = int(self.input_ids.shape[1])
        try:
            self.image_mask = image_token_mask(self.input_ids, model.config)
        except MitigationError:
            self.image_mask = None

        prefill_keys = sorted({k for s in self.streams for k in s.inputs})
        prefill = {}
        for key in prefill_keys:
            missing = [s.name for s in self.streams if key not in s.inputs]
            if missing:
                raise MitigationError(f"streams {missing} sharing a batch lack prefill input {key!r}")
            value = concat_batch([s.inputs[key] for s in self.streams], key)
            if value is not None and not (isinstance(value, dict) and not value):
                prefill[key] = value
        self._prefill_keys = set(prefill)

        common = dict(common_kwargs or {})
        if len(self.streams) > 1:  # per-row inputs (token_type_ids...) of streams with the clean prompt
            for key, value in common.items():
                if torch.is_tensor(value) and value.dim() >= 1 and value.shape[0] == self.batch_size:
                    common[key] = value.repeat(len(self.streams), *([1] * (value.dim() - 1)))
        if cache is None:
            cache = internals.new_cache(model)
        self.model_kwargs: dict[str, Any] = internals.with_cache({
            **common,
            **prefill,
            "attention_mask": attention_mask,
            "position_ids": prompt_position_ids(model, self.input_ids, attention_mask, {**common, **prefill}),
            "use_cache": True,
        }, cache)
        if internals.supports_logits_to_keep(model) and "logits_to_keep" not in self.model_kwargs:
            self.model_kwargs["logits_to_keep"] = 1
        self.prefilled = False
        self.static = None  # a compiled.StaticStep once the decode steps run on a static cache
        self._static_columns = None  # image_columns at the static cache's capacity (see use_static)

    def use_static(self, step) -> None:
        """Run the next steps through ``step`` (:class:`medheval.decoding.compiled.StaticStep`), on its cache."""
        self.static = step
        internals.with_cache(self.model_kwargs, step.cache)
        if self.image_mask is not None:  # built once, at the bucket's shape: read inside the compiled forward,
            self._static_columns = self.image_columns(step.capacity)  # a tensor growing per step would recompile

    @property
    def cache(self):
        return internals.cache_in(self.model_kwargs)

    def rows(self, name: str) -> slice:
        """Rows of stream ``name`` in this group's batch."""
        index = self.names.index(name)
        return slice(index * self.batch_size, (index + 1) * self.batch_size)

    def image_columns(self, kv_length: int) -> torch.Tensor | None:
        """``[S*B, kv_length]`` True on the key positions that hold image features.

        The keys are the *last* ``kv_length`` positions of the sequence fed so far: all of it for a
        full cache, only the window for a sliding-window layer (Gemma 3). A longer ``kv_length``
        (a static cache's capacity) is padded on the right, and a static step's padding rows copy row 0.
        """
        held = self._static_columns  # read first: a compiled step guards only on this bucket-shaped tensor
        if held is not None and held.shape[-1] == kv_length:
            return held
        if self.image_mask is None:
            return None
        mask = self.image_mask
        total = max(int(self.input_ids.shape[1]), int(mask.shape[1]))
        mask = torch.nn.functional.pad(mask, (0, total - mask.shape[1]), value=False)
        if kv_length > total:
            mask = torch.nn.functional.pad(mask, (0, kv_length - total), value=False)
        else:
            mask = mask[:, total - kv_length:]
        if self.static is not None and mask.shape[0] < self.static.rows:  # the static step's padding rows
            mask = torch.cat([mask, mask[:1].expand(self.static.rows - mask.shape[0], -1)], dim=0)
        return mask

    def forward(self, **extra: Any):
        """One forward: the whole prompt on the first call, then the last token."""
        model = self.model
        kwargs = dict(self.model_kwargs)
        if self.prefilled:
            for key in self._prefill_keys:
                kwargs.pop(key, None)
        inputs = internals.prepare_step_inputs(model, self.input_ids, kwargs, first=not self.prefilled)
        inputs.update(extra)
        if self.static is not None:
            outputs = self.static(inputs)
        else:
            outputs = model(**inputs, return_dict=True)
        self.model_kwargs = internals.update_model_kwargs(model, outputs, self.model_kwargs)
        if not self.prefilled:
            for key in self._prefill_keys:
                self.model_kwargs.pop(key, None)
            self.prefilled = True
        return outputs

    def append(self, next_tokens: torch.Tensor) -> None:
        """Feed the chosen ``[B]`` tokens to every stream of the group."""
        tokens = next_tokens.to(self.input_ids.device).repeat(len(self.streams))
        self.input_ids = torch.cat([self.input_ids, tokens[:, None]], dim=-1)

    def join_refusal(self, other: "StreamGroup") -> str | None:
        """Why ``other`` cannot :meth:`join` this group (``None`` if it can)."""
        if not (self.prefilled and other.prefilled):
            return "both groups must be prefilled"
        if other.batch_size != self.batch_size:
            return f"batch {other.batch_size} != {self.batch_size}"
        if other.input_ids.shape[1] > self.input_ids.shape[1]:
            return "its prompt is longer than the clean prompt"
        for group in (self, other):
            reason = internals.join_refusal(group.cache, int(group.input_ids.shape[1]) - 1)
            if reason is not None:
                return reason
        if internals.layer_signature(self.cache) != internals.layer_signature(other.cache):
            return "caches with different layer types or windows"
        positions = [self.model_kwargs.get("position_ids"), other.model_kwargs.get("position_ids")]
        if all(p is not None for p in positions) and positions[0].shape[:-2] != positions[1].shape[:-2]:
            return f"position ids of shapes {tuple(positions[0].shape)} and {tuple(positions[1].shape)}"
        if any(p is not None and p.dim() > 2 for p in positions) and any(p is None for p in positions):
            return "multi-dimensional position ids on one side only"
        for key in TOKEN_TYPE_INPUTS:
            if (self.model_kwargs.get(key) is None) != (other.model_kwargs.get(key) is None):
                return f"{key} is given to one group only"
        for key in set(self.model_kwargs) | set(other.model_kwargs):
            if key in _JOINED_KWARGS or internals.is_cache_key(key):
                continue
            mine, theirs = self.model_kwargs.get(key), other.model_kwargs.get(key)
            if torch.is_tensor(mine) or torch.is_tensor(theirs) or isinstance(mine, (dict, list, tuple)) or isinstance(
                theirs, (dict, list, tuple)
            ):
                return f"per-row input {key!r} cannot be joined"
            if mine != theirs:
                return f"input {key!r} differs ({mine!r} != {theirs!r})"
        return None

    def join(self, other: "StreamGroup", pad_token_id: int) -> None:
        """Append the streams of the prefilled group ``other`` to this one (one forward, one cache from now on).

        ``other`` is left-padded to this group's length ``T``: ``d = T - T_other`` columns of zero
        keys/values in every cache layer, attention-mask 0, position id 0 and ``pad_token_id``.
        Its real tokens keep their positions and attend to exactly what they attended to before.

        Raises:
            MitigationError: :meth:`join_refusal` gives a reason.
        """
        reason = self.join_refusal(other)
        if reason is not None:
            raise MitigationError(f"streams {other.names} cannot join {self.names}: {reason}")
        pad = int(self.input_ids.shape[1] - other.input_ids.shape[1])

        def left(tensor: torch.Tensor, value=0) -> torch.Tensor:
            return torch.nn.functional.pad(tensor, (pad, 0), value=value) if pad else tensor

        internals.append_rows_left_padded(self.cache, other.cache)
        masks = [self.model_kwargs.get("attention_mask"), other.model_kwargs.get("attention_mask")]
        if pad or any(m is not None for m in masks):
            mine = masks[0] if masks[0] is not None else torch.ones_like(self.input_ids)
            theirs = masks[1] if masks[1] is not None else torch.ones_like(other.input_ids)
            self.model_kwargs["attention_mask"] = torch.cat([mine, left(theirs.to(mine.dtype))], dim=0)
        positions = [self.model_kwargs.get("position_ids"), other.model_kwargs.get("position_ids")]
        if any(p is not None for p in positions):
            mine = positions[0] if positions[0] is not None else _position_ids(masks[0], self.input_ids)
            theirs = positions[1] if positions[1] is not None else _position_ids(masks[1], other.input_ids)
            rows = mine.dim() - 2  # the batch axis: 0 for [B, T], 1 for M-RoPE's [axes, B, T]
            mine = mine.expand(*mine.shape[:-2], self.input_ids.shape[0], -1)
            theirs = theirs.expand(*theirs.shape[:-2], other.input_ids.shape[0], -1)
            self.model_kwargs["position_ids"] = torch.cat([mine, left(theirs)], dim=rows)
        for key in TOKEN_TYPE_INPUTS:
            if self.model_kwargs.get(key) is not None:
                theirs = other.model_kwargs[key].to(self.model_kwargs[key])
                self.model_kwargs[key] = torch.cat([self.model_kwargs[key], left(theirs)], dim=0)
        self.input_ids = torch.cat([self.input_ids, left(other.input_ids, pad_token_id)], dim=0)
        if self.image_mask is not None:  # both or neither: the same config
            self.image_mask = torch.cat([self.image_mask, left(other.image_mask, False)], dim=0)
        self.streams += other.streams
        self.names += other.names


__all__ = ["Stream", "StreamGroup", "concat_batch", "token_type_inputs", "PREFILL_ONLY_INPUTS", "TOKEN_TYPE_INPUTS"]
