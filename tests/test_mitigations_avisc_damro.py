"""AvisC and DAMRO on tiny random-weight LLaVA and LLaVA-NeXT (CPU, offline).

- known answers: AvisC's layer choice and blind-token threshold on a hand-made attention
  tensor; DAMRO's per-tile top-k on a hand-made [CLS] attention;
- in the model: AvisC's selection equals the one computed from eager ``output_attentions``;
  DAMRO's outliers equal the top-k of the eager CLIP [CLS] attention; LLaVA-NeXT's patch ->
  image-token mapping reproduces the model's packed features;
- the contrast stream really masks the chosen embeddings (vs. a forward with those input
  embeddings zeroed/removed by hand);
- reductions to plain ``generate`` at alpha=0, batch invariance, hooks and attention
  implementation restored after generate and after errors, the custom_generate folders.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from medheval.decoding import MissingInternalError, MitigationError, hooks_installed, image_token_mask
from medheval.decoding.hooks import ATTENTION_FUNCTION, vision_encoder_layers
from medheval.mitigations import AVISC, DAMRO, MITIGATIONS, AvisC, generate_with, get_mitigation
from medheval.mitigations import damro as damro_module
from medheval.mitigations.avisc import select_blind_tokens, select_layers
from medheval.mitigations.damro import default_top_k, feature_patch_index, top_k_patches, vision_layer_index
from medheval.mitigations.image_masking import mask_features
from test_mitigations import PROMPTS, _gen, _inputs, _new_tokens, build_tiny_llava_next

REPO = Path(__file__).resolve().parents[1]


def _fresh(kind):
    from medheval.backends.tiny import build_tiny_llava

    return (build_tiny_llava(seed=0) if kind == "llava" else build_tiny_llava_next(seed=0))[0]


def _vision_hooks(model) -> int:
    return sum(len(layer.self_attn.q_proj._forward_hooks) + len(layer.self_attn.k_proj._forward_hooks)
               for layer in vision_encoder_layers(model))


def _image_features(model, inputs) -> list[torch.Tensor]:
    kwargs = {"pixel_values": inputs["pixel_values"]}
    if "image_sizes" in inputs:
        kwargs["image_sizes"] = inputs["image_sizes"]
    with torch.no_grad():
        return list(model.model.get_image_features(**kwargs, return_dict=True).pooler_output)


def _hand_masked_logits(model, inputs, keep_positions, drop=False) -> torch.Tensor:
    """Last-position logits per row from input embeddings built by hand: text embeddings, image features
    scattered into the image positions, then the image positions outside ``keep_positions`` zeroed (or
    removed with ``drop``). One unpadded forward per row."""
    features = _image_features(model, inputs)
    image_mask = image_token_mask(inputs["input_ids"], model.config)
    rows = []
    for row in range(inputs["input_ids"].shape[0]):
        real = inputs["attention_mask"][row].bool()
        ids = inputs["input_ids"][row][real]
        image = image_mask[row][real]
        keep = keep_positions[row][real]
        with torch.no_grad():
            embeds = model.get_input_embeddings()(ids).clone()
            embeds[image] = features[row].to(embeds.dtype)
            if drop:
                embeds = embeds[~image | keep]
            else:
                embeds[image & ~keep] = 0.0
            rows.append(model(inputs_embeds=embeds[None]).logits[0, -1].float())
    return torch.stack(rows)


class Spy:
    """Mixin keeping the first step's logits, the stream groups and the method's per-call state."""

    def scores(self, ctx, logits):
        if ctx.step == 0:
            self.first = {k: v.clone() for k, v in logits.items()}
            self.state = dict(ctx.state)
            self.groups = [[s.name for s in g.streams] for g in ctx.groups]
            self.contrast_inputs = {s.name: s for g in ctx.groups for s in g.streams}
        return super().scores(ctx, logits)


class SpyAvisC(Spy, AvisC):
    def forward_kwargs(self, ctx, group):
        self.__dict__.setdefault("implementations", []).append(
            (tuple(group.names), group.prefilled, ctx.model.config.get_text_config()._attn_implementation))
        return super().forward_kwargs(ctx, group)


class SpyDAMRO(Spy, DAMRO):
    pass


# ---------------------------------------------------------------------------------------
# construction
# ---------------------------------------------------------------------------------------
def test_constructible_without_arguments_and_specs():
    assert MITIGATIONS["avisc"] is AvisC and MITIGATIONS["damro"] is DAMRO and AVISC is AvisC
    # issue 9: the "medheval" preset by default: AvisC's top-10 blind tokens, DAMRO's last vision layer
    assert AvisC().settings() == {"preset": "medheval", "alpha": 1.0, "beta": 0.1, "layer_gamma": 0.5, "top_k": 10,
                                  "lamb": 1.0, "masking_scheme": "zeros"}
    assert DAMRO().settings() == {"preset": "medheval", "alpha": 0.5, "beta": 0.1, "top_k": None, "vision_layer": -1,
                                  "cls_heads": "mean", "masking_scheme": "zeros"}
    for method in (AvisC(), DAMRO(), AvisC(lamb=0.99, masking_scheme="noise"),
                   DAMRO(top_k=3, vision_layer=-2, cls_heads="single", masking_scheme="drop")):
        assert get_mitigation(method.spec()) == method, method.spec()
    assert get_mitigation("avisc:alpha=2.5,layer_gamma=0.3") == AvisC(alpha=2.5, layer_gamma=0.3)
    assert get_mitigation("damro:top_k=10,alpha=2") == DAMRO(top_k=10, alpha=2)
    with pytest.raises(MitigationError, match="masking_scheme"):
        AvisC(masking_scheme="blur")
    with pytest.raises(MitigationError, match="layer_gamma"):
        AvisC(layer_gamma=0.0)
    with pytest.raises(MitigationError, match="top_k"):
        DAMRO(top_k=0)
    with pytest.raises(MitigationError, match="cls_heads"):
        DAMRO(cls_heads="max")


# ---------------------------------------------------------------------------------------
# known answers on hand-made tensors
# ---------------------------------------------------------------------------------------
HAND_ATTENTION = torch.tensor([
    [0.20, 0.05, 0.05, 0.10],  # layer 0: image mass 0.40 -> share 0.4
    [0.02, 0.02, 0.02, 0.04],  # layer 1: 0.10 -> 0.1
    [0.30, 0.05, 0.05, 0.10],  # layer 2: 0.50 -> 0.5
])


def test_avisc_layer_selection_known_answer():
    # sorted shares 0.5, 0.4, 0.1; cumulative 0.5, 0.9, 1.0; k = #(cumulative < gamma) + 1
    assert select_layers(HAND_ATTENTION, 0.4).tolist() == [2]        # 0 below 0.4 -> k = 1
    assert select_layers(HAND_ATTENTION, 0.6).tolist() == [2, 0]     # 0.5 < 0.6 -> k = 2
    assert select_layers(HAND_ATTENTION, 0.95).tolist() == [2, 0, 1]  # 0.5, 0.9 < 0.95 -> k = 3
    assert select_layers(HAND_ATTENTION * 7.0, 0.6).tolist() == [2, 0]  # shares, not raw masses


def test_avisc_blind_tokens_known_answer():
    # gamma 0.6 -> layers {2, 0}: mean row a = [0.25, 0.05, 0.05, 0.10]
    # mean(a) = 0.1125, unbiased std(a) = sqrt(0.026875 / 3) = 0.094648
    blind, layers = select_blind_tokens(HAND_ATTENTION, layer_gamma=0.6, lamb=1.0)
    assert layers.tolist() == [2, 0]
    assert blind.tolist() == [True, False, False, False]        # tau = 0.207148
    blind, _ = select_blind_tokens(HAND_ATTENTION, layer_gamma=0.6, lamb=-0.5)
    assert blind.tolist() == [True, False, False, True]         # tau = 0.1125 - 0.047324 = 0.065176
    # gamma 0.4 -> layer 2 only: a = [0.30, 0.05, 0.05, 0.10], mean 0.125, std 0.119024
    blind, layers = select_blind_tokens(HAND_ATTENTION, layer_gamma=0.4, lamb=-0.5)
    assert layers.tolist() == [2] and blind.tolist() == [True, False, False, True]  # tau = 0.065488
    blind, _ = select_blind_tokens(HAND_ATTENTION, layer_gamma=0.4, lamb=-0.2)
    assert blind.tolist() == [True, False, False, False]        # tau = 0.125 - 0.023805 = 0.101195 > 0.10
    # threshold exactly as written: a >= mean + lamb * std
    average = HAND_ATTENTION[[2, 0]].double().mean(0)
    tau = average.mean() + 1.0 * average.std()
    assert tau.item() == pytest.approx(0.1125 + math.sqrt(0.026875 / 3), abs=1e-6)


def test_avisc_selection_matches_upstream_code():
    """The per-row selection equals AvisC's own code (avisc_sample.py) for a batch of one."""
    generator = torch.Generator().manual_seed(0)
    for _ in range(20):
        L, N = 6, 40
        attention = torch.rand(L, N, generator=generator) ** 4 / 10
        gamma, lamb = 0.5, 1.0
        # -- upstream, transcribed: portions, count_top_p, topk layers, mean, mask_idx = att < mean + std*lamb
        portion = attention.sum(-1) / attention.sum()
        k = (torch.cumsum(torch.sort(portion, descending=True)[0][None], dim=1) < gamma).sum() + 1
        _, top = torch.topk(portion.float(), int(k), dim=0)
        img_att = torch.stack([attention[i] for i in top], dim=0).mean(0)
        mask_idx = torch.where(img_att < img_att.mean() + img_att.std() * lamb)[0]
        # -- ours
        blind, layers = select_blind_tokens(attention, gamma, lamb)
        assert sorted(layers.tolist()) == sorted(top.tolist())
        assert sorted((~blind).nonzero().flatten().tolist()) == mask_idx.tolist()


