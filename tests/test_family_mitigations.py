"""VCD, M3ID, PAI, DoLa and AvisC beyond LLaVA (DAMRO: a clear refusal): Qwen2.5-VL, Qwen3-VL and Gemma 3 (MedGemma), tiny random weights.

The invariants of ``test_mitigations.py`` on each family's real model and processor classes:

- the neutral setting equals plain greedy ``generate`` token for token (left-padded batch of 3);
- a left-padded batch of 3 equals three single runs at a non-neutral setting that changes the output;
- no hook is left behind, and the model computes exactly what it computed before;
- the family-specific parts: image tokens found from ``image_token_id`` (Qwen) / ``image_token_index``
  (Gemma 3), Qwen's M-RoPE position ids (its text-only stream stays a separate forward), VCD's noise on
  Qwen's flattened patch layout, PAI's image columns on Gemma 3's sliding-window layers, AvisC's masked
  features handed back in Gemma 3's tensor form and with Qwen3-VL's DeepStack features (masked tokens get no
  DeepStack injection; its blind stream = a direct forward on the masked encoder output); DAMRO refuses towers
  without a [CLS] token (SigLIP, Qwen-VL).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from medheval.backends.tiny_families import build_tiny
from medheval.decoding import MitigationError, hooks_installed, image_token_mask
from medheval.mitigations import AvisC, DoLa, M3ID, OPERA, PAI, VCD
from medheval.mitigations.vcd import add_diffusion_noise

FAMILIES = ["qwen2_5_vl", "gemma3", "qwen3_vl"]
PROMPTS = [
    "is there a pleural effusion ?",
    "lung",
    "what is the size of the heart shown in this chest image and is it enlarged ?",
]
NEUTRAL = {
    "vcd": VCD(alpha=0.0),
    "m3id": M3ID(lam=0.0),
    "pai": PAI(alpha=0.0, gamma=1.0),
    "dola": DoLa(relative_top=1.0),
    "avisc": AvisC(alpha=0.0),
}
# strong settings: the tiny models' 4-16 image tokens weigh little, the defaults may keep greedy's tokens
STRONG = {
    "vcd": VCD(alpha=3.0, beta=0.0),
    "m3id": M3ID(lam=1.0, beta=0.0),
    "pai": PAI(alpha=0.5, gamma=3.0),
    "dola": DoLa(),
    "avisc": AvisC(alpha=3.0, beta=0.0),
}
NEW = 6


@pytest.fixture(scope="module", params=FAMILIES)
def family(request):
    model, processor = build_tiny(request.param)
    processor.tokenizer.padding_side = "left"
    return request.param, model, processor


def _inputs(processor, indices=range(len(PROMPTS))):
    from PIL import Image

    indices = list(indices)
    texts = [processor.apply_chat_template(
        [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": PROMPTS[i]}]}],
        add_generation_prompt=True, tokenize=False) for i in indices]
    images = [[Image.fromarray(np.random.RandomState(i).randint(0, 255, (30, 30, 3), dtype=np.uint8))]
              for i in indices]
    return processor(text=texts, images=images, padding=True, return_tensors="pt")


def _gen(model, inputs, **kwargs):
    return model.generate(**inputs, max_new_tokens=NEW, do_sample=False, **kwargs)


def test_image_tokens_found_from_the_config(family):
    name, model, processor = family
    inputs = _inputs(processor)
    attr = "image_token_index" if name == "gemma3" else "image_token_id"
    image_id = getattr(model.config, attr)
    mask = image_token_mask(inputs["input_ids"], model.config)
    assert torch.equal(mask, inputs["input_ids"] == image_id)
    counts = mask.sum(1).tolist()
    assert counts[0] > 0 and len(set(counts)) == 1  # same image size -> same run per row, wherever padding puts it
    assert (inputs["attention_mask"] == 0).any()


@pytest.mark.parametrize("method", sorted(NEUTRAL))
def test_neutral_setting_equals_greedy(family, method):
    name, model, processor = family
    inputs = _inputs(processor)
    expected = _gen(model, inputs)
    assert torch.equal(_gen(model, inputs, custom_generate=NEUTRAL[method]), expected)
    assert not hooks_installed(model)


@pytest.mark.parametrize("method", sorted(STRONG))
def test_batch_equals_single_runs_and_output_changes(family, method):
    name, model, processor = family
    inputs = _inputs(processor)
    with torch.no_grad():
        before = model(**inputs).logits
    length = inputs["input_ids"].shape[1]
    plain = _gen(model, inputs)[:, length:]
    batched = _gen(model, inputs, custom_generate=STRONG[method])[:, length:]
    for row in range(len(PROMPTS)):
        single = _inputs(processor, [row])
        alone = _gen(model, single, custom_generate=STRONG[method])[:, single["input_ids"].shape[1]:]
        assert torch.equal(batched[row:row + 1], alone), f"{name} {method} row {row}"
    assert not torch.equal(batched, plain), f"{name} {method} changed nothing"
    assert not hooks_installed(model)
    with torch.no_grad():
        assert torch.equal(model(**inputs).logits, before)


class SpyVCD(VCD):
    def scores(self, ctx, logits):
        if ctx.step == 0:
            self.first = {k: v.clone() for k, v in logits.items()}
            self.groups = [len(g.streams) for g in ctx.groups]
        return super().scores(ctx, logits)


def test_vcd_noised_pixels_reach_the_model(family):
    """ℓ' is the model's logits given the noised pixel values, in every layout (Qwen: flattened patches)."""
    _, model, processor = family
    inputs = _inputs(processor)
    spy = SpyVCD(alpha=1.0)
    _gen(model, inputs, custom_generate=spy)
    assert spy.groups == [2]  # clean and noised rows share one batch and cache
    noised = dict(inputs)
    noised["pixel_values"] = add_diffusion_noise(inputs["pixel_values"], 500, 0, inputs.get("image_grid_thw"))
    with torch.no_grad():
        direct = model(**noised).logits[:, -1]
        clean = model(**inputs).logits[:, -1]
    assert (direct - clean).abs().max() > 1e-4
    assert torch.allclose(spy.first["noised"], direct, atol=1e-4)
    assert torch.allclose(spy.first["main"], clean, atol=1e-4)


def test_vcd_noise_on_flattened_patches_is_per_image():
    pixels = torch.randn(16 + 36, 12)
    grid = torch.tensor([[1, 4, 4], [1, 6, 6]])
    both = add_diffusion_noise(pixels, 500, 0, grid)
    # the second image gets the same noise alone as in the batch
    assert torch.equal(add_diffusion_noise(pixels[16:], 500, 0, grid[1:]), both[16:])
    with pytest.raises(MitigationError, match="image_grid_thw"):
        add_diffusion_noise(pixels, 500, 0)
    with pytest.raises(MitigationError, match="covers 32 patch rows"):
        add_diffusion_noise(pixels, 500, 0, torch.tensor([[1, 4, 4], [1, 4, 4]]))


class SpyM3ID(M3ID):
    def scores(self, ctx, logits):
        if ctx.step == 0:
            self.first = {k: v.clone() for k, v in logits.items()}
            self.text = ctx.group_of("text_only").streams[0]
        self.separate = dict(ctx.state.get("separate_streams", {}))
        return super().scores(ctx, logits)


def test_text_only_stream(family):
    """The prompt without its image tokens, with the model's own positions: Qwen's text-only stream
    keeps its own forward (M-RoPE), Gemma 3's too (sliding-window cache)."""
    name, model, processor = family
    inputs = _inputs(processor)
    spy = SpyM3ID()
    _gen(model, inputs, custom_generate=spy)
    reason = spy.separate["text_only"]
    assert ("M-RoPE" in reason) if name.startswith("qwen") else ("DynamicCache" in reason), reason
    for row in range(len(PROMPTS)):
        text_ids = spy.text.input_ids[row][spy.text.attention_mask[row].bool()]
        full = inputs["input_ids"][row][inputs["attention_mask"][row].bool()]
        assert text_ids.tolist() == full[~image_token_mask(full[None], model.config)[0]].tolist()
        with torch.no_grad():
            direct = model(input_ids=text_ids[None]).logits[0, -1]
        assert torch.allclose(spy.first["text_only"][row], direct, atol=1e-4)


