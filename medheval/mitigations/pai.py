r"""PAI — Paying More Attention to Image.

Liu, Zheng, Chen, *Paying More Attention to Image: A Training-Free Method for Alleviating
Hallucination in LVLMs*, ECCV 2024 (arXiv 2407.21771); code ``LALBJ/PAI``.

Two parts:

1. **Attention intervention.** In language-model layers ``[start_layer, end_layer)``, on
   the last query row, after the mask and before the softmax, the attention logits on
   image-token keys are amplified:

   .. math:: z_{j} \leftarrow z_{j} + \alpha\,|z_{j}| \qquad (j \text{ an image column})

2. **CFG on a text-only stream** (the prompt without its image; prefilled alone, then decoded
   in the clean stream's batch and KV cache, one forward of 2B rows per step), with
   ``log p = log_softmax(ℓ)``:

   .. math::
       s = \gamma(\log p_c - \log p_u) + \log p_u,\qquad
       s(y) = -\infty \text{ unless } \log p_c(y) \ge \log\beta + \max \log p_c

Presets: ``medheval`` (default) and ``official`` are the same: α = 0.2, γ = 1.1, β = 0.1
(hard-coded in PAI), layers 2..32 of a 32-layer model — MedHEval's runner and the run commands
of PAI's README agree (PAI's evaluation scripts default to γ = 2 when none is passed). Layer
defaults adapt to depth: ``start_layer = round(2·N/32)``, ``end_layer = N`` for an ``N``-layer
language model (2..32 for 7B, 2..40 for 13B). ``alpha=0, gamma=1`` is the neutral setting (scores = ``log p_c``, whose arg-max is plain greedy's).

Needs eager attention on the language model: while PAI runs, its attention is switched to
medheval's hookable eager implementation and switched back afterwards (also on errors);
the vision tower is untouched.

Differences from the upstream code: image columns come from ``input_ids`` (not
hard-coded 34..610); the intervention applies at every prompt's first (prefill) step — the
upstream code skipped it there for the first prompt of each process only, whose prefill ran
while its ``use_cfg`` flag was still set from setup (``reference/mitigations.md`` §5 says
"skipped", without the "first prompt only"); and the base decoding follows the generation config.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import torch

from medheval.decoding.contrast import LogProbContrast, PlausibilityCutoff
from medheval.decoding.hooks import AttentionHook, ImageAttentionBoost, num_layers
from medheval.decoding.loop import DecodingContext, DecodingMethod
from medheval.decoding.streams import Stream
from medheval.decoding.visual_tokens import MitigationError, visual_token_ids
from medheval.mitigations.m3id import text_only_stream
from medheval.mitigations.presets import DEFAULT_PRESET, from_preset, resolve_preset


def default_layer_range(total_layers: int, start: int | None = None, end: int | None = None) -> tuple[int, int]:
    """PAI's ``[2, 32)`` of a 32-layer model, scaled to ``total_layers``."""
    start = int(round(2 * total_layers / 32)) if start is None else int(start)
    end = total_layers if end is None else int(end)
    if not 0 <= start <= end <= total_layers:
        raise MitigationError(
            f"PAI layers [{start}, {end}) do not fit a language model with {total_layers} layers"
        )
    return start, end


@dataclasses.dataclass
class PAI(DecodingMethod):
    """Paying More Attention to Image (formula and defaults in the module docstring).

    Args:
        preset: ``"medheval"`` (default) or ``"official"`` (identical for PAI); the unset options below
            take the preset's values.
        alpha: attention amplification α (``0`` = no intervention).
        gamma: CFG scale γ against the text-only stream (``1`` = no CFG term).
        start_layer, end_layer: the intervened layers ``[start, end)``; ``None`` = scaled defaults.
        beta: plausibility cutoff β (``0`` = no cutoff).
        use_cfg: run the text-only stream, the CFG step and the cutoff (``False`` = attention
            intervention only, on the raw logits).
    """

    preset: str = DEFAULT_PRESET
    alpha: float = from_preset()
    gamma: float = from_preset()
    start_layer: int | None = from_preset()
    end_layer: int | None = from_preset()
    beta: float = from_preset()
    use_cfg: bool = from_preset()

    name = "pai"
    PRESETS: ClassVar[dict[str, dict[str, Any]]] = {
        "medheval": {"alpha": 0.2, "gamma": 1.1, "start_layer": None, "end_layer": None, "beta": 0.1, "use_cfg": True},
        "official": {"alpha": 0.2, "gamma": 1.1, "start_layer": None, "end_layer": None, "beta": 0.1, "use_cfg": True},
    }
    PRESET_SOURCES: ClassVar[dict[str, str]] = {
        "alpha": "MedHEval `llama_modify(alpha=0.2)`; PAI README run commands and argparse",
        "gamma": "MedHEval `init_cfg_processor(gamma=1.1)`; PAI README run commands (its argparse default is 2)",
        "start_layer": "`None` = `round(2·N/32)`, i.e. layer 2 of 32 (MedHEval; PAI README `--start-layer 2`)",
        "end_layer": "`None` = `N`, i.e. 32 of 32 (MedHEval; PAI README `--end-layer 32`)",
        "beta": "hard-coded 0.1 in PAI's CFG processor (MedHEval copies it)",
        "use_cfg": "MedHEval `use_attn=True, use_cfg=True`; PAI's README examples set γ for the CFG part",
    }

    def __post_init__(self):
        resolve_preset(self)
        self._cutoff = PlausibilityCutoff(self.beta)

    def layers(self, model) -> range:
        start, end = default_layer_range(num_layers(model), self.start_layer, self.end_layer)
        return range(start, end)

    def check(self, model, ctx: DecodingContext) -> None:
        visual_token_ids(model.config)
        self.layers(model)

    def hooks(self, ctx: DecodingContext) -> list[AttentionHook]:
        return [ImageAttentionBoost(self.alpha, self.layers(ctx.model))]

    def contrast_streams(self, ctx: DecodingContext) -> list[Stream]:
        return [text_only_stream(ctx)] if self.use_cfg else []

    def scores(self, ctx: DecodingContext, logits: dict[str, torch.Tensor]) -> torch.Tensor:
        if not self.use_cfg:  # attention intervention only: plain scores, as PAI without its CFG processor
            return logits["main"]
        combined = LogProbContrast(self.gamma - 1.0)(logits["main"], logits["text_only"])
        return self._cutoff(combined, logits["main"])


__all__ = ["PAI", "default_layer_range"]
