"""OPERA (its own beam search) on tiny random-weight LLaVA and LLaVA-NeXT (CPU, offline).

- reductions: with the penalty off and no rollback, OPERA *is* transformers' beam search
  (``generate(num_beams=K, do_sample=False, length_penalty=…, early_stopping=…)``), token for
  token, same beams, scores and beam indices — with all tokens as candidates; with ``N``
  candidates it is that beam search restricted to each beam's top ``N`` tokens and renormalised
  (``TopKLogitsWarper(N)`` + ``renormalize_logits=True``); with one beam it is greedy;
- known answers: the over-trust score on a hand-made window; the rollback trigger on a
  hand-made sequence of locations;
- in the model: the candidates' image attention, window rows and over-trust scores equal those
  computed from eager ``output_attentions`` of a full forward; a rollback's rebuilt cache gives
  the logits and attention history the search had at that step;
- batch invariance (with and without rollbacks), the attention implementation and hooks restored
  after generate and after errors, the custom_generate folder, the memory bound of the history.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from medheval.decoding import MissingInternalError, MitigationError, hooks_installed
from medheval.decoding.beam import BeamSearch
from medheval.mitigations import MITIGATIONS, OPERA, generate_with, get_mitigation
from medheval.mitigations import opera as opera_module
from medheval.mitigations.opera import RollbackTracker, candidate_log_overtrust, overtrust_scores
from test_mitigations import PROMPTS, _inputs, _new_tokens, build_tiny_llava_next

REPO = Path(__file__).resolve().parents[1]
NEVER = 10**9  # a threshold no location count reaches: no rollback


def _vocab(model) -> int:
    return model.config.get_text_config().vocab_size


def _neutral(model, num_beams: int, candidates: int | None = None) -> OPERA:
    """Penalty off, no rollback; every token a candidate unless ``candidates`` is given."""
    return OPERA(num_beams=num_beams, penalty_weights=0.0, threshold=NEVER,
                 num_attn_candidates=candidates or _vocab(model))


class Spy(OPERA):
    """OPERA that keeps every event of the search."""

    def observe_step(self, event):
        self.__dict__.setdefault("events", []).append(event)

    def of(self, kind):
        return [e for e in self.__dict__.get("events", []) if e["kind"] == kind]


# a setting that rolls back several times within 30 tokens on both tiny models
ROLLING = dict(num_beams=3, scale_factor=25.0, threshold=0)


# ---------------------------------------------------------------------------------------
# construction
# ---------------------------------------------------------------------------------------
def test_defaults_registry_and_spec():
    # issue 9: the default is the "medheval" preset (MedHEval appendix A.4: σ 50, threshold 15), recorded in settings
    assert OPERA().settings() == {"preset": "medheval", "num_beams": 5, "scale_factor": 50.0, "threshold": 15,
                                  "num_attn_candidates": 5, "penalty_weights": 1.0, "window_size": 512}
    assert MITIGATIONS["opera"] is OPERA
    assert get_mitigation("opera:num_beams=3") == OPERA(num_beams=3)
    assert get_mitigation("opera") == OPERA()
    for method in (OPERA(), OPERA(num_beams=2, scale_factor=50, threshold=15, num_attn_candidates=1)):
        assert get_mitigation(method.spec()) == method
    with pytest.raises(MitigationError, match="no option"):
        get_mitigation("opera:beams=3")
    for bad in (dict(num_beams=0), dict(num_attn_candidates=0), dict(window_size=0), dict(scale_factor=-1)):
        with pytest.raises(MitigationError):
            OPERA(**bad)


# ---------------------------------------------------------------------------------------
# known answers
# ---------------------------------------------------------------------------------------
def test_overtrust_score_known_answer():
    window = torch.tensor([[0.5, 0.0, 0.0],
                           [0.2, 0.4, 0.0],
                           [0.1, 0.3, 0.6]])
    # sigma = 10: phi_0 = 1e-7 * 5*2*1, phi_1 = 1e-7 * 4*3, phi_2 = 1e-7 * 6
    phi = overtrust_scores(window, 10.0)
    assert torch.allclose(phi, torch.tensor([1.0e-6, 1.2e-6, 6.0e-7]), rtol=1e-5)
    assert int(phi.argmax()) == 1
    # the per-candidate form: history = the first two rows, candidate row = the last row
    log_phi = candidate_log_overtrust(window[None, :2, :2], window[None, None, 2], 10.0)
    assert torch.allclose(log_phi.exp()[0, 0], phi, rtol=1e-5)
    # sigma = 0 (or zero attention): all scores 0, location 0 as upstream's max()
    assert torch.equal(overtrust_scores(window, 0.0), torch.zeros(3))
    assert int(candidate_log_overtrust(window[None, :2, :2], window[None, None, 2], 0.0).argmax()) == 0


def test_candidate_scores_equal_the_window_formula():
    torch.manual_seed(0)
    K, N, h = 3, 4, 6
    history = torch.rand(K, h, h).tril() + 1e-3 * torch.eye(h)
    rows = torch.rand(K, N, h + 1)
    log_phi = candidate_log_overtrust(history, rows, 7.0)
    for k in range(K):
        for c in range(N):
            window = torch.zeros(h + 1, h + 1)
            window[:h, :h] = history[k]
            window[h] = rows[k, c]
            phi = overtrust_scores(window, 7.0)
            assert torch.allclose(log_phi[k, c].exp(), phi, rtol=1e-4)
            assert int(log_phi[k, c].argmax()) == int(phi.argmax())
    # long products stay finite in log space where the direct product overflows float32
    big = torch.full((1, 60, 60), 0.9).tril()
    assert torch.isinf(overtrust_scores(torch.full((61, 61), 0.9).tril(), 25.0)).any()
    assert torch.isfinite(candidate_log_overtrust(big, torch.full((1, 1, 61), 0.9), 25.0)).all()


def _locs(*per_beam):
    """[K, N] locations whose per-beam mode is ``per_beam`` (three candidates each)."""
    return torch.tensor([[v, v, v + 1] for v in per_beam])


def test_rollback_trigger_known_sequence():
    tracker = RollbackTracker(threshold=2, max_per_position=2, history_length=512)
    # beam 0 keeps location 12; beam 1 only from the second step on
    assert tracker.observe(_locs(12, 5), 13) is None          # modes (12, 5): loc = 5 (tie -> smallest)
    assert tracker.observe(_locs(12, 12), 14) is None         # (2, 1)
    assert tracker.observe(_locs(12, 12), 15) is None         # (3, 2): beam 1 not > 2 yet
    assert tracker.observe(_locs(12, 12), 16) == 13           # (4, 3): roll back to 12 + 1
    assert tracker.rollbacks == [{13: 1}]
    assert tracker.observe(_locs(12, 12), 17) == 13           # second time at 13
    assert tracker.observe(_locs(12, 12), 18) == 12           # 13 used up (2): one position earlier
    assert tracker.observe(_locs(12, 12), 19) == 12
    assert tracker.observe(_locs(12, 12), 20) is None         # 13 and 12 both used up: give up
    assert tracker.rollbacks == [{13: 2, 12: 2}]
    tracker.truncate(2)  # a rollback to step 2 keeps the locations of steps 0..2
    assert tracker.steps == 3
    assert tracker.history[0, :, :3].tolist() == [[12, 12, 12], [5, 12, 12]]
    # a location below 10 never triggers
    early = RollbackTracker(threshold=1, max_per_position=5, history_length=512)
    for step in range(5):
        assert early.observe(_locs(7, 7, 7), 8 + step) is None
    # the mode over a beam's candidates: [3, 3, 4] -> 3; ties -> the smallest
    mixed = RollbackTracker(threshold=0, max_per_position=5, history_length=512)
    assert mixed.observe(torch.tensor([[14, 11, 11], [11, 14, 20]]), 21) == 12
    # a target further back than the history is clamped
    short = RollbackTracker(threshold=0, max_per_position=5, history_length=4)
    assert short.observe(_locs(10, 10), 30) == 30 - 4 - 1


def test_rollback_trigger_proposes_nothing_before_the_threshold():
    """No proposal (nothing for the loop to read) while ``threshold`` steps or fewer are recorded; past the 16 steps
    the history first holds, the repeats are still counted over every step (and again after a truncation)."""
    tracker = RollbackTracker(threshold=30, max_per_position=5, history_length=512)
    proposals = [tracker.record(_locs(12, 12)) for _ in range(31)]
    assert all(p is None for p in proposals[:30])
    assert proposals[30].tolist() == [[12, 1]]  # 31 repeats > 30 in every beam
    tracker.truncate(29)  # 30 steps kept: not more than 30 repeats
    assert tracker.record(_locs(12, 11)).tolist() == [[11, 0]]  # loc 11 (tie -> smallest): 1 repeat, in beam 1 only
    assert tracker.steps == 31
    assert tracker.record(_locs(12, 12)).tolist() == [[12, 1]]  # 12: beam 0 at 32 steps of 32, beam 1 at 31
    assert tracker.decide(0, 12, True, 40) == 13 and tracker.decide(0, 12, False, 40) is None


def test_rollback_trigger_for_prompts_in_lock_step():
    """Three prompts recorded together propose what three trackers of one prompt each decide; a selection of prompts
    keeps their histories and rollback counts."""
    generator = torch.Generator().manual_seed(1)
    steps = [torch.randint(9, 14, (3, 2, 4), generator=generator) for _ in range(12)]
    steps[-4:] = [torch.full((3, 2, 4), 12) for _ in range(4)]
    together = RollbackTracker(threshold=3, max_per_position=2, history_length=512, prompts=3)
    alone = [RollbackTracker(threshold=3, max_per_position=2, history_length=512) for _ in range(3)]
    fired = 0
    for n, locations in enumerate(steps):
        proposals = together.record(locations)
        expected = [tracker.observe(locations[p], n + 1) for p, tracker in enumerate(alone)]
        got = [None] * 3 if proposals is None else [together.decide(p, loc, bool(due), n + 1)
                                                     for p, (loc, due) in enumerate(proposals.tolist())]
        assert got == expected, n
        fired += sum(target is not None for target in got)
    assert fired >= 3  # the last steps repeat 12 everywhere
    part = together.select([2, 0])
    assert torch.equal(part.history[:, :, : part.steps], together.history[[2, 0], :, : together.steps])
    assert part.rollbacks == [alone[2].rollbacks[0], alone[0].rollbacks[0]]


def test_beam_search_snapshot_outlives_its_steps():
    """A snapshot is the state itself (no copy): the steps after it leave its tensors as they were, and restoring it
    gives the same continuation again."""
    generator = torch.Generator().manual_seed(0)
    beams = BeamSearch(torch.ones(4, 3, dtype=torch.long), 2, 8, eos_token_id=torch.tensor([0]),
                       pad_token_id=torch.tensor(0))
    beams.step(torch.randn(4, 11, generator=generator).log_softmax(-1))
    snapshot = beams.snapshot()
    frozen = snapshot.clone()
    steps = [torch.randn(4, 11, generator=generator).log_softmax(-1) for _ in range(3)]
    first = [beams.step(log_probs) for log_probs in steps]
    for name in ("running_sequences", "running_beam_scores", "running_beam_indices", "sequences", "beam_scores",
                 "beam_indices", "is_sent_finished", "prompt_done"):
        assert torch.equal(getattr(snapshot, name), getattr(frozen, name)), name
    beams.restore(snapshot)
    again = [beams.step(log_probs) for log_probs in steps]
    assert all(torch.equal(a, b) for pair_a, pair_b in zip(first, again) for a, b in zip(pair_a, pair_b))


def test_beam_search_rejects_bad_settings():
    ids = torch.ones(4, 3, dtype=torch.long)
    with pytest.raises(MitigationError, match="multiple"):
        BeamSearch(ids[:3], 2, 10)
    with pytest.raises(MitigationError, match="num_return_sequences"):
        BeamSearch(ids, 2, 10, num_return_sequences=3)
    with pytest.raises(MitigationError, match="max_length"):
        BeamSearch(ids, 2, 3)


# ---------------------------------------------------------------------------------------
# reductions to transformers' beam search
# ---------------------------------------------------------------------------------------
BEAM_SETTINGS = [(3, 1.0, False), (4, 0.5, True), (2, 2.0, "never"), (3, -1.0, False)]


@pytest.mark.parametrize("num_beams,length_penalty,early_stopping", BEAM_SETTINGS)
def test_penalty_off_equals_transformers_beam_search(tiny, num_beams, length_penalty, early_stopping):
    kind, model, processor = tiny
    inputs = _inputs(kind, processor)
    assert (inputs["attention_mask"] == 0).any()  # left-padded batch of 4
    settings = dict(max_new_tokens=8, length_penalty=length_penalty, early_stopping=early_stopping)
    expected = model.generate(**inputs, num_beams=num_beams, do_sample=False, **settings)
    got = model.generate(**inputs, custom_generate=_neutral(model, num_beams), **settings)
    assert torch.equal(got, expected)
    assert not hooks_installed(model)


@pytest.mark.parametrize("num_beams,length_penalty,early_stopping", BEAM_SETTINGS)
def test_reduction_with_finished_hypotheses(llava, num_beams, length_penalty, early_stopping):
    """A frequent word as extra EOS: beams finish at different lengths, hypotheses are kept, padded
    and length-normalised, early stopping decides when to stop; two sequences per prompt."""
    model, processor = llava
    inputs = _inputs("llava", processor)
    plain = _new_tokens(model.generate(**inputs, max_new_tokens=12, do_sample=False), inputs)
    words, counts = plain.flatten().unique(return_counts=True)
    eos = int(words[counts.argmax()])
    settings = dict(max_new_tokens=12, length_penalty=length_penalty, early_stopping=early_stopping,
                    eos_token_id=[eos, model.generation_config.eos_token_id], num_return_sequences=2,
                    return_dict_in_generate=True, output_scores=True)
    expected = model.generate(**inputs, num_beams=num_beams, do_sample=False, **settings)
    # generate(num_beams=K) expands the prompts per beam: OPERA takes them back
    got = model.generate(**inputs, num_beams=num_beams, custom_generate=_neutral(model, num_beams), **settings)
    assert torch.equal(got.sequences, expected.sequences)
    assert torch.allclose(got.sequences_scores, expected.sequences_scores, atol=1e-5)
    assert torch.equal(got.beam_indices.long(), expected.beam_indices.long())
    if length_penalty <= 1.0:  # (a length penalty of 2 prefers the unfinished, longer beams)
        new = expected.sequences[:, inputs["input_ids"].shape[1]:]
        assert (new == eos).any()  # some kept hypotheses did end on the extra EOS


@pytest.mark.parametrize("candidates", [2, 3])
def test_n_candidates_equal_top_k_renormalised_beam_search(tiny, candidates):
    from transformers import LogitsProcessorList, TopKLogitsWarper

    kind, model, processor = tiny
    inputs = _inputs(kind, processor)
    expected = model.generate(**inputs, num_beams=3, do_sample=False, max_new_tokens=8, renormalize_logits=True,
                              logits_processor=LogitsProcessorList([TopKLogitsWarper(candidates)]))
    got = model.generate(**inputs, max_new_tokens=8, custom_generate=_neutral(model, 3, candidates))
    assert torch.equal(got, expected)


def test_one_beam_is_greedy(tiny):
    kind, model, processor = tiny
    inputs = _inputs(kind, processor)
    expected = model.generate(**inputs, max_new_tokens=8, do_sample=False)
    assert torch.equal(model.generate(**inputs, max_new_tokens=8, custom_generate=_neutral(model, 1)), expected)


def test_look_ahead_reuse_equals_plain_forwards(llava, monkeypatch):
    """The chosen candidates' KV and logits from the look-ahead == a separate forward of the chosen tokens."""
    model, processor = llava
    inputs = _inputs("llava", processor)
    spy = Spy(**ROLLING)
    reused = model.generate(**inputs, max_new_tokens=20, custom_generate=spy)
    assert any(e["reused"] for e in spy.of("advance"))
    monkeypatch.setattr(opera_module, "supports_token_selection", lambda cache: False)
    spy_plain = Spy(**ROLLING)
    plain = model.generate(**inputs, max_new_tokens=20, custom_generate=spy_plain)
    assert not any(e["reused"] for e in spy_plain.of("advance"))
    assert torch.equal(reused, plain)