@pytest.mark.parametrize("name,tower", [("qwen2_5_vl", "qwen2_5_vl_vision"), ("gemma3", "siglip_vision_model")])
def test_damro_refuses_towers_without_cls(name, tower):
    from medheval.decoding import MissingInternalError
    from medheval.mitigations import DAMRO

    model, processor = build_tiny(name)
    processor.tokenizer.padding_side = "left"
    inputs = _inputs(processor, [0])
    with pytest.raises(MissingInternalError, match=rf"{type(model).__name__} \(vision tower '{tower}'\) has none"):
        _gen(model, inputs, custom_generate=DAMRO())
    assert not hooks_installed(model)


class SpyAvisC(AvisC):
    def scores(self, ctx, logits):
        if ctx.step == 0:
            self.first = {k: v.clone() for k, v in logits.items()}
            self.blind = ctx.state["avisc_blind"].clone()
            self.streams = {s.name: s for g in ctx.groups for s in g.streams}
        return super().scores(ctx, logits)


def _image_features(model, inputs):
    """``get_image_features`` as the model's forward runs it on the processor's inputs."""
    kwargs = {k: inputs[k] for k in ("pixel_values", "image_grid_thw") if k in inputs}
    with torch.no_grad():
        return model.model.get_image_features(**kwargs, return_dict=True)


