r"""DoLa — Decoding by Contrasting Layers.

Chuang, Xie, Luo, Kim, Glass, He, *DoLa: Decoding by Contrasting Layers Improves
Factuality in Large Language Models*, ICLR 2024 (arXiv 2309.03883); code ``voidism/DoLa``.
transformers shipped it as ``generate(dola_layers=…)`` (PR #29619, still in review after 4.39 was
released; the Hub repo that replaced it matches transformers < 4.53) and 5.x moved it to a Hub repo;
this is a self-contained port on medheval's decoding loop.

Per step, with ``q_j = softmax(lm_head(h_j))`` the early-exit distribution of layer ``j``
(``h_0`` = embeddings, ``h_N`` = the final, normed hidden state, i.e. the model's logits):

.. math::
    m = \arg\max_{j \in J} \mathrm{JSD}(q_N \,\|\, q_j),\qquad
    s(y) = \log q_N(y) - \log q_m(y)\ \text{ if } \log q_N(y) \ge \max \log q_N + \log(\text{relative\_top}),
    \ -\infty \text{ otherwise}

The user's logits processors then run on ``s`` — so a repetition penalty is just
``generate(..., repetition_penalty=1.2)`` (the paper's recommended value; MedHEval ran
DoLa without one, and a repetition penalty is a ``generate`` option, not part of a preset).

Candidate layers ``J`` (``layers``), for an ``N``-layer language model:

- ``"medheval"``: ``[0, 2, …, 14]`` whatever ``N`` (MedHEval's setting, also for 40-layer
  models); layers ``≥ N`` are left out on models with at most 14 layers;
- ``"low"``: transformers' ``dola_layers="low"`` rule (≤ 4.52, now the Hub repo
  ``transformers-community/dola``), exactly: start ``s = 0`` without tied input/output
  embeddings, with tied ones ``s = 2`` if ``N > 2``, ``1`` if ``N = 2``, ``0`` if ``N = 1`` (an
  early exit at the tied embeddings just peaks at the current token); then ``[s]`` if
  ``s = N//2``, else ``range(s, N//2, 2)`` (``range(s, 20, 2)`` when ``N > 40``). E.g. 32
  layers: ``[0, 2, …, 14]`` (tied: ``[2, …, 14]``); 40: ``[0, 2, …, 18]``; 4 tied: ``[2]``;
- ``"high"``: transformers' rule: ``range(N//2, N, 2)``, or ``range(N−20, N, 2)`` when ``N > 40``;
- a list of layer indices in ``[0, N)`` (transformers silently drops indices ``≥ N``; here they
  are an error).

"Tied" is the language model's ``tie_word_embeddings`` (its text config; transformers read the
top-level config, the same for text-only models).

Presets: ``medheval`` (default) — ``layers="medheval"``; ``official`` — ``layers="low"``, the
rule of transformers' port (which DoLa's repository points its users to); it gives the
``[0, 2, …, 14]`` of DoLa's README for LLaMA-7B. Both: ``relative_top = 0.1``, no final norm on early exits.

Early-exit states are used **without** the final norm, as in the original code (its issue #9
asks whether to apply it); ``final_norm=True`` applies the language model's final norm to
them.

Cost per step: the candidates' last-position states go through the LM head in **one** call,
stacked on the row dimension (``[J·B, H] → [J·B, V]``, :func:`early_exit_logits`), so the head's
weights (262 MB at 7B in bfloat16) are read once, not ``J`` times; the chosen layers stay on the device
(``ctx.state["dola_chosen_index"]``; :func:`chosen_layers` reads them), so no step waits for the host.

Differences from the original code, so that a row's output does not depend on the batch:
the premature layer is chosen per row (the code averaged the JSD over the batch), and the
filter applies to every row. Neutral setting: ``relative_top=1.0`` keeps only the mature
arg-max, so greedy DoLa equals greedy decoding. (Candidates equal to the mature layer are
*not* neutral: the contrast is then 0 on every kept token.)
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Sequence

import torch

from medheval.decoding.contrast import DoLaContrast
from medheval.decoding.hooks import language_model, num_layers
from medheval.decoding.loop import DecodingContext, DecodingMethod
from medheval.decoding.streams import StreamGroup
from medheval.decoding.visual_tokens import MissingInternalError, MitigationError
from medheval.mitigations.presets import DEFAULT_PRESET, from_preset, resolve_preset

MEDHEVAL_LAYERS = tuple(range(0, 16, 2))
"""MedHEval's DoLa candidates, ``[0, 2, …, 14]``, for every model."""