# ---------------------------------------------------------------------------------------
# the penalty and the rollback in the model
# ---------------------------------------------------------------------------------------
def _eager_copy(kind):
    from medheval.backends.tiny import build_tiny_llava

    model = (build_tiny_llava(seed=0) if kind == "llava" else build_tiny_llava_next(seed=0))[0]
    model.set_attn_implementation("eager")
    return model


def test_scores_equal_full_forward_attention(tiny):
    """Image bonus (first 10 tokens), window rows and over-trust scores vs eager output_attentions."""
    kind, model, processor = tiny
    inputs = _inputs(kind, processor, [0])  # one prompt: no padding in the full forwards
    spy = Spy(num_beams=3, num_attn_candidates=3)
    model.generate(**inputs, max_new_tokens=14, custom_generate=spy)
    eager = _eager_copy(kind)
    prompt_len = inputs["input_ids"].shape[1]
    image = (inputs["input_ids"][0] == model.config.image_token_id)
    extra = {k: v for k, v in inputs.items() if k not in ("input_ids", "attention_mask")}
    steps = {e["step"]: e for e in spy.of("step")}
    for step in (3, 12):
        event = steps[step]
        for k in (0, 2):
            for c in (0, 2):
                seq = torch.cat([event["sequences"][k], event["candidates"][k, c : c + 1]])[None]
                with torch.no_grad():
                    out = eager(input_ids=seq, output_attentions=True, **extra)
                row = out.attentions[-1][0].amax(0).float()  # [L, L]: max over heads
                row = row / row.sum(-1, keepdim=True)
                assert torch.allclose(event["image_attention"][k, c], row[-1, :prompt_len][image].sum(), atol=1e-5)
                window = row[prompt_len:, prompt_len:]
                assert torch.allclose(event["rows"][k, c], window[-1], atol=1e-5)
                assert torch.allclose(event["history"][k], window[:-1, :-1], atol=1e-5)
                phi = overtrust_scores(window, spy.scale_factor)
                assert torch.allclose(event["log_score"][k, c].exp(), phi.max(), rtol=1e-3)
                assert int(event["locations"][k, c]) == int(phi.argmax())
        expected = -event["image_attention"] if step + 1 <= 10 else event["log_score"].exp()
        assert torch.allclose(event["penalty"], expected, rtol=1e-5)