def test_damro_top_k_known_answer():
    cls = torch.tensor([[0.10, 0.50, 0.20, 0.05, 0.15],
                        [0.30, 0.10, 0.12, 0.40, 0.08]])
    assert top_k_patches(cls, 2).tolist() == [[False, True, True, False, False], [True, False, False, True, False]]
    assert top_k_patches(cls, 1).tolist() == [[False, True, False, False, False], [False, False, False, True, False]]
    # only candidates (patches that survive un-padding) can be chosen
    candidates = torch.tensor([[True, False, True, True, True], [True, True, True, True, True]])
    assert top_k_patches(cls, 2, candidates).tolist() == [[False, False, True, False, True],
                                                         [True, False, False, True, False]]
    few = torch.tensor([[True, False, False, False, False], [False] * 5])
    assert top_k_patches(cls, 3, few).tolist() == [[True, False, False, False, False], [False] * 5]
    assert int(top_k_patches(cls, 99).sum()) == 10  # k is clamped to the patches of a tile
    # k = 10 of LLaVA-1.5's 576 patches, scaled to the grid
    assert default_top_k(576) == 10 and default_top_k(2304) == 40 and default_top_k(100) == 2
    assert default_top_k(25) == 1 and default_top_k(1) == 1


def test_damro_vision_layer_index(llava):
    model, _ = llava
    assert vision_layer_index(model, None) == 1  # vision_feature_layer=-1 of a 2-layer tower -> layers[1]
    assert vision_layer_index(model, 0) == 0 and vision_layer_index(model, -2) == 0
    with pytest.raises(MitigationError, match="vision_layer"):
        vision_layer_index(model, 2)
    previous = model.config.vision_feature_layer
    try:
        model.config.vision_feature_layer = 1   # hidden_states[1] = output of layers[0]
        assert vision_layer_index(model, None) == 0
        model.config.vision_feature_layer = [-2, -1]  # several: the deepest
        assert vision_layer_index(model, None) == 1
        model.config.vision_feature_layer = 0
        with pytest.raises(MitigationError, match="embeddings"):
            vision_layer_index(model, None)
    finally:
        model.config.vision_feature_layer = previous