def low_start_layer(total_layers: int, tied_embeddings: bool) -> int:
    """transformers' first ``"low"`` candidate: 0 untied; tied: 2 if ``N > 2``, 1 if ``N = 2``, else 0."""
    if not tied_embeddings:
        return 0
    return 2 if total_layers > 2 else 1 if total_layers == 2 else 0


LAYER_RULES = ("medheval", "low", "high")
"""The named rules of :attr:`DoLa.layers` (a list of layer indices is the other form)."""


def check_layers(spec: str | int | list[int] | tuple[int, ...]) -> None:
    """Check a ``layers`` value whatever the model: a rule of :data:`LAYER_RULES`, or indices ``>= 0`` (a bound
    of ``N`` needs the model: :func:`candidate_layers`).

    Raises:
        MitigationError: naming the value and the allowed forms.
    """
    indices = [spec] if isinstance(spec, int) else spec
    bad = (spec.strip().lower() not in LAYER_RULES if isinstance(spec, str)
           else not indices or any(int(j) < 0 for j in indices))
    if bad:
        raise MitigationError(
            f"dola: option layers={spec!r} must be {', '.join(map(repr, LAYER_RULES))} or a non-empty list of layer "
            "indices >= 0, e.g. --mitigation dola:layers=low or dola:layers=0/2/4 (one layer: dola:layers=4/)")