def test_penalty_changes_the_output(tiny):
    kind, model, processor = tiny
    inputs = _inputs(kind, processor)
    beams = _neutral(model, 5, 5)
    plain = model.generate(**inputs, max_new_tokens=12, custom_generate=beams)
    assert not torch.equal(model.generate(**inputs, max_new_tokens=12, custom_generate=OPERA()), plain)


def test_rollback_rebuilds_the_state_of_that_step(tiny):
    kind, model, processor = tiny
    inputs = _inputs(kind, processor)
    spy = Spy(**ROLLING)
    out = model.generate(**inputs, max_new_tokens=30, custom_generate=spy)
    rollbacks = spy.of("rollback")
    assert len(rollbacks) >= 3
    assert out.shape[1] == inputs["input_ids"].shape[1] + 30
    events = spy.events
    K = spy.num_beams
    for position, rollback in enumerate(events):
        if rollback["kind"] != "rollback":
            continue
        # the last time that prompt was at the target step (in a batched group, or alone)
        before = [e for e in events[:position] if e["kind"] == "step" and rollback["prompt"] in e["prompts"]
                  and e["step"] == rollback["to"]]
        original = before[-1]
        m = original["prompts"].index(rollback["prompt"])
        rows = slice(m * K, (m + 1) * K)
        assert torch.equal(rollback["sequences"], original["sequences"][rows])
        n = original["candidates"].shape[1]
        logits, tokens = torch.topk(rollback["logits"], n, dim=-1)
        assert torch.equal(tokens, original["candidates"][rows])
        assert torch.allclose(logits, original["candidate_logits"][rows], atol=1e-4)
        assert torch.allclose(rollback["history"], original["history"][rows], atol=1e-5)
        # the rejected (beam, token) pairs are the ones that step had chosen
        assert rollback["rejected"].numel() % spy.num_beams == 0
    # a rollback changes the answer of that prompt (the redone step avoids the earlier choice)
    plain = model.generate(**inputs, max_new_tokens=30, custom_generate=OPERA(**{**ROLLING, "threshold": NEVER}))
    rolled = {e["prompt"] for e in rollbacks}
    assert any(not torch.equal(out[p], plain[p]) for p in rolled)


