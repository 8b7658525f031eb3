r"""DoLa — Decoding by Contrasting Layers.

Chuang, Xie, Luo, Kim, Glass, He, *DoLa: Decoding by Contrasting Layers Improves
Factuality in Large Language Models*, ICLR 2024 (arXiv 2309.03883); code ``voidism/DoLa``.
transformers shipped it as ``generate(dola_layers=…)`` (4.39–4.52) and 5.x moved it to a Hub
repo; this is a self-contained port on medheval's decoding loop.

Per step, with ``q_j = softmax(lm_head(h_j))`` the early-exit distribution of layer ``j``
(``h_0`` = embeddings, ``h_N`` = the final, normed hidden state, i.e. the model's logits):

.. math::
    m = \arg\max_{j \in J} \mathrm{JSD}(q_N \,\|\, q_j),\qquad
    s(y) = \log q_N(y) - \log q_m(y)\ \text{ if } \log q_N(y) \ge \max \log q_N + \log(\text{relative\_top}),
    \ -\infty \text{ otherwise}

The user's logits processors then run on ``s`` — so a repetition penalty is just
``generate(..., repetition_penalty=1.2)`` (the paper's recommended value; MedHEval ran
DoLa without one, which is the default here).

Candidate layers ``J`` (``layers``):

- ``"low"`` (default; MedHEval's ``[0, 2, …, 14]`` for a 32-layer model): ``range(0, N//2, 2)``,
  or ``range(0, 20, 2)`` when ``N > 40``;
- ``"high"``: ``range(N//2, N, 2)``, or ``range(N−20, N, 2)`` when ``N > 40``;
- a list of layer indices in ``[0, N)``.

These are transformers' ``dola_layers`` rules. With tied input/output embeddings, layer 0 is
left out of the ``"low"`` set (``lm_head(embed(x))`` then just peaks at the current token).

Early-exit states are used **without** the final norm, as in the original code (its issue #9
asks whether to apply it); ``final_norm=True`` applies the language model's final norm to
them.

Differences from the original code, so that a row's output does not depend on the batch:
the premature layer is chosen per row (the code averaged the JSD over the batch), and the
filter applies to every row. Neutral setting: ``relative_top=1.0`` keeps only the mature
arg-max, so greedy DoLa equals greedy decoding. (Candidates equal to the mature layer are
*not* neutral: the contrast is then 0 on every kept token.)
"""

from __future__ import annotations

import dataclasses

import torch

from medheval.decoding.contrast import DoLaContrast
from medheval.decoding.hooks import language_model, num_layers
from medheval.decoding.loop import DecodingContext, DecodingMethod
from medheval.decoding.streams import StreamGroup
from medheval.decoding.visual_tokens import MissingInternalError, MitigationError


def candidate_layers(spec: str | list[int] | tuple[int, ...], total_layers: int, tied_embeddings: bool = False) -> list[int]:
    """The premature-layer candidates for an ``total_layers``-layer model (see module docstring)."""
    n = int(total_layers)
    if isinstance(spec, str):
        key = spec.strip().lower()
        if key == "low":
            layers = list(range(0, n // 2, 2)) if n <= 40 else list(range(0, 20, 2))
            if tied_embeddings and 0 in layers:
                layers = [j for j in layers if j != 0] or [min(1, n - 1)]
        elif key == "high":
            layers = list(range(n // 2, n, 2)) if n <= 40 else list(range(n - 20, n, 2))
        else:
            raise MitigationError(f"DoLa layers must be 'low', 'high' or a list of layer indices, got {spec!r}")
    else:
        layers = sorted({int(j) for j in (spec if isinstance(spec, (list, tuple)) else [spec])})
    bad = [j for j in layers if not 0 <= j < n]
    if bad or not layers:
        raise MitigationError(
            f"DoLa candidate layers {bad or layers} are not in [0, {n}) for a {n}-layer language model "
            f"(layer {n} is the mature layer itself)"
        )
    return layers


@dataclasses.dataclass
class DoLa(DecodingMethod):
    """Decoding by Contrasting Layers (formula and defaults in the module docstring).

    Args:
        layers: premature candidates: ``"low"``, ``"high"`` or a list of indices in ``[0, N)``.
        relative_top: the relative-top filter's threshold (0.1 in the paper).
        final_norm: apply the final norm to early-exit hidden states.
    """

    layers: str | list[int] = "low"
    relative_top: float = 0.1
    final_norm: bool = False

    name = "dola"

    def __post_init__(self):
        self._contrast = DoLaContrast(self.relative_top)

    def candidate_layers(self, model) -> list[int]:
        text_config = model.config.get_text_config()
        tied = bool(getattr(text_config, "tie_word_embeddings", getattr(model.config, "tie_word_embeddings", False)))
        return candidate_layers(self.layers, num_layers(model), tied)

    def check(self, model, ctx: DecodingContext) -> None:
        if model.get_output_embeddings() is None:
            raise MissingInternalError(f"DoLa needs the LM head of {type(model).__name__} (get_output_embeddings())")
        if self.final_norm and getattr(language_model(model), "norm", None) is None:
            raise MissingInternalError(
                f"DoLa with final_norm=True needs the language model's final norm (language_model.norm) "
                f"of {type(model).__name__}"
            )
        ctx.state["dola_candidates"] = self.candidate_layers(model)
        ctx.state["dola_chosen"] = []

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
        rows = ctx.rows("main")
        head = model.get_output_embeddings()
        norm = language_model(model).norm if self.final_norm else None
        candidates = []
        for j in ctx.state["dola_candidates"]:
            state = hidden_states[j][rows, -1]
            if norm is not None:
                state = norm(state)
            candidates.append(head(state).float())
        scores, chosen = self._contrast(logits["main"], candidates)
        ctx.state["dola_chosen"].append([ctx.state["dola_candidates"][int(i)] for i in chosen])
        return scores


__all__ = ["DoLa", "candidate_layers"]
