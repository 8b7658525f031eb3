"""The shared decoding core: formulas on hand-made logits, the image-token locator, streams,
attention hooks (installed for the call, always removed), and the loop against ``generate``.

CPU only, tiny random-weight LLaVA built in-process (``medheval.backends.tiny``).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from medheval.decoding import internals
from medheval.decoding import (
    ATTENTION_FUNCTION,
    AttentionHook,
    AttentionRowRecorder,
    DecodingMethod,
    DoLaContrast,
    ImageAttentionBoost,
    LogitContrast,
    LogProbContrast,
    MissingInternalError,
    MitigationError,
    PlausibilityCutoff,
    RelativeTopFilter,
    Stream,
    StreamGroup,
    attention_hooks,
    concat_batch,
    drop_image_tokens,
    hooks_installed,
    image_spans,
    image_token_mask,
    jensen_shannon_divergence,
    m3id_weight,
    remove_positions,
)

PROMPTS = [
    "is there a pleural effusion ?",
    "lung",
    "what is the size of the heart shown in this chest image and is it enlarged ?",
    "no acute process",
]


# ---------------------------------------------------------------------------------------
# fixtures
# ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny():
    from medheval.backends.tiny import build_tiny_llava

    model, processor = build_tiny_llava(seed=0)
    return model, processor


def _images(n, size=30):
    from PIL import Image

    return [Image.fromarray(np.random.RandomState(i).randint(0, 255, (size, size, 3), dtype=np.uint8)) for i in range(n)]


def _inputs(processor, prompts=PROMPTS):
    texts = [f"USER: <image>\n{p} ASSISTANT:" for p in prompts]
    return processor(text=texts, images=_images(len(prompts)), padding=True, return_tensors="pt")


# ---------------------------------------------------------------------------------------
# formulas, known answers
# ---------------------------------------------------------------------------------------
def test_plausibility_cutoff_known_answer():
    logits = torch.tensor([[2.0, 1.0, 0.0, -3.0], [0.0, 0.0, -1.0, 5.0]])
    # beta=0.1: threshold = max + log(0.1) = max - 2.3026
    keep = PlausibilityCutoff(0.1).keep_mask(logits)
    assert keep.tolist() == [[True, True, True, False], [False, False, False, True]]
    # the same set as p >= beta * max p
    probs = logits.softmax(-1)
    assert torch.equal(keep, probs >= 0.1 * probs.max(-1, keepdim=True).values)
    scores = torch.tensor([[10.0, 20.0, 30.0, 40.0], [1.0, 2.0, 3.0, 4.0]])
    out = PlausibilityCutoff(0.1)(scores, logits)
    assert out[0].tolist() == [10.0, 20.0, 30.0, float("-inf")]
    assert out[1].tolist() == [float("-inf"), float("-inf"), float("-inf"), 4.0]
    # beta=0.5: log 0.5 = -0.693 -> only 2.0 survives in row 0
    assert PlausibilityCutoff(0.5).keep_mask(logits)[0].tolist() == [True, False, False, False]
    # beta=0 disables, beta=1 keeps the argmax (and ties)
    assert torch.equal(PlausibilityCutoff(0.0)(scores, logits), scores)
    assert PlausibilityCutoff(1.0).keep_mask(torch.tensor([[1.0, 3.0, 3.0]])).tolist() == [[False, True, True]]
    with pytest.raises(MitigationError):
        PlausibilityCutoff(1.5)


def test_logit_contrast_known_answer():
    logits = torch.tensor([[1.0, 2.0, -1.0]])
    contrast = torch.tensor([[3.0, 0.0, -1.0]])
    assert LogitContrast(1.0)(logits, contrast).tolist() == [[-1.0, 4.0, -1.0]]  # 2l - l'
    assert LogitContrast(0.5)(logits, contrast).tolist() == [[0.0, 3.0, -1.0]]  # 1.5l - 0.5l'
    assert torch.equal(LogitContrast(0.0)(logits, contrast), logits)


def test_log_prob_contrast_known_answer():
    logits = torch.tensor([[0.0, math.log(3.0)]])  # p_c = [0.25, 0.75]
    uncond = torch.tensor([[0.0, 0.0]])  # p_u = [0.5, 0.5]
    log_c = torch.log(torch.tensor([[0.25, 0.75]]))
    log_u = torch.log(torch.tensor([[0.5, 0.5]]))
    out = LogProbContrast(2.0)(logits, uncond)
    assert torch.allclose(out, log_c + 2.0 * (log_c - log_u))
    # PAI's form gamma*(l_c - l_u) + l_u is the same rule with w = gamma - 1
    gamma = 1.1
    assert torch.allclose(LogProbContrast(gamma - 1)(logits, uncond), gamma * (log_c - log_u) + log_u, atol=1e-6)
    # w = 0 returns log_softmax(l_c) exactly
    assert torch.equal(LogProbContrast(0.0)(logits, uncond), F.log_softmax(logits, -1))


def test_m3id_weight_schedule():
    assert m3id_weight(1, 0.02) == pytest.approx(math.exp(0.02) - 1)  # (1 - g)/g with g = exp(-0.02)
    gamma = math.exp(-0.02 * 35)
    assert m3id_weight(35, 0.02) == pytest.approx((1 - gamma) / gamma)
    assert m3id_weight(100, 0.02) == pytest.approx(6.389, abs=1e-3)
    assert m3id_weight(50, 0.0) == 0.0
    with pytest.raises(MitigationError):
        m3id_weight(0, 0.02)


def test_jensen_shannon_matches_dola_code():
    p = torch.tensor([[0.7, 0.2, 0.1]])
    q = torch.tensor([[0.1, 0.3, 0.6]])
    m = 0.5 * (p + q)
    # DoLa's code: 0.5 * (F.kl_div(log p, M).mean(-1) + F.kl_div(log q, M).mean(-1)); F.kl_div(log x, M) = KL(M || x)
    kl_mp = (m * (m.log() - p.log())).mean(-1)
    kl_mq = (m * (m.log() - q.log())).mean(-1)
    expected = 0.5 * (kl_mp + kl_mq)
    got = jensen_shannon_divergence(p.log(), q.log())
    assert torch.allclose(got, expected)
    assert torch.allclose(jensen_shannon_divergence(q.log(), p.log()), got)  # symmetric
    assert jensen_shannon_divergence(p.log(), p.log()).abs().item() < 1e-7


def test_dola_contrast_known_answer():
    mature = torch.tensor([[3.0, 2.5, 0.0, -2.0]])
    close = mature + 0.01  # nearly the mature distribution
    far = torch.tensor([[0.0, 3.0, 0.0, 0.0]])
    scores, chosen = DoLaContrast(relative_top=0.1)(mature, [close, far])
    assert chosen.tolist() == [1]  # the farthest layer (JSD) is the premature one
    log_n, log_m = F.log_softmax(mature, -1), F.log_softmax(far, -1)
    keep = log_n >= log_n.max() + math.log(0.1)
    assert keep.tolist() == [[True, True, False, False]]
    expected = (log_n - log_m).masked_fill(~keep, float("-inf"))
    assert torch.allclose(scores, expected)
    # the contrast can overturn the mature argmax: token 0 beats token 1 after subtracting the far layer
    assert scores.argmax(-1).item() == 0
    # relative_top = 1 keeps only the mature argmax -> greedy
    scores1, _ = DoLaContrast(relative_top=1.0)(mature, [close, far])
    assert torch.isfinite(scores1).sum().item() == 1 and scores1.argmax(-1).item() == 0
    # per-row choice: row 1 prefers the other layer
    batch_mature = torch.cat([mature, far])
    _, chosen2 = DoLaContrast()(batch_mature, [torch.cat([close, mature]), torch.cat([far, far + 0.01])])
    assert chosen2.tolist() == [1, 0]
    # the candidates as one [J, B, V] tensor (DoLa's stacked head output): the same result, bit for bit
    candidates = [torch.cat([close, mature]), torch.cat([far, far + 0.01])]
    scores_list, chosen_list = DoLaContrast()(batch_mature, candidates)
    scores_stacked, chosen_stacked = DoLaContrast()(batch_mature, torch.stack(candidates))
    assert torch.equal(scores_stacked, scores_list) and torch.equal(chosen_stacked, chosen_list)
    assert DoLaContrast().select(batch_mature, torch.stack(candidates)).tolist() == [1, 0]
    with pytest.raises(MitigationError, match="at least one candidate"):
        DoLaContrast()(mature, [])
    with pytest.raises(MitigationError, match="at least one candidate"):
        DoLaContrast()(mature, torch.empty(0, 1, 4))
    with pytest.raises(MitigationError, match=r"\[J, B, V\]"):
        DoLaContrast()(mature, far)  # one [B, V] tensor is not a stack of candidates


def test_relative_top_filter_min_tokens():
    log_probs = F.log_softmax(torch.tensor([[5.0, 0.0, -1.0, -2.0]]), -1)
    assert RelativeTopFilter(0.1).keep_mask(log_probs).tolist() == [[True, False, False, False]]
    assert RelativeTopFilter(0.1, min_tokens_to_keep=3).keep_mask(log_probs).tolist() == [[True, True, True, False]]


# ---------------------------------------------------------------------------------------
# visual-token locator
# ---------------------------------------------------------------------------------------
class _Cfg:
    image_token_id = 7


def test_image_token_mask_spans_and_removal():
    pad = 0
    ids = torch.tensor([
        [0, 0, 1, 7, 7, 7, 5, 6],  # left padded
        [1, 7, 7, 7, 4, 5, 6, 9],
    ])
    mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1, 1]])
    img = image_token_mask(ids, _Cfg)
    assert img.sum(1).tolist() == [3, 3]
    assert image_spans(img) == [[(3, 6)], [(1, 4)]]
    text_ids, text_mask = drop_image_tokens(ids, mask, _Cfg, pad)
    assert text_ids.tolist() == [[0, 0, 1, 5, 6], [1, 4, 5, 6, 9]]
    assert text_mask.tolist() == [[0, 0, 1, 1, 1], [1, 1, 1, 1, 1]]
    # two images in one row -> two spans
    two = torch.tensor([[1, 7, 7, 3, 7, 7, 2]])
    assert image_spans(image_token_mask(two, _Cfg)) == [[(1, 3), (4, 6)]]
    # remove arbitrary positions
    ids2, mask2 = remove_positions(two, None, two == 3, pad)
    assert ids2.tolist() == [[1, 7, 7, 7, 7, 2]] and mask2.tolist() == [[1] * 6]


def test_locator_uses_config_not_positions(tiny):
    model, processor = tiny
    inputs = _inputs(processor)
    img = image_token_mask(inputs["input_ids"], model.config)
    # every row holds exactly the model's number of image features, wherever padding put them
    assert img.sum(1).tolist() == [model.config.image_seq_length] * len(PROMPTS)
    starts = [spans[0][0] for spans in image_spans(img)]
    assert len(set(starts)) > 1  # left padding moves the image block: no fixed position would do


def test_locator_without_image_token_fails_clearly():
    class NoImage:
        pass

    with pytest.raises(MissingInternalError, match="image_token_id"):
        image_token_mask(torch.tensor([[1, 2]]), NoImage())


# ---------------------------------------------------------------------------------------
# streams
# ---------------------------------------------------------------------------------------
def test_concat_batch():
    a, b = torch.ones(2, 3), torch.zeros(2, 3)
    assert concat_batch([a, b]).shape == (4, 3)
    assert concat_batch([[1, 2], [3]]) == [1, 2, 3]
    merged = concat_batch([{"x": a, "y": None}, {"x": b, "y": None}])
    assert merged["x"].shape == (4, 3) and merged["y"] is None
    with pytest.raises(MitigationError):
        concat_batch([a, None])


def test_stream_group_shares_rows(tiny):
    model, processor = tiny
    inputs = _inputs(processor)
    main = Stream("main", inputs["input_ids"], inputs["attention_mask"], {"pixel_values": inputs["pixel_values"]})
    twin = main.replace("twin")
    assert twin.same_prompt_as(main)
    group = StreamGroup(model, [main, twin])
    assert group.input_ids.shape[0] == 2 * len(PROMPTS)
    assert group.rows("twin") == slice(len(PROMPTS), 2 * len(PROMPTS))
    with torch.no_grad():
        out = group.forward()
    assert out.logits.shape[0] == 2 * len(PROMPTS)
    assert torch.allclose(out.logits[group.rows("main")], out.logits[group.rows("twin")], atol=1e-5)
    assert group.cache.layers[0].keys.shape[0] == 2 * len(PROMPTS)  # one cache for both streams


# ---------------------------------------------------------------------------------------
# attention hooks
# ---------------------------------------------------------------------------------------
def _forward_logits(model, inputs):
    with torch.no_grad():
        return model(**inputs).logits


def test_hooked_attention_matches_eager_and_is_removed(tiny):
    model, processor = tiny
    inputs = _inputs(processor)
    before = _forward_logits(model, inputs)
    previous = model.config.text_config._attn_implementation
    with attention_hooks(model, [AttentionHook()]):
        assert model.config.text_config._attn_implementation == ATTENTION_FUNCTION
        assert hooks_installed(model)
        hooked = _forward_logits(model, inputs)
    assert not hooks_installed(model)
    assert model.config.text_config._attn_implementation == previous
    # medheval's eager attention with a no-op hook computes the model's attention (on real tokens;
    # fully masked padding rows differ between SDPA and any eager implementation)
    real = inputs["attention_mask"].bool()
    assert torch.allclose(hooked[real], before[real], atol=1e-4)
    assert torch.equal(_forward_logits(model, inputs), before)


def test_attention_row_recorder_matches_output_attentions(tiny):
    model, processor = tiny
    inputs = _inputs(processor)
    recorder = AttentionRowRecorder(reduce="mean")
    with attention_hooks(model, [recorder]):
        with torch.no_grad():
            out = model(**inputs, output_attentions=True)
    assert sorted(recorder.rows) == [0, 1]
    for layer, rows in recorder.rows.items():
        assert rows.shape == (len(PROMPTS), inputs["input_ids"].shape[1])
        assert torch.allclose(rows.sum(-1), torch.ones(len(PROMPTS)), atol=1e-5)
        assert torch.allclose(rows, out.attentions[layer][:, :, -1, :].mean(1), atol=1e-6)
    assert not hooks_installed(model)


def test_image_attention_boost_edits_only_image_columns(tiny):
    model, processor = tiny
    inputs = _inputs(processor)
    main = Stream("main", inputs["input_ids"], inputs["attention_mask"], {"pixel_values": inputs["pixel_values"]})
    boost = ImageAttentionBoost(alpha=0.5, layers=[0, 1])
    recorder = AttentionRowRecorder(layers=[1])
    plain_recorder = AttentionRowRecorder(layers=[1])

    def run(hooks):
        group = StreamGroup(model, [main])
        with attention_hooks(model, hooks), torch.no_grad():
            for hook in hooks:
                hook.bind(group)
            return group.forward().logits

    plain = run([plain_recorder])
    boosted = run([boost, recorder])
    assert not torch.allclose(plain, boosted)
    img = image_token_mask(inputs["input_ids"], model.config)
    # the last query row puts more attention mass on the image columns
    assert bool((recorder.rows[1][img].view(len(PROMPTS), -1).sum(-1)
                 > plain_recorder.rows[1][img].view(len(PROMPTS), -1).sum(-1)).all())
    # alpha = 0 is the identity
    assert torch.allclose(run([ImageAttentionBoost(alpha=0.0, layers=[0, 1])]), plain, atol=1e-6)
    assert not hooks_installed(model)


def test_hooks_removed_after_exception(tiny):
    model, processor = tiny
    inputs = _inputs(processor)
    before = _forward_logits(model, inputs)

    class Boom(AttentionHook):
        def observe(self, layer_idx, weights):
            raise RuntimeError("boom in layer %d" % layer_idx)

    with pytest.raises(RuntimeError, match="boom"):
        with attention_hooks(model, [Boom(layers=[1])]):
            _forward_logits(model, inputs)
    assert not hooks_installed(model)
    assert torch.equal(_forward_logits(model, inputs), before)
    with pytest.raises(MitigationError, match="layers"):
        with attention_hooks(model, [AttentionHook(layers=[5])]):
            pass
    assert not hooks_installed(model)


# ---------------------------------------------------------------------------------------
# the loop against generate
# ---------------------------------------------------------------------------------------
class Plain(DecodingMethod):
    """The loop with no contrast: must be generate's _sample, token for token."""

    name = "plain"


