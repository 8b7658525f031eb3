"""The per-step score rules of the contrastive mitigations: one small class per idea.

Each class is pure tensor arithmetic on next-token logits ``[B, V]`` (no model, no
state), in the style of transformers' ``generation/logits_process.py``: the formula
and the paper are in the docstring. The decoding loop (:mod:`medheval.decoding.loop`)
calls them *before* the user's logits processors and warpers (repetition penalty,
temperature, top-k/top-p), as the original implementations do, except two that their cards list:
DAMRO's sampler skipped every processor, and PAI's CFG step ran after transformers' built-in
processors (before the warpers).

Notation: ``ℓ`` = next-token logits of the clean (full-image) stream, ``ℓ'`` = logits
of a contrast stream, ``log p = log_softmax(ℓ)``.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F

from medheval.decoding.visual_tokens import MitigationError


class PlausibilityCutoff:
    r"""Adaptive plausibility constraint (APC): keep only tokens the clean stream finds plausible.

    .. math::
        \mathcal{V}_{head} = \{ y : p(y) \ge \beta \max_{y'} p(y') \}
        \iff \ell(y) \ge \log\beta + \max_{y'} \ell(y')

    (log-softmax shifts every logit by the same constant, so the test can run on raw
    logits). Every token outside the head gets ``-inf`` in the combined score. The
    reference logits are the clean stream's *raw* logits, before temperature/top-k/top-p.

    Introduced by Li et al., *Contrastive Decoding* (ACL 2023) and used with β = 0.1 by
    VCD (Leng et al., CVPR 2024), AvisC, DAMRO, the M3ID reimplementation and PAI's CFG step.

    Args:
        beta: in ``[0, 1]``. ``0`` disables the cutoff (every token kept); ``1`` keeps
            only the clean stream's arg-max (and ties).
    """

    def __init__(self, beta: float = 0.1):
        beta = float(beta)
        if not 0.0 <= beta <= 1.0:
            raise MitigationError(f"plausibility cutoff beta must be in [0, 1], got {beta}")
        self.beta = beta

    def keep_mask(self, reference_logits: torch.Tensor) -> torch.BoolTensor:
        """``[B, V]`` True where a token passes the cutoff."""
        if self.beta == 0.0:
            return torch.ones_like(reference_logits, dtype=torch.bool)
        reference = reference_logits.float()
        threshold = reference.max(dim=-1, keepdim=True).values + math.log(self.beta)
        return reference >= threshold

    def __call__(self, scores: torch.Tensor, reference_logits: torch.Tensor) -> torch.Tensor:
        """``scores`` with every token outside the head of ``reference_logits`` set to ``-inf``."""
        if self.beta == 0.0:
            return scores
        return scores.masked_fill(~self.keep_mask(reference_logits), float("-inf"))


class LogitContrast:
    r"""Contrast on raw logits (VCD, AvisC, DAMRO).

    .. math:: s = (1 + \alpha)\,\ell - \alpha\,\ell'

    Leng et al., *Mitigating Object Hallucinations in Large Vision-Language Models through
    Visual Contrastive Decoding*, CVPR 2024 (arXiv 2311.16922), Eq. 3; AvisC and DAMRO reuse it
    with their own ``ℓ'``. ``α = 0`` returns ``ℓ`` exactly.
    """

    def __init__(self, alpha: float = 1.0):
        self.alpha = float(alpha)

    def __call__(self, logits: torch.Tensor, contrast_logits: torch.Tensor) -> torch.Tensor:
        logits = logits.float()
        if self.alpha == 0.0:
            return logits
        return (1.0 + self.alpha) * logits - self.alpha * contrast_logits.float()


class LogProbContrast:
    r"""Contrast on log-probabilities against an unconditioned (text-only) stream (M3ID, PAI).

    .. math::
        s = \log p_c + w\,(\log p_c - \log p_u)
          = \gamma(\log p_c - \log p_u) + \log p_u \quad\text{with } \gamma = 1 + w

    - PAI's CFG step (Liu et al., ECCV 2024, arXiv 2407.21771): ``w = γ − 1``.
    - M3ID (Favero et al., CVPR 2024, arXiv 2403.14003, as implemented in AvisC): ``w = (1 − γ_t)/γ_t``
      with ``γ_t = exp(−λ t)`` (:func:`m3id_weight`).

    Written as ``log p_c + w(...)`` so that ``w = 0`` returns ``log p_c`` exactly.

    Args:
        weight: ``w`` (a number, or a ``[B, 1]`` tensor for per-row weights).
    """

    def __init__(self, weight: float | torch.Tensor = 0.0):
        self.weight = weight

    def __call__(self, logits: torch.Tensor, uncond_logits: torch.Tensor) -> torch.Tensor:
        log_p_c = F.log_softmax(logits.float(), dim=-1)
        if not torch.is_tensor(self.weight) and float(self.weight) == 0.0:
            return log_p_c
        log_p_u = F.log_softmax(uncond_logits.float(), dim=-1)
        return log_p_c + self.weight * (log_p_c - log_p_u)


def m3id_weight(step: int, lam: float) -> float:
    r"""M3ID's weight on the mutual-information term at generated token ``t = step`` (1-based).

    .. math:: \gamma_t = e^{-\lambda t},\qquad w_t = \frac{1-\gamma_t}{\gamma_t} = e^{\lambda t} - 1

    ``λ = 0`` gives ``w = 0`` (plain decoding); with λ = 0.02, ``w`` is 0.020 at t = 1, 1.0 at
    t ≈ 35 and 6.4 at t = 100: the image's weight grows as the text gets longer.
    """
    if step < 1:
        raise MitigationError(f"M3ID steps count from 1, got {step}")
    return math.expm1(float(lam) * step)


class RelativeTopFilter:
    r"""DoLa's relative-top filter on the mature layer: the APC on log-probabilities.

    .. math:: \log q_N(y) \ge \max_{y'} \log q_N(y') + \log(\text{relative\_top})

    Chuang et al., *DoLa: Decoding by Contrasting Layers Improves Factuality in Large
    Language Models*, ICLR 2024 (arXiv 2309.03883), Eq. 4 (α = relative_top = 0.1).
    At least ``min_tokens_to_keep`` tokens (the top ones) are always kept.
    """

    def __init__(self, relative_top: float = 0.1, min_tokens_to_keep: int = 1):
        relative_top = float(relative_top)
        if not 0.0 <= relative_top <= 1.0:
            raise MitigationError(f"DoLa relative_top must be in [0, 1], got {relative_top}")
        self.relative_top = relative_top
        self.min_tokens_to_keep = int(min_tokens_to_keep)

    def keep_mask(self, log_probs: torch.Tensor) -> torch.BoolTensor:
        if self.relative_top == 0.0:
            return torch.ones_like(log_probs, dtype=torch.bool)
        threshold = log_probs.max(dim=-1, keepdim=True).values + math.log(self.relative_top)
        if self.min_tokens_to_keep > 1:
            kth = torch.topk(log_probs, self.min_tokens_to_keep, dim=-1).values[..., -1:]
            threshold = torch.minimum(threshold, kth)
        return log_probs >= threshold


def jensen_shannon_divergence(log_p: torch.Tensor, log_q: torch.Tensor) -> torch.Tensor:
    r"""DoLa's layer distance, per row: ``[B, V] × [B, V] → [B]``.

    .. math::
        M = \tfrac12 (p + q),\qquad
        d = \tfrac12 \big[\mathrm{KL}(M \,\|\, p)_{\text{mean}} + \mathrm{KL}(M \,\|\, q)_{\text{mean}}\big]

    This is exactly what DoLa's code computes with ``F.kl_div(log p, M)`` (which is KL(M‖p))
    and ``.mean(-1)`` over the vocabulary; the mean instead of a sum only rescales ``d``
    by ``1/V`` and never changes which layer is the farthest.
    """
    m = 0.5 * (log_p.exp() + log_q.exp())
    kl_p = F.kl_div(log_p, m, reduction="none").mean(-1)
    kl_q = F.kl_div(log_q, m, reduction="none").mean(-1)
    return 0.5 * (kl_p + kl_q)


class DoLaContrast:
    r"""DoLa's score: pick the premature layer farthest (JSD) from the mature one, contrast log-probs.

    For each row: ``m = argmax_j JSD(q_N, q_j)`` over the candidate early-exit layers ``j``, then

    .. math::
        s(y) = \log q_N(y) - \log q_m(y)\ \text{ if } y \in \mathcal{V}_{head}\ \text{(relative-top filter)},
        \qquad -\infty \text{ otherwise.}

    Chuang et al., ICLR 2024 (arXiv 2309.03883), Eqs. 2–4. Differences from the original
    code, both so that a row's output never depends on the rest of the batch: the layer
    is chosen **per row** (the code averaged the JSD over the batch and chose one layer
    for all rows), and the filter is applied to every row (the code set the premature
    log-probs to −1e3 only for row 0; on kept tokens that value never matters).

    Args:
        relative_top: the filter's threshold (0.1 in the paper). ``1.0`` keeps only the
            mature layer's arg-max, so greedy DoLa then *is* greedy decoding.
    """

    def __init__(self, relative_top: float = 0.1, min_tokens_to_keep: int = 1):
        self.filter = RelativeTopFilter(relative_top, min_tokens_to_keep)

    @staticmethod
    def _stacked(candidate_logits: torch.Tensor | Sequence[torch.Tensor]) -> torch.Tensor:
        """The candidates as one float32 ``[J, B, V]`` tensor (a list of ``[B, V]`` tensors is stacked)."""
        if torch.is_tensor(candidate_logits):
            if candidate_logits.dim() != 3:
                raise MitigationError(
                    f"DoLa's candidate logits must be [J, B, V] (J candidate layers), got {tuple(candidate_logits.shape)}"
                )
            stacked = candidate_logits.float()
        else:
            stacked = torch.stack([c.float() for c in candidate_logits]) if len(candidate_logits) else None
        if stacked is None or stacked.shape[0] == 0:
            raise MitigationError("DoLa needs at least one candidate premature layer")
        return stacked

    def select(
        self, mature_logits: torch.Tensor, candidate_logits: torch.Tensor | Sequence[torch.Tensor]
    ) -> torch.LongTensor:
        """Index (into the candidates) of the premature layer chosen for each row, ``[B]``."""
        return self._select(*self._log_probs(mature_logits, candidate_logits))

    def _log_probs(self, mature_logits: torch.Tensor,
                   candidate_logits: torch.Tensor | Sequence[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """``(log q_N [B, V], log q_j [J, B, V])`` in float32."""
        return (F.log_softmax(mature_logits.float(), dim=-1),
                F.log_softmax(self._stacked(candidate_logits), dim=-1))

    @staticmethod
    def _select(log_q_n: torch.Tensor, log_q: torch.Tensor) -> torch.LongTensor:
        # all J candidates in one pass: [B, V] against [J, B, V] -> distances [J, B]
        distances = jensen_shannon_divergence(log_q_n.expand_as(log_q), log_q)
        return distances.argmax(dim=0)

    def __call__(
        self, mature_logits: torch.Tensor, candidate_logits: torch.Tensor | Sequence[torch.Tensor]
    ) -> tuple[torch.Tensor, torch.LongTensor]:
        """``(scores [B, V], chosen candidate index [B])``; candidates as ``[J, B, V]`` or a list of ``[B, V]``."""
        log_q_n, log_q = self._log_probs(mature_logits, candidate_logits)
        chosen = self._select(log_q_n, log_q)
        log_q_m = log_q[chosen, torch.arange(log_q.shape[1], device=log_q.device)]  # [B, V]
        scores = log_q_n - log_q_m
        scores = scores.masked_fill(~self.filter.keep_mask(log_q_n), float("-inf"))
        return scores, chosen


__all__ = [
    "PlausibilityCutoff",
    "LogitContrast",
    "LogProbContrast",
    "m3id_weight",
    "RelativeTopFilter",
    "jensen_shannon_divergence",
    "DoLaContrast",
]