def test_mask_features_schemes():
    features = [torch.arange(12.0).view(4, 3) + 1, torch.arange(6.0).view(2, 3) + 1]
    keep = [torch.tensor([True, False, True, False]), torch.tensor([False, True])]
    zeros = mask_features(features, keep, "zeros")
    assert zeros[0].tolist() == [[1, 2, 3], [0, 0, 0], [7, 8, 9], [0, 0, 0]]
    assert zeros[1].tolist() == [[0, 0, 0], [4, 5, 6]]
    assert mask_features(features, keep, "ones")[1].tolist() == [[1, 1, 1], [4, 5, 6]]
    dropped = mask_features(features, keep, "drop")
    assert dropped[0].tolist() == [[1, 2, 3], [7, 8, 9]] and dropped[1].tolist() == [[4, 5, 6]]
    noise = mask_features(features, keep, "noise")
    assert torch.equal(noise[0][[0, 2]], features[0][[0, 2]]) and not torch.equal(noise[0][1], features[0][1])
    assert torch.equal(mask_features(features, keep, "noise")[0], noise[0])  # seeded per image
    assert torch.equal(features[0], torch.arange(12.0).view(4, 3) + 1)  # inputs untouched


# ---------------------------------------------------------------------------------------
# selections inside the model
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("preset", ["official", "medheval"])
def test_avisc_selection_from_model_attention(tiny, preset):
    """The blind tokens equal AvisC's rule applied to eager output_attentions (head mean, last query):
    the mean + std threshold (official) or the top-10 (medheval)."""
    kind, model, processor = tiny
    inputs = _inputs(kind, processor)
    spy = SpyAvisC(preset=preset)
    top_k = 10 if preset == "medheval" else None
    _gen(model, inputs, custom_generate=spy, max_new_tokens=3)
    blind = spy.state["avisc_blind"]
    previous = model.config.text_config._attn_implementation
    model.set_attn_implementation({"text_config": "eager"})
    try:
        with torch.no_grad():
            out = model(**inputs, output_attentions=True)
    finally:
        model.set_attn_implementation({"text_config": previous})
    rows = torch.stack([a.mean(1)[:, -1, :] for a in out.attentions], 0)  # [L, B, T]
    image_mask = image_token_mask(inputs["input_ids"], model.config)
    for row in range(len(PROMPTS)):
        expected, layers = select_blind_tokens(rows[:, row, image_mask[row]], 0.5, 1.0, top_k)
        assert blind[row, image_mask[row]].tolist() == expected.tolist()
        assert spy.state["avisc_layers"][row] == layers.tolist()
        assert 0 < int(expected.sum()) < int(image_mask[row].sum())  # some blind, some masked
        if top_k:
            assert int(blind[row].sum()) == top_k
    assert not bool(blind[~image_mask].any())
    # eager (medheval's hookable attention) for the clean prefill only; the model's own afterwards
    assert spy.implementations[0] == (("main",), False, ATTENTION_FUNCTION)
    assert all(impl == previous for _, _, impl in spy.implementations[1:])
    assert spy.groups == [["main"], ["blind"]]