class Twin(DecodingMethod):
    """A contrast stream identical to the clean one, shared or separate; scores = mean."""

    name = "twin"

    def __init__(self, share: bool):
        self.share = share
        self.seen = {}

    def contrast_streams(self, ctx):
        stream = ctx.main.replace("twin")
        if not self.share:
            stream.share_batch = False
        return [stream]

    def scores(self, ctx, logits):
        self.seen["groups"] = [len(g.streams) for g in ctx.groups]
        self.seen.setdefault("diff", []).append((logits["main"] - logits["twin"]).abs().max().item())
        return logits["main"]


def _gen(model, inputs, **kwargs):
    kwargs.setdefault("max_new_tokens", 6)
    kwargs.setdefault("do_sample", False)
    return model.generate(**inputs, **kwargs)


def test_loop_equals_generate_greedy_batched(tiny):
    model, processor = tiny
    inputs = _inputs(processor)
    assert (inputs["attention_mask"] == 0).any()  # really left-padded
    assert torch.equal(_gen(model, inputs, custom_generate=Plain()), _gen(model, inputs))


def test_loop_equals_generate_sampling_with_processors(tiny):
    model, processor = tiny
    inputs = _inputs(processor)
    settings = dict(do_sample=True, temperature=0.7, top_k=20, top_p=0.9, repetition_penalty=1.3, max_new_tokens=8)
    torch.manual_seed(123)
    expected = _gen(model, inputs, **settings)
    torch.manual_seed(123)
    got = _gen(model, inputs, custom_generate=Plain(), **settings)
    assert torch.equal(got, expected)


