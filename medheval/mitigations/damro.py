r"""DAMRO — Dive into the Attention Mechanism of LVLM to Reduce Object Hallucination.

Gong, Ming, Wang, Wei, *DAMRO: Dive into the Attention Mechanism of LVLM to Reduce Object
Hallucination*, EMNLP 2024 (arXiv 2410.04514); code ``coder-gx/DAMRO``. MedHEval ran its own
reimplementation (``clip_encoder.get_damro_mask_idx``): the ``medheval`` preset (default) follows
it, the ``official`` preset follows DAMRO's code.

The vision encoder's [CLS] token attends strongly to a few **outlier** patches; the language
model over-relies on them. DAMRO contrasts the clean stream with a stream that sees *only*
those outliers:

1. In one vision-encoder layer (``vision_layer``), take the [CLS] query's attention over the
   patches. MedHEval reads the tower's **last** layer (``vision_layer=-1``) averaged over heads
   (``cls_heads="mean"``); DAMRO's official code reads the layer whose output the projector
   takes (``vision_layer=None`` → ``config.vision_feature_layer``, −2 for LLaVA-1.5) and treats
   the full width as one head (``cls_heads="single"``).
2. The ``top_k`` patches with the largest [CLS] attention are the outliers.
3. The contrast stream is the same prompt in which every other image token is masked: its
   input embedding after the projector is set to zeros (MedHEval). ``masking_scheme="drop"``
   removes the other image tokens instead (DAMRO's official code: a prompt with only ``k``
   image tokens).

Per step, with ``ℓ`` the clean logits and ``ℓ_o`` the outlier-only stream's logits:

.. math::
    s = (1+\alpha)\,\ell - \alpha\,\ell_o,\qquad
    s(y) = -\infty \text{ unless } \ell(y) \ge \log\beta + \max \ell

Presets: ``medheval`` (default) — α = 0.5, β = 0.1, k = 10, last vision layer, head mean,
zeros (MedHEval's appendix A.4 and ``clip_encoder.get_damro_mask_idx``); ``official`` — α = 2,
β = 0.1, k = 10, ``vision_feature_layer``, one head over the full width, drop (DAMRO's argparse
defaults and LLaVA-1.5 scripts; its InstructBLIP POPE runs use α = 0.5, k = 4). ``alpha=0`` is
the neutral setting: greedy DAMRO then equals plain greedy decoding token for token.

**k on other grids.** k = 10 is for LLaVA-1.5's 24×24 = 576 patches per image (1.7 %). With
``top_k=None`` (the default) k is scaled to the encoder's grid: ``max(1, round(10·P/576))`` for
``P`` patches per tile, i.e. 10 on 336 px / 14 px towers and 1 on the 25-patch test towers.

**LLaVA-NeXT (any resolution).** The vision tower encodes every tile (the base image and the
high-resolution crops) in its own forward, each with its own [CLS] and its own outliers, so the
top-k is taken **per tile**. The tiles' patches are then rearranged by the model (grid merge,
un-padding that crops patches away, a newline token after each row); to know which image token
holds which patch, the model's own ``pack_image_features`` is run on patch *indices* instead of
features, so the mapping follows the model's code exactly, whatever the tiling. The top-k of a
tile is taken among its patches that survive un-padding; newline tokens are masked like every
other non-outlier token. (DAMRO's official LLaVA-NeXT code kept only the base tile's top-k.)

Both streams have the same prompt tokens (except with ``"drop"``), so they are prefilled as one
batch with one KV cache (2B rows per forward); with ``"drop"`` the outlier stream is prefilled at
its own length and then joins that batch and cache (left-padded), so every later step is one
forward of 2B rows as well. The images are encoded once, with the [CLS] attention
captured from that same pass. No attention weights of the language model are needed, and the
vision tower keeps its attention implementation (q/k projections are hooked).

Differences from the upstream code: image tokens are located from ``input_ids`` (MedHEval hard-coded
34..610), batches are supported, and the base decoding follows the generation config (greedy by
default) instead of forcing sampling at T = 1 (MedHEval) or skipping every processor (DAMRO). With
``"drop"`` the outlier tokens keep their image order; DAMRO's code feeds them in ``torch.topk`` order
(decreasing [CLS] attention).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import torch

from medheval.decoding.contrast import LogitContrast, PlausibilityCutoff
from medheval.decoding.hooks import VisionCLSAttention, vision_encoder_layers
from medheval.decoding.loop import DecodingContext, DecodingMethod
from medheval.decoding.streams import Stream
from medheval.decoding.visual_tokens import MissingInternalError, MitigationError, visual_token_ids
from medheval.mitigations.image_masking import (
    check_drop_supported,
    check_masking_scheme,
    encode_images,
    image_encoder,
    masked_image_stream,
)
from medheval.mitigations.presets import DEFAULT_PRESET, from_preset, resolve_preset

REFERENCE_TOP_K = 10
REFERENCE_PATCHES = 576  # LLaVA-1.5: 336 px / 14 px


def default_top_k(patches_per_tile: int) -> int:
    """DAMRO's k = 10 of 576 patches, scaled to ``patches_per_tile`` (at least 1)."""
    return max(1, int(round(REFERENCE_TOP_K * int(patches_per_tile) / REFERENCE_PATCHES)))