# ---------------------------------------------------------------------------------------
# batches, hooks, folder, memory
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("setting", ["default", "rolling"])
def test_batch_equals_single_runs(tiny, setting):
    kind, model, processor = tiny
    method = Spy() if setting == "default" else Spy(**ROLLING)
    batch = _inputs(kind, processor)
    assert len(set(batch["attention_mask"].sum(1).tolist())) == len(PROMPTS)
    new_tokens = 8 if setting == "default" else 24
    batched = _new_tokens(model.generate(**batch, max_new_tokens=new_tokens, custom_generate=method), batch)
    # the prompts are decoded in lock-step (one forward per step for all of them) ...
    assert method.of("step")[0]["prompts"] == list(range(len(PROMPTS)))
    if setting == "rolling":  # ... until one rolls back: it continues alone, the others go on together
        assert method.of("rollback")
        assert any(len(e["prompts"]) == 1 for e in method.of("step"))
    for i in range(len(PROMPTS)):
        single = _inputs(kind, processor, [i])
        alone = _new_tokens(model.generate(**single, max_new_tokens=new_tokens, custom_generate=method), single)
        assert torch.equal(batched[i : i + 1], alone), f"row {i}"


def test_eager_switch_and_hooks_restored(llava):
    model, processor = llava
    inputs = _inputs("llava", processor)
    previous = model.config.text_config._attn_implementation
    assert previous != "eager"
    with torch.no_grad():
        before = model(**inputs).logits
    model.generate(**inputs, max_new_tokens=4, custom_generate=OPERA(num_beams=2))
    assert model.config.text_config._attn_implementation == previous
    assert not hooks_installed(model)

    from transformers import LogitsProcessor, LogitsProcessorList

    class Boom(LogitsProcessor):
        calls = 0

        def __call__(self, input_ids, scores):
            Boom.calls += 1
            if Boom.calls == 3:
                raise RuntimeError("boom")
            return scores

    with pytest.raises(RuntimeError, match="boom"):
        model.generate(**inputs, max_new_tokens=6, custom_generate=OPERA(num_beams=2),
                       logits_processor=LogitsProcessorList([Boom()]))
    assert model.config.text_config._attn_implementation == previous
    assert not hooks_installed(model)
    with torch.no_grad():
        assert torch.equal(model(**inputs).logits, before)


