"""Where the image tokens are: found from ``input_ids`` and the model config, never hard-coded.

In transformers 5.x the processor of every LLaVA-family model expands each ``<image>``
placeholder into *all* the feature positions the model will fill: LLaVA-1.5's 576
patch tokens, LLaVA-NeXT's base + any-resolution tiles + row-newline tokens, the
frames of LLaVA-NeXT-Video / OneVision. So "which positions hold image features" is
exactly ``input_ids == config.image_token_id`` (plus ``video_token_id`` where the
model has one) — for every row, whatever the prompt template, padding or image size.

MedHEval's code instead hard-coded positions 34..610 of one prompt template
(``reference/medheval_repo.md`` §5); that breaks with any other template, with left
padding and with LLaVA-NeXT's variable token counts.
"""

from __future__ import annotations

from typing import Sequence

import torch


# The package's exceptions live here, in its lowest-level module, so every other module can
# import them without cycles; ``medheval.decoding`` re-exports them.
class MitigationError(ValueError):
    """A mitigation was asked for something it cannot do (bad setting, unsupported input or mode)."""


class MissingInternalError(MitigationError):
    """The model lacks an internal the mitigation needs (the message names it and what to do)."""


_IMAGE_ID_NAMES = ("image_token_id", "image_token_index")
_VIDEO_ID_NAMES = ("video_token_id", "video_token_index")


def _first_attr(config, names) -> int | None:
    for name in names:
        value = getattr(config, name, None)
        if value is not None:
            return int(value)
    return None


def visual_token_ids(config) -> tuple[int, ...]:
    """The placeholder ids that stand for visual features (image, and video where present).

    Raises:
        MissingInternalError: the config has no ``image_token_id``/``image_token_index``.
    """
    image_id = _first_attr(config, _IMAGE_ID_NAMES)
    if image_id is None:
        raise MissingInternalError(
            f"{type(config).__name__} has no image_token_id/image_token_index: the mitigation needs to know "
            "which input positions hold image features (LLaVA-family models in transformers 5 set it)"
        )
    ids = [image_id]
    video_id = _first_attr(config, _VIDEO_ID_NAMES)
    if video_id is not None and video_id != image_id:
        ids.append(video_id)
    return tuple(ids)


def image_token_mask(input_ids: torch.Tensor, config) -> torch.BoolTensor:
    """``[B, T]`` boolean mask of the positions that hold image (or video) features."""
    mask = torch.zeros_like(input_ids, dtype=torch.bool)
    for token_id in visual_token_ids(config):
        mask |= input_ids == token_id
    return mask


def image_spans(mask: torch.Tensor) -> list[list[tuple[int, int]]]:
    """Per row, the ``[start, end)`` runs of ``True`` in a ``[B, T]`` mask (one run per image)."""
    spans: list[list[tuple[int, int]]] = []
    padded = torch.nn.functional.pad(mask.to(torch.int8), (1, 1))
    change = padded[:, 1:] - padded[:, :-1]
    for row in range(mask.shape[0]):
        starts = (change[row] == 1).nonzero().flatten().tolist()
        ends = (change[row] == -1).nonzero().flatten().tolist()
        spans.append(list(zip(starts, ends)))
    return spans


def remove_positions(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    remove: torch.Tensor,
    pad_token_id: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Drop the positions where ``remove`` is True and left-pad the rows again.

    Padding positions (``attention_mask == 0``) are dropped too, so the result is the
    minimal left-padded batch holding each row's remaining tokens in order.

    Returns:
        ``(input_ids, attention_mask)``, both ``[B, T']`` with ``T'`` the longest kept row.
    """
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    keep = (~remove) & attention_mask.bool()
    lengths = keep.sum(dim=1)
    width = max(int(lengths.max().item()) if lengths.numel() else 0, 1)
    out_ids = input_ids.new_full((input_ids.shape[0], width), pad_token_id)
    out_mask = attention_mask.new_zeros((input_ids.shape[0], width))
    for row in range(input_ids.shape[0]):
        kept = input_ids[row][keep[row]]
        n = kept.shape[0]
        if n:
            out_ids[row, width - n :] = kept
            out_mask[row, width - n :] = 1
    return out_ids, out_mask


def left_pad(rows: Sequence[Sequence[int]], pad_token_id: int,
             device: torch.device | str | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows of token ids as a left-padded ``[B, T]`` batch (``T`` the longest row) and its attention mask."""
    width = max((len(row) for row in rows), default=0)
    input_ids = torch.full((len(rows), width), int(pad_token_id), dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for index, row in enumerate(rows):
        if len(row):
            input_ids[index, width - len(row):] = torch.as_tensor([int(t) for t in row], dtype=torch.long)
            attention_mask[index, width - len(row):] = 1
    return input_ids.to(device), attention_mask.to(device)


def drop_image_tokens(
    input_ids: torch.Tensor, attention_mask: torch.Tensor | None, config, pad_token_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The text-only view of a prompt batch: every image-feature position removed, rows left-padded.

    This is M3ID's / PAI's "unconditioned" input (the same prompt without the image).
    """
    return remove_positions(input_ids, attention_mask, image_token_mask(input_ids, config), pad_token_id)


__all__ = [
    "MitigationError",
    "MissingInternalError",
    "visual_token_ids", "image_token_mask", "image_spans", "remove_positions", "left_pad", "drop_image_tokens"]
