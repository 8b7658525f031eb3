"""Beam search one step at a time, with the semantics of transformers 5's own beam search.

transformers 5 removed ``BeamSearchScorer``; its beam search is now a vectorised loop inside
``GenerationMixin._beam_search`` with no way in for a method that must *change* the scores of
each step (OPERA's over-trust penalty) or *go back* to an earlier step (OPERA's rollback).
:class:`BeamSearch` is that loop's bookkeeping as an object a method can drive itself:

    beams = BeamSearch(prompt_ids, num_beams=5, max_length=..., length_penalty=1.0, early_stopping=False,
                       eos_token_id=..., pad_token_id=...)
    while True:
        log_probs = log_softmax(scores_of_this_step)               # [B*K, V]
        log_probs = logits_processor(beams.flat_sequences(), log_probs)
        beam_idx, tokens = beams.step(log_probs, stopping_criteria)
        if beams.done:
            break
        cache.reorder_cache(beam_idx); forward(tokens)             # the caller owns model and cache
    sequences, scores, beam_indices = beams.finalize()

Each step does exactly what ``_beam_search`` does (``_get_top_k_continuations``,
``_get_running_beams_for_next_iteration``, ``_update_finished_beams``,
``_check_early_stop_heuristic``, ``_beam_search_has_unfinished_sequences``, transformers 5.23):

1. add the running beams' scores to the step's log-probabilities and keep the top
   ``K' = max(2, 1 + #eos) · K`` continuations of each prompt over all its beams and tokens;
2. ask the stopping criteria which of them are finished;
3. the best ``K`` unfinished ones become the running beams;
4. finished ones among the top ``K`` enter the ``K`` kept hypotheses with score
   ``sum log p / (generated length) ** length_penalty`` if they beat the worst one
   (none once ``early_stopping=True`` has ``K`` of them, or when the heuristic says no
   running beam can still win);
5. the search stops when no running beam can beat the worst kept hypothesis (heuristic set by
   ``early_stopping`` and ``length_penalty``), when ``early_stopping=True`` and every prompt has
   ``K`` hypotheses, or when every continuation hits a stopping criterion (``max_length``).

So a method that feeds it the plain ``log_softmax`` of the logits reproduces
``generate(num_beams=K, do_sample=False, length_penalty=…, early_stopping=…)`` token for token
(``tests/test_mitigations_opera.py`` checks it through OPERA at its neutral setting). Beam *sampling*
is not implemented.

:meth:`snapshot` / :meth:`restore` copy the state (a few small tensors) so a method can go
back to an earlier step; :attr:`prompt_done` (prompt ``b`` searched alone would have stopped)
and :meth:`select` (the search of some prompts only) let a caller finish each prompt as soon as
it alone would, or move it to a search of its own. The helpers at the bottom handle the KV
cache per beam: :func:`select_cache_rows` (some rows of a cache, without copying the others)
and :func:`keep_appended_tokens` (keep, per new beam, the prefix of its source beam plus *one*
of several tokens a look-ahead forward appended).
"""

from __future__ import annotations

import copy
import dataclasses

import torch

from medheval.decoding import internals
from medheval.decoding.visual_tokens import MitigationError


def _gather_beams(tensor: torch.Tensor, beam_indices: torch.Tensor) -> torch.Tensor:
    """``tensor[b, beam_indices[b, i], ...]`` (transformers' ``_gather_beams``) for indices ``>= 0``: one
    ``gather`` (``take_along_dim`` adds a ``remainder`` launch to wrap negative indices)."""
    while beam_indices.dim() < tensor.dim():
        beam_indices = beam_indices.unsqueeze(-1)
    return torch.gather(tensor, 1, beam_indices.expand(*beam_indices.shape[:2], *tensor.shape[2:]))


def _flatten(tensor: torch.Tensor) -> torch.Tensor:
    """``[B, K, ...] -> [B*K, ...]``."""
    return tensor.reshape(tensor.shape[0] * tensor.shape[1], *tensor.shape[2:])