def test_only_the_last_layer_is_hooked_and_memory_is_bounded(llava_next, monkeypatch):
    model, processor = llava_next
    inputs = _inputs("llava_next", processor)
    installed = []
    real = opera_module.attention_hooks

    def spy_hooks(model_, hooks):
        installed.append(list(hooks))
        return real(model_, hooks)

    monkeypatch.setattr(opera_module, "attention_hooks", spy_hooks)
    window = 4
    spy = Spy(**{**ROLLING, "window_size": window})
    model.generate(**inputs, max_new_tokens=24, custom_generate=spy)
    n_layers = model.config.text_config.num_hidden_layers
    assert len(installed) == 1 and len(installed[0]) == 1
    assert installed[0][0].layers == [n_layers - 1]
    steps = spy.of("step")
    assert max(e["step"] for e in steps) > 3 * window and spy.of("rollback")
    for event in steps + spy.of("rollback"):
        # the history holds at most (window - 1)^2 weights per beam, the candidates' rows at most window each
        assert max(event["history"].shape[-2:]) <= window - 1
        if event["kind"] == "step":
            assert event["rows"].shape == (len(event["prompts"]) * spy.num_beams, spy.num_attn_candidates,
                                           min(event["step"] + 1, window))
    recorder_results = [e["rows"] for e in steps]
    assert all(r.dim() == 3 for r in recorder_results)  # no per-layer or per-head maps are kept