def _eager_cls_attention(model, pixel_values, layer):
    previous = model.config.vision_config._attn_implementation
    model.set_attn_implementation({"vision_config": "eager"})
    try:
        with torch.no_grad():
            out = model.model.vision_tower(pixel_values, output_attentions=True)
    finally:
        model.set_attn_implementation({"vision_config": previous})
    return out.attentions[layer][:, :, 0, 1:].mean(1)


def test_damro_outliers_are_top_k_of_cls_attention(llava):
    model, processor = llava
    inputs = _inputs("llava", processor)
    spy = SpyDAMRO(top_k=3)
    _gen(model, inputs, custom_generate=spy, max_new_tokens=2)
    cls = _eager_cls_attention(model, inputs["pixel_values"], layer=-1)
    expected = torch.zeros_like(cls, dtype=torch.bool).scatter_(1, cls.topk(3, dim=1).indices, True)
    assert torch.equal(spy.state["damro_outliers"], expected)
    # LLaVA: feature row i of image b is patch i of image b
    assert [k.tolist() for k in spy.state["damro_keep"]] == expected.tolist()
    assert spy.groups == [["main", "outliers"]]  # same prompt tokens: one batch, one cache


def test_llava_next_patch_mapping_reproduces_packed_features(llava_next):
    """Every image-token row holding a patch is that patch's projected feature; the rest are newlines."""
    model, processor = llava_next
    inputs = _inputs("llava_next", processor)
    features = _image_features(model, inputs)
    from transformers.models.llava_next.modeling_llava_next import image_size_to_num_patches

    counts = [image_size_to_num_patches(image_size=s, grid_pinpoints=model.config.image_grid_pinpoints,
                                        patch_size=model.config.vision_config.image_size)
              for s in inputs["image_sizes"]]
    pixels = torch.cat([p[:n] for p, n in zip(inputs["pixel_values"], counts)])
    with torch.no_grad():
        hidden = model.model.vision_tower(pixels, output_hidden_states=True).hidden_states[-1][:, 1:]
        projected = model.model.multi_modal_projector(hidden)  # [tiles, P, H]
    tiles, patches = projected.shape[:2]
    index = feature_patch_index(model, features, patches, tiles, inputs["image_sizes"])
    flat = projected.reshape(tiles * patches, -1)
    offset = 0
    for image, (rows, feature) in enumerate(zip(index, features)):
        assert rows.shape[0] == feature.shape[0]
        assert rows[:patches].tolist() == list(range(offset * patches, (offset + 1) * patches))  # base tile first
        assert torch.allclose(feature[rows >= 0], flat[rows[rows >= 0]], atol=1e-5)
        newline = model.model.image_newline.expand_as(feature[rows < 0])
        assert torch.equal(feature[rows < 0], newline)
        assert len(set(rows[rows >= 0].tolist())) == int((rows >= 0).sum())  # each patch at most once
        offset += counts[image]
    assert len(set(counts)) > 1  # different tilings in the batch