def _masked_by_hand(model, inputs, keep_positions):
    """The encoder output with the rows of the image tokens outside ``keep_positions`` zeroed, in the main
    features and in every DeepStack layer; feature row i is the i-th image-token position, row-major."""
    output = _image_features(model, inputs)
    keep = keep_positions[image_token_mask(inputs["input_ids"], model.config)]

    def masked(value):
        if torch.is_tensor(value):  # Gemma 3: [images, tokens, hidden]
            flat = value.reshape(-1, value.shape[-1])
            return torch.where(keep[:, None], flat, torch.zeros_like(flat)).reshape(value.shape)
        rows = torch.cat(list(value))
        return torch.where(keep[:, None], rows, torch.zeros_like(rows)).split([len(v) for v in value])

    image = {"pooler_output": masked(output.pooler_output)}
    if getattr(output, "deepstack_features", None) is not None:
        image["deepstack_features"] = [masked(layer) for layer in output.deepstack_features]
    return type(output)(**image), output


def test_avisc_blind_stream_equals_a_direct_forward(family):
    """The blind stream's first logits = ``model(...)`` on the full processor inputs (``mm_token_type_ids`` /
    ``token_type_ids``, ``image_grid_thw``) with ``pixel_values`` replaced by the masked encoder output
    (masked main features AND DeepStack rows), for every row of a left-padded batch."""
    name, model, processor = family
    inputs = _inputs(processor)
    spy = SpyAvisC(alpha=1.0, top_k=2)
    model.generate(**inputs, max_new_tokens=1, do_sample=False, custom_generate=spy)
    image_mask = image_token_mask(inputs["input_ids"], model.config)
    assert spy.blind.sum(1).tolist() == [2] * len(PROMPTS) and not (spy.blind & ~image_mask).any()
    masked, clean = _masked_by_hand(model, inputs, spy.blind)
    rest = {k: v for k, v in inputs.items() if k != "pixel_values"}
    with torch.no_grad():
        direct = model(**rest, mm_encoder_outputs={"image": masked}).logits[:, -1]
        plain = model(**inputs).logits[:, -1]
    assert torch.allclose(spy.first["main"], plain, atol=1e-4)
    for row in range(len(PROMPTS)):
        assert torch.allclose(spy.first["blind"][row], direct[row], atol=1e-4), f"{name} row {row}"
    assert (direct - plain).abs().max() > 1e-3
    if name == "qwen3_vl":  # the DeepStack rows matter: unmasked, they would give other logits
        leaky = type(masked)(pooler_output=masked.pooler_output, deepstack_features=clean.deepstack_features)
        with torch.no_grad():
            unmasked_deepstack = model(**rest, mm_encoder_outputs={"image": leaky}).logits[:, -1]
        assert (unmasked_deepstack - direct).abs().max() > 1e-4


@pytest.fixture(scope="module")
def qwen3_vl():
    model, processor = build_tiny("qwen3_vl")
    processor.tokenizer.padding_side = "left"
    return model, processor