def candidate_layers(spec: str | int | list[int] | tuple[int, ...], total_layers: int,
                     tied_embeddings: bool = False) -> list[int]:
    """The premature-layer candidates for an ``total_layers``-layer model (rules in the module docstring)."""
    n = int(total_layers)
    check_layers(spec)
    if isinstance(spec, str):
        key = spec.strip().lower()
        if key == "medheval":
            layers = [j for j in MEDHEVAL_LAYERS if j < n]
        elif key == "low":
            start = low_start_layer(n, tied_embeddings)
            if start == n // 2:
                layers = [start]
            else:
                layers = list(range(start, n // 2, 2)) if n <= 40 else list(range(start, 20, 2))
        else:  # "high"
            layers = list(range(n // 2, n, 2)) if n <= 40 else list(range(n - 20, n, 2))
        if not layers:
            raise MitigationError(
                f"DoLa layers={spec!r} gives no candidate layer for a {n}-layer language model"
                f"{' with tied embeddings' if tied_embeddings else ''}; pass a list of layer indices in [0, {n})"
            )
        return layers
    layers = sorted({int(j) for j in (spec if isinstance(spec, (list, tuple)) else [spec])})
    bad = [j for j in layers if j >= n]
    if bad:
        raise MitigationError(
            f"DoLa candidate layers {bad} are not in [0, {n}) for a {n}-layer language model "
            f"(layer {n} is the mature layer itself)"
        )
    return layers


@dataclasses.dataclass
class DoLa(DecodingMethod):
    """Decoding by Contrasting Layers (formula and defaults in the module docstring).

    Args:
        preset: ``"medheval"`` (default) or ``"official"``; the unset options below take its values.
        layers: premature candidates: ``"medheval"``, ``"low"``, ``"high"`` or a list of indices in ``[0, N)``
            (checked here; the bound ``N`` when a model decodes).
        relative_top: the relative-top filter's threshold (0.1 in the paper).
        final_norm: apply the final norm to early-exit hidden states.
    """

    preset: str = DEFAULT_PRESET
    layers: str | int | list[int] = from_preset()
    relative_top: float = from_preset()
    final_norm: bool = from_preset()

    name = "dola"
    PRESETS: ClassVar[dict[str, dict[str, Any]]] = {
        "medheval": {"layers": "medheval", "relative_top": 0.1, "final_norm": False},
        "official": {"layers": "low", "relative_top": 0.1, "final_norm": False},
    }
    PRESET_SOURCES: ClassVar[dict[str, str]] = {
        "layers": "MedHEval appendix A.4 / `model_vqa.py`: `[0, 2, …, 14]` for every model; official: "
                  "transformers' `dola_layers=\"low\"` rule (= DoLa README's `[0, 2, …, 14]` for LLaMA-7B)",
        "relative_top": "DoLa's code and transformers' default; MedHEval `relative_top=0.1`",
        "final_norm": "DoLa's code and transformers apply no final norm to early exits; neither does MedHEval",
    }

    def __post_init__(self):
        resolve_preset(self)
        check_layers(self.layers)
        self._contrast = DoLaContrast(self.relative_top)

    def candidate_layers(self, model) -> list[int]:
        text_config = model.config.get_text_config()
        tied = bool(getattr(text_config, "tie_word_embeddings", getattr(model.config, "tie_word_embeddings", False)))
        return candidate_layers(self.layers, num_layers(model), tied)

    def check_model(self, model) -> None:
        if model.get_output_embeddings() is None:
            raise MissingInternalError(f"DoLa needs the LM head of {type(model).__name__} (get_output_embeddings())")
        if self.final_norm and getattr(language_model(model), "norm", None) is None:
            raise MissingInternalError(
                f"DoLa with final_norm=True needs the language model's final norm (language_model.norm) "
                f"of {type(model).__name__}"
            )
        self.candidate_layers(model)

    def check(self, model, ctx: DecodingContext) -> None:
        ctx.state["dola_candidates"] = self.candidate_layers(model)
        ctx.state["dola_chosen_index"] = []

    def forward_kwargs(self, ctx: DecodingContext, group: StreamGroup) -> dict:
        return {"output_hidden_states": True} if "main" in group.names else {}

    def scores(self, ctx: DecodingContext, logits: dict[str, torch.Tensor]) -> torch.Tensor:
        model = ctx.model
        outputs = ctx.outputs["main"]
        hidden_states = getattr(outputs, "hidden_states", None)
        total = num_layers(model)
        if hidden_states is None or len(hidden_states) != total + 1:
            raise MissingInternalError(
                f"DoLa needs output_hidden_states with {total + 1} entries (embeddings + every layer) from "
                f"{type(model).__name__}, got {None if hidden_states is None else len(hidden_states)}"
            )
        early = early_exit_logits(model, hidden_states, ctx.state["dola_candidates"], ctx.rows("main"), self.final_norm)
        scores, chosen = self._contrast(logits["main"], early)
        ctx.state["dola_chosen_index"].append(chosen)  # a device tensor: no host sync per step
        return scores


def early_exit_logits(
    model, hidden_states: Sequence[torch.Tensor], layers: Sequence[int], rows: slice, final_norm: bool = False
) -> torch.Tensor:
    """``[J, B, V]`` float32 early-exit logits ``lm_head(h_j)`` of the last position, ``j`` in ``layers``.

    The ``J`` states are stacked on the row dimension and go through the (optional final norm and)
    LM head in **one** call, ``[J·B, H] → [J·B, V]``: the head's weights (``V × H``, 262 MB at 7B in
    bfloat16) are read once per step instead of once per candidate layer.
    """
    head = model.get_output_embeddings()
    states = torch.stack([hidden_states[j][rows, -1] for j in layers])  # [J, B, H]
    if final_norm:
        states = language_model(model).norm(states)
    count, batch, hidden = states.shape
    return head(states.reshape(count * batch, hidden)).float().reshape(count, batch, -1)


def chosen_layers(state: dict[str, Any]) -> list[list[int]]:
    """The premature layer DoLa chose, per step and row, from a decoding context's ``state``.

    ``state["dola_chosen_index"]`` holds one ``[B]`` tensor of candidate indices per step (kept on the
    device, so decoding never waits for the host); this reads them (one transfer) and maps them to
    layer numbers of ``state["dola_candidates"]``.
    """
    candidates, steps = state["dola_candidates"], state["dola_chosen_index"]
    indices = torch.stack(steps).tolist() if steps else []  # [steps, B]: every step has the call's B rows
    return [[candidates[i] for i in row] for row in indices]


__all__ = ["DoLa", "LAYER_RULES", "candidate_layers", "check_layers", "chosen_layers", "early_exit_logits"]
