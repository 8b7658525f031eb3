"""Contrast views that mask chosen image tokens (AvisC, DAMRO).

Both methods contrast the clean stream with the *same prompt* in which only some image
tokens keep their features: AvisC keeps its "blind" (over-attended) tokens, DAMRO the
vision encoder's outlier patches. The upstream code wrote zeros into ``inputs_embeds`` at
hard-coded positions after the projector; here the same is done through the model's own
input path:

1. :func:`encode_images` runs the image encoder once, as ``generate`` itself does before
   prefill (``base_model.get_image_features``), and hands the clean stream the result as
   ``mm_encoder_outputs``, so the vision tower is not run a second time for the contrast view;
2. the contrast view gets a copy of those features in which the rows of the masked tokens
   are replaced (:func:`mask_features`). The model scatters feature row ``i`` into the
   ``i``-th image-token position of the batch (row-major), so replacing a feature row *is*
   replacing that position's input embedding. :func:`feature_keep_from_positions` maps a
   per-position choice to feature rows;
3. :func:`masked_image_stream` builds the stream. Masking schemes:

   - ``"zeros"`` (the upstream default), ``"ones"``: the masked rows become 0 / 1;
   - ``"noise"``: the masked rows become standard normal noise, drawn per image from a
     generator seeded with 0 (the same image gets the same noise in any batch);
   - ``"drop"``: the masked image tokens are removed from the prompt (rows re-left-padded),
     as DAMRO's official code does; this view is then prefilled at its own (shorter) length.
     Refused where ``image_grid_thw`` fixes each image's token count (Qwen-VL: its M-RoPE
     positions are laid out on the ``t × h × w`` grid, which a subset of tokens does not fill).

   The first three keep the prompt tokens, so the view is prefilled in the clean stream's batch
   when it is built before the prefill (DAMRO); otherwise (``"drop"``, or AvisC's view built
   after the clean prefill) it is prefilled alone and then joins the clean batch and cache.
   Either way every later step is one forward over 2B rows.

**DeepStack (Qwen3-VL).** Qwen3-VL's ``get_image_features`` also returns ``deepstack_features``:
a list over the DeepStack layers ``d`` of per-image ``[tokens, hidden]`` tensors ``D_d``, and the
first decoder layers add them to the hidden states at the image-token positions,
``h_{d}[p_i] += D_d[i]`` (feature row ``i`` ↔ ``i``-th image-token position, as for the main
features). The clean stream gets them back unchanged (it stays plain ``generate``). A masked token
must carry no image information, so in the masked view its DeepStack rows are

- ``0`` (no injection) for ``"zeros"``, ``"ones"`` and ``"noise"`` alike — the scheme fills the
  *input embedding* ``E[p_i]`` only: ``E'[p_i] = fill``, ``D'_d[i] = 0``;
- dropped together with the token for ``"drop"``;

and the kept (blind / outlier) tokens keep their rows ``D_d[i]`` in every layer.
"""

from __future__ import annotations

import inspect
from typing import Any, Sequence

import torch

from medheval.decoding import internals
from medheval.decoding.loop import DecodingContext
from medheval.decoding.streams import Stream
from medheval.decoding.visual_tokens import (
    MissingInternalError,
    MitigationError,
    image_token_mask,
    remove_positions,
)

MASKING_SCHEMES = ("zeros", "ones", "noise", "drop")
NOISE_SEED = 0


def check_masking_scheme(method: str, scheme: str) -> str:
    scheme = str(scheme).lower()
    if scheme not in MASKING_SCHEMES:
        raise MitigationError(f"{method} masking_scheme must be one of {list(MASKING_SCHEMES)}, got {scheme!r}")
    return scheme


def check_drop_supported(ctx: DecodingContext, method: str, scheme: str) -> None:
    """Refuse ``"drop"`` on models whose image-token count is fixed by ``image_grid_thw`` (Qwen-VL).

    Their M-RoPE positions are computed from the grid and the per-token types; with tokens
    dropped, the image no longer fills its ``t × h × w`` grid and the model cannot position it.
    """
    if scheme == "drop" and ctx.main.inputs.get("image_grid_thw") is not None:
        raise MitigationError(
            f"{method} masking_scheme='drop' on {type(ctx.model).__name__}: its M-RoPE positions come from "
            "image_grid_thw, which a prompt with image tokens removed no longer matches; use masking_scheme='zeros'"
        )


