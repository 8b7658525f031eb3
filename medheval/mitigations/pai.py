r"""PAI — Paying More Attention to Image.

Liu, Zheng, Chen, *Paying More Attention to Image: A Training-Free Method for Alleviating
Hallucination in LVLMs*, ECCV 2024 (arXiv 2407.21771); code ``LALBJ/PAI``.

Two parts:

1. **Attention intervention.** In language-model layers ``[start_layer, end_layer)``, on
   the last query row, after the mask and before the softmax, the attention logits on
   image-token keys are amplified:

   .. math:: z_{j} \leftarrow z_{j} + \alpha\,|z_{j}| \qquad (j \text{ an image column})

2. **CFG on a text-only stream** (prefilled alone, then decoded in the clean stream's batch and KV
   cache, one forward of 2B rows per step), with ``log p = log_softmax(ℓ)``:

   .. math::
       s = \gamma(\log p_c - \log p_u) + \log p_u,\qquad
       s(y) = -\infty \text{ unless } \log p_c(y) \ge \log\beta + \max \log p_c

   At ``γ = 1`` the score is ``log p_c`` with no cutoff, as PAI's CFG processor returns it, and the text-only
   stream, which it would not read, is not run (``use_cfg=False`` gives the raw logits, with no text-only stream
   either).

The text-only stream (``cfg_stream``): ``"templated"`` (default) is the templated prompt without
its image tokens, as PAI's own LLaVA code builds it; ``"raw_question"`` is BOS + the tokens of the
user's question text alone (no conversation template, no image marker, no other special token), as
MedHEval's released ``model_vqa.py`` builds it (``init_cfg_processor`` on ``cur_prompt``: the question
with the script's instruction suffixes, ``<image>`` removed, stripped). The question text does not
appear in ``input_ids`` on its own, so the caller hands it over: ``generate(...,
method_inputs=pai.question_inputs(tokenizer, questions))`` (the HF backend does this with each record's
instruction text). A tokenizer without a BOS token (Qwen-VL) gets the question tokens alone.

Presets: ``medheval`` (default) and ``official`` are the same: α = 0.2, γ = 1.1, β = 0.1
(hard-coded in PAI), layers 2..32 of a 32-layer model — MedHEval's runner and the run commands
of PAI's README agree (PAI's evaluation scripts default to γ = 2 when none is passed). Layer
defaults adapt to depth: ``start_layer = round(2·N/32)``, ``end_layer = N`` for an ``N``-layer
language model (2..32 for 7B, 2..40 for 13B). ``alpha=0, gamma=1`` is the neutral setting (scores = ``log p_c``, uncut: plain greedy, and plain
sampling up to sign-dependent processors such as a repetition penalty).

Needs eager attention on the language model: while PAI runs, its attention is switched to
medheval's hookable eager implementation and switched back afterwards (also on errors);
the vision tower is untouched.

Differences from the upstream code: image columns come from ``input_ids`` (not
hard-coded 34..610); the intervention applies at every prompt's first (prefill) step — the
upstream code skipped it there for the first prompt of each process only, whose prefill ran
while its ``use_cfg`` flag was still set from setup (``reference/mitigations.md`` §5 says
"skipped", without the "first prompt only"); at ``γ = 1`` the intervention still applies (upstream's
CFG processor returned before clearing that flag, so no step of any prompt was boosted); the
generation config's processors (e.g. a repetition penalty) run on the CFG score, where upstream's CFG
processor came after transformers' built-in ones, which therefore saw the clean logits only (the same
when none is set: MedHEval's and PAI's scripts pass none); and the base decoding follows the generation
config.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Sequence

import torch

from medheval.decoding.contrast import LogProbContrast, PlausibilityCutoff
from medheval.decoding.hooks import AttentionHook, ImageAttentionBoost, num_layers
from medheval.decoding.loop import DecodingContext, DecodingMethod
from medheval.decoding.streams import Stream
from medheval.decoding.visual_tokens import MitigationError, image_token_mask, left_pad, visual_token_ids
from medheval.mitigations.m3id import text_only_stream
from medheval.mitigations.presets import DEFAULT_PRESET, from_preset, resolve_preset


CFG_STREAMS = ("templated", "raw_question")
"""Values of :attr:`PAI.cfg_stream`."""

RAW_QUESTION_IDS = "raw_question_ids"
"""The ``method_inputs`` key of the raw-question stream's per-row token ids."""


def raw_question_ids(tokenizer, questions: Sequence[str]) -> list[list[int]]:
    """Per question: the tokenizer's BOS (when it has one), then the question's tokens with no special tokens added.

    Raises:
        MitigationError: a question gives no token at all (empty text and no BOS).
    """
    bos = getattr(tokenizer, "bos_token_id", None)
    rows = []
    for index, question in enumerate(questions):
        ids = [int(t) for t in tokenizer(str(question), add_special_tokens=False)["input_ids"]]
        row = ([int(bos)] if bos is not None else []) + ids
        if not row:
            raise MitigationError(f"PAI raw_question: question {index} ({question!r}) gives no token")
        rows.append(row)
    return rows