def test_damro_llava_next_keeps_top_k_per_tile(llava_next):
    model, processor = llava_next
    inputs = _inputs("llava_next", processor)
    spy = SpyDAMRO(top_k=2)
    _gen(model, inputs, custom_generate=spy, max_new_tokens=2)
    outliers = spy.state["damro_outliers"]  # [tiles, P]
    assert bool((outliers.sum(1) <= 2).all()) and int(outliers[0].sum()) == 2
    kept = sum(int(k.sum()) for k in spy.state["damro_keep"])
    assert kept == int(outliers.sum())  # every chosen patch is an image token exactly once


# ---------------------------------------------------------------------------------------
# the contrast stream masks the chosen embeddings
# ---------------------------------------------------------------------------------------
def _keep_positions(model, inputs, keep_rows):
    image_mask = image_token_mask(inputs["input_ids"], model.config)
    positions = torch.zeros_like(image_mask)
    positions[image_mask] = torch.cat(keep_rows)
    return positions


def test_avisc_contrast_stream_masks_non_blind_embeddings(tiny):
    kind, model, processor = tiny
    inputs = _inputs(kind, processor)
    spy = SpyAvisC()
    _gen(model, inputs, custom_generate=spy, max_new_tokens=1)
    blind = spy.state["avisc_blind"]
    expected = _hand_masked_logits(model, inputs, blind)
    assert torch.allclose(spy.first["blind"], expected, atol=1e-4)
    with torch.no_grad():
        clean = model(**inputs).logits[:, -1]
    assert torch.allclose(spy.first["main"], clean, atol=1e-4)
    assert (spy.first["blind"] - spy.first["main"]).abs().max() > 1e-3


@pytest.mark.parametrize("scheme", ["zeros", "drop"])
def test_damro_contrast_stream_keeps_only_outliers(tiny, scheme):
    kind, model, processor = tiny
    inputs = _inputs(kind, processor)
    spy = SpyDAMRO(top_k=2, masking_scheme=scheme)
    _gen(model, inputs, custom_generate=spy, max_new_tokens=1)
    keep = _keep_positions(model, inputs, spy.state["damro_keep"])
    expected = _hand_masked_logits(model, inputs, keep, drop=scheme == "drop")
    assert torch.allclose(spy.first["outliers"], expected, atol=1e-4)
    assert (spy.first["outliers"] - spy.first["main"]).abs().max() > 1e-3
    if scheme == "drop":  # DAMRO's official form: a shorter prompt with only the outlier tokens, own cache
        assert spy.groups == [["main"], ["outliers"]]
        stream = spy.contrast_inputs["outliers"]
        assert image_token_mask(stream.input_ids, model.config).sum(1).tolist() == keep.sum(1).tolist()


def test_scores_follow_the_formula(llava):
    model, processor = llava
    inputs = _inputs("llava", processor)
    for spy, name, alpha in ((SpyAvisC(alpha=2.0, beta=0.2), "blind", 2.0), (SpyDAMRO(alpha=0.7), "outliers", 0.7)):
        out = _gen(model, inputs, custom_generate=spy, max_new_tokens=1, return_dict_in_generate=True,
                   output_scores=True)
        clean, contrast = spy.first["main"], spy.first[name]
        expected = (1 + alpha) * clean - alpha * contrast
        keep = clean >= clean.max(-1, keepdim=True).values + math.log(spy.beta)
        assert torch.allclose(out.scores[0], expected.masked_fill(~keep, float("-inf")), atol=1e-5)