def image_encoder(model, method: str):
    """``model.base_model.get_image_features`` (what ``generate`` uses to pre-encode images)."""
    base = getattr(model, "base_model", model)
    encoder = getattr(base, "get_image_features", None) or getattr(model, "get_image_features", None)
    if encoder is None:
        raise MissingInternalError(
            f"{method} needs get_image_features() on {type(model).__name__} (LLaVA-family models in transformers 5 "
            "have it) to build its masked-image view"
        )
    return encoder


def has_image_inputs(ctx: DecodingContext) -> bool:
    inputs = ctx.main.inputs
    encoded = inputs.get(internals.ENCODED_IMAGES) or {}
    return inputs.get("pixel_values") is not None or encoded.get("image") is not None


def encode_images(ctx: DecodingContext, method: str) -> list[torch.Tensor]:
    """The clean stream's image features (one ``[tokens, hidden]`` tensor per image), encoded once.

    With raw ``pixel_values`` the images are encoded here exactly as ``generate`` pre-encodes
    them, and the clean stream's ``pixel_values`` (and the encoder's other inputs, e.g.
    ``image_sizes``) are replaced by ``mm_encoder_outputs``; already encoded
    ``mm_encoder_outputs`` are used as they are. Qwen3-VL's ``deepstack_features`` travel with
    the features in the encoder's own output class, so the clean stream computes what it
    computes from ``pixel_values`` (see the module docstring).

    Raises:
        MissingInternalError: no image inputs, or the model has no ``get_image_features``.
    """
    from transformers.modeling_outputs import BaseModelOutputWithPooling

    inputs = ctx.main.inputs
    encoded = inputs.get(internals.ENCODED_IMAGES) or {}
    if encoded.get("image") is not None:
        ctx.state["image_features_as_tensor"] = torch.is_tensor(encoded["image"].pooler_output)
        return list(encoded["image"].pooler_output)
    if inputs.get("pixel_values") is None:
        raise MissingInternalError(
            f"{method} needs the prompt's images: pass the processor's pixel_values (or mm_encoder_outputs) to "
            "generate; prompts given only as inputs_embeds cannot be masked by image token"
        )
    encoder = image_encoder(ctx.model, method)
    names = [n for n in inspect.signature(encoder).parameters if n != "kwargs" and n in inputs]
    with torch.no_grad():
        output = encoder(**{n: inputs[n] for n in names}, return_dict=True)
    ctx.state["image_features_as_tensor"] = torch.is_tensor(output.pooler_output)
    features = list(output.pooler_output)
    deepstack = getattr(output, "deepstack_features", None)
    if deepstack is None:
        image = BaseModelOutputWithPooling(pooler_output=_pooled(ctx, features))
    else:  # Qwen3-VL: keep the encoder's class, drop its last_hidden_state (the forward reads neither)
        image = type(output)(pooler_output=_pooled(ctx, features), deepstack_features=deepstack)
    # the grid stays: Qwen-VL's M-RoPE positions are computed from it
    rest = {k: v for k, v in inputs.items() if k not in names or k in ("image_grid_thw", "video_grid_thw")}
    rest[internals.ENCODED_IMAGES] = {**encoded, "image": image}
    ctx.main.inputs = rest
    return features


def _pooled(ctx: DecodingContext, features: Sequence[torch.Tensor]):
    """Features in the form the model's forward takes back: a list per image (LLaVA, Qwen-VL), or, where
    ``get_image_features`` returned one tensor (Gemma 3), the rows concatenated into ``[Σ tokens, hidden]``
    (the forward scatters them into the image-token positions in order)."""
    if ctx.state.get("image_features_as_tensor"):
        return torch.cat(list(features), dim=0)
    return list(features)


def feature_keep_from_positions(
    ctx: DecodingContext, keep: torch.Tensor, features: Sequence[torch.Tensor]
) -> list[torch.Tensor]:
    """Per image, a ``[tokens]`` bool mask of its feature rows from a ``[B, T]`` per-position choice.

    Feature row ``i`` of the concatenated features fills the ``i``-th image-token position of
    the batch in row-major order (transformers' ``masked_scatter``), so the mapping is exact for
    any template, padding, number of images per row and LLaVA-NeXT token layout.
    """
    image_mask = image_token_mask(ctx.main.input_ids, ctx.model.config)
    lengths = [int(f.shape[0]) for f in features]
    if int(image_mask.sum()) != sum(lengths):
        raise MitigationError(
            f"the prompt has {int(image_mask.sum())} image-token positions but the images give {sum(lengths)} "
            "feature rows; expand the image placeholders with the model's processor"
        )
    flat = keep.to(image_mask.device)[image_mask]
    return list(flat.split(lengths))