def top_k_patches(cls_attention: torch.Tensor, k: int, candidates: torch.Tensor | None = None) -> torch.BoolTensor:
    """``[tiles, P]`` True at the ``k`` patches of each tile with the largest [CLS] attention.

    Args:
        cls_attention: ``[tiles, P]`` [CLS] attention over the patches of each vision forward.
        k: patches per tile (clamped to the candidates available).
        candidates: optional ``[tiles, P]`` bool, the patches that may be chosen.
    """
    scores = cls_attention.double()
    if candidates is not None:
        scores = scores.masked_fill(~candidates.to(scores.device), float("-inf"))
    k = min(int(k), int(scores.shape[-1]))
    chosen = torch.zeros_like(scores, dtype=torch.bool)
    if k <= 0:
        return chosen
    index = torch.topk(scores, k, dim=-1).indices
    chosen.scatter_(-1, index, True)
    if candidates is not None:
        chosen &= candidates.to(chosen.device)
    return chosen


def vision_layer_index(model, layer: int | None) -> int:
    """The encoder layer whose attention DAMRO reads: ``layer``, or the one producing the projector's input.

    ``config.vision_feature_layer`` indexes the tower's ``hidden_states`` (entry 0 = embeddings):
    ``-j`` is the output of ``layers[-j]``, ``j > 0`` the output of ``layers[j - 1]``. With a list, the
    deepest layer is used.
    """
    total = len(vision_encoder_layers(model))
    if layer is not None:
        index = int(layer) + (total if int(layer) < 0 else 0)
        if not 0 <= index < total:
            raise MitigationError(f"DAMRO vision_layer={layer} is not a layer of the {total}-layer vision encoder")
        return index
    selected = getattr(model.config, "vision_feature_layer", -1)
    selected = list(selected) if isinstance(selected, (list, tuple)) else [selected]
    indices = []
    for value in selected:
        value = int(value)
        if value == 0:
            raise MitigationError(
                "DAMRO: vision_feature_layer=0 feeds the projector the patch embeddings, which have no attention; "
                "pass vision_layer=<encoder layer index>"
            )
        indices.append(total + value if value < 0 else value - 1)
    return max(indices)


def _vision_embeddings(model):
    tower = getattr(getattr(model, "model", None), "vision_tower", None) or getattr(model, "vision_tower", None)
    return getattr(tower, "embeddings", None) or getattr(getattr(tower, "vision_model", None), "embeddings", None)


