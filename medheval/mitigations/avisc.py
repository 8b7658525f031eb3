r"""AvisC — Attentional Vision Calibration.

Woo, Kim, Jang, Choi, Kim, *Don't Miss the Forest for the Trees: Attentional Vision
Calibration for Large Vision Language Models*, arXiv 2405.17820; code ``sangminwoo/AvisC``
(``avisc_utils/avisc_sample.py``), which MedHEval runs as its ``avisc`` baseline.

**Blind tokens** are the few image tokens that soak up the language model's attention while
carrying little object information. They are found once, at the prefill of the clean stream,
from the attention of the *last prompt position* over the image tokens, per row:

1. for each language-model layer ``l``: ``a_l`` = the head-mean attention row over the image
   tokens, and its share ``p_l = Σa_l / Σ_l' Σa_l'`` of the image attention of all layers;
2. keep the ``k`` layers with the largest shares, ``k = #{cumulative sorted share < γ} + 1``
   (a top-p over layers with ``γ = layer_gamma``; the layers are chosen per sample);
3. ``ā = mean`` of ``a_l`` over those layers;
4. blind tokens: with ``top_k = k`` (MedHEval: "top-10 outlier image tokens"), the ``k`` image
   tokens with the largest ``ā_j``; with ``top_k=None`` (AvisC's paper and code), ``{j : ā_j ≥ τ}``
   with ``τ = mean(ā) + λ·std(ā)`` (``λ = lamb``, unbiased std, as ``torch.std``). Every other
   image token (the upstream ``mask_idx``) is masked in the contrast stream: its input embedding
   after the projector is set to zeros (``masking_scheme``), so that stream sees the text and the
   blind tokens only. On Qwen3-VL the masked tokens' DeepStack rows (the visual features its first
   decoder layers add at the image positions) are zeroed too, for every scheme, or dropped with
   ``"drop"`` (:mod:`~medheval.mitigations.image_masking`).

Per step, with ``ℓ`` the clean logits and ``ℓ_b`` the logits of the blind-token stream (NaN rows
of ``ℓ_b`` are replaced by ``ℓ``, as upstream):

.. math::
    s = (1+\alpha)\,\ell - \alpha\,\ell_b,\qquad
    s(y) = -\infty \text{ unless } \ell(y) \ge \log\beta + \max \ell

Presets: ``medheval`` (default) — the top-10 blind tokens (MedHEval's appendix A.4; its released
``model_vqa.py`` still ran the threshold), α = 1, β = 0.1, γ = 0.5, zeros; ``official`` — the
threshold with λ = 1 (AvisC's scripts), α = 1 (its POPE script; 2.5 for AMBER and LLaVA-Bench),
β = 0.1, γ = 0.5, zeros. ``lamb`` is used only by the threshold (``top_k=None``). The top-10 is
a fixed count (10 of LLaVA-1.5's 576 image tokens; clamped to the image tokens a row has).
``alpha=0`` is the neutral setting (``s = ℓ``): greedy AvisC then equals plain greedy decoding
token for token. There are no layer-indexed settings: the layers are chosen per sample
among all of the language model's layers, so nothing needs scaling with depth.

Attention weights are needed for the clean prefill only: for that one forward the language
model runs medheval's hookable eager attention, which keeps just the last query row per layer
(head mean; never the full ``[heads, T, T]`` maps); the model's own implementation (e.g.
SDPA) is restored right after it, and on errors. The vision tower is untouched and runs once.

The blind-token stream depends on that prefill, so it cannot be prefilled with the clean stream.
Nor is its cache a copy of the clean cache under another attention mask: the masked image
tokens get *other input embeddings* (zeros, ones or noise — not absent keys), which changes the
keys and values of every later position in every layer. So it gets its own prefill forward, in
the same step, right after the clean one; then its cache joins the clean cache (same length; with
``"drop"`` left-padded) and every later step is one forward over 2B rows.

Differences from the upstream code: image tokens are found from ``input_ids`` (upstream
hard-coded positions 35..611 for one template; MedHEval 34..610), the selection is per row
(upstream pooled the batch into one threshold), and the base decoding follows the generation
config (greedy by default) instead of forcing sampling at T = 1.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import torch

from medheval.decoding import internals
from medheval.decoding.contrast import LogitContrast, PlausibilityCutoff
from medheval.decoding.hooks import AttentionHook, AttentionRowRecorder, attention_modules
from medheval.decoding.loop import DecodingContext, DecodingMethod
from medheval.decoding.streams import Stream
from medheval.decoding.visual_tokens import (
    MissingInternalError,
    MitigationError,
    image_token_mask,
    visual_token_ids,
)
from medheval.mitigations.image_masking import (
    check_drop_supported,
    check_masking_scheme,
    encode_images,
    feature_keep_from_positions,
    has_image_inputs,
    image_encoder,
    masked_image_stream,
)
from medheval.mitigations.presets import DEFAULT_PRESET, from_preset, resolve_preset


def select_layers(attention: torch.Tensor, layer_gamma: float) -> torch.LongTensor:
    """AvisC's layer choice: the top-``k`` layers by share of image attention, ``k`` by top-p ``γ``.

    Args:
        attention: ``[L, N]`` per layer, the head-mean attention of the last query over the ``N``
            image tokens.

    Returns:
        the chosen layer indices, ``[k]``, largest share first.
    """
    mass = attention.double().sum(-1)
    total = mass.sum()
    share = mass / total if float(total) > 0 else torch.full_like(mass, 1.0 / mass.numel())
    ordered = torch.sort(share, descending=True).values
    k = min(int((torch.cumsum(ordered, 0) < layer_gamma).sum()) + 1, int(share.numel()))
    return torch.topk(share, k).indices


def select_blind_tokens(
    attention: torch.Tensor, layer_gamma: float = 0.5, lamb: float = 1.0, top_k: int | None = None
) -> tuple[torch.BoolTensor, torch.LongTensor]:
    """AvisC's blind tokens of one row from ``ā``, the mean attention of the chosen layers.

    ``top_k=k``: the ``k`` tokens with the largest ``ā`` (all of them if there are at most ``k``;
    ties broken by ``torch.topk``); ``top_k=None``: ``ā ≥ mean(ā) + λ·std(ā)``.

    Args:
        attention: ``[L, N]`` (see :func:`select_layers`).

    Returns:
        ``(blind [N] bool, chosen layers [k])``. The contrast stream keeps the blind tokens and
        masks the rest.
    """
    layers = select_layers(attention, layer_gamma)
    average = attention.double()[layers].mean(0)
    if top_k is not None:
        blind = torch.zeros_like(average, dtype=torch.bool)
        blind[torch.topk(average, min(int(top_k), int(average.numel()))).indices] = True
        return blind, layers
    spread = average.std() if average.numel() > 1 else average.new_zeros(())
    threshold = average.mean() + float(lamb) * spread
    return average >= threshold, layers


def restore_attention_implementation(model, implementation: str) -> None:
    """Switch the language model (only) back to ``implementation``."""
    internals.set_text_attention_implementation(model, implementation)


@dataclasses.dataclass
class AvisC(DecodingMethod):
    """Attentional Vision Calibration (formula, selection and defaults in the module docstring).

    Args:
        preset: ``"medheval"`` (default) or ``"official"``; the unset options below take its values.
        alpha: contrast strength α (``0`` = plain decoding).
        beta: plausibility cutoff β (``0`` = no cutoff).
        layer_gamma: γ of the top-p choice of layers (``(0, 1]``).
        top_k: blind tokens = the ``top_k`` image tokens with the most attention; ``None`` = the
            threshold ``mean + λ·std``.
        lamb: λ of the threshold (used only with ``top_k=None``).
        masking_scheme: how the non-blind image tokens are masked in the contrast stream:
            ``"zeros"`` (upstream default), ``"ones"``, ``"noise"`` or ``"drop"`` (removed; refused on
            Qwen-VL, whose M-RoPE positions need each image's full ``image_grid_thw`` grid).
    """

    preset: str = DEFAULT_PRESET
    alpha: float = from_preset()
    beta: float = from_preset()
    layer_gamma: float = from_preset()
    top_k: int | None = from_preset()
    lamb: float = from_preset()
    masking_scheme: str = from_preset()

    name = "avisc"
    PRESETS: ClassVar[dict[str, dict[str, Any]]] = {
        "medheval": {"alpha": 1.0, "beta": 0.1, "layer_gamma": 0.5, "top_k": 10, "lamb": 1.0,
                     "masking_scheme": "zeros"},
        "official": {"alpha": 1.0, "beta": 0.1, "layer_gamma": 0.5, "top_k": None, "lamb": 1.0,
                     "masking_scheme": "zeros"},
    }
    PRESET_SOURCES: ClassVar[dict[str, str]] = {
        "alpha": "MedHEval `cd_alpha=1.0`; AvisC `pope_eval_batch.sh` (`amber_eval.sh`, `llava_bench_eval.sh`: 2.5)",
        "beta": "MedHEval and AvisC `cd_beta=0.1`",
        "layer_gamma": "MedHEval and AvisC `layer_gamma=0.5`",
        "top_k": "MedHEval appendix A.4: the top-10 outlier image tokens (its `model_vqa.py` still used the "
                 "threshold); AvisC paper/code: `None` = threshold `mean + λ·std`",
        "lamb": "AvisC's scripts `lamb=1.0` (its POPE argparse default 0.99); unused with `top_k`",
        "masking_scheme": "MedHEval and AvisC `masking_scheme=\"zeros\"`",
    }

    def __post_init__(self):
        resolve_preset(self)
        if self.top_k is not None and int(self.top_k) < 1:
            raise MitigationError(f"AvisC top_k must be >= 1 (or None for the mean + lamb*std threshold), got {self.top_k}")
        if not 0.0 < float(self.layer_gamma) <= 1.0:
            raise MitigationError(f"AvisC layer_gamma must be in (0, 1], got {self.layer_gamma}")
        self.masking_scheme = check_masking_scheme("AvisC", self.masking_scheme)
        self._cutoff = PlausibilityCutoff(self.beta)
        self._contrast = LogitContrast(self.alpha)

    # -- extension points ------------------------------------------------------------------
    def check_model(self, model) -> None:
        visual_token_ids(model.config)
        attention_modules(model)

    def check(self, model, ctx: DecodingContext) -> None:
        if not has_image_inputs(ctx):
            raise MissingInternalError(
                "AvisC needs the prompt's images: pass the processor's pixel_values (or mm_encoder_outputs) to generate"
            )
        image_encoder(model, "AvisC")
        check_drop_supported(ctx, "AvisC", self.masking_scheme)
        ctx.state["avisc_attn_implementation"] = internals.text_attention_implementation(model)

    def contrast_streams(self, ctx: DecodingContext) -> list[Stream]:
        # encode the images once; the clean stream then takes them as mm_encoder_outputs
        ctx.state["avisc_features"] = encode_images(ctx, "AvisC")
        return []

    def hooks(self, ctx: DecodingContext) -> list[AttentionHook]:
        recorder = AttentionRowRecorder(layers=None, reduce="mean")
        ctx.state["avisc_recorder"] = recorder
        return [recorder]

    def deferred_streams(self, ctx: DecodingContext) -> list[Stream]:
        recorder: AttentionRowRecorder = ctx.state["avisc_recorder"]
        recorder.enabled = False
        # eager attention was needed for the clean prefill only
        restore_attention_implementation(ctx.model, ctx.state["avisc_attn_implementation"])
        blind, layers = self.select(ctx, recorder.rows)
        recorder.rows = {}
        ctx.state["avisc_blind"] = blind
        ctx.state["avisc_layers"] = layers
        features = ctx.state.pop("avisc_features")
        keep = feature_keep_from_positions(ctx, blind, features)
        return [masked_image_stream(ctx, "blind", features, keep, self.masking_scheme)]

    def scores(self, ctx: DecodingContext, logits: dict[str, torch.Tensor]) -> torch.Tensor:
        clean, blind = logits["main"], logits["blind"]
        blind = torch.where(torch.isnan(blind).any(-1, keepdim=True), clean, blind)
        return self._cutoff(self._contrast(clean, blind), clean)

    # -- selection -------------------------------------------------------------------------
    def select(self, ctx: DecodingContext, rows: dict[int, torch.Tensor]) -> tuple[torch.BoolTensor, list[list[int]]]:
        """``([B, T] True at blind image tokens, chosen layers per row)`` from the recorded prefill rows."""
        total = len(attention_modules(ctx.model))
        if sorted(rows) != list(range(total)):
            raise MissingInternalError(
                f"AvisC recorded attention for layers {sorted(rows)} of {total}: the language model of "
                f"{type(ctx.model).__name__} must run its attention through transformers' AttentionInterface"
            )
        stacked = torch.stack([rows[layer] for layer in range(total)], 0)  # [L, B, T]
        image_mask = image_token_mask(ctx.main.input_ids, ctx.model.config).to(stacked.device)
        if stacked.shape[1:] != image_mask.shape:
            raise MitigationError(
                f"AvisC: recorded attention rows {tuple(stacked.shape[1:])} do not match the prompt "
                f"{tuple(image_mask.shape)}"
            )
        blind = torch.zeros_like(image_mask)
        chosen: list[list[int]] = []
        for row in range(image_mask.shape[0]):
            columns = image_mask[row]
            if not bool(columns.any()):
                chosen.append([])
                continue
            row_blind, layers = select_blind_tokens(stacked[:, row, columns], self.layer_gamma, self.lamb, self.top_k)
            blind[row, columns] = row_blind
            chosen.append(layers.tolist())
        return blind, chosen


AVISC = AvisC

__all__ = ["AVISC", "AvisC", "restore_attention_implementation", "select_blind_tokens", "select_layers"]
