"""Mitigation presets (issue 9): ``medheval`` (MedHEval's appendix A.4, the default) and ``official``.

- every preset resolves to the values its card documents (the card holds the rendered table);
- explicit options override a preset (constructor, spec string, custom_generate folder);
- an unknown preset is refused with the list of presets;
- hand-worked behaviour per changed method: OPERA's σ and threshold reach the search, DoLa's
  candidate layers at 1–48 layers (transformers' rule for ``official``), AvisC's top-10 blind
  tokens, DAMRO's last vision layer;
- the invariants under the ``official`` presets: neutral settings = plain greedy, a left-padded
  batch = single runs;
- the runner records the preset and the resolved values.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from medheval.decoding import MitigationError
from medheval.mitigations import DAMRO, MITIGATIONS, OPERA, AvisC, DoLa, generate_with, get_mitigation
from medheval.mitigations import opera as opera_module
from medheval.mitigations.avisc import select_blind_tokens
from medheval.mitigations.dola import candidate_layers
from medheval.mitigations.presets import DEFAULT_PRESET, FROM_PRESET, preset_table
from test_mitigations_avisc_damro import SpyDAMRO, _eager_cls_attention
from test_mitigations import PROMPTS, _gen, _inputs, _new_tokens

REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------------------------------
# resolution, overrides, errors, cards
# ---------------------------------------------------------------------------------------
DOCUMENTED = {  # the values the issue and the cards give, written out by hand
    ("opera", "medheval"): dict(num_beams=5, scale_factor=50.0, threshold=15, num_attn_candidates=5,
                                penalty_weights=1.0, window_size=512),
    ("opera", "official"): dict(num_beams=5, scale_factor=50.0, threshold=15, num_attn_candidates=5,
                                penalty_weights=1.0, window_size=512),
    ("opera", "medheval_llava_med_report"): dict(scale_factor=25.0, threshold=25, num_attn_candidates=5,
                                                 penalty_weights=1.0),
    ("dola", "medheval"): dict(layers="medheval", relative_top=0.1, final_norm=False),
    ("dola", "official"): dict(layers="low", relative_top=0.1, final_norm=False),
    ("avisc", "medheval"): dict(alpha=1.0, beta=0.1, layer_gamma=0.5, top_k=10, masking_scheme="zeros"),
    ("avisc", "official"): dict(alpha=1.0, beta=0.1, layer_gamma=0.5, top_k=None, lamb=1.0, masking_scheme="zeros"),
    ("damro", "medheval"): dict(alpha=0.5, beta=0.1, top_k=None, vision_layer=-1, cls_heads="mean",
                                masking_scheme="zeros"),
    ("damro", "official"): dict(alpha=2.0, beta=0.1, top_k=None, vision_layer=None, cls_heads="single",
                                masking_scheme="drop"),
    ("vcd", "medheval"): dict(alpha=1.0, beta=0.1, noise_step=500),
    ("vcd", "official"): dict(alpha=1.0, beta=0.1, noise_step=500),
    ("m3id", "medheval"): dict(lam=0.02, beta=0.1),
    ("m3id", "official"): dict(lam=0.02, beta=0.1),
    ("pai", "medheval"): dict(alpha=0.2, gamma=1.1, start_layer=None, end_layer=None, beta=0.1, use_cfg=True),
    ("pai", "official"): dict(alpha=0.2, gamma=1.1, start_layer=None, end_layer=None, beta=0.1, use_cfg=True),
}


@pytest.mark.parametrize("name,preset", sorted(DOCUMENTED))
def test_preset_resolves_to_the_documented_values(name, preset):
    method = MITIGATIONS[name](preset=preset)
    settings = method.settings()
    assert settings["preset"] == preset
    assert {k: settings[k] for k in DOCUMENTED[name, preset]} == DOCUMENTED[name, preset]
    assert FROM_PRESET not in settings.values()
    # the spec (what results record) carries the preset and every resolved value, and parses back
    assert method.spec().startswith(f"{name}:preset={preset},")
    assert get_mitigation(method.spec()) == method


def test_every_method_has_medheval_default_and_official():
    for name, cls in MITIGATIONS.items():
        assert {"medheval", "official"} <= set(cls.PRESETS), name
        assert cls().preset == DEFAULT_PRESET == "medheval"
        assert cls() == cls(preset="medheval")
        for preset in cls.PRESETS:
            assert (name, preset) in DOCUMENTED, f"{name}:{preset} has no hand-written expectation here"


@pytest.mark.parametrize("name", sorted(MITIGATIONS))
def test_card_holds_the_preset_table(name):
    """Each card documents exactly the values the code resolves (the table is rendered from the presets)."""
    card = (REPO / "mitigations" / name / "README.md").read_text(encoding="utf-8")
    assert preset_table(MITIGATIONS[name]) in card, f"mitigations/{name}/README.md: preset table out of date"
    assert "preset" in card and "official" in card


def test_explicit_options_override_the_preset():
    method = OPERA(preset="official", threshold=25)
    assert (method.preset, method.threshold, method.scale_factor) == ("official", 25, 50.0)
    assert get_mitigation("opera:preset=official,threshold=25") == method
    assert get_mitigation("opera:threshold=25,preset=official") == method  # order does not matter
    assert OPERA(preset="medheval_llava_med_report", scale_factor=40).settings()["scale_factor"] == 40
    # an explicit value equal to a default of the *other* preset, including None, is kept
    assert DAMRO(vision_layer=None).vision_layer is None            # medheval's own value is -1
    assert DAMRO(preset="official", vision_layer=-1).vision_layer == -1
    assert AvisC(preset="official", top_k=10).top_k == 10
    assert AvisC(top_k=None).top_k is None
    assert DoLa(preset="official", layers=[0, 1]).layers == [0, 1]
    # overrides are validated like any option
    with pytest.raises(MitigationError, match="top_k"):
        AvisC(top_k=0)


@pytest.mark.parametrize("name", sorted(MITIGATIONS))
def test_unknown_preset_lists_the_presets(name):
    cls = MITIGATIONS[name]
    with pytest.raises(MitigationError) as error:
        cls(preset="paper")
    message = str(error.value)
    assert "unknown preset 'paper'" in message and name in message
    for preset in cls.PRESETS:
        assert preset in message
    with pytest.raises(MitigationError, match="unknown preset 'Official'"):
        get_mitigation(f"{name}:preset=Official")


def test_unknown_preset_through_the_folder(llava):
    model, processor = llava
    inputs = _inputs("llava", processor, [0])
    with pytest.raises(MitigationError, match="presets: medheval, official"):
        _gen(model, inputs, custom_generate=str(REPO / "mitigations" / "vcd"), trust_remote_code=True,
             preset="paper")


# ---------------------------------------------------------------------------------------
# OPERA: σ and threshold of the preset reach the search
# ---------------------------------------------------------------------------------------
class SpyOPERA(OPERA):
    def observe_step(self, event):
        if event["kind"] == "step":
            self.__dict__.setdefault("steps", []).append(event)


@pytest.mark.parametrize("preset,scale,threshold", [("medheval", 50.0, 15), ("medheval_llava_med_report", 25.0, 25)])
def test_opera_preset_reaches_the_search(llava, monkeypatch, preset, scale, threshold):
    model, processor = llava
    inputs = _inputs("llava", processor, [0])
    trackers = []

    class Recording(opera_module.RollbackTracker):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            trackers.append(self)

    monkeypatch.setattr(opera_module, "RollbackTracker", Recording)
    spy = SpyOPERA(preset=preset, num_beams=2)
    model.generate(**inputs, max_new_tokens=3, custom_generate=spy)
    assert trackers and all(t.threshold == threshold and t.max_per_position == 5 for t in trackers)
    # first answer token: the window is the candidate's own column, so φ = 1e-7 · σ · w_00
    first = spy.steps[0]
    w = first["rows"][..., 0]
    assert torch.allclose(first["log_score"].exp(), 1e-7 * scale * w, rtol=1e-4)


# ---------------------------------------------------------------------------------------
# DoLa: candidate layers, worked out by hand
# ---------------------------------------------------------------------------------------
EVEN_0_14 = [0, 2, 4, 6, 8, 10, 12, 14]
LAYERS = [  # (rule, N, tied, expected)
    ("medheval", 32, False, EVEN_0_14),
    ("medheval", 40, False, EVEN_0_14),              # MedHEval: also for 40-layer models
    ("medheval", 48, True, EVEN_0_14),
    ("medheval", 4, False, [0, 2]),                  # shallow models: the layers below N
    ("medheval", 4, True, [0, 2]),
    ("medheval", 1, False, [0]),
    # transformers' "low" (<= 4.52, transformers-community/dola)
    ("low", 32, False, EVEN_0_14),
    ("low", 32, True, [2, 4, 6, 8, 10, 12, 14]),
    ("low", 40, False, [0, 2, 4, 6, 8, 10, 12, 14, 16, 18]),
    ("low", 40, True, [2, 4, 6, 8, 10, 12, 14, 16, 18]),
    ("low", 48, False, [0, 2, 4, 6, 8, 10, 12, 14, 16, 18]),   # N > 40: range(0, 20, 2)
    ("low", 48, True, [2, 4, 6, 8, 10, 12, 14, 16, 18]),
    ("low", 4, False, [0]),
    ("low", 4, True, [2]),                           # start 2 == N // 2 -> [2] (was [1] before issue 9)
    ("low", 5, True, [2]),
    ("low", 6, True, [2]),
    ("low", 8, True, [2]),
    ("low", 2, True, [1]),                           # tied, N = 2: start 1 == N // 2
    ("low", 2, False, [0]),
    ("low", 1, True, [0]),
    ("low", 1, False, [0]),
    ("high", 32, False, [16, 18, 20, 22, 24, 26, 28, 30]),
    ("high", 40, True, [20, 22, 24, 26, 28, 30, 32, 34, 36, 38]),
    ("high", 48, False, [28, 30, 32, 34, 36, 38, 40, 42, 44, 46]),
    ("high", 3, False, [1]),
]


@pytest.mark.parametrize("spec,message", [
    ("pai:alpha=x", "pai: option alpha='x' must be a number (float), e.g. --mitigation pai:alpha=0.2"),
    ("vcd:alpha=abc", "vcd: option alpha='abc' must be a number (float)"),
    ("opera:num_beams=2.5", "opera: option num_beams=2.5 must be a whole number (int)"),
    ("pai:use_cfg=1", "pai: option use_cfg=1 must be true or false (bool)"),
    ("avisc:top_k=ten", "avisc: option top_k='ten' must be a whole number (int) or none"),
    ("dola:layers=abc", "dola: option layers='abc' must be 'medheval', 'low', 'high' or a non-empty list"),
    ("dola:layers=0/-2", "dola: option layers=[0, -2] must be"),
    ("dola:relative_top=high", "dola: option relative_top='high' must be a number (float)"),
])
def test_a_mistyped_option_value_is_refused_when_the_method_is_built(spec, message):
    """Was found only at the first generation (``could not convert string to float: 'x'``), or not at all."""
    with pytest.raises(MitigationError) as error:
        get_mitigation(spec)
    assert message in str(error.value)


@pytest.mark.parametrize("spec", ["vcd:alpha=nan", "pai:gamma=inf", "m3id:lam=nan", "avisc:lamb=-inf",
                                  "damro:alpha=nan", "opera:penalty_weights=nan", "opera:scale_factor=inf"])
def test_a_non_finite_option_is_refused_when_the_method_is_built(spec):
    """Was accepted: ``--mitigation vcd:alpha=nan`` ran and wrote NaN-scored noise as answers, without an error."""
    name, _, option = spec.partition(":")
    key, _, value = option.partition("=")
    with pytest.raises(MitigationError) as error:
        get_mitigation(spec)
    assert f"{name}: option {key}={float(value)!r} must be a finite number, e.g. --mitigation {name}:{key}=" \
        in str(error.value)


def test_option_types_accept_what_the_specs_and_constructors_write():
    assert get_mitigation("vcd:alpha=1,noise_seed=none").spec() == (
        "vcd:preset=medheval,alpha=1,beta=0.1,noise_step=500,noise_seed=none")  # an int is a float: spec unchanged
    assert get_mitigation("dola:layers=4").layers == 4 and get_mitigation("dola:layers=4/").layers == [4]
    assert DoLa(layers=(0, 2)).layers == (0, 2) and get_mitigation("avisc:top_k=none").top_k is None
    for cls in MITIGATIONS.values():  # every preset's values fit the declared types
        for preset in cls.PRESETS:
            assert get_mitigation(cls(preset=preset).spec()).spec() == cls(preset=preset).spec()
    with pytest.raises(MitigationError, match="option alpha='x' must be a number"):
        AvisC(alpha="x")  # constructed directly, too


@pytest.mark.parametrize("rule,n,tied,expected", LAYERS)
def test_dola_candidate_layers(rule, n, tied, expected):
    assert candidate_layers(rule, n, tied_embeddings=tied) == expected


def test_dola_candidate_layer_errors():
    with pytest.raises(MitigationError, match="no candidate layer for a 3-layer language model with tied"):
        candidate_layers("low", 3, tied_embeddings=True)   # range(2, 1, 2) is empty (transformers would crash)
    with pytest.raises(MitigationError, match="'medheval', 'low', 'high'"):
        candidate_layers("middle", 32)
    with pytest.raises(MitigationError, match=r"\[16\] are not in \[0, 16\)"):
        candidate_layers([0, 16], 16)                       # explicit lists are checked, not silently cut


@pytest.mark.parametrize("tied", [False, True])
def test_dola_presets_on_a_4_layer_llm(tied):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                                         num_attention_heads=4, num_key_value_heads=4, pad_token_id=0,
                                         tie_word_embeddings=tied)).eval()
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == tied
    assert DoLa().candidate_layers(model) == [0, 2]
    assert DoLa(preset="official").candidate_layers(model) == ([2] if tied else [0])
    ids = torch.randint(3, 50, (2, 7))
    plain = model.generate(input_ids=ids, max_new_tokens=4, do_sample=False)
    for preset in ("medheval", "official"):  # neutral setting under either preset: plain greedy
        neutral = DoLa(preset=preset, relative_top=1.0)
        assert torch.equal(model.generate(input_ids=ids, max_new_tokens=4, do_sample=False,
                                          custom_generate=neutral), plain)


# ---------------------------------------------------------------------------------------
# AvisC: the medheval preset's top-10 blind tokens on a hand-built attention map
# ---------------------------------------------------------------------------------------
HAND = torch.tensor([
    [9, 1, 8, 2, 7, 3, 6, 4, 5, 0, 10, 11, 0, 0, 12, 13],                 # layer 0: mass 91
    [0.5] * 16,                                                             # layer 1: mass 8
    [0, 20, 0, 0, 0, 0, 0, 0, 0, 30, 0, 0, 0, 0, 0, 0],                     # layer 2: mass 50
], dtype=torch.float64)


def test_avisc_top10_known_answer():
    # shares 91/149 = 0.61, 8/149 = 0.05, 50/149 = 0.34
    # gamma 0.5: cumulative 0.61 >= 0.5 -> layer 0 only; its 10 largest: 13 12 11 10 9 8 7 6 5 4
    blind, layers = select_blind_tokens(HAND, layer_gamma=0.5, top_k=10)
    assert layers.tolist() == [0]
    assert blind.nonzero().flatten().tolist() == [0, 2, 4, 6, 7, 8, 10, 11, 14, 15]
    # gamma 0.7: 0.61 < 0.7 -> layers {0, 2}, mean
    # a = [4.5, 10.5, 4, 1, 3.5, 1.5, 3, 2, 2.5, 15, 5, 5.5, 0, 0, 6, 6.5]; the 10 largest down to 3 (2.5 is 11th)
    blind, layers = select_blind_tokens(HAND, layer_gamma=0.7, top_k=10)
    assert sorted(layers.tolist()) == [0, 2]
    assert blind.nonzero().flatten().tolist() == [0, 1, 2, 4, 6, 9, 10, 11, 14, 15]
    # the official threshold picks fewer: a >= mean(a) + std(a) (mean 4.4375, std 3.83) -> 10.5 and 15
    blind, _ = select_blind_tokens(HAND, layer_gamma=0.7, lamb=1.0, top_k=None)
    assert blind.nonzero().flatten().tolist() == [1, 9]
    # fewer image tokens than k: all are blind
    assert bool(select_blind_tokens(HAND[:, :6], layer_gamma=0.5, top_k=10)[0].all())


# ---------------------------------------------------------------------------------------
# DAMRO: medheval reads the vision tower's last layer, official the projector's input layer
# ---------------------------------------------------------------------------------------
def test_damro_medheval_reads_the_last_vision_layer():
    from medheval.backends.tiny import build_tiny_llava

    model, processor = build_tiny_llava(seed=0)
    model.config.vision_feature_layer = -2  # as LLaVA-1.5: the projector reads the second-to-last layer
    inputs = _inputs("llava", processor)
    last = _eager_cls_attention(model, inputs["pixel_values"], layer=-1)
    feature = _eager_cls_attention(model, inputs["pixel_values"], layer=-2)
    k = 3

    def top(cls):
        return torch.zeros_like(cls, dtype=torch.bool).scatter_(1, cls.topk(k, dim=1).indices, True)

    assert not torch.equal(top(last), top(feature))  # the two layers disagree: the test can tell them apart
    medheval = SpyDAMRO(top_k=k)
    _gen(model, inputs, custom_generate=medheval, max_new_tokens=2)
    assert medheval.state["damro_vision_layer"] == 1
    assert torch.equal(medheval.state["damro_outliers"], top(last))
    official = SpyDAMRO(preset="official", top_k=k, cls_heads="mean")  # head mean to compare with the eager maps
    _gen(model, inputs, custom_generate=official, max_new_tokens=2)
    assert official.state["damro_vision_layer"] == 0
    assert torch.equal(official.state["damro_outliers"], top(feature))


# ---------------------------------------------------------------------------------------
# invariants under the official presets; the ways in accept the preset
# ---------------------------------------------------------------------------------------
OFFICIAL_NEUTRAL = {
    "avisc": AvisC(preset="official", alpha=0.0),
    "damro": DAMRO(preset="official", alpha=0.0),
    "dola": DoLa(preset="official", relative_top=1.0),
}


@pytest.mark.parametrize("name", sorted(OFFICIAL_NEUTRAL))
def test_official_neutral_setting_reduces_to_greedy(tiny, name):
    kind, model, processor = tiny
    inputs = _inputs(kind, processor)
    expected = _gen(model, inputs, max_new_tokens=8)
    assert torch.equal(_gen(model, inputs, max_new_tokens=8, custom_generate=OFFICIAL_NEUTRAL[name]), expected)


@pytest.mark.parametrize("name", ["avisc", "damro", "dola"])
def test_official_batch_of_four_equals_single_runs(tiny, name):
    kind, model, processor = tiny
    method = MITIGATIONS[name](preset="official")
    batch = _inputs(kind, processor)
    batched = _new_tokens(_gen(model, batch, custom_generate=method), batch)
    for i in range(len(PROMPTS)):
        single = _inputs(kind, processor, [i])
        alone = _new_tokens(_gen(model, single, custom_generate=method), single)
        assert torch.equal(batched[i: i + 1], alone), f"{method.spec()} row {i}"


@pytest.mark.parametrize("name", ["avisc", "damro", "dola", "opera"])
def test_folder_and_spec_accept_the_preset(llava, name):
    model, processor = llava
    inputs = _inputs("llava", processor)
    folder = str(REPO / "mitigations" / name)
    official = _gen(model, inputs, custom_generate=MITIGATIONS[name](preset="official"))
    assert torch.equal(_gen(model, inputs, custom_generate=folder, trust_remote_code=True, preset="official"), official)
    assert torch.equal(generate_with(f"{name}:preset=official", model, **inputs, max_new_tokens=6, do_sample=False),
                       official)


def test_folder_preset_changes_the_method(llava):
    """The folder's preset is not ignored: AvisC's official threshold and medheval top-10 decode differently here."""
    model, processor = llava
    inputs = _inputs("llava", processor)
    folder = str(REPO / "mitigations" / "avisc")
    official = _gen(model, inputs, custom_generate=folder, trust_remote_code=True, preset="official", max_new_tokens=8)
    medheval = _gen(model, inputs, custom_generate=folder, trust_remote_code=True, max_new_tokens=8)
    assert torch.equal(medheval, _gen(model, inputs, custom_generate=AvisC(), max_new_tokens=8))
    assert not torch.equal(official, medheval)


# ---------------------------------------------------------------------------------------
# results record the preset and the resolved values
# ---------------------------------------------------------------------------------------
def test_runner_records_preset_and_resolved_values(fixture_benchmark, tmp_path):
    from medheval.cli import main

    out = tmp_path / "run"
    roots = [a for s, r in fixture_benchmark["image_roots"].items() for a in ("--image-root", f"{s}={r}")]
    code = main(["run", "--benchmark", "context", "--model", "tiny-random-llava", "--output", str(out),
                 "--data-dir", fixture_benchmark["data_dir"], "--max-new-tokens", "4", "--batch-size", "4",
                 "--limit", "4", "--mitigation", "dola:preset=official,relative_top=0.2", *roots])
    assert code == 0
    expected = "dola:preset=official,layers=low,relative_top=0.2,final_norm=false"
    assert json.loads((out / "run.json").read_text())["mitigation"] == expected
    assert json.loads((out / "results.json").read_text())["settings"]["mitigation"] == expected
    assert expected in (out / "results.md").read_text()
    assert all('"mitigation": "' + expected in line for line in (out / "predictions.jsonl").read_text().splitlines())


def test_option_types_the_check_does_not_read_take_any_value():
    """A field typed ``Any``, ``Literal``, ``dict[...]`` or ``tuple[...]`` (no method has one today) must not crash
    the type check with a TypeError: the check reads numbers, text, booleans, lists and unions only."""
    import typing

    from medheval.mitigations.presets import _fits

    for hint in (typing.Any, typing.Literal["a"], dict[str, float], tuple[int, ...]):
        assert _fits({"a": 1}, hint), hint
    assert _fits(2, float) and not _fits(True, float) and not _fits("x", float)
    assert _fits([0, 2], list[int]) and not _fits(["a"], list[int]) and _fits(None, float | None)