def test_custom_generate_folder_equals_callable(llava):
    model, processor = llava
    inputs = _inputs("llava", processor)
    folder = REPO / "mitigations" / "opera"
    assert (folder / "custom_generate" / "generate.py").is_file() and (folder / "README.md").is_file()
    assert (folder / "custom_generate" / "requirements.txt").is_file()
    options = dict(num_beams=3, scale_factor=50.0, threshold=1)
    via_folder = model.generate(**inputs, max_new_tokens=14, custom_generate=str(folder), trust_remote_code=True,
                                **options)
    via_callable = model.generate(**inputs, max_new_tokens=14, custom_generate=OPERA(**options))
    assert torch.equal(via_folder, via_callable)
    assert torch.equal(generate_with("opera:num_beams=3,scale_factor=50,threshold=1", model, **inputs,
                                     max_new_tokens=14), via_callable)


def test_generate_num_beams_must_agree(llava):
    model, processor = llava
    inputs = _inputs("llava", processor, [0, 1])
    same = model.generate(**inputs, max_new_tokens=5, num_beams=3, custom_generate=OPERA(num_beams=3))
    assert torch.equal(same, model.generate(**inputs, max_new_tokens=5, custom_generate=OPERA(num_beams=3)))
    with pytest.raises(MitigationError, match="num_beams"):
        model.generate(**inputs, max_new_tokens=5, num_beams=3, custom_generate=OPERA(num_beams=5))
    with pytest.raises(MitigationError, match="do_sample"):
        model.generate(**inputs, max_new_tokens=5, do_sample=True, custom_generate=OPERA())


def test_text_only_model_is_refused():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=4, pad_token_id=0)).eval()
    with pytest.raises(MissingInternalError, match="image_token"):
        model.generate(input_ids=torch.randint(3, 50, (1, 5)), max_new_tokens=2, custom_generate=OPERA())
