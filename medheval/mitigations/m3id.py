r"""M3ID — Multi-Modal Mutual-Information Decoding.

Favero, Zancato, Trager, Choudhary, Perera, Achille, Swaminathan, Soatto, *Multi-Modal
Hallucination Control by Visual Information Grounding*, CVPR 2024 (arXiv 2403.14003).
There is no official code; MedHEval (and this module) follow the public
reimplementation in AvisC (``sangminwoo/AvisC``, ``use_m3id``).

Per generated token ``t = 1, 2, …``, with ``ℓ_c`` the logits given image and text and
``ℓ_u`` the logits of the *unconditioned* stream (the same prompt with every image token
removed):

.. math::
    \gamma_t = e^{-\lambda t},\qquad
    s = \log p_c + \frac{1-\gamma_t}{\gamma_t}\,(\log p_c - \log p_u),\qquad
    s(y) = -\infty \text{ unless } \ell_c(y) \ge \log\beta + \max \ell_c

with ``log p = log_softmax(ℓ)``. The text-only prompt is prefilled in its own (short) forward,
then joins the clean stream's batch and KV cache, left-padded: every later step is one forward
over 2B rows (:mod:`medheval.decoding.streams`). The weight grows with ``t`` (0.02 at t = 1, 1.0 at
t ≈ 35, 6.4 at t = 100 for λ = 0.02), countering the fading of visual information in
long answers.

Presets: ``medheval`` (default) and ``official`` are the same, λ = 0.02, β = 0.1 — M3ID has
no official code, and MedHEval hard-coded the values of the AvisC reimplementation it copied
(the paper's own hyperparameters were not verified). ``lam=0`` is the neutral setting: the
weight is 0 and ``s = log p_c``, whose arg-max is plain greedy's.

Differences from MedHEval: the unconditioned prompt drops the image-token positions
found from ``input_ids`` (MedHEval dropped hard-coded embedding positions 34..609), rows
are re-left-padded so batches work, and the base decoding follows the generation config
(MedHEval forced sampling at T = 1).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import torch

from medheval.decoding.contrast import LogProbContrast, PlausibilityCutoff, m3id_weight
from medheval.decoding.loop import DecodingContext, DecodingMethod
from medheval.decoding.streams import Stream
from medheval.decoding.visual_tokens import MitigationError, drop_image_tokens, visual_token_ids
from medheval.mitigations.presets import DEFAULT_PRESET, from_preset, resolve_preset


def text_only_stream(ctx: DecodingContext, name: str = "text_only") -> Stream:
    """The clean prompt without its image tokens (and without image inputs).

    Prefilled alone at its own length, then joined to the clean batch (one forward per step).
    """
    visual_token_ids(ctx.model.config)  # fails with a clear message on models without image tokens
    input_ids, attention_mask = drop_image_tokens(
        ctx.main.input_ids, ctx.main.attention_mask, ctx.model.config, ctx.pad_token_id
    )
    return Stream(name, input_ids, attention_mask, inputs={})


@dataclasses.dataclass
class M3ID(DecodingMethod):
    """Multi-Modal Mutual-Information Decoding (formula and defaults in the module docstring).

    Args:
        preset: ``"medheval"`` (default) or ``"official"`` (identical for M3ID); the unset options below
            take the preset's values.
        lam: λ of ``γ_t = exp(−λt)`` (``0`` = plain decoding).
        beta: plausibility cutoff β on the conditioned logits (``0`` = no cutoff).
    """

    preset: str = DEFAULT_PRESET
    lam: float = from_preset()
    beta: float = from_preset()

    name = "m3id"
    PRESETS: ClassVar[dict[str, dict[str, Any]]] = {
        "medheval": {"lam": 0.02, "beta": 0.1},
        "official": {"lam": 0.02, "beta": 0.1},
    }
    PRESET_SOURCES: ClassVar[dict[str, str]] = {
        "lam": "hard-coded in AvisC's `use_m3id` branch, copied by MedHEval (no official M3ID code)",
        "beta": "MedHEval `cd_beta=0.1`; AvisC's sampler default",
    }

    def __post_init__(self):
        resolve_preset(self)
        if self.lam < 0:
            raise MitigationError(f"M3ID lam must be >= 0, got {self.lam}")
        self._cutoff = PlausibilityCutoff(self.beta)

    def contrast_streams(self, ctx: DecodingContext) -> list[Stream]:
        return [text_only_stream(ctx)]

    def scores(self, ctx: DecodingContext, logits: dict[str, torch.Tensor]) -> torch.Tensor:
        weight = m3id_weight(ctx.step + 1, self.lam)
        combined = LogProbContrast(weight)(logits["main"], logits["text_only"])
        return self._cutoff(combined, logits["main"])


__all__ = ["M3ID", "text_only_stream"]