def feature_patch_index(
    model, features: list[torch.Tensor], patches_per_tile: int, tiles: int, image_sizes=None
) -> list[torch.LongTensor]:
    """For each image, the patch behind each of its feature rows: ``tile * P + patch`` (tiles counted over
    the whole vision batch), or ``-1`` for rows that hold no patch ([CLS] with the ``"full"`` strategy,
    LLaVA-NeXT's newline tokens).

    LLaVA: one tile per image, rows in patch order. LLaVA-NeXT: the model's own
    ``pack_image_features`` is run on the indices, so the tiling, un-padding and newlines are
    exactly the model's.
    """
    config = model.config
    strategy = getattr(config, "vision_feature_select_strategy", "default")
    lead = 0 if strategy == "default" else 1  # "full" keeps [CLS] as the first row of every tile
    base = getattr(model, "base_model", model)
    packer = getattr(base, "pack_image_features", None)
    P = int(patches_per_tile)

    def tile_tags(first_tile: int, count: int) -> torch.Tensor:
        tags = torch.arange(count * P, dtype=torch.float64).view(count, P) + first_tile * P
        if lead:
            tags = torch.cat([torch.full((count, 1), -1.0, dtype=torch.float64), tags], dim=1)
        return tags

    result: list[torch.LongTensor] = []
    if packer is not None and image_sizes is not None:
        from transformers.models.llava_next.modeling_llava_next import image_size_to_num_patches

        counts = [
            image_size_to_num_patches(
                image_size=size, grid_pinpoints=config.image_grid_pinpoints, patch_size=config.vision_config.image_size
            )
            for size in image_sizes
        ]
        if sum(counts) != tiles:
            raise MissingInternalError(
                f"DAMRO: the images give {sum(counts)} tiles but the vision encoder ran {tiles}; cannot map "
                f"patches to image tokens for {type(model).__name__}"
            )
        tagged, start = [], 0
        for count in counts:
            tagged.append(tile_tags(start, count)[..., None])
            start += count
        try:
            packed, _ = packer(tagged, image_sizes, vision_feature_select_strategy=strategy,
                               image_newline=torch.tensor([-1.0], dtype=torch.float64))
        except (TypeError, RuntimeError, ValueError) as error:
            raise MissingInternalError(
                f"DAMRO cannot map vision patches to image tokens through {type(base).__name__}.pack_image_features "
                f"({error}); supported: LLaVA and LLaVA-NeXT"
            ) from error
        for values in packed:
            values = values.reshape(-1)
            if not bool((values == values.round()).all()):
                raise MissingInternalError(
                    f"{type(base).__name__}.pack_image_features resamples the patches (not a plain rearrangement): "
                    "DAMRO cannot tell which image token holds which patch"
                )
            result.append(values.long())
    else:
        if len(features) != tiles:
            raise MissingInternalError(
                f"DAMRO: {len(features)} images but {tiles} vision forwards; cannot map patches to image tokens "
                f"for {type(model).__name__}"
            )
        result = [tile_tags(i, 1).reshape(-1).long() for i in range(tiles)]
    for image, (index, feature) in enumerate(zip(result, features)):
        if index.shape[0] != feature.shape[0]:
            raise MissingInternalError(
                f"DAMRO: image {image} has {feature.shape[0]} feature rows but {index.shape[0]} mapped patches; "
                f"cannot map patches to image tokens for {type(model).__name__}"
            )
    return result