def raw_question_stream(ctx: DecodingContext, name: str = "text_only") -> Stream:
    """The text-only stream of ``cfg_stream="raw_question"``: each row's ids from ``ctx.method_inputs``, left-padded.

    Raises:
        MitigationError: the ids were not passed, do not match the batch, or hold image tokens.
    """
    rows = ctx.method_inputs.get(RAW_QUESTION_IDS)
    if rows is None:
        raise MitigationError(
            "PAI cfg_stream='raw_question' needs each row's question: pass "
            "method_inputs=pai.question_inputs(tokenizer, questions) to generate (HFBackend does this), "
            "or use cfg_stream='templated'")
    if len(rows) != ctx.batch_size or any(len(row) == 0 for row in rows):
        raise MitigationError(
            f"PAI raw_question: got {len(rows)} rows of question ids (empty ones included) for a batch of "
            f"{ctx.batch_size}; pass one non-empty row per prompt, in the batch's order")
    input_ids, attention_mask = left_pad(rows, ctx.pad_token_id, ctx.main.input_ids.device)
    if bool(image_token_mask(input_ids, ctx.model.config)[attention_mask.bool()].any()):
        raise MitigationError("PAI raw_question: a question holds image tokens; remove the image marker from its text")
    return Stream(name, input_ids, attention_mask, inputs={})


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
        gamma: CFG scale γ against the text-only stream (``1`` = no CFG term and no cutoff: the score is ``log p_c``,
            and no text-only stream runs).
        start_layer, end_layer: the intervened layers ``[start, end)``; ``None`` = scaled defaults.
        beta: plausibility cutoff β (``0`` = no cutoff).
        use_cfg: run the text-only stream, the CFG step and the cutoff (``False`` = attention
            intervention only, on the raw logits).
        cfg_stream: the text-only stream: ``"templated"`` (the prompt without its image tokens) or
            ``"raw_question"`` (BOS + the question text alone, as MedHEval's script; needs
            ``method_inputs`` from :meth:`question_inputs`).
    """

    preset: str = DEFAULT_PRESET
    alpha: float = from_preset()
    gamma: float = from_preset()
    start_layer: int | None = from_preset()
    end_layer: int | None = from_preset()
    beta: float = from_preset()
    use_cfg: bool = from_preset()
    cfg_stream: str = "templated"

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
        if self.cfg_stream not in CFG_STREAMS:
            raise MitigationError(
                f"pai cfg_stream must be one of {list(CFG_STREAMS)}, got {self.cfg_stream!r} "
                "(e.g. --mitigation pai:cfg_stream=raw_question)")
        self._cutoff = PlausibilityCutoff(self.beta)

    def layers(self, model) -> range:
        start, end = default_layer_range(num_layers(model), self.start_layer, self.end_layer)
        return range(start, end)

    def check_model(self, model) -> None:
        visual_token_ids(model.config)
        self.layers(model)

    def _runs_cfg_stream(self) -> bool:
        """Whether decoding runs the text-only stream: with ``use_cfg``, unless ``γ = 1`` (whose score reads none)."""
        return bool(self.use_cfg) and float(self.gamma) != 1.0

    def rows_per_record(self) -> int:
        """2 with the text-only stream (:meth:`_runs_cfg_stream`), else 1."""
        return 2 if self._runs_cfg_stream() else 1

    def hooks(self, ctx: DecodingContext) -> list[AttentionHook]:
        return [ImageAttentionBoost(self.alpha, self.layers(ctx.model))]

    def question_inputs(self, tokenizer, questions: list[str]) -> dict[str, Any]:
        """``{"raw_question_ids": ...}`` (:func:`raw_question_ids`) when the CFG stream is the raw question,
        else ``{}``."""
        if not (self._runs_cfg_stream() and self.cfg_stream == "raw_question"):
            return {}
        return {RAW_QUESTION_IDS: raw_question_ids(tokenizer, questions)}

    def contrast_streams(self, ctx: DecodingContext) -> list[Stream]:
        if not self._runs_cfg_stream():
            return []
        return [raw_question_stream(ctx) if self.cfg_stream == "raw_question" else text_only_stream(ctx)]

    def scores(self, ctx: DecodingContext, logits: dict[str, torch.Tensor]) -> torch.Tensor:
        if not self.use_cfg:  # attention intervention only: plain scores, as PAI without its CFG processor
            return logits["main"]
        if not self._runs_cfg_stream():  # γ = 1: PAI's CFG processor returns log p_c as it is, no cutoff
            return torch.log_softmax(logits["main"].float(), dim=-1)
        combined = LogProbContrast(self.gamma - 1.0)(logits["main"], logits["text_only"])
        return self._cutoff(combined, logits["main"])


__all__ = ["CFG_STREAMS", "PAI", "RAW_QUESTION_IDS", "default_layer_range", "raw_question_ids", "raw_question_stream"]