def test_loop_per_row_finish_eos_and_pad(tiny):
    model, processor = tiny
    inputs = _inputs(processor)
    greedy = _gen(model, inputs, max_new_tokens=6)
    prompt_len = inputs["input_ids"].shape[1]
    eos = int(greedy[0, prompt_len + 1])  # row 0 "finishes" at its 2nd token
    kwargs = dict(max_new_tokens=6, eos_token_id=eos, pad_token_id=processor.tokenizer.pad_token_id)
    expected = _gen(model, inputs, **kwargs)
    got = _gen(model, inputs, custom_generate=Plain(), **kwargs)
    assert torch.equal(got, expected)
    assert got[0, prompt_len + 2 :].eq(processor.tokenizer.pad_token_id).all()


def test_loop_respects_user_processors_and_stopping_criteria(tiny):
    from transformers import LogitsProcessor, LogitsProcessorList, StoppingCriteria, StoppingCriteriaList

    model, processor = tiny
    inputs = _inputs(processor)
    banned = int(_gen(model, inputs)[0, inputs["input_ids"].shape[1]])

    class Ban(LogitsProcessor):
        def __call__(self, input_ids, scores):
            scores = scores.clone()
            scores[:, banned] = float("-inf")
            return scores

    class StopAfter(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return torch.full((input_ids.shape[0],), input_ids.shape[1] >= inputs["input_ids"].shape[1] + 3)

    kwargs = dict(logits_processor=LogitsProcessorList([Ban()]), stopping_criteria=StoppingCriteriaList([StopAfter()]),
                  max_new_tokens=10)
    expected = _gen(model, inputs, **kwargs)
    got = _gen(model, inputs, custom_generate=Plain(), **kwargs)
    assert torch.equal(got, expected)
    assert got.shape[1] == inputs["input_ids"].shape[1] + 3
    assert not (got[:, inputs["input_ids"].shape[1]:] == banned).any()


def test_processor_chain_reads_signatures_once_and_matches_the_list(tiny, monkeypatch):
    import inspect as inspect_module

    from transformers import LogitsProcessor, LogitsProcessorList, RepetitionPenaltyLogitsProcessor, TopKLogitsWarper

    class NeedsMore(LogitsProcessor):
        def __call__(self, input_ids, scores, cur_len):
            return scores

    model, processor = tiny
    inputs = _inputs(processor)
    settings = dict(do_sample=True, temperature=0.7, top_k=20, repetition_penalty=1.3, max_new_tokens=8)
    torch.manual_seed(5)
    expected = _gen(model, inputs, custom_generate=Plain(), **settings)  # counted below: the first run warms up

    reads: list[str] = []
    real_signature = inspect_module.signature

    def counting(target, *args, **kwargs):
        owner = getattr(target, "__self__", None)
        if isinstance(owner, LogitsProcessor):
            reads.append(type(owner).__name__)
        return real_signature(target, *args, **kwargs)

    monkeypatch.setattr(inspect_module, "signature", counting)
    torch.manual_seed(5)
    got = _gen(model, inputs, custom_generate=Plain(), **settings)
    assert torch.equal(got, expected)
    # repetition penalty, temperature, top-k: each processor's signature is read once, not once per step (8 steps)
    assert sorted(reads) == sorted(set(reads)) and len(reads) == 3, reads

    scores = torch.randn(2, 11)
    ids = torch.tensor([[1, 2, 3], [4, 5, 6]])
    plain = LogitsProcessorList([RepetitionPenaltyLogitsProcessor(penalty=1.5), TopKLogitsWarper(top_k=4)])
    assert torch.equal(internals.processor_chain(plain)(ids, scores), plain(ids, scores))
    needs_more = LogitsProcessorList([NeedsMore()])
    assert internals.processor_chain(needs_more) is needs_more  # keeps the list's own call and error
    with pytest.raises(ValueError, match="required parameters"):
        internals.processor_chain(needs_more)(ids, scores)


def test_loop_return_dict(tiny):
    model, processor = tiny
    inputs = _inputs(processor)
    kwargs = dict(return_dict_in_generate=True, output_scores=True, output_logits=True)
    expected = _gen(model, inputs, **kwargs)
    got = _gen(model, inputs, custom_generate=Plain(), **kwargs)
    assert torch.equal(got.sequences, expected.sequences)
    assert len(got.scores) == len(expected.scores) == 6
    assert torch.allclose(got.scores[0], expected.scores[0], atol=1e-5)
    assert torch.allclose(got.logits[-1], expected.logits[-1], atol=1e-5)
    assert internals.cache_length(internals.output_cache(got)) == internals.cache_length(internals.output_cache(expected))
    assert internals.cache_length(internals.output_cache(got)) > 0


@pytest.mark.parametrize("share", [True, False])
def test_second_stream_shared_or_separate(tiny, share):
    model, processor = tiny
    inputs = _inputs(processor)
    method = Twin(share)
    out = _gen(model, inputs, custom_generate=method, return_dict_in_generate=True)
    assert method.seen["groups"] == ([2] if share else [1, 1])
    assert max(method.seen["diff"]) < 1e-4  # identical inputs -> identical logits, every step
    assert torch.equal(out.sequences, _gen(model, inputs))
    assert internals.first_layer_keys(internals.output_cache(out)).shape[0] == len(PROMPTS)  # clean rows only


def test_loop_rejects_beam_search(tiny):
    model, processor = tiny
    inputs = _inputs(processor)
    with pytest.raises(MitigationError, match="num_beams"):
        _gen(model, inputs, custom_generate=Plain(), num_beams=2)


def test_hooks_gone_after_generate_error(tiny):
    model, processor = tiny
    inputs = _inputs(processor)
    before = _forward_logits(model, inputs)

    class Fails(DecodingMethod):
        name = "fails"

        def hooks(self, ctx):
            return [ImageAttentionBoost(0.3, [0, 1])]

        def scores(self, ctx, logits):
            assert hooks_installed(ctx.model)
            if ctx.step == 2:
                raise RuntimeError("scoring failed")
            return logits["main"]

    with pytest.raises(RuntimeError, match="scoring failed"):
        _gen(model, inputs, custom_generate=Fails())
    assert not hooks_installed(model)
    assert torch.equal(_forward_logits(model, inputs), before)


def test_vision_cls_attention_capture(tiny):
    from medheval.decoding import VisionCLSAttention

    model, processor = tiny
    inputs = _inputs(processor)
    capture = VisionCLSAttention(model, heads="mean")
    assert capture.layer == model.config.vision_feature_layer
    with capture:
        with torch.no_grad():
            model(**inputs)
    cls_rows = capture.cls_attention()
    patches = model.config.image_seq_length
    assert cls_rows.shape == (len(PROMPTS), patches)
    # the same as the eager tower's attention maps, [CLS] row, mean over heads, CLS column dropped
    previous = model.config.vision_config._attn_implementation
    model.set_attn_implementation({"vision_config": "eager"})
    try:
        with torch.no_grad():
            out = model.model.vision_tower(inputs["pixel_values"], output_attentions=True)
    finally:
        model.set_attn_implementation({"vision_config": previous})
    expected = out.attentions[capture.layer][:, :, 0, 1:].mean(1)
    assert torch.allclose(cls_rows, expected, atol=1e-5)
    # hooks are gone: nothing captured by later forwards
    capture._q = None
    with torch.no_grad():
        model(**inputs)
    assert capture._q is None
    single = VisionCLSAttention(model, heads="single")
    with single, torch.no_grad():
        model(**inputs)
    rows = single.cls_attention()
    assert rows.shape == (len(PROMPTS), patches) and bool((rows.sum(-1) <= 1.0 + 1e-6).all())
    assert not torch.allclose(rows, cls_rows)  # one head over the full width is another distribution


def test_nested_hooks_are_refused(tiny):
    model, _ = tiny
    with attention_hooks(model, [AttentionHook()]):
        with pytest.raises(MitigationError, match="already installed"):
            with attention_hooks(model, [AttentionHook()]):
                pass
        assert hooks_installed(model)  # the outer hooks survive the refused inner call
    assert not hooks_installed(model)


def test_vision_cls_attention_default_layer_follows_hidden_state_indexing(tiny):
    """hidden_states[k] is the output of encoder layer k-1 for k >= 0, of layer k for k < 0."""
    from medheval.decoding import VisionCLSAttention
    from medheval.decoding.visual_tokens import MissingInternalError

    model, _ = tiny
    saved = model.config.vision_feature_layer
    try:
        model.config.vision_feature_layer = -1
        assert VisionCLSAttention(model).layer == -1
        model.config.vision_feature_layer = 2
        assert VisionCLSAttention(model).layer == 1
        model.config.vision_feature_layer = 0
        with pytest.raises(MissingInternalError, match="embeddings"):
            VisionCLSAttention(model)
    finally:
        model.config.vision_feature_layer = saved


def test_registered_attention_refuses_sinks_and_matches_sdpa():
    """transformers' calling convention reaches medheval's eager attention through internals' adapter."""
    from transformers import AttentionInterface

    from medheval.decoding.hooks import ATTENTION_FUNCTION, _register_attention_function
    from medheval.decoding.visual_tokens import MissingInternalError

    _register_attention_function()
    attention = AttentionInterface()[ATTENTION_FUNCTION]
    generator = torch.Generator().manual_seed(0)
    query, key, value = (torch.randn(1, 4, 5, 8, generator=generator) for _ in range(3))
    module = torch.nn.Module().eval()
    output, weights = attention(module, query, key[:, :2], value[:, :2], None, scaling=0.25, dropout=0.0)
    expected = torch.nn.functional.scaled_dot_product_attention(
        query, key[:, :2].repeat_interleave(2, dim=1), value[:, :2].repeat_interleave(2, dim=1), scale=0.25)
    assert torch.allclose(output, expected.transpose(1, 2), atol=1e-6)
    assert torch.allclose(weights.sum(-1), torch.ones(1, 4, 5))
    module.sinks = torch.zeros(4)
    with pytest.raises(MissingInternalError, match="attention sinks"):
        attention(module, query, key, value, None, scaling=0.25)