@dataclasses.dataclass
class BeamState:
    """The whole state of a beam search between two steps (all tensors, plus the length).

    ``running_*`` are the ``K`` live beams per prompt; ``sequences``/``beam_scores``/
    ``beam_indices``/``is_sent_finished`` the ``K`` best finished hypotheses. Shapes as in
    transformers: sequences ``[B, K, max_length]``, beam indices ``[B, K, max_length - T]``
    (here the beam *within* its prompt, ``0..K-1``; :meth:`BeamSearch.finalize` adds the prompt
    offset). ``prompt_done[b]``: prompt ``b`` alone would have stopped (its results no longer
    change); ``done``: the whole batch stops, as ``generate`` (a 0-d tensor after a step, read only when asked:
    on a GPU a read waits for the step's kernels; a ``bool`` when known on the host).
    """

    running_sequences: torch.Tensor
    running_beam_scores: torch.Tensor
    running_beam_indices: torch.Tensor
    sequences: torch.Tensor
    beam_scores: torch.Tensor
    beam_indices: torch.Tensor
    is_sent_finished: torch.Tensor
    is_early_stop_heuristic_unsatisfied: torch.Tensor
    next_token_hits_stopping_criteria: torch.Tensor
    prompt_done: torch.Tensor
    cur_len: int
    done: bool | torch.Tensor = False

    def clone(self) -> "BeamState":
        return BeamState(**{
            f.name: (getattr(self, f.name).clone() if torch.is_tensor(getattr(self, f.name)) else getattr(self, f.name))
            for f in dataclasses.fields(self)
        })

    def select(self, prompts: torch.Tensor) -> "BeamState":
        """The state of the prompts ``prompts`` only (a copy)."""
        fields = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name != "done":
                fields[f.name] = value.index_select(0, prompts.to(value.device)) if torch.is_tensor(value) else value
        fields["done"] = fields["prompt_done"].all()
        return BeamState(**fields)


