r"""OPERA — Over-trust Penalty and Retrospection-Allocation (its own beam search).

Huang, Dong, Zhang, Wang, He, Wang, Lin, Zhang, Yu, *OPERA: Alleviating Hallucination in
Multi-Modal Large Language Models via Over-Trust Penalty and Retrospection-Allocation*,
CVPR 2024 (arXiv 2311.17911); code ``shikiw/OPERA`` (a modified transformers 4.29.2,
``opera_beam_search``), as run by MedHEval (``reference/mitigations.md`` §6).

Per step of a beam search with ``K`` beams, for every running beam:

1. **Candidates**: the top ``N`` tokens by raw logit (``N = num_attn_candidates``).
2. **Look-ahead**: append each candidate and take its last-layer attention row, max over heads,
   normalised to sum 1. ``W`` is the local window: the rows and columns of the *generated*
   tokens (the beam's attention history plus the candidate's row), at most ``window_size`` of
   them.
3. **Over-trust score** of the window (column-wise product from the diagonal down):

   .. math:: \phi_j = 10^{-7} \prod_{i \ge j} \sigma W_{ij}, \qquad
             \text{score} = \max_j \phi_j,\ \text{location} = \arg\max_j \phi_j

   with ``σ = scale_factor``.
4. **Penalty**: while the answer (candidate included) has at most 10 tokens,
   ``−Σ_{image columns} W_{last, j}`` (a bonus for attending to the image); afterwards
   ``max_j φ_j``. Candidate score ``= logit − penalty_weights · penalty``; every other token
   ``−∞``.
5. **Retrospection-allocation**: per beam the most frequent location over its candidates, per
   prompt the most frequent over its beams (``loc``). If *every* beam has had ``loc`` as its
   location in more than ``threshold`` steps and ``loc ≥ 10``, roll back to the step that chose
   token ``loc + 1`` (at most ``N`` times per position, then one position earlier, then never):
   restore the beams of that step, recompute their KV cache and attention history, and redo that
   step as a plain beam step in which the previously chosen (beam, token) pairs are forbidden.
6. ``log_softmax``, the generation config's logits processors, and a standard beam step with
   length normalisation (:class:`medheval.decoding.beam.BeamSearch`: transformers 5's own beam
   search semantics, including ``length_penalty`` and ``early_stopping``).

Presets: ``medheval`` (default) and ``official`` are the same — 5 beams, σ = 50, threshold 15,
5 candidates, penalty 1, window 512 (MedHEval's appendix A.4; OPERA's evaluation settings).
MedHEval used σ = 25, threshold 25 for LLaVA-Med-1.5 *report generation* only (also what its
released ``model_vqa.py`` passes): select that with ``preset="medheval_llava_med_report"``
(the model is never guessed from its name). ``max_new_tokens`` is a ``generate`` argument
(MedHEval 128, OPERA 512). The differences from the
official code are listed in ``mitigations/opera/README.md``; the main ones: image tokens come
from ``input_ids`` (never positions 34..610), the four look-ahead forwards of a step are one
forward (the candidates as ``N`` query tokens that each see the prefix and only themselves),
whose KV and logits are then reused for the chosen tokens, so a step costs one forward
instead of ``1 + N``; a rollback recomputes only the generated tokens (the prompt's cache is
shared); the attention history is kept only for the window (never every layer or the prompt);
the prompts of a batch are decoded in lock-step, and a prompt that rolls back continues on its
own, so rollbacks of one prompt never move another (a batch gives the single-prompt results).

Sliding-window models (Gemma 3 / MedGemma): rollbacks and look-ahead crops need every key, so the
cache is a ``DynamicCache`` of full-length ``DynamicLayer``\ s (never the ``DynamicSlidingWindowLayer``\ s
``generate`` prepares, which drop keys outside the window). The model's own mask functions apply
the window per layer over those keys (``kv_idx > q_idx - sliding_window``: the keys a sliding layer
would keep, so the logits are the same), the prefill takes the processor's ``token_type_ids``
(bidirectional attention over image tokens; generated tokens are causal, as in ``generate``), and
the look-ahead forward gets one 4-D mask per layer type. On a sliding last layer (MedGemma) the
recorded rows are over the full-length keys with weight 0 outside the window. A caller's cache with
sliding or static layers is refused.

Compiled decoding (CUDA by default, ``compiled_decoding(True)`` elsewhere): after the prefill the beams move
onto a static cache (:class:`medheval.decoding.compiled.StaticRows`) and the look-ahead forward runs through
the compiled model, one graph per row, capacity and candidate-count bucket; the masks span the capacity and
the recorder reduces over heads inside the graph and slices the window after it. Beam reordering and the kept
candidate move rows and columns in place; rollbacks and redone steps run eagerly on the same cache, and a
prompt that rolls back continues on a static cache of its own. The tokens are the eager path's.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import math
from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from medheval.decoding import compiled, internals
from medheval.decoding.beam import (
    BeamSearch,
    keep_appended_tokens,
    select_cache_rows,
    supports_token_selection,
    trim_to_generated,
)
from medheval.decoding.hooks import AttentionHook, attention_hooks, attention_modules
from medheval.decoding.loop import DecodingMethod
from medheval.decoding.internals import prompt_position_ids
from medheval.decoding.visual_tokens import MissingInternalError, MitigationError, image_token_mask
from medheval.mitigations.presets import DEFAULT_PRESET, from_preset, resolve_preset

EARLY_TOKENS = 10
"""Answer length (candidate included) up to which the penalty is the image-attention bonus; also
the smallest location a rollback may target (both hard-coded 10 upstream)."""

SCORE_SCALE = 1e-7
"""The constant factor of the over-trust score (hard-coded upstream)."""

_FLOAT32_MAX_LOG = math.log(torch.finfo(torch.float32).max)


# ---------------------------------------------------------------------------------------
# the over-trust score
# ---------------------------------------------------------------------------------------
def overtrust_scores(window: torch.Tensor, scale_factor: float) -> torch.Tensor:
    r"""Column-wise over-trust scores of attention windows (the reference formula).

    .. math:: \phi_j = 10^{-7} \prod_{i \ge j} \sigma W_{ij}

    Args:
        window: ``[..., r, r]`` lower-triangular attention among generated tokens (row ``i``:
            attention of token ``i`` over tokens ``0..i``).
        scale_factor: ``σ``.

    Returns:
        ``[..., r]`` the scores ``φ_j`` (float32, computed as a direct product).
    """
    scaled = window.float() * scale_factor
    r = scaled.shape[-1]
    out = torch.empty(scaled.shape[:-1], dtype=torch.float32, device=scaled.device)
    for j in range(r):
        out[..., j] = SCORE_SCALE * scaled[..., j:, j].prod(-1)
    return out


def candidate_log_overtrust(history: torch.Tensor, candidate_rows: torch.Tensor, scale_factor: float) -> torch.Tensor:
    r"""``log φ_j`` of each candidate's window, sharing the history's column products.

    The window of candidate ``c`` is the beam's history ``H`` (``h×h``) with one zero column
    appended and the candidate's row below it, so

    .. math:: \log\phi_{c,j} = \log 10^{-7} + \sum_{i \ge j} \log \sigma H_{ij} + \log \sigma w_{c,j}

    (the last sum is empty for ``j = h``). Log space keeps long products finite.

    Args:
        history: ``[K, h, h]`` the beams' attention history (lower-triangular rows).
        candidate_rows: ``[K, N, h + 1]`` the candidates' rows.
        scale_factor: ``σ``.

    Returns:
        ``[K, N, h + 1]`` float32 ``log φ`` (``-inf`` where a weight is 0).
    """
    K, h = history.shape[0], history.shape[-1]
    scale = float(scale_factor)
    log_scale = math.log(scale) if scale > 0 else float("-inf")
    if h:
        lower = torch.ones(h, h, dtype=torch.bool, device=history.device).tril()
        logs = torch.where(lower, torch.log(history.float()) + log_scale, torch.zeros((), device=history.device))
        column = logs.sum(dim=-2)  # [K, h]: sum over rows i >= j
    else:
        column = history.new_zeros((K, 0), dtype=torch.float32)
    column = torch.cat([column, column.new_zeros((K, 1))], dim=-1)  # candidate's own column
    return math.log(SCORE_SCALE) + column[:, None, :] + torch.log(candidate_rows.float()) + log_scale


# ---------------------------------------------------------------------------------------
# the rollback trigger
# ---------------------------------------------------------------------------------------
class RollbackTracker:
    """OPERA's retrospection trigger for ``P`` prompts decoded in lock-step, ``K`` beams each.

    Each step, :meth:`record` gets the over-trust locations of every beam's candidates: per beam
    the most frequent one (``torch.mode``, the smallest on ties) is recorded, and a prompt's ``loc`` is
    the most frequent of its beams'. A rollback of a prompt is due when, for every beam slot, more than
    ``threshold`` recorded steps have ``loc``, and ``loc >= min_location``. The target is position
    ``loc + 1``; a position is targeted at most ``max_per_position`` times, then the one before it, then
    the trigger gives up; targets further back than ``history_length + 1`` are clamped. As upstream,
    the history is per beam *slot* (not reordered with the beams).

    :meth:`record` runs on the locations' device for every prompt at once (no host read) and proposes
    ``(loc, due)`` per prompt; the loop reads the proposals once and decides on the host (:meth:`decide`). While
    ``threshold`` steps or fewer are recorded no rollback can be due, and nothing is proposed (nothing to read).
    :meth:`observe` does both for one prompt.

    Args:
        threshold: repeats needed (strictly more than).
        max_per_position: rollbacks per position (upstream: ``num_attn_candidates``).
        history_length: how far back a rollback can go (upstream: ``window_size``).
        min_location: smallest location that triggers (upstream: 10).
        prompts: ``P``.
    """

    def __init__(self, threshold: int, max_per_position: int, history_length: int, min_location: int = EARLY_TOKENS,
                 prompts: int = 1):
        self.threshold = int(threshold)
        self.max_per_position = int(max_per_position)
        self.history_length = int(history_length)
        self.min_location = int(min_location)
        self.history: torch.Tensor | None = None  # [P, K, capacity] per-beam locations, the first `steps` recorded
        self.steps = 0
        self.rollbacks: list[dict[int, int]] = [{} for _ in range(int(prompts))]  # per prompt: position -> count

    def record(self, locations: torch.Tensor) -> torch.Tensor | None:
        """Record one step; ``[P, 2]`` ``(loc, due)`` per prompt on the locations' device, or ``None`` while none
        can be due.

        Args:
            locations: ``[P, K, N]`` (or ``[K, N]`` for one prompt) the location of the maximal over-trust score of
                each candidate (index among the generated tokens).
        """
        if locations.dim() == 2:
            locations = locations[None]
        per_beam = locations.mode(dim=-1).values  # [P, K]
        if self.history is None or self.steps == self.history.shape[-1]:  # room for twice the steps
            grown = per_beam.new_zeros((*per_beam.shape, max(16, 2 * self.steps)))
            if self.history is not None:
                grown[..., : self.steps] = self.history[..., : self.steps]
            self.history = grown
        self.history[..., self.steps] = per_beam
        self.steps += 1
        if self.steps <= self.threshold:  # no beam can have more than `threshold` repeats yet
            return None
        loc = per_beam.mode(dim=-1).values  # [P]
        repeats = (self.history[..., : self.steps] == loc[:, None, None]).sum(dim=-1)  # [P, K]
        due = (repeats > self.threshold).all(dim=-1) & (loc >= self.min_location)
        return torch.stack([loc, due.to(loc.dtype)], dim=-1)

    def decide(self, prompt: int, loc: int, due: bool, response_length: int) -> int | None:
        """Where prompt ``prompt`` rolls back to, if anywhere (the generated-token index whose choice is redone),
        from its :meth:`record` proposal read on the host; ``response_length``: generated tokens including the
        candidate (upstream's ``cur_response_lens``)."""
        if not due:
            return None
        rollbacks = self.rollbacks[prompt]
        position = int(loc) + 1
        if rollbacks.get(position, 0) >= self.max_per_position:
            position -= 1
            if rollbacks.get(position, 0) >= self.max_per_position:
                return None
        rollbacks[position] = rollbacks.get(position, 0) + 1
        if response_length - position > self.history_length + 1:
            position = max(1, response_length - self.history_length - 1)
        return position

    def observe(self, locations: torch.Tensor, response_length: int) -> int | None:
        """One prompt (``[K, N]`` locations): record a step and say where to roll back to, if anywhere."""
        proposal = self.record(locations)
        if proposal is None:
            return None
        loc, due = proposal[0].tolist()
        return self.decide(0, loc, bool(due), response_length)

    def select(self, prompts: list[int]) -> "RollbackTracker":
        """The trackers of ``prompts`` only (their history copied; their rollback counts shared)."""
        part = copy.copy(self)
        if self.history is not None:
            index = torch.tensor(prompts, device=self.history.device)
            part.history = self.history.index_select(0, index)
        part.rollbacks = [self.rollbacks[p] for p in prompts]
        return part

    def truncate(self, step: int) -> None:
        """Forget the steps after ``step`` (after a rollback to ``step``)."""
        self.steps = min(self.steps, step + 1)


# ---------------------------------------------------------------------------------------
# attention rows of the last layer, window columns only
# ---------------------------------------------------------------------------------------
class WindowAttentionRecorder(AttentionHook):
    """Last-layer attention, max over heads, each row normalised to sum 1; keeps only window columns.

    Armed before a forward (:meth:`arm`), it keeps that forward's ``[rows, heads, q, kv]`` weights reduced
    over heads (the only work inside the forward, so a compiled forward reads no per-step number), and
    :meth:`take` reduces them to what OPERA needs:

    - ``"lookahead"`` (``q = N`` candidates appended at once, each seeing the prefix and itself):
      per candidate its window row ``[rows, N, r]`` and its image-attention sum ``[rows, N]``;
    - ``"step"`` (``q = 1``): the fed token's window row ``[rows, r]``;
    - ``"rebuild"`` (``q = p`` generated tokens): the last ``keep`` rows, window columns only,
      ``[rows, keep, keep]``.

    On a static cache the keys span its capacity: :meth:`take` gets the rows and columns that are real.
    Nothing is kept between forwards except the last result, so the attention stored is
    ``O(N · capacity)`` per beam; the caller's history is ``O(window²)`` per beam.
    """

    def __init__(self, layer: int):
        super().__init__([layer])
        self.mode: str | None = None
        self.weights: torch.Tensor | None = None

    def arm(self, mode: str, *, start: int, prompt_length: int = 0, image_mask: torch.Tensor | None = None,
            keep: int = 0) -> None:
        if mode not in ("lookahead", "step", "rebuild"):  # pragma: no cover - programming error
            raise MitigationError(f"unknown recorder mode {mode!r}")
        self.mode, self.start, self.prompt_length = mode, int(start), int(prompt_length)
        self.image_mask, self.keep, self.weights = image_mask, int(keep), None

    def observe(self, layer_idx: int, weights: torch.Tensor) -> None:
        if self.mode is None:
            return
        self.weights = weights.detach().float().amax(dim=1)  # [rows, q, kv]

    def take(self, *, rows: int | None = None, columns: int | None = None):
        """The armed reduction of the recorded weights; ``rows``/``columns``: the real ones (static cache)."""
        if self.weights is None:
            raise MissingInternalError(
                "OPERA recorded no last-layer attention: the language model's attention must run through "
                "transformers' AttentionInterface (eager-capable decoder layers)"
            )
        w, mode = self.weights, self.mode
        self.weights, self.mode = None, None
        w = w[:rows, :, :columns]
        if mode == "lookahead":
            n = w.shape[1]
            prefix_len = w.shape[2] - n
            own = torch.diagonal(w[:, :, prefix_len:], dim1=1, dim2=2)  # [rows, N]
            prefix = w[:, :, :prefix_len]
            total = prefix.sum(-1) + own
            window = torch.cat([prefix[:, :, self.start:], own[..., None]], dim=-1) / total[..., None]
            t = self.prompt_length
            image = (prefix[:, :, :t] * self.image_mask[:, None, :t].to(w.dtype)).sum(-1) / total
            return window, image
        if mode == "step":
            row = w[:, -1, :]
            return row[:, self.start:] / row.sum(-1, keepdim=True)
        lo = w.shape[1] - self.keep  # "rebuild"
        return w[:, lo:, self.start:] / w[:, lo:].sum(-1, keepdim=True)


# ---------------------------------------------------------------------------------------
# the method
# ---------------------------------------------------------------------------------------
@dataclasses.dataclass
class OPERA(DecodingMethod):
    """OPERA's beam search (see the module docstring for the rule, defaults and differences).

    Args:
        preset: ``"medheval"`` (default), ``"official"`` (the same values) or
            ``"medheval_llava_med_report"`` (σ = 25, threshold 25); the unset options below take its values.
        num_beams: beams per prompt (``1`` gives OPERA on greedy-like decoding).
        scale_factor: ``σ``, multiplies the attention window before the column products.
        threshold: a rollback needs the same location in more than this many steps (every beam).
        num_attn_candidates: ``N``, candidates per beam and step (clamped to the vocabulary);
            also the number of rollbacks allowed per position.
        penalty_weights: weight of the penalty (``0`` = no penalty).
        window_size: most generated tokens in the attention window, and how many past steps a
            rollback can reach.
    """

    preset: str = DEFAULT_PRESET
    num_beams: int = from_preset()
    scale_factor: float = from_preset()
    threshold: int = from_preset()
    num_attn_candidates: int = from_preset()
    penalty_weights: float = from_preset()
    window_size: int = from_preset()

    name = "opera"
    supports_sampling: ClassVar[bool] = False  # a beam search (see _check_generation_config)
    # Its own beam loop, with the look-ahead forward compiled on a static cache (medheval.decoding.compiled.StaticRows):
    # the N candidates are written at the capacity's columns [prefix, prefix + N) under a 4-D mask over the whole
    # capacity, the recorder keeps only the head-max weights inside the graph (its slicing by window and length runs
    # after it), and the kept candidate's column is moved in place. Rollbacks and redone steps (other query counts,
    # rare) run eagerly on the same static cache; a prompt that rolls back gets a static cache of its own.
    compiles: ClassVar[bool] = True
    PRESETS: ClassVar[dict[str, dict[str, Any]]] = {
        "medheval": {"num_beams": 5, "scale_factor": 50.0, "threshold": 15, "num_attn_candidates": 5,
                     "penalty_weights": 1.0, "window_size": 512},
        "official": {"num_beams": 5, "scale_factor": 50.0, "threshold": 15, "num_attn_candidates": 5,
                     "penalty_weights": 1.0, "window_size": 512},
        "medheval_llava_med_report": {"num_beams": 5, "scale_factor": 25.0, "threshold": 25,
                                      "num_attn_candidates": 5, "penalty_weights": 1.0, "window_size": 512},
    }
    PRESET_SOURCES: ClassVar[dict[str, str]] = {
        "num_beams": "MedHEval `num_beams=5`; OPERA's evaluation (5 beams)",
        "scale_factor": "MedHEval appendix A.4 (25 for LLaVA-Med-1.5 report generation, as its `model_vqa.py`); "
                        "OPERA `generate` default and evaluation 50",
        "threshold": "MedHEval appendix A.4 (25 for LLaVA-Med-1.5 report generation); OPERA default 15 "
                     "(its README's faster setting: 25 with 1 candidate)",
        "num_attn_candidates": "MedHEval appendix A.4; OPERA default 5",
        "penalty_weights": "MedHEval appendix A.4; OPERA default 1",
        "window_size": "OPERA `window_size=512` (MedHEval keeps the default)",
    }

    def rows_per_record(self) -> int:
        return int(self.num_beams)

    def __post_init__(self):
        resolve_preset(self)
        if int(self.num_beams) < 1:
            raise MitigationError(f"OPERA num_beams must be >= 1, got {self.num_beams}")
        if int(self.num_attn_candidates) < 1:
            raise MitigationError(f"OPERA num_attn_candidates must be >= 1, got {self.num_attn_candidates}")
        if int(self.window_size) < 1:
            raise MitigationError(f"OPERA window_size must be >= 1, got {self.window_size}")
        if float(self.scale_factor) < 0:
            raise MitigationError(f"OPERA scale_factor must be >= 0, got {self.scale_factor}")
        if int(self.threshold) < 0:
            raise MitigationError(f"OPERA threshold must be >= 0, got {self.threshold}")

    def run_loop(self, model, input_ids, *, synced_gpus: bool = False, **kwargs):
        """OPERA runs its own beam search; generate hands pixel values over raw and unexpanded."""
        return opera_generate(self, model, input_ids, synced_gpus=synced_gpus, **kwargs)

    def observe_step(self, event: dict[str, Any]) -> None:
        """Called with what the search computed (``event["kind"]``: ``"step"`` — candidates, penalties,
        locations of the prompts decoded together; ``"rollback"``; ``"advance"``); does nothing.
        Subclass it to log or inspect the search."""


# ---------------------------------------------------------------------------------------
# decoding
# ---------------------------------------------------------------------------------------
_UNSUPPORTED_INPUTS = ("inputs_embeds",)


def _check_generation_config(method: OPERA, gen) -> int:
    """Validate the generation settings; returns the factor ``generate`` expanded the inputs by."""
    if getattr(gen, "do_sample", False):
        raise MitigationError("OPERA is a beam search: do_sample=True (beam sampling) is not supported")
    gen_beams = int(getattr(gen, "num_beams", 1) or 1)
    if gen_beams > 1 and gen_beams != method.num_beams:
        raise MitigationError(
            f"OPERA(num_beams={method.num_beams}) but generate(num_beams={gen_beams}): set the beams on OPERA "
            "(or pass the same number to both)"
        )
    n_return = int(getattr(gen, "num_return_sequences", 1) or 1)
    if n_return > method.num_beams:
        raise MitigationError(
            f"num_return_sequences={n_return} > OPERA num_beams={method.num_beams}; at most one sequence per beam"
        )
    if getattr(gen, "max_length", None) is None:
        raise MitigationError("OPERA needs generation_config.max_length (generate sets it from max_new_tokens)")
    return max(gen_beams, n_return)


_RAW_INPUTS = ("pixel_values", "image_sizes", "image_grid_thw")  # named in DecodingMethod.__call__: generate hands them over unexpanded


def _dexpand(value, factor: int, rows: int):
    """Undo generate's ``repeat_interleave(factor)`` on batch-first tensors."""
    if factor > 1 and torch.is_tensor(value) and value.dim() >= 1 and value.shape[0] == rows * factor:
        return value[::factor]
    return value


def _sliding_window(model) -> int | None:
    """The sliding window of a model whose text config mixes ``"sliding_attention"`` and ``"full_attention"``
    layers (Gemma 3 / MedGemma), ``None`` for full attention only; refuses other layer kinds."""
    text = model.config.get_text_config(decoder=True)
    layer_types = getattr(text, "layer_types", None)
    window = getattr(text, "sliding_window", None)
    if not layer_types:
        if window is not None and getattr(text, "use_sliding_window", True) is not False:
            raise MitigationError(
                f"OPERA on {type(model).__name__}: its text config sets sliding_window={window} without per-layer "
                "layer_types, so the model takes one mask for every layer and OPERA cannot give the look-ahead "
                "forward its sliding-window mask (not supported; models with layer_types, e.g. Gemma 3, are)"
            )
        return None
    kinds = set(layer_types)
    other = sorted(kinds - {"full_attention", "sliding_attention"})
    if other:
        raise MitigationError(
            f"OPERA on {type(model).__name__}: layer types {other} are not supported (OPERA handles "
            "'full_attention' and 'sliding_attention' layers)"
        )
    if "sliding_attention" not in kinds:
        return None
    if not isinstance(window, int) or window < 1:
        raise MitigationError(
            f"OPERA on {type(model).__name__}: 'sliding_attention' layers but sliding_window={window!r} "
            "in its text config"
        )
    return window


def _full_length_cache(model, past) -> tuple[Any, int | None]:
    """OPERA's cache, and the model's sliding window (``None`` without sliding-window layers).

    OPERA crops its cache (rollbacks, look-ahead tokens) and selects its rows (beams), so every layer
    must keep every key: a ``DynamicCache`` of plain ``DynamicLayer``\\ s. A sliding-window model
    (Gemma 3) gets one too, without its ``DynamicSlidingWindowLayer``\\ s: the model's own mask
    functions then apply the window per layer over the full-length keys (``kv_idx > q_idx - window``,
    the same keys a sliding layer keeps), and OPERA's look-ahead mask does the same for those layers.
    The cache ``generate`` prepared (``DynamicCache(config)``, or a static one from the generation
    config's ``cache_implementation``, e.g. Gemma 3's ``"hybrid"``) is replaced; a cache the caller
    passed is used only if it is already such a cache and empty.
    """
    name = type(model).__name__
    window = _sliding_window(model)
    if internals.cache_length(past) > 0:
        raise MitigationError(
            f"OPERA on {name} cannot continue from a filled KV cache ({type(past).__name__}; a "
            "sliding-window layer has also dropped the keys a rollback needs): start from the prompt"
        )
    if past is not None and internals.is_user_cache(past):
        layers = internals.non_full_layer_kinds(past)
        if not internals.is_plain_dynamic_cache(past) or layers:
            raise MitigationError(
                f"OPERA on {name}: the KV cache passed to generate is a {type(past).__name__}"
                f"{' with ' + ', '.join(layers) + ' layers' if layers else ''}; OPERA crops and reorders its cache "
                "and needs every key of every layer: pass no cache (OPERA then builds a DynamicCache of "
                "full-length layers) or DynamicCache() without a config"
            )
        return past, window
    if window is not None:
        return internals.new_cache(), window  # lazily filled with full-length DynamicLayers
    if past is not None and internals.is_full_length_cache(past):
        return past, None
    cache = internals.new_cache(model)
    layers = internals.non_full_layer_kinds(cache)
    if layers:
        raise MitigationError(
            f"OPERA on {name}: its cache has {', '.join(layers)} layers; OPERA needs full-length DynamicLayers "
            "(it crops and reorders the cache)"
        )
    return cache, None


def _static_rows(prompts: int, beams: int) -> int:
    """The static cache's row bucket for ``prompts`` prompts: their bucket times the beams (4 prompts x 5 beams:
    20 rows, where rounding the 20 rows would give 32), so every full batch shares one graph."""
    return compiled.row_bucket(prompts) * beams


def opera_generate(
    method: OPERA,
    model,
    input_ids: torch.LongTensor,
    logits_processor=None,
    stopping_criteria=None,
    generation_config=None,
    synced_gpus: bool = False,
    streamer=None,
    **model_kwargs,
):
    """Run OPERA on a prepared batch (what ``generate`` hands a ``custom_generate`` callable).

    Returns:
        ``[B * num_return_sequences, T + new]`` sequences (finished hypotheses padded with
        ``pad_token_id`` as in ``generate``), or a ``GenerateBeamDecoderOnlyOutput`` with
        ``sequences``, ``sequences_scores`` (if ``output_scores``) and ``beam_indices`` when
        ``return_dict_in_generate=True``.
    """
    from transformers import LogitsProcessorList, StoppingCriteriaList

    gen = generation_config if generation_config is not None else model.generation_config
    factor = _check_generation_config(method, gen)
    if streamer is not None:
        raise MitigationError("OPERA (beam search) cannot stream tokens; drop the streamer")
    if synced_gpus:
        raise MitigationError("OPERA does not support synced_gpus (run one process per GPU instead)")
    for key in _UNSUPPORTED_INPUTS:
        if model_kwargs.get(key) is not None:
            raise MitigationError(f"OPERA needs input_ids with image placeholders; {key} is not supported")
    logits_processor = logits_processor if logits_processor is not None else LogitsProcessorList()
    stopping_criteria = stopping_criteria if stopping_criteria is not None else StoppingCriteriaList()
    if not stopping_criteria:
        stopping_criteria.append(internals.max_length_criteria(gen.max_length))

    # generate repeated the prompts per beam (when it got num_beams/num_return_sequences): undo it,
    # the prompt is prefilled once and its cache repeated per beam
    rows = input_ids.shape[0] // factor
    if factor > 1:
        encoded = model_kwargs.get(internals.ENCODED_IMAGES)
        if encoded:
            raise MitigationError(
                "OPERA: pre-encoded mm_encoder_outputs cannot be combined with generate(num_beams>1); "
                "set the beams on OPERA instead"
            )
        input_ids = input_ids[::factor]
        model_kwargs = {k: (v if k in _RAW_INPUTS else _dexpand(v, factor, rows)) for k, v in model_kwargs.items()}
    batch_size = int(input_ids.shape[0])
    if any(type(p).__name__ == "PrefixConstrainedLogitsProcessor" for p in logits_processor) and batch_size > 1:
        raise MitigationError(
            "OPERA regroups the prompts of a batch during the search (a prompt that rolls back continues alone), "
            "but prefix_allowed_tokens_fn identifies prompts by row: use batch size 1"
        )

    cache, sliding_window = _full_length_cache(model, internals.pop_cache(model_kwargs))
    attention_mask = model_kwargs.pop("attention_mask", None)
    model_kwargs.pop("position_ids", None)
    for key in ("use_cache", "logits_to_keep", "cache_position"):
        model_kwargs.pop(key, None)
    model_kwargs = {k: v for k, v in model_kwargs.items() if not (v is None or (isinstance(v, dict) and not v))}
    # the prompt's positions as generate computes them (Qwen-VL: [4, B, T] M-RoPE positions)
    position_ids = prompt_position_ids(model, input_ids, attention_mask, model_kwargs)
    if position_ids.dim() == 2:
        position_ids = position_ids.expand(input_ids.shape[0], -1)

    image_mask = image_token_mask(input_ids, model.config)  # raises MissingInternalError without an image token id
    last_layer = len(attention_modules(model)) - 1  # fails early if the decoder layers cannot be hooked

    with torch.no_grad():
        # 1. prefill all prompts at once, in the model's own attention implementation
        inputs = internals.prefill_inputs(
            model, input_ids, cache=cache, attention_mask=attention_mask, position_ids=position_ids, use_cache=True,
            **({"logits_to_keep": 1} if internals.supports_logits_to_keep(model) else {}), **model_kwargs,
        )
        outputs = model(**inputs, return_dict=True)
        first_logits = outputs.logits[:, -1, :].to(copy=True, dtype=torch.float32)
        cache = internals.output_cache(outputs)
        del outputs, inputs

        if position_ids is not None:
            # [B], or [B, A] for multi-axis (M-RoPE) positions: generated tokens advance every axis by one
            last_positions = position_ids[..., -1] if position_ids.dim() == 2 else position_ids[..., -1].T
        elif attention_mask is not None:
            last_positions = attention_mask.long().sum(-1) - 1
        else:
            last_positions = torch.full((batch_size,), input_ids.shape[1] - 1, dtype=torch.long)

        # 2. the beam searches, with the last layer's attention recorded (this call only); on the static path
        # (compiled decoding: CUDA by default) the look-ahead forwards run compiled
        K = method.num_beams
        internals.repeat_rows(cache, K)  # the prompt's cache once per beam
        static = None
        candidates = min(int(method.num_attn_candidates), int(first_logits.shape[-1]))  # N, clamped to the vocabulary
        if compiled.wanted(model) and internals.static_refusal(cache) is None:
            # the look-ahead writes N columns past the longest prefix (max_length - 1)
            static = compiled.StaticRows(model, cache, slot=("opera", -1), capacity=int(gen.max_length) + candidates,
                                         rows=_static_rows(batch_size, K))
            cache = None
        emb = model.get_input_embeddings()
        shared = _Shared(
            method=method, model=model, recorder=WindowAttentionRecorder(last_layer), K=K, T=int(input_ids.shape[1]),
            window=int(method.window_size), vocab=int(first_logits.shape[-1]), candidates=candidates,
            dtype=emb.weight.dtype if emb is not None else torch.float32, device=input_ids.device,
            logits_processor=internals.processor_chain(logits_processor), stopping_criteria=stopping_criteria,
            accepts_positions="position_ids" in inspect.signature(model.forward).parameters,
            token_selection=static is not None or supports_token_selection(cache), sliding_window=sliding_window,
            observed=type(method).observe_step is not OPERA.observe_step,
        )
        beams = BeamSearch(
            input_ids.repeat_interleave(K, dim=0), K, gen.max_length,
            length_penalty=gen.length_penalty if gen.length_penalty is not None else 1.0,
            early_stopping=gen.early_stopping if gen.early_stopping is not None else False,
            eos_token_id=internals.eos_token_tensor(gen), pad_token_id=internals.pad_token_tensor(gen),
            num_return_sequences=int(getattr(gen, "num_return_sequences", 1) or 1),
        )
        prompt_mask = None
        if attention_mask is not None and not bool(attention_mask.all()):
            prompt_mask = attention_mask.repeat_interleave(K, dim=0)
        group = _Group(
            shared, prompts=list(range(batch_size)), beams=beams, cache=cache, prompt_mask=prompt_mask,
            image_mask=image_mask.repeat_interleave(K, dim=0),
            next_position=(last_positions.to(input_ids.device).long() + 1).repeat_interleave(K, dim=0),
            logits=first_logits.repeat_interleave(K, dim=0),
            history=first_logits.new_zeros((batch_size * K, 0, 0)),
            tracker=RollbackTracker(method.threshold, method.num_attn_candidates, method.window_size,
                                    prompts=batch_size),
            static=static,
        )
        del cache
        results: dict[int, tuple] = {}
        with attention_hooks(model, [shared.recorder]):
            queue = [group]
            del group
            while queue:
                queue.pop(0).run(queue, results)

    sequences = torch.cat([results[b][0] for b in range(batch_size)], dim=0)
    sequence_scores = torch.cat([results[b][1] for b in range(batch_size)], dim=0)
    beam_indices = torch.cat([results[b][2] for b in range(batch_size)], dim=0)
    sequences, beam_indices = trim_to_generated(sequences, beam_indices, input_ids.shape[1])
    if not getattr(gen, "return_dict_in_generate", False):
        return sequences
    return internals.beam_output(
        sequences=sequences,
        sequences_scores=sequence_scores if getattr(gen, "output_scores", False) else None,
        beam_indices=beam_indices,
    )


@dataclasses.dataclass
class _Shared:
    """What every group of a call shares."""

    method: OPERA
    model: Any
    recorder: WindowAttentionRecorder
    K: int
    T: int
    window: int
    vocab: int
    candidates: int  # N: candidates per beam and step (num_attn_candidates clamped to the vocabulary)
    dtype: torch.dtype
    device: torch.device
    logits_processor: Any
    stopping_criteria: Any
    accepts_positions: bool
    token_selection: bool
    sliding_window: int | None  # Gemma 3: the window of its "sliding_attention" layers (None: full attention only)
    observed: bool  # a subclass overrides OPERA.observe_step: build its events (else skipped, no work per step)


@dataclasses.dataclass
class _Lookahead:
    tokens: torch.Tensor  # [R, N] candidates (R = rows = prompts x beams)
    logits: torch.Tensor  # [R, N] their raw logits
    rows: torch.Tensor  # [R, N, r] their window rows
    image: torch.Tensor  # [R, N] their image-attention sums
    next_logits: torch.Tensor  # [R, N, V] the logits after each candidate
    log_score: torch.Tensor  # [R, N] log max_j phi_j
    locations: torch.Tensor  # [R, N] argmax_j, as generated-token index
    appended: int  # tokens appended to the cache

    def select(self, rows: torch.Tensor) -> "_Lookahead":
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        return _Lookahead(**{k: (v.index_select(0, rows) if torch.is_tensor(v) else v) for k, v in fields.items()})


class _Group:
    """Prompts decoded in lock-step: their ``K`` beams each are the rows of one batch and one cache.

    All prompts of a call start in one group. A prompt leaves it when its beam search is done
    (its result is kept), or when it rolls back: it then continues in a group of its own, so the
    others never wait for it or move with it, and every prompt gets exactly what it would get alone.
    """

    def __init__(self, shared: _Shared, *, prompts: list[int], beams: BeamSearch, cache, prompt_mask, image_mask,
                 next_position, logits, history, tracker, snapshots=None, selections=None, rejects=None,
                 static: compiled.StaticRows | None = None):
        self.shared = shared
        self.prompts = prompts  # index of each member in the caller's batch
        self.beams = beams
        self.cache = cache  # a DynamicCache of full-length layers, or None on the static path
        self.static = static  # the rows on a static cache with the compiled look-ahead forward (or None)
        self.prompt_mask = prompt_mask  # [R, T] or None (no padding)
        self.image_mask = image_mask  # [R, T]
        self.next_position = next_position  # [R] position of the first generated token
        self.logits = logits  # [R, V] next-token logits of the running beams
        self.history = history  # [R, h, h] attention among the generated tokens (window)
        self.tracker = tracker  # the members' rollback triggers
        self.snapshots: dict[int, Any] = snapshots if snapshots is not None else {}  # step -> BeamState
        self.selections: dict[int, tuple] = selections if selections is not None else {}  # step -> (beam_idx, tokens)
        self.rejects: list[dict[int, torch.Tensor]] = rejects if rejects is not None else [{} for _ in prompts]
        self.redo: torch.Tensor | None = None  # (single-member group) pairs forbidden at the redone step
        self.rollback_to: tuple[int, int] | None = None  # (target, step) to execute first

    # -- membership ---------------------------------------------------------------------------
    def _rows(self, members: list[int]) -> torch.Tensor:
        """The rows of ``members`` (their ``K`` beams each), made on the device."""
        K = self.shared.K
        beams = torch.arange(K, device=self.shared.device)
        return torch.cat([beams + m * K for m in members])

    def _subset(self, members: list[int]) -> dict[str, Any]:
        """Everything per member/row, for ``members`` only (new tensors; the cache is not included)."""
        K = self.shared.K
        rows = self._rows(members)
        index = torch.tensor(members, device=self.shared.device)
        remap = torch.full((len(self.prompts) * K,), -1, dtype=torch.long, device=self.shared.device)
        remap[rows] = torch.arange(rows.numel(), device=self.shared.device)
        selections = {}
        for step, (beam_idx, tokens) in self.selections.items():
            selections[step] = (remap[beam_idx.index_select(0, rows)], tokens.index_select(0, rows))
        return dict(
            prompts=[self.prompts[m] for m in members],
            beams=self.beams.select(index),
            prompt_mask=None if self.prompt_mask is None else self.prompt_mask.index_select(0, rows),
            image_mask=self.image_mask.index_select(0, rows),
            next_position=self.next_position.index_select(0, rows),
            logits=self.logits.index_select(0, rows),
            history=self.history.index_select(0, rows),
            tracker=self.tracker.select(members),
            snapshots={step: state.select(index) for step, state in self.snapshots.items()},
            selections=selections,
            rejects=[self.rejects[m] for m in members],
        )

    def split(self, member: int) -> "_Group":
        """A new group for one member (a copy of its state and cache rows)."""
        part = self._subset([member])
        rows = self._rows([member])
        if self.static is not None:  # its own static cache: the groups of a call are alive at the same time
            alone = self.static.split(rows, ("opera", self.prompts[member]), _static_rows(1, self.shared.K))
            return _Group(self.shared, cache=None, static=alone, **part)
        return _Group(self.shared, cache=select_cache_rows(self.cache, rows), **part)

    def keep(self, members: list[int]) -> None:
        """Drop every member not in ``members``."""
        rows = self._rows(members)
        for key, value in self._subset(members).items():
            setattr(self, key, value)
        if self.static is not None:
            self.static.select(rows)
        else:
            internals.select_rows(self.cache, rows)

    def _finish(self, members: list[int], results: dict) -> None:
        index = torch.tensor(members, device=self.shared.device)
        done = self.beams.select(index)
        sequences, scores, beam_indices = done.finalize(
            trim=False, prompt_index=torch.tensor([self.prompts[m] for m in members], device=self.shared.device))
        n = done.num_return_sequences
        for i, m in enumerate(members):
            results[self.prompts[m]] = (sequences[i * n : (i + 1) * n], scores[i * n : (i + 1) * n],
                                        beam_indices[i * n : (i + 1) * n])

    # -- forwards --------------------------------------------------------------------------------
    def _mask(self, length: int) -> torch.Tensor | None:
        if self.prompt_mask is None:
            return None
        extra = length - self.shared.T
        return torch.cat([self.prompt_mask, self.prompt_mask.new_ones((self.prompt_mask.shape[0], extra))], dim=-1)

    def _positions(self, offsets: torch.Tensor) -> torch.Tensor:
        """``[R, n]`` positions ``next_position + offsets`` (multi-axis M-RoPE: ``[A, R, n]``, the same
        offset on every axis, as ``generate`` advances them)."""
        base = self.next_position
        if base.dim() == 1:
            return base[:, None] + offsets[None, :]
        return (base[:, :, None] + offsets[None, None, :]).permute(1, 0, 2)

    def _forward(self, tokens: torch.Tensor, positions: torch.Tensor, *, attention_mask, logits_to_keep=1):
        kwargs = dict(input_ids=tokens, attention_mask=attention_mask, use_cache=True,
                      logits_to_keep=logits_to_keep, return_dict=True, **internals.cache_keyword(self.cache))
        if self.shared.accepts_positions:
            kwargs["position_ids"] = positions
        return self.shared.model(**kwargs)

    def _static_forward(self, tokens: torch.Tensor, positions: torch.Tensor, *, base: torch.Tensor, own: torch.Tensor,
                        anchor: torch.Tensor, logits_to_keep: int = 1, compile: bool = False):
        """A forward on the static cache, writing ``tokens`` ``[R, q]`` from its length on. Query ``i`` sees the
        prompt (not its padding), the columns before ``base[i]`` and column ``own[i]``; on sliding-window layers
        only the columns after ``anchor[i] - window`` (the model's own rule for a query at column ``anchor[i]``).
        ``compile``: through the compiled forward (the look-ahead; rollbacks and redone steps run eagerly)."""
        sh, static = self.shared, self.static
        columns = torch.arange(static.capacity, device=sh.device)
        allowed = (columns[None, :] < base[:, None]) | (columns[None, :] == own[:, None])  # [q, C]
        allowed = allowed[None].expand(tokens.shape[0], -1, -1)
        if self.prompt_mask is not None:
            seen = F.pad(self.prompt_mask.bool(), (0, static.capacity - sh.T), value=True)  # [R, C]
            allowed = allowed & seen[:, None, :]
        mask: Any = self._additive(allowed)
        if sh.sliding_window is not None:
            recent = columns[None, :] > anchor[:, None] - sh.sliding_window
            mask = {"full_attention": mask, "sliding_attention": self._additive(allowed & recent)}
        inputs = dict(input_ids=tokens, attention_mask=mask, use_cache=True, logits_to_keep=logits_to_keep)
        if sh.accepts_positions:
            inputs["position_ids"] = positions
        return static.forward(inputs, compile=compile, advance=int(tokens.shape[1]))

    def _additive(self, allowed: torch.Tensor) -> torch.Tensor:
        """``[R, 1, q, kv]`` additive mask (0 where ``allowed``, the dtype's minimum elsewhere)."""
        dtype = self.shared.dtype
        mask = torch.zeros((allowed.shape[0], 1, *allowed.shape[1:]), dtype=dtype, device=allowed.device)
        return mask.masked_fill_(~allowed[:, None], torch.finfo(dtype).min)

    def _window_start(self, step: int) -> int:
        """First generated-token index in the window of step ``step`` (its candidate at ``step``)."""
        return max(0, step + 1 - self.shared.window)

    def _lookahead(self, step: int) -> _Lookahead:
        sh = self.shared
        R, T = self.logits.shape[0], sh.T
        n = sh.candidates
        cand_logits, cand_tokens = torch.topk(self.logits, n, dim=-1)
        prefix = T + step
        held = self.static.length if self.static is not None else internals.cache_length(self.cache)
        if held != prefix:  # pragma: no cover - internal invariant
            raise MitigationError(f"OPERA cache holds {held} tokens, expected {prefix}")
        positions = self._positions(torch.full((n,), step, device=sh.device))
        lo = self._window_start(step)
        sh.recorder.arm("lookahead", start=T + lo, prompt_length=T, image_mask=self.image_mask)
        if self.static is not None:  # one compiled graph per bucket: n candidates over the capacity's columns
            at_prefix = torch.full((n,), prefix, device=sh.device)
            out = self._static_forward(cand_tokens, positions, base=at_prefix,
                                       own=prefix + torch.arange(n, device=sh.device), anchor=at_prefix,
                                       logits_to_keep=0, compile=True)
            rows, image = sh.recorder.take(rows=R, columns=prefix + n)
            return self._scored(cand_tokens, cand_logits, rows, image, out.logits.to(dtype=torch.float32), lo, n)
        # the N candidates in one forward: each sees the prefix and itself only, all at the same position
        prefix_mask = self._mask(prefix)
        allowed_prefix = (prefix_mask.bool() if prefix_mask is not None
                          else torch.ones((R, prefix), dtype=torch.bool, device=sh.device))
        allowed = torch.cat([allowed_prefix[:, None, :].expand(R, n, prefix),
                             torch.eye(n, dtype=torch.bool, device=sh.device).expand(R, n, n)], dim=-1)
        mask4d = self._additive(allowed)
        if sh.sliding_window is not None:
            # Gemma 3: a mask per layer type; a sliding layer's candidate (query index ``prefix``) sees the
            # keys ``j > prefix - window`` (as the model's own sliding mask) and itself
            recent = torch.arange(prefix + n, device=sh.device) > prefix - sh.sliding_window
            mask4d = {"full_attention": mask4d, "sliding_attention": self._additive(allowed & recent)}
        out = self._forward(cand_tokens, positions, attention_mask=mask4d, logits_to_keep=0)
        rows, image = sh.recorder.take()
        return self._scored(cand_tokens, cand_logits, rows, image, out.logits.to(dtype=torch.float32), lo, n)

    def _scored(self, tokens, logits, rows, image, next_logits, lo: int, n: int) -> _Lookahead:
        """The look-ahead with each candidate's over-trust score and its location (generated-token index)."""
        log_phi = candidate_log_overtrust(self.history, rows, self.shared.method.scale_factor)
        log_score, location = log_phi.max(dim=-1)
        return _Lookahead(tokens, logits, rows, image, next_logits, log_score, location + lo, n)

    # -- scores ------------------------------------------------------------------------------------
    def _penalised_scores(self, look: _Lookahead, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        if step + 1 <= EARLY_TOKENS:
            penalty = -look.image
        else:
            penalty = torch.exp(look.log_score.clamp(max=_FLOAT32_MAX_LOG)).clamp(max=torch.finfo(torch.float32).max)
        weight = float(self.shared.method.penalty_weights)
        cand = look.logits - weight * penalty if weight != 0.0 else look.logits
        scores = torch.full_like(self.logits, float("-inf"))
        scores.scatter_(-1, look.tokens, cand)
        return scores, penalty

    # -- history ---------------------------------------------------------------------------------
    def _append_history(self, beam_idx: torch.Tensor, row: torch.Tensor) -> None:
        history = self.history.index_select(0, beam_idx)
        history = F.pad(history, (0, 1))
        history = torch.cat([history, row[:, None, :]], dim=1)
        if history.shape[-1] > self.shared.window - 1:
            cut = history.shape[-1] - (self.shared.window - 1)
            history = history[:, cut:, cut:]
        self.history = history

    def _advance(self, step: int, beam_idx: torch.Tensor, tokens: torch.Tensor, look: _Lookahead | None,
                 which: torch.Tensor | None) -> None:
        """Cache, logits and history for the chosen tokens: the look-ahead's (``which``: each new beam's candidate
        index, given when every chosen token is a candidate of its source beam), else one forward."""
        sh = self.shared
        if look is not None and which is not None:
            if self.static is not None:
                # a beam's source is a beam of its prompt: the prompt's columns are equal, copy the rest
                self.static.keep_appended(sh.T + step, beam_idx, which, shared=sh.T)
            else:
                keep_appended_tokens(self.cache, sh.T + step, beam_idx, which)
            self.logits = look.next_logits[beam_idx, which]
            self._append_history(beam_idx, look.rows[beam_idx, which])
            if sh.observed:
                sh.method.observe_step({"kind": "advance", "prompts": list(self.prompts), "step": step,
                                        "reused": True})
            return
        positions = self._positions(torch.full((1,), step, device=sh.device))
        sh.recorder.arm("step", start=sh.T + self._window_start(step))
        if self.static is not None:
            prefix = torch.full((1,), sh.T + step, device=sh.device)
            self.static.set_length(sh.T + step)  # drops the look-ahead tokens, if any
            self.static.select(beam_idx, shared=sh.T)  # beams of the same prompt: only the generated columns move
            out = self._static_forward(tokens[:, None], positions, base=prefix + 1, own=prefix, anchor=prefix)
            row = sh.recorder.take(rows=int(beam_idx.numel()), columns=sh.T + step + 1)
        else:
            if look is not None:
                internals.crop(self.cache, look.appended)
            internals.reorder_rows(self.cache, beam_idx)
            out = self._forward(tokens[:, None], positions, attention_mask=self._mask(sh.T + step + 1))
            row = sh.recorder.take()
        self.logits = out.logits[:, -1, :].to(dtype=torch.float32)
        del out
        self._append_history(beam_idx, row)
        if sh.observed:
            sh.method.observe_step({"kind": "advance", "prompts": list(self.prompts), "step": step, "reused": False})

    # -- rollback (single-member group) ------------------------------------------------------------
    def _rollback(self, target: int, step: int) -> None:
        """Go back to the start of step ``target`` and forbid the (beam, token) pairs chosen there."""
        sh = self.shared
        rejects = self.rejects[0]
        beam_idx, tokens = self.selections[target]
        rejected = beam_idx * sh.vocab + tokens
        if target in rejects:
            rejected = torch.cat([rejects[target], rejected])
        self.rejects[0] = {k: v for k, v in rejects.items() if k < target}
        self.rejects[0][target] = rejected
        self.snapshots = {k: v for k, v in self.snapshots.items() if k <= target}
        self.selections = {k: v for k, v in self.selections.items() if k < target}
        self.tracker.truncate(target)
        self.beams.restore(self.snapshots[target])
        # the prompt's KV is the same for every beam: keep it, recompute the generated tokens
        generated = self.beams.flat_sequences()[:, sh.T :]
        keep = min(target, sh.window - 1)
        sh.recorder.arm("rebuild", start=sh.T + target - keep, keep=keep)
        positions = self._positions(torch.arange(target, device=sh.device))
        if self.static is not None:
            self.static.set_length(sh.T)
            at = sh.T + torch.arange(target, device=sh.device)
            out = self._static_forward(generated, positions, base=at + 1, own=at, anchor=at)
            self.history = sh.recorder.take(rows=int(generated.shape[0]), columns=sh.T + target)
        else:
            internals.crop(self.cache, internals.cache_length(self.cache) - sh.T)
            out = self._forward(generated, positions, attention_mask=self._mask(sh.T + target))
            self.history = sh.recorder.take()
        self.logits = out.logits[:, -1, :].to(dtype=torch.float32)
        del out
        self.redo = rejected
        if sh.observed:
            sh.method.observe_step({"kind": "rollback", "prompt": self.prompts[0], "from": step, "to": target,
                                    "rejected": rejected.clone(), "logits": self.logits.clone(),
                                    "history": self.history, "sequences": self.beams.flat_sequences().clone()})

    # -- the loop ------------------------------------------------------------------------------------
    def _rollbacks_due(self, look: _Lookahead, step: int) -> dict[int, int]:
        """Member -> the step it rolls back to, for the members whose trigger fired this step: one host read for
        every member (none while no trigger can fire yet)."""
        proposals = self.tracker.record(look.locations.view(len(self.prompts), self.shared.K, -1))
        if proposals is None:
            return {}
        rolling = {}
        for m, (loc, due) in enumerate(proposals.tolist()):
            target = self.tracker.decide(m, loc, bool(due), step + 1)
            if target is not None:
                target = min(target, step - 1)
                if target >= 1 and target in self.snapshots:
                    rolling[m] = target
        return rolling

    def run(self, queue: list, results: dict) -> None:
        """Decode until every member is done or has left for a group of its own (appended to ``queue``)."""
        sh = self.shared
        beams = self.beams
        if self.rollback_to is not None:
            self._rollback(*self.rollback_to)
            self.rollback_to = None
        while self.prompts:
            beams = self.beams
            step = beams.generated_length
            look = None
            if self.redo is not None:  # the step a rollback returned to: plain scores, earlier choices forbidden
                scores = self.logits.clone()
                scores.view(-1).index_fill_(0, self.redo, float("-inf"))
            else:
                look = self._lookahead(step)
                rolling = self._rollbacks_due(look, step)
                if rolling:
                    if len(self.prompts) == 1:
                        self._rollback(rolling[0], step)
                        continue
                    for m, target in rolling.items():
                        part = self.split(m)
                        part.rollback_to = (target, step)
                        queue.append(part)
                    stay = [m for m in range(len(self.prompts)) if m not in rolling]
                    if not stay:
                        return
                    rows = self._rows(stay)
                    self.keep(stay)
                    look = look.select(rows)
                    beams = self.beams
                scores, penalty = self._penalised_scores(look, step)
                if sh.observed:
                    sh.method.observe_step({
                        "kind": "step", "prompts": list(self.prompts), "step": step,
                        "sequences": beams.flat_sequences(), "candidates": look.tokens,
                        "candidate_logits": look.logits, "penalty": penalty, "image_attention": look.image,
                        "log_score": look.log_score, "locations": look.locations, "rows": look.rows,
                        "history": self.history,
                    })
            log_probs = F.log_softmax(scores, dim=-1)
            log_probs = sh.logits_processor(beams.flat_sequences(), log_probs)
            self.snapshots[step] = beams.snapshot()
            for old in [k for k in self.snapshots if k < step - sh.window - 1]:
                del self.snapshots[old]
            beam_idx, tokens = beams.step(log_probs, sh.stopping_criteria)
            self.selections[step] = (beam_idx, tokens)
            self.redo = None
            # one host read: which prompts are done, and whether every chosen token is one of its beam's candidates
            # (then the look-ahead's cache column, logits and attention row are kept)
            which = None
            flags = beams.prompt_done
            if look is not None and sh.token_selection:
                match = look.tokens.index_select(0, beam_idx) == tokens[:, None]
                which = match.to(torch.int8).argmax(dim=-1)
                flags = torch.cat([flags, match.any(dim=-1).all()[None]])
            flags = flags.tolist()
            done = [m for m, flag in enumerate(flags[: len(self.prompts)]) if flag]
            if len(done) == len(self.prompts):
                self._finish(done, results)
                return
            self._advance(step, beam_idx, tokens, look, which if which is not None and flags[-1] else None)
            if done:
                self._finish(done, results)
                self.keep([m for m in range(len(self.prompts)) if m not in done])


__all__ = [
    "EARLY_TOKENS",
    "OPERA",
    "RollbackTracker",
    "WindowAttentionRecorder",
    "candidate_log_overtrust",
    "opera_generate",
    "overtrust_scores",
]