@pytest.mark.parametrize("scheme", ["zeros", "ones", "noise", "drop"])
def test_avisc_masks_deepstack_rows_of_masked_tokens(qwen3_vl, scheme):
    """Qwen3-VL: the clean stream keeps the encoder's DeepStack features; in the blind view a masked token's
    DeepStack rows are 0 whatever fills its input embedding (dropped with ``"drop"``), kept tokens keep theirs."""
    model, processor = qwen3_vl
    inputs = _inputs(processor)
    spy = SpyAvisC(alpha=1.0, top_k=3, masking_scheme=scheme)
    model.generate(**inputs, max_new_tokens=1, do_sample=False, custom_generate=spy)
    reference = _image_features(model, inputs)
    clean = spy.streams["main"].inputs["mm_encoder_outputs"]["image"]
    view = spy.streams["blind"].inputs["mm_encoder_outputs"]["image"]
    assert type(clean).__name__ == "BaseModelOutputWithDeepstackFeatures" and type(view) is type(clean)
    keep = spy.blind[image_token_mask(inputs["input_ids"], model.config)]
    assert keep.any() and (~keep).any()
    layers = len(model.config.vision_config.deepstack_visual_indexes)
    assert len(clean.deepstack_features) == len(view.deepstack_features) == len(reference.deepstack_features) == layers
    kept_per_image = [int(k.sum()) for k in keep.split([len(t) for t in reference.pooler_output])]
    for got, want in zip(clean.deepstack_features, reference.deepstack_features):
        assert torch.equal(torch.cat(list(got)), torch.cat(list(want)))
    for got, want in zip(view.deepstack_features, reference.deepstack_features):
        rows, want = torch.cat(list(got)), torch.cat(list(want))
        if scheme == "drop":
            assert [len(t) for t in got] == kept_per_image
            assert torch.equal(rows, want[keep])
        else:
            assert torch.equal(rows[keep], want[keep]) and bool((rows[~keep] == 0).all())
            assert bool((want[~keep] != 0).any())
    pooled, want = torch.cat(list(view.pooler_output)), torch.cat(list(reference.pooler_output))
    if scheme == "drop":
        assert torch.equal(pooled, want[keep])
        stream = spy.streams["blind"]
        assert image_token_mask(stream.input_ids, model.config).sum(1).tolist() == kept_per_image
        return
    assert torch.equal(pooled[keep], want[keep])
    fill = pooled[~keep]
    if scheme == "zeros":
        assert bool((fill == 0).all())
    elif scheme == "ones":
        assert bool((fill == 1).all())
    else:
        assert bool((fill != 0).all()) and abs(float(fill.std()) - 1.0) < 0.2


# ---------------------------------------------------------------------------------------
# OPERA on Qwen-VL (M-RoPE positions through its own beam search)
# ---------------------------------------------------------------------------------------
class SpyOPERA(OPERA):
    def observe_step(self, event):
        self.__dict__.setdefault("events", []).append(event)


@pytest.fixture(scope="module", params=["qwen2_5_vl", "qwen3_vl"])
def qwen(request):
    model, processor = build_tiny(request.param)
    processor.tokenizer.padding_side = "left"
    return request.param, model, processor


def test_opera_penalty_off_equals_beam_search_on_qwen(qwen):
    _, model, processor = qwen
    inputs = _inputs(processor)
    vocab = model.config.get_text_config().vocab_size
    expected = model.generate(**inputs, max_new_tokens=NEW, num_beams=3, do_sample=False)
    neutral = OPERA(num_beams=3, penalty_weights=0.0, threshold=10**9, num_attn_candidates=vocab)
    assert torch.equal(model.generate(**inputs, max_new_tokens=NEW, custom_generate=neutral), expected)
    assert not hooks_installed(model)


def test_opera_rolling_batch_equals_single_runs_on_qwen(qwen):
    name, model, processor = qwen
    inputs = _inputs(processor)
    length = inputs["input_ids"].shape[1]
    method = SpyOPERA(num_beams=3, scale_factor=25.0, threshold=0)
    beams = model.generate(**inputs, max_new_tokens=16, num_beams=3, do_sample=False)[:, length:]
    batched = model.generate(**inputs, max_new_tokens=16, custom_generate=method)[:, length:]
    assert any(e["kind"] == "rollback" for e in method.events)
    assert not torch.equal(batched, beams)
    for row in range(len(PROMPTS)):
        single = _inputs(processor, [row])
        alone = model.generate(**single, max_new_tokens=16, custom_generate=method)[:, single["input_ids"].shape[1]:]
        assert torch.equal(batched[row:row + 1], alone), f"{name} row {row}"
    assert not hooks_installed(model)


def test_opera_refuses_sliding_window_models():
    model, processor = build_tiny("gemma3")
    processor.tokenizer.padding_side = "left"
    with pytest.raises(MitigationError, match="OPERA on Gemma3ForConditionalGeneration.*sliding-window"):
        model.generate(**_inputs(processor, [0]), max_new_tokens=2, custom_generate=OPERA(num_beams=2))
    assert not hooks_installed(model)