# ---------------------------------------------------------------------------------------
# reductions, batch invariance, changes
# ---------------------------------------------------------------------------------------
NEUTRAL = {
    "avisc": AvisC(alpha=0.0),
    "damro": DAMRO(alpha=0.0),
    "damro-drop": DAMRO(alpha=0.0, masking_scheme="drop"),
}


@pytest.mark.parametrize("name", sorted(NEUTRAL))
def test_alpha0_reduces_to_plain_greedy(tiny, name):
    kind, model, processor = tiny
    inputs = _inputs(kind, processor)
    assert (inputs["attention_mask"] == 0).any()
    expected = _gen(model, inputs, max_new_tokens=8)
    assert torch.equal(_gen(model, inputs, max_new_tokens=8, custom_generate=NEUTRAL[name]), expected)
    assert not hooks_installed(model) and _vision_hooks(model) == 0


def test_alpha0_beta0_equals_plain_sampling(llava):
    model, processor = llava
    inputs = _inputs("llava", processor)
    settings = dict(do_sample=True, top_k=None, temperature=1.0, max_new_tokens=8)
    for method in (AvisC(alpha=0.0, beta=0.0), DAMRO(alpha=0.0, beta=0.0)):
        torch.manual_seed(3)
        expected = _gen(model, inputs, **settings)
        torch.manual_seed(3)
        assert torch.equal(_gen(model, inputs, custom_generate=method, **settings), expected)


@pytest.mark.parametrize("method", [AvisC(), DAMRO(), DAMRO(top_k=3, masking_scheme="drop"),
                                    AvisC(masking_scheme="noise")], ids=lambda m: m.spec())
def test_batch_of_four_equals_single_runs(tiny, method):
    kind, model, processor = tiny
    batch = _inputs(kind, processor)
    assert len(set(batch["attention_mask"].sum(1).tolist())) == len(PROMPTS)  # real left padding
    batched = _new_tokens(_gen(model, batch, custom_generate=method), batch)
    for i in range(len(PROMPTS)):
        single = _inputs(kind, processor, [i])
        alone = _new_tokens(_gen(model, single, custom_generate=method), single)
        assert torch.equal(batched[i: i + 1], alone), f"{method.spec()} row {i}"


@pytest.mark.parametrize("method", [AvisC(), DAMRO()], ids=lambda m: m.name)
def test_defaults_change_the_output(tiny, method):
    kind, model, processor = tiny
    inputs = _inputs(kind, processor)
    plain = _gen(model, inputs, max_new_tokens=8)
    got = _gen(model, inputs, max_new_tokens=8, custom_generate=method)
    assert got.shape == plain.shape and not torch.equal(got, plain)


# ---------------------------------------------------------------------------------------
# hooks and attention implementation restored
# ---------------------------------------------------------------------------------------
class BrokenAtPrefill(AvisC):
    """Fails right after the clean prefill, while its eager attention and hooks are still installed."""

    def deferred_streams(self, ctx):
        assert ctx.model.config.get_text_config()._attn_implementation == ATTENTION_FUNCTION
        assert hooks_installed(ctx.model)
        raise RuntimeError("boom at prefill")


class BrokenLater(AvisC):
    def scores(self, ctx, logits):
        if ctx.step == 2:
            raise RuntimeError("boom later")
        return super().scores(ctx, logits)