@dataclasses.dataclass
class DAMRO(DecodingMethod):
    """DAMRO's outlier-token contrast (formula, selection and defaults in the module docstring).

    Args:
        preset: ``"medheval"`` (default) or ``"official"``; the unset options below take its values.
        alpha: contrast strength α (``0`` = plain decoding).
        beta: plausibility cutoff β (``0`` = no cutoff).
        top_k: outlier patches per vision tile; ``None`` = 10 per 576 patches, scaled to the grid.
        vision_layer: vision-encoder layer index whose [CLS] attention is read (``-1`` = the last
            layer, MedHEval); ``None`` = the layer that produces the projector's input
            (``config.vision_feature_layer``, DAMRO's code).
        cls_heads: ``"mean"`` over heads (MedHEval) or ``"single"`` head over the full width (DAMRO code).
        masking_scheme: how the other image tokens are masked: ``"zeros"`` (MedHEval), ``"ones"``,
            ``"noise"``, or ``"drop"`` (removed, as DAMRO's official code).
    """

    preset: str = DEFAULT_PRESET
    alpha: float = from_preset()
    beta: float = from_preset()
    top_k: int | None = from_preset()
    vision_layer: int | None = from_preset()
    cls_heads: str = from_preset()
    masking_scheme: str = from_preset()

    name = "damro"
    PRESETS: ClassVar[dict[str, dict[str, Any]]] = {
        "medheval": {"alpha": 0.5, "beta": 0.1, "top_k": None, "vision_layer": -1, "cls_heads": "mean",
                     "masking_scheme": "zeros"},
        "official": {"alpha": 2.0, "beta": 0.1, "top_k": None, "vision_layer": None, "cls_heads": "single",
                     "masking_scheme": "drop"},
    }
    PRESET_SOURCES: ClassVar[dict[str, str]] = {
        "alpha": "MedHEval `cd_alpha=0.5`; DAMRO argparse and LLaVA-1.5 scripts `damro_alpha=2` "
                 "(InstructBLIP: 0.5 POPE, 1.5 CHAIR)",
        "beta": "MedHEval and DAMRO `0.1`",
        "top_k": "`None` = 10 per 576 patches (MedHEval `topK=10`; DAMRO `damro_topk=10` for LLaVA-1.5, "
                 "4 for InstructBLIP), scaled to other grids",
        "vision_layer": "MedHEval `clip_encoder.get_damro_mask_idx` reads `attentions[-1]`, the vision tower's last "
                        "layer (`-1`; appendix A.4 names no layer); DAMRO hooks layer `vision_feature_layer` "
                        "(`None`; −2 for LLaVA-1.5)",
        "cls_heads": "MedHEval averages the heads; DAMRO's LLaVA code uses one head over the full width "
                     "(its InstructBLIP code averages heads)",
        "masking_scheme": "MedHEval zeroes the other image-token embeddings; DAMRO feeds only the k outlier "
                          "features (`\"drop\"`)",
    }

    def __post_init__(self):
        resolve_preset(self)
        if self.top_k is not None and int(self.top_k) < 1:
            raise MitigationError(f"DAMRO top_k must be >= 1 (or None for the scaled default), got {self.top_k}")
        if self.cls_heads not in ("mean", "single"):
            raise MitigationError(f"DAMRO cls_heads must be 'mean' or 'single', got {self.cls_heads!r}")
        self.masking_scheme = check_masking_scheme("DAMRO", self.masking_scheme)
        self._cutoff = PlausibilityCutoff(self.beta)
        self._contrast = LogitContrast(self.alpha)

    def check_model(self, model) -> None:
        visual_token_ids(model.config)
        if getattr(_vision_embeddings(model), "class_embedding", None) is None:
            vision = getattr(model.config, "vision_config", None)
            kind = getattr(vision, "model_type", None) or "unknown"
            raise MissingInternalError(
                f"DAMRO needs a [CLS] token in the vision encoder, and {type(model).__name__} (vision tower "
                f"{kind!r}) has none: its outlier patches are defined by the [CLS] attention, which SigLIP "
                "(Gemma 3 / MedGemma) and Qwen-VL's patch-merging ViT do not compute; use DAMRO with a CLIP-style "
                "tower (LLaVA, LLaVA-NeXT) or another mitigation (VCD, M3ID, PAI, DoLa)"
            )
        vision_layer_index(model, self.vision_layer)  # the encoder's layers, and vision_layer among them
        image_encoder(model, "DAMRO")

    def check(self, model, ctx: DecodingContext) -> None:
        check_drop_supported(ctx, "DAMRO", self.masking_scheme)
        if ctx.main.inputs.get("pixel_values") is None:
            raise MissingInternalError(
                "DAMRO needs the raw pixel_values (the [CLS] attention is read while the vision encoder runs); "
                "pass the processor's pixel_values to generate, not pre-computed mm_encoder_outputs/inputs_embeds"
            )
        ctx.state["damro_vision_layer"] = vision_layer_index(model, self.vision_layer)

    def contrast_streams(self, ctx: DecodingContext) -> list[Stream]:
        model = ctx.model
        image_sizes = ctx.main.inputs.get("image_sizes")
        capture = VisionCLSAttention(model, layer=ctx.state["damro_vision_layer"], heads=self.cls_heads)
        with capture:
            features = encode_images(ctx, "DAMRO")
        cls_attention = capture.cls_attention()  # [tiles, P]
        tiles, patches = int(cls_attention.shape[0]), int(cls_attention.shape[1])
        index = feature_patch_index(model, features, patches, tiles, image_sizes)
        present = torch.zeros(tiles * patches, dtype=torch.bool)
        for rows in index:
            present[rows[rows >= 0].cpu()] = True
        k = default_top_k(patches) if self.top_k is None else int(self.top_k)
        outliers = top_k_patches(cls_attention.cpu(), k, candidates=present.view(tiles, patches))
        flat = outliers.reshape(-1)
        keep = [(rows >= 0) & flat[rows.clamp(min=0).cpu()].to(rows.device) for rows in index]
        ctx.state["damro_outliers"] = outliers
        ctx.state["damro_keep"] = keep
        ctx.state["damro_top_k"] = k
        return [masked_image_stream(ctx, "outliers", features, keep, self.masking_scheme)]

    def scores(self, ctx: DecodingContext, logits: dict[str, torch.Tensor]) -> torch.Tensor:
        clean, outliers = logits["main"], logits["outliers"]
        return self._cutoff(self._contrast(clean, outliers), clean)


__all__ = ["DAMRO", "default_top_k", "feature_patch_index", "top_k_patches", "vision_layer_index"]
