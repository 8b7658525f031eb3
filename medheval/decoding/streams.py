"""Decoding streams: several views of the same batch decoded in lock-step.

A contrastive mitigation scores each next token from two (or more) forward passes:
the clean prompt and a *contrast* view of it (VCD: the same tokens with a noised
image; M3ID/PAI: the prompt without its image; AvisC: blind image tokens only;
DAMRO: only the outlier image tokens). Every stream receives the *same* chosen token
at every step; only its prompt differs.

- :class:`Stream` describes one view: its prompt ``input_ids``/``attention_mask`` and the
  inputs used only at prefill (``pixel_values``, ``image_sizes``, ``mm_encoder_outputs``,
  ``inputs_embeds``...).
- :class:`StreamGroup` runs streams in one forward. Streams whose prompt has exactly the
  clean prompt's tokens (VCD, AvisC) **share one batch and one cache** with the clean
  stream: their rows are concatenated along the batch (2B rows, one KV cache), which
  beats two separate passes. A stream of another length (text-only, token-pruned) gets
  its **own** group and cache.

The group feeds the model through ``model.prepare_inputs_for_generation`` and advances
with ``model._update_model_kwargs_for_generation``, the same helpers ``generate``'s own
sampling loop uses, so positions, masks and caches behave exactly as in ``generate``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from medheval.decoding.visual_tokens import MitigationError, image_token_mask

# Inputs consumed only by the first forward (the prompt); later steps feed one token.
PREFILL_ONLY_INPUTS = (
    "pixel_values",
    "image_sizes",
    "pixel_mask",
    "mm_encoder_outputs",
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
        share_batch: ``None`` (default) shares the clean stream's batch and cache when the
            prompt tokens and mask are identical; ``False`` forces a separate cache.
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


def concat_batch(values: Sequence[Any], what: str = "input") -> Any:
    """Concatenate per-stream values along the batch: tensors on dim 0, lists end to end,
    dicts and ``ModelOutput``s key by key; ``None`` stays ``None``; equal plain values pass."""
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
        merged = {k: concat_batch([v[k] for v in values], f"{what}.{k}") for k in keys}
        try:
            return type(first)(**merged)
        except TypeError:
            return type(first)(merged)
    if all(v == first for v in values):
        return first
    raise MitigationError(f"cannot batch {what!r} of type {type(first).__name__} across streams")


def _position_ids(attention_mask: torch.Tensor | None, input_ids: torch.Tensor) -> torch.Tensor:
    """As ``generate``: cumulative sum of the mask (0 on padding), or ``arange`` without a mask."""
    if attention_mask is None:
        return torch.arange(input_ids.shape[1], dtype=torch.long, device=input_ids.device).unsqueeze(0)
    position_ids = attention_mask.long().cumsum(-1) - 1
    return position_ids.masked_fill(attention_mask == 0, 0)


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

        if cache is None:
            from transformers import DynamicCache

            cache = DynamicCache(config=model.config)
        self.model_kwargs: dict[str, Any] = {
            **(common_kwargs or {}),
            **prefill,
            "attention_mask": attention_mask,
            "position_ids": _position_ids(attention_mask, self.input_ids),
            "past_key_values": cache,
            "use_cache": True,
        }
        if model._supports_logits_to_keep() and "logits_to_keep" not in self.model_kwargs:
            self.model_kwargs["logits_to_keep"] = 1
        self.prefilled = False

    @property
    def cache(self):
        return self.model_kwargs.get("past_key_values")

    def rows(self, name: str) -> slice:
        """Rows of stream ``name`` in this group's batch."""
        index = self.names.index(name)
        return slice(index * self.batch_size, (index + 1) * self.batch_size)

    def image_columns(self, kv_length: int) -> torch.Tensor | None:
        """``[S*B, kv_length]`` True on the key positions that hold image features."""
        if self.image_mask is None:
            return None
        mask = self.image_mask
        if kv_length > mask.shape[1]:
            mask = torch.nn.functional.pad(mask, (0, kv_length - mask.shape[1]), value=False)
        return mask[:, :kv_length]

    def forward(self, **extra: Any):
        """One forward: the whole prompt on the first call, then the last token."""
        model = self.model
        kwargs = dict(self.model_kwargs)
        if self.prefilled:
            for key in self._prefill_keys:
                kwargs.pop(key, None)
        inputs = model.prepare_inputs_for_generation(
            self.input_ids,
            next_sequence_length=1 if self.prefilled else None,
            is_first_iteration=not self.prefilled,
            **kwargs,
        )
        inputs.update(extra)
        outputs = model(**inputs, return_dict=True)
        self.model_kwargs = model._update_model_kwargs_for_generation(
            outputs, self.model_kwargs, is_encoder_decoder=False
        )
        if not self.prefilled:
            for key in self._prefill_keys:
                self.model_kwargs.pop(key, None)
            self.prefilled = True
        return outputs

    def append(self, next_tokens: torch.Tensor) -> None:
        """Feed the chosen ``[B]`` tokens to every stream of the group."""
        tokens = next_tokens.to(self.input_ids.device).repeat(len(self.streams))
        self.input_ids = torch.cat([self.input_ids, tokens[:, None]], dim=-1)


__all__ = ["Stream", "StreamGroup", "concat_batch", "PREFILL_ONLY_INPUTS"]