def test_state_restored_after_generate_and_errors(tiny, monkeypatch):
    kind, model, processor = tiny
    inputs = _inputs(kind, processor)
    previous = model.config.text_config._attn_implementation
    vision_previous = model.config.vision_config._attn_implementation
    fresh = _fresh(kind)

    def assert_clean():
        assert not hooks_installed(model)
        assert model.config.text_config._attn_implementation == previous
        assert model.config.vision_config._attn_implementation == vision_previous
        assert _vision_hooks(model) == 0
        with torch.no_grad():
            assert torch.equal(model(**inputs).logits, fresh(**inputs).logits)

    for method in (AvisC(), DAMRO()):
        _gen(model, inputs, custom_generate=method, max_new_tokens=3)
        assert_clean()
    with pytest.raises(RuntimeError, match="boom at prefill"):
        _gen(model, inputs, custom_generate=BrokenAtPrefill(), max_new_tokens=3)
    assert_clean()
    with pytest.raises(RuntimeError, match="boom later"):
        _gen(model, inputs, custom_generate=BrokenLater(), max_new_tokens=5)
    assert_clean()

    real_encode = damro_module.encode_images

    def encode_then_fail(ctx, method):  # fails while the vision [CLS] hooks are attached
        real_encode(ctx, method)
        assert _vision_hooks(model) == 2
        raise RuntimeError("boom in vision")

    monkeypatch.setattr(damro_module, "encode_images", encode_then_fail)
    with pytest.raises(RuntimeError, match="boom in vision"):
        _gen(model, inputs, custom_generate=DAMRO(), max_new_tokens=3)
    assert_clean()


def test_eager_model_stays_eager():
    from medheval.backends.tiny import build_tiny_llava

    model, processor = build_tiny_llava(seed=0)
    model.set_attn_implementation("eager")
    inputs = _inputs("llava", processor)
    spy = SpyAvisC()
    _gen(model, inputs, custom_generate=spy, max_new_tokens=3)
    assert model.config.text_config._attn_implementation == "eager"
    # step 0: the clean prefill (hooked eager), then the blind prefill; then one forward of both streams per step
    assert spy.implementations == [(("main",), False, ATTENTION_FUNCTION), (("blind",), False, "eager"),
                                   (("main", "blind"), True, "eager"), (("main", "blind"), True, "eager")]


# ---------------------------------------------------------------------------------------
# ways in and clear errors
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name,options", [("avisc", {"alpha": 0.5, "lamb": 0.5}),
                                          ("damro", {"alpha": 1.0, "top_k": 3, "masking_scheme": "drop"})])
def test_custom_generate_folder(tiny, name, options):
    kind, model, processor = tiny
    inputs = _inputs(kind, processor)
    folder = REPO / "mitigations" / name
    assert (folder / "custom_generate" / "generate.py").is_file() and (folder / "README.md").is_file()
    assert (folder / "custom_generate" / "requirements.txt").is_file()
    via_folder = _gen(model, inputs, custom_generate=str(folder), trust_remote_code=True, **options)
    via_callable = _gen(model, inputs, custom_generate=MITIGATIONS[name](**options))
    assert torch.equal(via_folder, via_callable)
    assert torch.equal(via_folder, generate_with(f"{name}:" + ",".join(f"{k}={v}" for k, v in options.items()),
                                                 model, **inputs, max_new_tokens=6, do_sample=False))


def test_models_without_the_internals_fail_clearly(llava):
    from transformers import LlamaConfig, LlamaForCausalLM, LlavaConfig, LlavaForConditionalGeneration

    torch.manual_seed(0)
    text = LlamaForCausalLM(LlamaConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=4, pad_token_id=0)).eval()
    ids = torch.randint(3, 50, (2, 7))
    for method in (AvisC(), DAMRO()):
        with pytest.raises(MissingInternalError, match="image_token"):
            text.generate(input_ids=ids, max_new_tokens=2, custom_generate=method)

    model, processor = llava
    text_only = processor.tokenizer(["lung"], return_tensors="pt")
    for method in (AvisC(), DAMRO()):
        with pytest.raises(MissingInternalError, match="pixel_values"):
            _gen(model, text_only, custom_generate=method)

    # a LLaVA whose vision tower has no [CLS] token (SigLIP): DAMRO says so; AvisC does not need one
    config = LlavaConfig(
        text_config=model.config.text_config.to_dict(),
        vision_config={"model_type": "siglip_vision_model", "image_size": 30, "patch_size": 6, "hidden_size": 32,
                       "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4},
        image_token_index=model.config.image_token_id, image_seq_length=25, projector_hidden_act="gelu",
        vision_feature_select_strategy="full", vision_feature_layer=-1,
    )
    siglip = LlavaForConditionalGeneration(config).eval()
    inputs = _inputs("llava", processor)
    with pytest.raises(MissingInternalError, match=r"\[CLS\]"):
        _gen(siglip, inputs, custom_generate=DAMRO())
    _gen(siglip, inputs, custom_generate=AvisC(), max_new_tokens=2)
