"""The mitigations (VCD, M3ID, PAI, DoLa) on tiny random-weight LLaVA and LLaVA-NeXT.

- reductions to plain ``generate`` (greedy, token for token) at each method's neutral setting;
- batch invariance: a left-padded batch of 4 equals four single runs;
- VCD: the reference noise schedule, and the noised image really reaches the model;
- M3ID/PAI: the text-only stream is the prompt without its image tokens;
- DoLa: the chosen layer and the score match a computation from ``output_hidden_states``;
- the three ways in: callable, ``custom_generate`` folder, ``generate_with``/spec strings;
- clear errors for models or inputs that lack what a method needs.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from medheval.backends.tiny_families import build_tiny_llava_next  # noqa: F401 (test_mitigations_opera etc. import it from here)
from medheval.decoding import MissingInternalError, MitigationError, hooks_installed, image_token_mask
from medheval.mitigations import DoLa, M3ID, MITIGATIONS, PAI, VCD, generate_with, get_mitigation, parse_spec
from medheval.mitigations.dola import candidate_layers, chosen_layers, early_exit_logits
from medheval.mitigations.pai import default_layer_range
from medheval.mitigations.vcd import add_diffusion_noise, noise_schedule

REPO = Path(__file__).resolve().parents[1]
PROMPTS = [
    "is there a pleural effusion ?",
    "lung",
    "what is the size of the heart shown in this chest image and is it enlarged ?",
    "no acute process",
]
# LLaVA-NeXT: different image sizes -> different any-resolution tilings and token counts per row
NEXT_IMAGE_SIZES = [(30, 30), (30, 70), (80, 40), (50, 50)]
NEUTRAL = {
    "vcd": VCD(alpha=0.0),
    "m3id": M3ID(lam=0.0),
    "pai": PAI(alpha=0.0, gamma=1.0),
    "dola": DoLa(relative_top=1.0),
}
DEFAULTS = {name: cls() for name, cls in MITIGATIONS.items()}


# ---------------------------------------------------------------------------------------
# tiny models
# ---------------------------------------------------------------------------------------
def _images(kind, indices):
    from PIL import Image

    sizes = NEXT_IMAGE_SIZES if kind == "llava_next" else [(30, 30)] * len(PROMPTS)
    return [
        Image.fromarray(np.random.RandomState(i).randint(0, 255, (*sizes[i], 3), dtype=np.uint8)) for i in indices
    ]


def _inputs(kind, processor, indices=range(len(PROMPTS))):
    indices = list(indices)
    texts = [f"USER: <image>\n{PROMPTS[i]} ASSISTANT:" for i in indices]
    return processor(text=texts, images=_images(kind, indices), padding=True, return_tensors="pt")


def _gen(model, inputs, **kwargs):
    kwargs.setdefault("max_new_tokens", 6)
    kwargs.setdefault("do_sample", False)
    return model.generate(**inputs, **kwargs)


def _new_tokens(out, inputs):
    return out[:, inputs["input_ids"].shape[1]:]


# ---------------------------------------------------------------------------------------
# construction, specs, defaults
# ---------------------------------------------------------------------------------------
def test_every_method_constructible_without_arguments():
    assert {"vcd", "m3id", "pai", "dola"} <= set(MITIGATIONS)
    # issue 9: settings carry the preset ("medheval" by default); DoLa's default candidates are MedHEval's
    assert VCD().settings() == {"preset": "medheval", "alpha": 1.0, "beta": 0.1, "noise_step": 500, "noise_seed": 0}
    assert M3ID().settings() == {"preset": "medheval", "lam": 0.02, "beta": 0.1}
    assert PAI().settings() == {"preset": "medheval", "alpha": 0.2, "gamma": 1.1, "start_layer": None,
                                "end_layer": None, "beta": 0.1, "use_cfg": True, "cfg_stream": "templated"}
    assert DoLa().settings() == {"preset": "medheval", "layers": "medheval", "relative_top": 0.1, "final_norm": False}
    for method in [*DEFAULTS.values(), VCD(noise_seed=None), DoLa(layers=[0, 2], final_norm=True), DoLa(layers=[4]),
                   PAI(start_layer=1, use_cfg=False), PAI(cfg_stream="raw_question")]:
        assert get_mitigation(method.spec()) == method, method.spec()
    assert DoLa(layers=[0, 2]).spec() == "dola:preset=medheval,layers=0/2,relative_top=0.1,final_norm=false"


def test_spec_parsing_and_errors():
    assert parse_spec("vcd:alpha=1,beta=0.1") == ("vcd", {"alpha": 1, "beta": 0.1})
    assert get_mitigation("vcd:alpha=1,beta=0.2,noise_seed=none") == VCD(alpha=1, beta=0.2, noise_seed=None)
    assert get_mitigation("dola:layers=0/2/4,final_norm=true") == DoLa(layers=[0, 2, 4], final_norm=True)
    assert get_mitigation("PAI") == PAI()
    assert get_mitigation("none") is None and get_mitigation(None) is None
    with pytest.raises(MitigationError, match="unknown mitigation 'vdc'"):
        get_mitigation("vdc")
    with pytest.raises(MitigationError, match="no option"):
        get_mitigation("vcd:gamma=2")
    with pytest.raises(MitigationError, match="key=value"):
        get_mitigation("vcd:alpha")
    with pytest.raises(MitigationError, match="noise_step"):
        VCD(noise_step=1000)


def test_layer_defaults_adapt_to_depth():
    # PAI: [2, 32) of a 32-layer model
    assert default_layer_range(32) == (2, 32)
    assert default_layer_range(40) == (2, 40)
    assert default_layer_range(2) == (0, 2)
    with pytest.raises(MitigationError):
        default_layer_range(2, start=3)
    # DoLa: transformers' dola_layers rules; MedHEval's [0, 2, ..., 14] is "low" for 32 layers
    assert candidate_layers("low", 32) == list(range(0, 16, 2))
    assert candidate_layers("high", 32) == list(range(16, 32, 2))
    assert candidate_layers("low", 48) == list(range(0, 20, 2))
    assert candidate_layers("high", 48) == list(range(28, 48, 2))
    assert candidate_layers("low", 32, tied_embeddings=True) == list(range(2, 16, 2))
    assert candidate_layers("low", 2) == [0]
    assert candidate_layers([4, 2, 2], 8) == [2, 4]
    with pytest.raises(MitigationError, match="mature"):
        candidate_layers([32], 32)


def test_locator_finds_every_llava_next_feature_position(llava_next):
    """Base features + any-resolution tiles + row newlines: as many positions as feature rows, per row."""
    model, processor = llava_next
    inputs = _inputs("llava_next", processor)
    counts = image_token_mask(inputs["input_ids"], model.config).sum(1).tolist()
    with torch.no_grad():
        features = model.model.get_image_features(
            pixel_values=inputs["pixel_values"], image_sizes=inputs["image_sizes"], return_dict=True
        ).pooler_output
    assert counts == [int(f.shape[0]) for f in features]
    assert len(set(counts)) > 1  # image shapes change the token count: no fixed positions possible


# ---------------------------------------------------------------------------------------
# VCD noise
# ---------------------------------------------------------------------------------------
def test_vcd_noise_schedule_reference_values():
    signal, noise = noise_schedule(500)
    assert signal == pytest.approx(0.8630, abs=5e-5)
    assert noise == pytest.approx(0.5052, abs=5e-5)
    assert signal**2 + noise**2 == pytest.approx(1.0)
    assert noise_schedule(0) == pytest.approx((1.0, 0.0047), abs=5e-5)
    assert noise_schedule(999) == pytest.approx((0.2850, 0.9585), abs=5e-5)
    assert noise_schedule(100) == pytest.approx((0.9983, 0.0584), abs=5e-5)


def test_vcd_noise_is_seeded_per_image_and_batch_independent():
    pixels = torch.randn(3, 3, 8, 8)
    noised = add_diffusion_noise(pixels, 500, seed=0)
    signal, scale = noise_schedule(500)
    eps = (noised - signal * pixels) / scale
    assert abs(eps.mean().item()) < 0.1 and abs(eps.std().item() - 1.0) < 0.1
    # the same image gets the same noise alone or in a batch
    assert torch.allclose(add_diffusion_noise(pixels[1:2], 500, seed=0), noised[1:2])
    assert torch.equal(add_diffusion_noise(pixels, 500, seed=0), noised)
    assert not torch.equal(add_diffusion_noise(pixels, 500, seed=1), noised)
    # LLaVA-NeXT tiles [N, P, C, H, W]: tile p of every image gets the same draw whatever P
    tiles = torch.randn(2, 5, 3, 4, 4)
    assert torch.allclose(add_diffusion_noise(tiles, 500, seed=0)[:, :3], add_diffusion_noise(tiles[:, :3], 500, seed=0))
    # seed=None: torch's global RNG, as upstream
    torch.manual_seed(0)
    a = add_diffusion_noise(pixels, 500, seed=None)
    torch.manual_seed(0)
    assert torch.equal(add_diffusion_noise(pixels, 500, seed=None), a)


class SpyVCD(VCD):
    """VCD that keeps the per-step logits of both streams."""

    def scores(self, ctx, logits):
        ctx.state.setdefault("trace", []).append({k: v.clone() for k, v in logits.items()})
        self.trace = ctx.state["trace"]
        self.groups = [len(g.streams) for g in ctx.groups]
        return super().scores(ctx, logits)


def test_vcd_noised_image_reaches_the_model(tiny):
    kind, model, processor = tiny
    inputs = _inputs(kind, processor)
    spy = SpyVCD()
    _gen(model, inputs, custom_generate=spy)
    assert spy.groups == [2]  # clean + noised rows in one batch, one cache
    first = spy.trace[0]
    assert (first["main"] - first["noised"]).abs().max() > 1e-3  # l' != l
    # l' is exactly the model's next-token logits given the noised pixel values
    noised_inputs = dict(inputs)
    noised_inputs["pixel_values"] = add_diffusion_noise(inputs["pixel_values"], 500, seed=0)
    with torch.no_grad():
        direct = model(**noised_inputs).logits[:, -1]
        clean = model(**inputs).logits[:, -1]
    assert torch.allclose(first["noised"], direct, atol=1e-4)
    assert torch.allclose(first["main"], clean, atol=1e-4)


def test_vcd_alpha0_beta0_equals_plain_sampling(llava):
    model, processor = llava
    inputs = _inputs("llava", processor)
    settings = dict(do_sample=True, top_k=None, temperature=1.0, max_new_tokens=8)
    torch.manual_seed(7)
    expected = _gen(model, inputs, **settings)
    torch.manual_seed(7)
    got = _gen(model, inputs, custom_generate=VCD(alpha=0.0, beta=0.0), **settings)
    assert torch.equal(got, expected)


def test_vcd_needs_pixel_values(llava):
    model, processor = llava
    ids = processor.tokenizer(["lung"], return_tensors="pt")
    with pytest.raises(MissingInternalError, match="pixel_values"):
        _gen(model, ids, custom_generate=VCD())


# ---------------------------------------------------------------------------------------
# reductions to plain decoding and batch invariance, every method, LLaVA and LLaVA-NeXT
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(NEUTRAL))
def test_neutral_setting_reduces_to_greedy(tiny, name):
    kind, model, processor = tiny
    inputs = _inputs(kind, processor)
    assert (inputs["attention_mask"] == 0).any()
    expected = _gen(model, inputs, max_new_tokens=8)
    got = _gen(model, inputs, max_new_tokens=8, custom_generate=NEUTRAL[name])
    assert torch.equal(got, expected)
    assert not hooks_installed(model)


@pytest.mark.parametrize("name", sorted(DEFAULTS))
def test_default_setting_changes_the_output(tiny, name):
    kind, model, processor = tiny
    inputs = _inputs(kind, processor)
    plain = _gen(model, inputs, max_new_tokens=8)
    got = _gen(model, inputs, max_new_tokens=8, custom_generate=DEFAULTS[name])
    assert got.shape == plain.shape
    assert not torch.equal(got, plain)


@pytest.mark.parametrize("name", sorted(DEFAULTS))
def test_batch_of_four_equals_single_runs(tiny, name):
    kind, model, processor = tiny
    method = DEFAULTS[name]
    batch = _inputs(kind, processor)
    lengths = batch["attention_mask"].sum(1).tolist()
    assert len(set(lengths)) == len(PROMPTS)  # different prompt lengths -> real left padding
    batched = _new_tokens(_gen(model, batch, custom_generate=method), batch)
    for i in range(len(PROMPTS)):
        single = _inputs(kind, processor, [i])
        alone = _new_tokens(_gen(model, single, custom_generate=method), single)
        assert torch.equal(batched[i : i + 1], alone), f"{name} row {i}"


# ---------------------------------------------------------------------------------------
# M3ID / PAI text-only stream, PAI attention
# ---------------------------------------------------------------------------------------
class SpyM3ID(M3ID):
    def scores(self, ctx, logits):
        if ctx.step == 0:
            self.first = {k: v.clone() for k, v in logits.items()}
            self.text_group = ctx.group_of("text_only")
        return super().scores(ctx, logits)


def test_text_only_stream_is_the_prompt_without_image(tiny):
    kind, model, processor = tiny
    inputs = _inputs(kind, processor)
    spy = SpyM3ID()
    _gen(model, inputs, custom_generate=spy, max_new_tokens=2)
    group = spy.text_group
    assert group.streams[0].input_ids.shape[1] < inputs["input_ids"].shape[1]
    assert not image_token_mask(group.streams[0].input_ids, model.config).any()
    tok = processor.tokenizer
    for row in range(len(PROMPTS)):  # each row: the same text, image tokens removed, re-left-padded
        text_ids = group.streams[0].input_ids[row][group.streams[0].attention_mask[row].bool()]
        full = inputs["input_ids"][row][inputs["attention_mask"][row].bool()]
        assert text_ids.tolist() == full[~image_token_mask(full[None], model.config)[0]].tolist()
        with torch.no_grad():  # the same logits as running that prompt alone, without pixels
            direct = model(input_ids=text_ids[None]).logits[0, -1]
        assert torch.allclose(spy.first["text_only"][row], direct, atol=1e-4)
    assert tok.pad_token_id in group.streams[0].input_ids[:, 0].tolist()


def test_m3id_scores_follow_the_formula(llava):
    model, processor = llava
    inputs = _inputs("llava", processor)
    spy = SpyM3ID(lam=0.5, beta=0.1)
    out = _gen(model, inputs, custom_generate=spy, max_new_tokens=1, return_dict_in_generate=True, output_scores=True)
    l_c, l_u = F.log_softmax(spy.first["main"], -1), F.log_softmax(spy.first["text_only"], -1)
    gamma = math.exp(-0.5 * 1)
    expected = l_c + (1 - gamma) / gamma * (l_c - l_u)
    keep = spy.first["main"] >= spy.first["main"].max(-1, keepdim=True).values + math.log(0.1)
    expected = expected.masked_fill(~keep, float("-inf"))
    assert torch.allclose(out.scores[0], expected, atol=1e-5)


def test_pai_attention_only_changes_output_and_restores_attention(tiny):
    kind, model, processor = tiny
    inputs = _inputs(kind, processor)
    previous = model.config.text_config._attn_implementation
    plain = _gen(model, inputs, max_new_tokens=8)
    boosted = _gen(model, inputs, max_new_tokens=8, custom_generate=PAI(alpha=2.0, use_cfg=False))
    assert not torch.equal(plain, boosted)
    assert model.config.text_config._attn_implementation == previous
    assert not hooks_installed(model)
    with torch.no_grad():  # the model computes what it computed before
        assert torch.equal(model(**inputs).logits, model(**inputs).logits)
    # cfg only (alpha=0): the text-only stream runs and the scores follow gamma*(lc-lu)+lu
    cfg = _gen(model, inputs, max_new_tokens=8, custom_generate=PAI(alpha=0.0, gamma=3.0))
    assert not torch.equal(plain, cfg)


def test_pai_gamma_one_is_log_p_c_without_cutoff(llava):
    """At γ = 1 PAI's CFG processor (``CFG.py``) returns ``log_softmax`` of the logits before its cutoff: every
    token stays, so neutral PAI also samples as plain sampling (the β cutoff used to drop the tail)."""
    logits = torch.tensor([[4.0, 0.0, -3.0]])  # p(-3) < 0.1 · p(4): below the cutoff
    scores = PAI(gamma=1.0).scores(None, {"main": logits, "text_only": torch.zeros(1, 3)})
    assert torch.allclose(scores, F.log_softmax(logits, -1)) and torch.isfinite(scores).all()
    assert torch.isinf(PAI(gamma=1.5).scores(None, {"main": logits, "text_only": torch.zeros(1, 3)})).any()
    model, processor = llava
    inputs = _inputs("llava", processor)
    with torch.no_grad():
        first = model(**inputs).logits[:, -1].float()
    out = _gen(model, inputs, max_new_tokens=1, custom_generate=PAI(alpha=0.0, gamma=1.0),
               return_dict_in_generate=True, output_scores=True)
    assert torch.allclose(out.scores[0], F.log_softmax(first, -1), atol=1e-5)
    sampled = {}
    for name, method in (("plain", None), ("pai", PAI(alpha=0.0, gamma=1.0))):
        torch.manual_seed(0)
        sampled[name] = _gen(model, inputs, max_new_tokens=8, do_sample=True, top_k=0, temperature=3.0,
                             **({"custom_generate": method} if method else {}))
    assert torch.equal(sampled["plain"], sampled["pai"])


def _forward_rows(model, inputs, method) -> list[int]:
    """The rows of every language-model forward of one greedy call (read at the token embedding)."""
    rows: list[int] = []
    handle = model.get_input_embeddings().register_forward_hook(lambda module, args, out: rows.append(out.shape[0]))
    try:
        _gen(model, inputs, max_new_tokens=4, **({"custom_generate": method} if method else {}))
    finally:
        handle.remove()
    return rows


def test_pai_gamma_one_runs_no_text_only_stream(llava):
    """At γ = 1 the score is log p_c alone: the text-only stream was prefilled and decoded with the clean one (2B
    rows a step) for nothing. Now neutral PAI runs the forwards plain decoding runs, B rows each; γ ≠ 1 still
    runs the stream (and use_cfg=False none), and the batch sizing counts the rows each runs."""
    model, processor = llava
    inputs = _inputs("llava", processor)
    batch = int(inputs["input_ids"].shape[0])
    plain = _forward_rows(model, inputs, None)
    assert plain == [batch] * 4
    assert _forward_rows(model, inputs, PAI(alpha=0.0, gamma=1.0)) == plain
    assert _forward_rows(model, inputs, PAI(alpha=0.5, gamma=1.0, cfg_stream="raw_question")) == plain
    assert 2 * batch in _forward_rows(model, inputs, PAI(alpha=0.0, gamma=1.5))  # the stream joined the batch
    assert _forward_rows(model, inputs, PAI(alpha=0.5, use_cfg=False)) == plain
    assert [PAI(gamma=g, use_cfg=c).rows_per_record() for g, c in ((1.0, True), (1.1, True), (1.1, False))] == [1, 2, 1]
    # the raw question is not needed where its stream does not run
    assert PAI(gamma=1.0, cfg_stream="raw_question").question_inputs(processor.tokenizer, PROMPTS) == {}


def test_pai_forward_after_call_matches_fresh_model(llava):
    from medheval.backends.tiny import build_tiny_llava

    model, processor = llava
    inputs = _inputs("llava", processor)
    _gen(model, inputs, custom_generate=PAI(alpha=0.5))
    fresh, _ = build_tiny_llava(seed=0)
    with torch.no_grad():
        assert torch.equal(model(**inputs).logits, fresh(**inputs).logits)


# ---------------------------------------------------------------------------------------
# DoLa
# ---------------------------------------------------------------------------------------
class SpyDoLa(DoLa):
    def scores(self, ctx, logits):
        out = super().scores(ctx, logits)
        self.chosen = chosen_layers(ctx.state)  # per step, per row: the layer number
        self.candidates = ctx.state["dola_candidates"]
        self.index = ctx.state["dola_chosen_index"]
        return out


@pytest.mark.parametrize("final_norm", [False, True])
def test_dola_first_step_matches_hidden_state_computation(llava_next, final_norm):
    model, processor = llava_next
    inputs = _inputs("llava_next", processor)
    spy = SpyDoLa(layers=[0, 1, 2], final_norm=final_norm)
    out = _gen(model, inputs, custom_generate=spy, max_new_tokens=1, return_dict_in_generate=True, output_scores=True)
    with torch.no_grad():
        full = model(**inputs, output_hidden_states=True)
    head, norm = model.lm_head, model.model.language_model.norm
    mature = full.logits[:, -1].float()
    log_n = F.log_softmax(mature, -1)
    for row in range(len(PROMPTS)):
        early = {}
        for j in (0, 1, 2):
            h = full.hidden_states[j][row, -1]
            early[j] = F.log_softmax(head(norm(h) if final_norm else h).float(), -1)
        dist = {j: 0.5 * (F.kl_div(log_n[row], 0.5 * (log_n[row].exp() + e.exp()), reduction="none").mean()
                          + F.kl_div(e, 0.5 * (log_n[row].exp() + e.exp()), reduction="none").mean())
                for j, e in early.items()}
        m = max(dist, key=dist.get)
        assert spy.chosen[0][row] == m
        assert spy.index[0].dtype == torch.long and int(spy.index[0][row]) == spy.candidates.index(m)
        keep = log_n[row] >= log_n[row].max() + math.log(0.1)
        expected = (log_n[row] - early[m]).masked_fill(~keep, float("-inf"))
        assert torch.allclose(out.scores[0][row], expected, atol=1e-4)


def test_dola_early_exit_logits_stacked_equal_per_layer(llava_next):
    """One head call on the J candidates' states stacked on the row dimension gives each layer's
    ``lm_head(h_j)``. Bound: the stacked call is one GEMM with M = J·B rows where the per-layer calls had
    M = B, and a BLAS may pick another kernel (summation order) for another M — on CPU float32 it does for
    B <= 2 (differences of ~1e-7 here). Both are float32 dot products of length H, each within
    H·eps·Σ|w_i h_i| of the exact value, so they differ by at most twice that."""
    model, processor = llava_next
    with torch.no_grad():
        full = model(**_inputs("llava_next", processor), output_hidden_states=True)
        head, norm = model.lm_head, model.model.language_model.norm
        layers = [0, 1, 2]
        for final_norm in (False, True):
            for rows in (slice(0, 4), slice(1, 2), slice(2, 4)):
                stacked = early_exit_logits(model, full.hidden_states, layers, rows, final_norm)
                assert stacked.dtype == torch.float32 and stacked.shape == (3, rows.stop - rows.start, head.out_features)
                for k, j in enumerate(layers):
                    h = full.hidden_states[j][rows, -1]
                    h = norm(h) if final_norm else h
                    per_layer = head(h).float()
                    bound = 2 * h.shape[-1] * torch.finfo(torch.float32).eps * (h.abs() @ head.weight.abs().T)
                    assert ((stacked[k] - per_layer).abs() <= bound).all()
                    assert not torch.equal(stacked[k], stacked[(k + 1) % 3])  # each slice is its own layer


def test_dola_reads_the_lm_head_once_per_step(llava_next):
    """The LM head runs once per step for the model's own logits and once for all J candidates together
    (applying it per candidate layer would read its weights J times per step)."""
    model, processor = llava_next
    calls = []
    handle = model.lm_head.register_forward_hook(lambda module, args, out: calls.append(args[0].shape[0]))
    try:
        _gen(model, _inputs("llava_next", processor), custom_generate=DoLa(layers=[0, 1, 2]), max_new_tokens=4)
    finally:
        handle.remove()
    rows = len(PROMPTS)
    # per step: the model's forward (its logits: [B, ...]), then DoLa's one call on [3·B, H]
    assert len(calls) == 2 * 4
    assert calls[0::2] == [rows] * 4 and calls[1::2] == [3 * rows] * 4


def test_dola_default_layers_on_tiny_models(llava, llava_next):
    spy = SpyDoLa()
    model, processor = llava
    _gen(model, _inputs("llava", processor), custom_generate=spy, max_new_tokens=2)
    assert spy.candidates == [0]  # "low" of a 2-layer model: range(0, 1, 2)
    spy = SpyDoLa(layers="high")
    model, processor = llava_next
    _gen(model, _inputs("llava_next", processor), custom_generate=spy, max_new_tokens=2)
    assert spy.candidates == [1]  # "high" of 3 layers: range(1, 3, 2)


def test_dola_repetition_penalty_is_a_normal_processor(llava):
    model, processor = llava
    inputs = _inputs("llava", processor)
    plain = _gen(model, inputs, custom_generate=DoLa(), max_new_tokens=10)
    penalised = _gen(model, inputs, custom_generate=DoLa(), max_new_tokens=10, repetition_penalty=1.2)
    assert plain.shape == penalised.shape  # the processor runs on DoLa's scores; nothing breaks


def test_dola_on_a_text_only_llm():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                                         num_attention_heads=4, num_key_value_heads=4, pad_token_id=0)).eval()
    ids = torch.randint(3, 50, (2, 7))
    plain = model.generate(input_ids=ids, max_new_tokens=5, do_sample=False)
    assert torch.equal(model.generate(input_ids=ids, max_new_tokens=5, do_sample=False,
                                      custom_generate=DoLa(relative_top=1.0)), plain)
    model.generate(input_ids=ids, max_new_tokens=5, do_sample=False, custom_generate=DoLa())
    # image-based methods say what is missing
    for method in (M3ID(), PAI()):
        with pytest.raises(MissingInternalError, match="image_token"):
            model.generate(input_ids=ids, max_new_tokens=2, custom_generate=method)
    with pytest.raises(MissingInternalError, match="pixel_values"):
        model.generate(input_ids=ids, max_new_tokens=2, custom_generate=VCD())


# ---------------------------------------------------------------------------------------
# the three ways in
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,options", [("vcd", {"alpha": 0.5}), ("m3id", {"lam": 0.1}),
                                          ("pai", {"alpha": 0.3, "gamma": 1.5}), ("dola", {"relative_top": 0.2})])
def test_custom_generate_folder(llava, name, options):
    model, processor = llava
    inputs = _inputs("llava", processor)
    folder = REPO / "mitigations" / name
    assert (folder / "custom_generate" / "generate.py").is_file() and (folder / "README.md").is_file()
    via_folder = _gen(model, inputs, custom_generate=str(folder), trust_remote_code=True, **options)
    via_callable = _gen(model, inputs, custom_generate=MITIGATIONS[name](**options))
    assert torch.equal(via_folder, via_callable)
    neutral = NEUTRAL[name].settings()
    assert torch.equal(_gen(model, inputs, custom_generate=str(folder), trust_remote_code=True, **neutral),
                       _gen(model, inputs))


def test_generate_with(llava):
    model, processor = llava
    inputs = _inputs("llava", processor)
    kwargs = dict(max_new_tokens=5, do_sample=False)
    assert torch.equal(generate_with("none", model, **inputs, **kwargs), model.generate(**inputs, **kwargs))
    assert torch.equal(generate_with("vcd:alpha=0.5", model, **inputs, **kwargs),
                       model.generate(**inputs, **kwargs, custom_generate=VCD(alpha=0.5)))
    assert torch.equal(generate_with(M3ID(), model, **inputs, **kwargs), M3ID().generate(model, **inputs, **kwargs))