def mask_features(features: Sequence[torch.Tensor], keep: Sequence[torch.Tensor], scheme: str) -> list[torch.Tensor]:
    """Copies of ``features`` whose rows outside ``keep`` are masked by ``scheme`` (``"drop"`` removes them)."""
    out = []
    for feature, kept in zip(features, keep):
        kept = kept.to(feature.device)
        if scheme == "drop":
            out.append(feature[kept])
            continue
        if scheme == "zeros":
            fill = torch.zeros_like(feature)
        elif scheme == "ones":
            fill = torch.ones_like(feature)
        elif scheme == "noise":
            generator = torch.Generator(device="cpu").manual_seed(NOISE_SEED)
            fill = torch.randn(feature.shape, generator=generator).to(feature.device, feature.dtype)
        else:
            raise MitigationError(f"unknown masking scheme {scheme!r}; use one of {list(MASKING_SCHEMES)}")
        out.append(torch.where(kept[:, None], feature, fill))
    return out


def mask_deepstack_features(deepstack: Sequence[Any], keep: Sequence[torch.Tensor], scheme: str) -> list[Any]:
    """Qwen3-VL's DeepStack features for a masked view: ``D'_d[i] = D_d[i]`` where ``keep``, else ``0``
    (no injection; whatever ``scheme`` fills the input embedding with), or removed with ``"drop"``.

    Args:
        deepstack: per DeepStack layer, the per-image ``[tokens, hidden]`` tensors (as
            ``get_image_features`` returns them) or one tensor of all images' rows.
        keep: per image, the ``[tokens]`` bool mask of kept feature rows.

    Returns:
        the same structure with the masked rows zeroed (or dropped).
    """
    lengths = [int(k.shape[0]) for k in keep]
    rows_scheme = "drop" if scheme == "drop" else "zeros"
    out = []
    for layer in deepstack:
        per_image = list(layer.split(lengths)) if torch.is_tensor(layer) else list(layer)
        if [int(t.shape[0]) for t in per_image] != lengths:
            raise MitigationError(
                f"DeepStack features have {[int(t.shape[0]) for t in per_image]} rows per image but the image "
                f"features have {lengths}; pass the deepstack_features get_image_features returned"
            )
        masked = mask_features(per_image, keep, rows_scheme)
        out.append(torch.cat(masked, dim=0) if torch.is_tensor(layer) else type(layer)(masked))
    return out


def masked_image_stream(
    ctx: DecodingContext, name: str, features: Sequence[torch.Tensor], keep: Sequence[torch.Tensor], scheme: str
) -> Stream:
    """The clean prompt with only the ``keep`` image tokens' features (and DeepStack rows; see the module
    docstring). The method refuses ``"drop"`` beforehand where it cannot work (:func:`check_drop_supported`)."""
    from transformers.modeling_outputs import BaseModelOutputWithPooling

    masked = mask_features(features, keep, scheme)
    encoded = dict(ctx.main.inputs.get(internals.ENCODED_IMAGES) or {})
    clean = encoded.get("image")
    deepstack = getattr(clean, "deepstack_features", None)
    if deepstack is None:
        encoded["image"] = BaseModelOutputWithPooling(pooler_output=_pooled(ctx, masked))
    else:
        encoded["image"] = type(clean)(
            pooler_output=_pooled(ctx, masked), deepstack_features=mask_deepstack_features(deepstack, keep, scheme)
        )
    if scheme != "drop":
        return ctx.main.replace(name, **{internals.ENCODED_IMAGES: encoded})
    image_mask = image_token_mask(ctx.main.input_ids, ctx.model.config)
    remove = image_mask.clone()
    remove[image_mask] = ~torch.cat([k.to(remove.device) for k in keep])
    input_ids, attention_mask = remove_positions(ctx.main.input_ids, ctx.main.attention_mask, remove, ctx.pad_token_id)
    inputs: dict[str, Any] = {**ctx.main.inputs, internals.ENCODED_IMAGES: encoded}
    return Stream(name, input_ids, attention_mask, inputs=inputs)


__all__ = [
    "MASKING_SCHEMES",
    "check_drop_supported",
    "check_masking_scheme",
    "encode_images",
    "feature_keep_from_positions",
    "has_image_inputs",
    "image_encoder",
    "mask_deepstack_features",
    "mask_features",
    "masked_image_stream",
]