class BeamSearch:
    """Beam-search bookkeeping for ``B`` prompts × ``K`` beams, driven one step at a time.

    Args:
        input_ids: ``[B*K, T]`` the prompts, each repeated ``K`` times (``repeat_interleave``).
        num_beams: ``K``.
        max_length: total length (prompt + generated) at which sequences end, as
            ``generation_config.max_length``; sizes the buffers.
        length_penalty: exponent of the length normalisation of finished hypotheses.
        early_stopping: ``True`` | ``False`` | ``"never"``, as in ``GenerationConfig``.
        eos_token_id: 1-D tensor of EOS ids or ``None`` (``generation_config._eos_token_tensor``).
        pad_token_id: scalar tensor or ``None`` (``generation_config._pad_token_tensor``).
        num_return_sequences: hypotheses returned per prompt (``≤ K``).
    """

    def __init__(
        self,
        input_ids: torch.LongTensor,
        num_beams: int,
        max_length: int,
        *,
        length_penalty: float = 1.0,
        early_stopping: bool | str = False,
        eos_token_id: torch.Tensor | None = None,
        pad_token_id: torch.Tensor | None = None,
        num_return_sequences: int = 1,
    ):
        if num_beams < 1:
            raise MitigationError(f"num_beams must be >= 1, got {num_beams}")
        if not 1 <= num_return_sequences <= num_beams:
            raise MitigationError(
                f"num_return_sequences ({num_return_sequences}) must be between 1 and num_beams ({num_beams})"
            )
        total, prompt_len = input_ids.shape
        if total % num_beams:
            raise MitigationError(f"input_ids has {total} rows, not a multiple of num_beams={num_beams}")
        if max_length <= prompt_len:
            raise MitigationError(f"max_length ({max_length}) must exceed the prompt length ({prompt_len})")
        device = input_ids.device
        self.batch_size = total // num_beams
        self.num_beams = num_beams
        self.prompt_length = prompt_len
        self.max_length = int(max_length)
        self.length_penalty = float(length_penalty)
        self.early_stopping = early_stopping
        self.num_return_sequences = num_return_sequences
        if eos_token_id is not None and not torch.is_tensor(eos_token_id):
            eos_token_id = torch.tensor(eos_token_id, device=device).view(-1)
        self.eos_token_id = eos_token_id
        n_eos = eos_token_id.shape[0] if eos_token_id is not None else 0
        self.beams_to_keep = max(2, 1 + n_eos) * num_beams
        self.top_num_beam_mask = torch.cat(
            (torch.ones(num_beams, dtype=torch.bool), torch.zeros(self.beams_to_keep - num_beams, dtype=torch.bool))
        ).to(device)
        # transformers: `pad_token_id or eos_token_id[0] if eos_token_id is not None else -1`
        if eos_token_id is None:
            fill = -1
        else:
            fill = int(pad_token_id) if (pad_token_id is not None and bool(pad_token_id)) else int(eos_token_id[0])
        self.fill_value = fill

        B, K = self.batch_size, num_beams
        running_sequences = torch.full((B, K, self.max_length), fill, dtype=torch.int64, device=device)
        running_sequences[:, :, :prompt_len] = input_ids.view(B, K, prompt_len)
        running_beam_scores = torch.zeros((B, K), dtype=torch.float, device=device)
        running_beam_scores[:, 1:] = -1e9  # only the first beam's tokens at the first step
        running_beam_indices = torch.full((B, K, self.max_length - prompt_len), -1, dtype=torch.int32, device=device)
        self.state = BeamState(
            running_sequences=running_sequences,
            running_beam_scores=running_beam_scores,
            running_beam_indices=running_beam_indices,
            sequences=running_sequences.clone(),
            beam_scores=torch.full((B, K), -1e9, dtype=torch.float, device=device),
            beam_indices=running_beam_indices.clone(),
            is_sent_finished=torch.zeros((B, K), dtype=torch.bool, device=device),
            is_early_stop_heuristic_unsatisfied=torch.ones((B, 1), dtype=torch.bool, device=device),
            next_token_hits_stopping_criteria=torch.zeros((B, K), dtype=torch.bool, device=device),
            prompt_done=torch.zeros((B,), dtype=torch.bool, device=device),
            cur_len=prompt_len,
        )

    # -- views ----------------------------------------------------------------------------
    @property
    def cur_len(self) -> int:
        return self.state.cur_len

    @property
    def done(self) -> bool:
        """Whether the whole batch stops (a host read of the last step's flag)."""
        return bool(self.state.done)

    @property
    def generated_length(self) -> int:
        """Tokens generated so far by the running beams."""
        return self.state.cur_len - self.prompt_length

    def flat_sequences(self) -> torch.LongTensor:
        """``[B*K, cur_len]`` the running beams (what the logits processors and the model see)."""
        return _flatten(self.state.running_sequences[:, :, : self.state.cur_len])

    def snapshot(self) -> BeamState:
        """The state, for :meth:`restore`: not a copy, since :meth:`step` builds a new state of new tensors and never
        writes into the old one (so keeping one per step costs no copies)."""
        return self.state

    def restore(self, state: BeamState) -> None:
        """Go back to a :meth:`snapshot` (the snapshot itself stays usable)."""
        self.state = state.clone()

    def select(self, prompts: torch.Tensor) -> "BeamSearch":
        """A beam search over the prompts ``prompts`` only (same settings, a copy of their state)."""
        new = copy.copy(self)
        new.state = self.state.select(prompts)
        new.batch_size = int(prompts.numel())
        return new

    @property
    def prompt_done(self) -> torch.Tensor:
        """``[B]`` whether each prompt, searched alone, would have stopped."""
        return self.state.prompt_done

    # -- one step ---------------------------------------------------------------------------
    def step(self, log_probs: torch.Tensor, stopping_criteria=None,
             scores=None) -> tuple[torch.LongTensor, torch.LongTensor]:
        """Advance every prompt by one token from this step's processed log-probabilities.

        Args:
            log_probs: ``[B*K, V]`` log-probabilities of the next token per running beam (after the
                logits processors), *not* yet added to the beam scores.
            stopping_criteria: called on the ``[B*K', cur_len + 1]`` candidate continuations.
            scores: passed to the stopping criteria (``None`` unless scores are kept).

        Returns:
            ``(beam_idx, next_tokens)``, both ``[B*K]``: the new running beam ``r`` continues the
            old flat beam ``beam_idx[r]`` (reorder the cache with it) with ``next_tokens[r]``.
        """
        s = self.state
        if s.done is True:  # known on the host (max_length); a flag on the device is not read here
            raise MitigationError("the beam search is already finished")
        B, K, T = self.batch_size, self.num_beams, self.prompt_length
        cur_len = s.cur_len
        if cur_len >= self.max_length:
            raise MitigationError(f"cannot generate past max_length={self.max_length}")
        vocab = log_probs.shape[-1]
        accumulated = log_probs.view(B, K, vocab) + s.running_beam_scores[:, :, None]
        accumulated = accumulated.reshape(B, K * vocab)

        # c. top-K' continuations over all beams and tokens of a prompt
        topk_log_probs, topk_indices = torch.topk(accumulated, k=self.beams_to_keep)
        topk_current_beam_indices = topk_indices // vocab
        topk_running_beam_indices = _gather_beams(s.running_beam_indices, topk_current_beam_indices)
        topk_running_sequences = _gather_beams(s.running_sequences, topk_current_beam_indices)
        topk_ids = topk_indices % vocab
        topk_running_sequences[:, :, cur_len] = topk_ids
        topk_running_beam_indices[:, :, cur_len - T] = topk_current_beam_indices  # (prompt offset: finalize)

        # d. which continuations are finished
        if stopping_criteria is not None and len(stopping_criteria) > 0:
            hits = stopping_criteria(_flatten(topk_running_sequences[:, :, : cur_len + 1]), scores)
            hits = hits.view(B, self.beams_to_keep).to(topk_log_probs.device)
        else:
            hits = torch.zeros((B, self.beams_to_keep), dtype=torch.bool, device=topk_log_probs.device)

        # e. the best K unfinished continuations run on
        topk_running_log_probs = topk_log_probs + hits.to(torch.float32) * -1.0e9
        next_topk_indices = torch.topk(topk_running_log_probs, k=K)[1]
        running_sequences = _gather_beams(topk_running_sequences, next_topk_indices)
        running_beam_scores = _gather_beams(topk_running_log_probs, next_topk_indices)
        running_beam_indices = _gather_beams(topk_running_beam_indices, next_topk_indices)

        # f. finished continuations among the top K enter the kept hypotheses if they are better
        just_finished = hits & self.top_num_beam_mask[None, :]
        finished_scores = topk_log_probs / ((cur_len + 1 - T) ** self.length_penalty)
        beams_in_batch_are_full = torch.all(s.is_sent_finished, dim=-1, keepdim=True) & (self.early_stopping is True)
        finished_scores = finished_scores + beams_in_batch_are_full.to(torch.float32) * -1.0e9
        finished_scores = finished_scores + (~s.is_early_stop_heuristic_unsatisfied).to(torch.float32) * -1.0e9
        finished_scores = finished_scores + (~just_finished) * -1.0e9
        merged_sequences = torch.cat((s.sequences, topk_running_sequences), dim=1)
        merged_scores = torch.cat((s.beam_scores, finished_scores), dim=1)
        merged_beam_indices = torch.cat((s.beam_indices, topk_running_beam_indices), dim=1)
        merged_is_sent_finished = torch.cat((s.is_sent_finished, just_finished), dim=1)
        topk_merged_indices = torch.topk(merged_scores, k=K)[1]
        sequences = _gather_beams(merged_sequences, topk_merged_indices)
        beam_scores = _gather_beams(merged_scores, topk_merged_indices)
        beam_indices = _gather_beams(merged_beam_indices, topk_merged_indices)
        is_sent_finished = _gather_beams(merged_is_sent_finished, topk_merged_indices)

        # g. bookkeeping for the next step
        batch_offset = torch.arange(B, device=running_beam_indices.device).view(-1, 1) * K
        beam_idx = _flatten(running_beam_indices[..., cur_len - T].long() + batch_offset)
        next_tokens = _flatten(running_sequences[:, :, cur_len])
        cur_len += 1
        heuristic = self._early_stop_heuristic(
            s.is_early_stop_heuristic_unsatisfied, running_beam_scores, beam_scores, is_sent_finished, cur_len
        )
        improvement_possible = torch.any(heuristic)
        exists_open_beam = ~(torch.all(is_sent_finished) & (self.early_stopping is True))
        valid_continuations = ~torch.all(hits)
        done: bool | torch.Tensor = ~(improvement_possible & exists_open_beam & valid_continuations)
        # the same three conditions for each prompt on its own
        prompt_done = ~(heuristic[:, 0] & ~(torch.all(is_sent_finished, dim=-1) & (self.early_stopping is True))
                        & ~torch.all(hits, dim=-1))
        if cur_len >= self.max_length:
            prompt_done = torch.ones_like(prompt_done)
            done = True
        self.state = BeamState(
            running_sequences=running_sequences,
            running_beam_scores=running_beam_scores,
            running_beam_indices=running_beam_indices,
            sequences=sequences,
            beam_scores=beam_scores,
            beam_indices=beam_indices,
            is_sent_finished=is_sent_finished,
            is_early_stop_heuristic_unsatisfied=heuristic,
            next_token_hits_stopping_criteria=hits,
            prompt_done=prompt_done | s.prompt_done,
            cur_len=cur_len,
            done=done,
        )
        return beam_idx, next_tokens

    def _early_stop_heuristic(self, unsatisfied, running_beam_scores, beam_scores, is_sent_finished, cur_len):
        """transformers' ``_check_early_stop_heuristic``: can a running beam still beat the worst kept one?"""
        if self.early_stopping == "never" and self.length_penalty > 0.0:
            best_hypothetical_length = self.max_length - self.prompt_length
        else:
            best_hypothetical_length = cur_len - self.prompt_length
        best_possible_running_score = running_beam_scores[:, :1] / (best_hypothetical_length**self.length_penalty)
        worst_finished_score = torch.where(is_sent_finished, torch.min(beam_scores, dim=1, keepdim=True)[0], -1.0e9)
        return unsatisfied & torch.any(best_possible_running_score > worst_finished_score, dim=-1, keepdim=True)

    # -- result -------------------------------------------------------------------------------
    def finalize(self, trim: bool = True, prompt_index: torch.Tensor | None = None):
        """The best ``num_return_sequences`` hypotheses per prompt, best first.

        Args:
            trim: crop to the prompt plus the longest returned generation (as ``generate``);
                ``False`` keeps ``max_length`` (for merging searches run separately).
            prompt_index: ``[B]`` index of each prompt in the caller's batch, for the flat beam
                indices ``prompt_index * K + beam`` (default ``0..B-1``).

        Returns:
            ``(sequences [B*n, L], sequence_scores [B*n], beam_indices [B*n, L - T])``.
        """
        s = self.state
        n = self.num_return_sequences
        if prompt_index is None:
            prompt_index = torch.arange(self.batch_size, device=s.beam_indices.device)
        offset = (prompt_index.to(s.beam_indices.device) * self.num_beams).view(-1, 1, 1)
        sequences = _flatten(s.sequences[:, :n, :])
        scores = _flatten(s.beam_scores[:, :n])
        local = s.beam_indices[:, :n, :].long()
        beam_indices = _flatten(torch.where(local >= 0, local + offset, local))
        if trim:
            sequences, beam_indices = trim_to_generated(sequences, beam_indices, self.prompt_length)
        return sequences, scores, beam_indices


def trim_to_generated(sequences: torch.Tensor, beam_indices: torch.Tensor, prompt_length: int):
    """Crop ``[N, max_length]`` sequences to the prompt plus the longest generation (as ``generate``)."""
    max_generated_length = int(((beam_indices + 1).bool()).sum(dim=1).max()) if beam_indices.numel() else 0
    return sequences[:, : prompt_length + max_generated_length], beam_indices[:, :max_generated_length]


# ---------------------------------------------------------------------------------------
# KV cache per beam: transformers' cache layers are edited in medheval.decoding.internals only
# ---------------------------------------------------------------------------------------
select_cache_rows = internals.copy_selected_rows  # some rows of a cache, the others not copied
supports_token_selection = internals.is_full_length_cache  # whether keep_appended_tokens can edit it
keep_appended_tokens = internals.keep_appended_tokens


__all__ = [
    "BeamSearch",
    "BeamState",
    "keep_appended_tokens",
    "select_cache_rows",
    "supports_token_selection",
    "trim_to_generated",
]
