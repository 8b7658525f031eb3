"""VCD, M3ID, PAI, DoLa, AvisC and OPERA beyond LLaVA (DAMRO: a clear refusal): Qwen2.5-VL, Qwen3-VL and Gemma 3 (MedGemma), tiny random weights.

The invariants of ``test_mitigations.py`` on each family's real model and processor classes:

- the neutral setting equals plain greedy ``generate`` token for token (left-padded batch of 3);
- a left-padded batch of 3 equals three single runs at a non-neutral setting that changes the output;
- no hook is left behind, and the model computes exactly what it computed before;
- the family-specific parts: image tokens found from ``image_token_id`` (Qwen) / ``image_token_index``
  (Gemma 3), Qwen's M-RoPE position ids (its text-only stream joins the clean batch), VCD's noise on
  Qwen's flattened patch layout, PAI's image columns on Gemma 3's sliding-window layers, AvisC's masked
  features handed back in Gemma 3's tensor form and with Qwen3-VL's DeepStack features (masked tokens get no
  DeepStack injection; the blind stream = a direct forward on the masked encoder output); DAMRO refuses towers
  without a [CLS] token (SigLIP, Qwen-VL);
- OPERA (its own beam search) on Qwen-VL (M-RoPE) and Gemma 3: penalty off equals transformers' beam search, a
  rolling batch equals single runs; on Gemma 3 its full-length cache keeps the sliding window (same logits as the
  model's sliding cache and cache-free forward), with the last layer full (tiny model) or sliding (as MedGemma),
  and a caller's sliding or static cache is refused.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from medheval.backends.tiny_families import build_tiny
from medheval.decoding import internals
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
    "avisc": AvisC(alpha=3.0, beta=0.0, top_k=2),  # Gemma 3 has 4 image tokens: top 10 would keep them all
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
    """The prompt without its image tokens, with the model's own positions (Qwen: M-RoPE with no image,
    all axes equal), joined to the clean batch and cache after prefill (Gemma 3: sliding-window layers too)."""
    name, model, processor = family
    inputs = _inputs(processor)
    spy = SpyM3ID()
    _gen(model, inputs, custom_generate=spy)
    assert spy.separate == {}
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


@pytest.mark.parametrize("scheme", ["zeros", "ones", "noise"])
def test_avisc_masks_deepstack_rows_of_masked_tokens(qwen3_vl, scheme):
    """Qwen3-VL: the clean stream keeps the encoder's DeepStack features; in the blind view a masked token's
    DeepStack rows are 0 whatever fills its input embedding, the blind tokens keep theirs."""
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
    for got, want in zip(clean.deepstack_features, reference.deepstack_features):
        assert torch.equal(torch.cat(list(got)), torch.cat(list(want)))
    for got, want in zip(view.deepstack_features, reference.deepstack_features):
        assert [len(t) for t in got] == [len(t) for t in want]
        rows, want = torch.cat(list(got)), torch.cat(list(want))
        assert torch.equal(rows[keep], want[keep]) and bool((rows[~keep] == 0).all())
        assert bool((want[~keep] != 0).any())
    pooled, want = torch.cat(list(view.pooler_output)), torch.cat(list(reference.pooler_output))
    assert torch.equal(pooled[keep], want[keep])
    fill = pooled[~keep]
    if scheme == "zeros":
        assert bool((fill == 0).all())
    elif scheme == "ones":
        assert bool((fill == 1).all())
    else:
        assert bool((fill != 0).all()) and abs(float(fill.std()) - 1.0) < 0.2


def test_mask_deepstack_features_known_answer():
    """Per DeepStack layer: kept rows unchanged, masked rows 0 for every scheme, removed with "drop";
    per-image tuples stay per-image tuples, a layer given as one tensor of all rows stays one tensor."""
    from medheval.mitigations.image_masking import mask_deepstack_features

    first, second = torch.arange(1.0, 7.0).reshape(3, 2), torch.arange(7.0, 11.0).reshape(2, 2)
    deepstack = [(first, second), torch.cat([first, second]) * 10]
    keep = [torch.tensor([True, False, True]), torch.tensor([False, True])]
    for scheme in ("zeros", "ones", "noise"):
        layer0, layer1 = mask_deepstack_features(deepstack, keep, scheme)
        assert isinstance(layer0, tuple) and torch.is_tensor(layer1)
        assert [t.tolist() for t in layer0] == [[[1, 2], [0, 0], [5, 6]], [[0, 0], [9, 10]]]
        assert layer1.tolist() == [[10, 20], [0, 0], [50, 60], [0, 0], [90, 100]]
    layer0, layer1 = mask_deepstack_features(deepstack, keep, "drop")
    assert [t.tolist() for t in layer0] == [[[1, 2], [5, 6]], [[9, 10]]]
    assert layer1.tolist() == [[10, 20], [50, 60], [90, 100]]
    with pytest.raises(MitigationError, match=r"\[3, 1\] rows per image but the image features have \[3, 2\]"):
        mask_deepstack_features([(first, second[:1])], keep, "zeros")


@pytest.mark.parametrize("name", ["qwen2_5_vl", "qwen3_vl"])
def test_avisc_drop_refused_on_qwen_vl(name):
    """Dropping image tokens leaves Qwen-VL's image_grid_thw (its M-RoPE layout) unfilled: a clear refusal."""
    model, processor = build_tiny(name)
    processor.tokenizer.padding_side = "left"
    implementation = model.config.get_text_config()._attn_implementation
    with pytest.raises(MitigationError, match=rf"AvisC masking_scheme='drop' on {type(model).__name__}: .*image_grid_thw"):
        _gen(model, _inputs(processor, [0]), custom_generate=AvisC(masking_scheme="drop"))
    assert not hooks_installed(model)
    assert model.config.get_text_config()._attn_implementation == implementation


# ---------------------------------------------------------------------------------------
# OPERA on Qwen-VL (M-RoPE positions through its own beam search) and Gemma 3 (below)
# ---------------------------------------------------------------------------------------
class SpyOPERA(OPERA):
    def observe_step(self, event):
        self.__dict__.setdefault("events", []).append(event)


@pytest.fixture(scope="module", params=["qwen2_5_vl", "qwen3_vl"])
def qwen(request):
    model, processor = build_tiny(request.param)
    processor.tokenizer.padding_side = "left"
    return request.param, model, processor


def _opera_penalty_off_equals_beam_search(model, processor, new_tokens: int) -> None:
    inputs = _inputs(processor)
    vocab = model.config.get_text_config().vocab_size
    expected = model.generate(**inputs, max_new_tokens=new_tokens, num_beams=3, do_sample=False)
    neutral = OPERA(num_beams=3, penalty_weights=0.0, threshold=10**9, num_attn_candidates=vocab)
    assert torch.equal(model.generate(**inputs, max_new_tokens=new_tokens, custom_generate=neutral), expected)
    assert not hooks_installed(model)


def test_opera_penalty_off_equals_beam_search_on_qwen(qwen):
    _, model, processor = qwen
    _opera_penalty_off_equals_beam_search(model, processor, NEW)


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


# ---------------------------------------------------------------------------------------
# OPERA on Gemma 3 / MedGemma (sliding-window layers over a full-length cache)
# ---------------------------------------------------------------------------------------
GEMMA_NEW = 16  # more generated tokens than the tiny model's sliding_window (8)
GEMMA_ROLL = 20  # a rollback needs a location >= 10 chosen by every beam: enough steps for both layer layouts


def _last_layer_sliding(model):
    """The tiny Gemma 3 with its layer types swapped (same weights): the last layer is a sliding one, as in
    MedGemma 4B / 27B (layer 34 / 62 of a 5-sliding-1-full pattern)."""
    import copy

    config = copy.deepcopy(model.config)
    config.text_config.layer_types = list(reversed(config.text_config.layer_types))
    flipped = type(model)(config).to(torch.float32).eval()
    flipped.load_state_dict(model.state_dict())
    flipped.generation_config = copy.deepcopy(model.generation_config)
    return flipped


@pytest.fixture(scope="module", params=["last_full", "last_sliding"])
def gemma(request):
    model, processor = build_tiny("gemma3")
    processor.tokenizer.padding_side = "left"
    if request.param == "last_sliding":
        model = _last_layer_sliding(model)
    assert model.config.text_config.layer_types[-1] == ("sliding_attention" if request.param == "last_sliding"
                                                        else "full_attention")
    return request.param, model, processor


def _model_inputs(single, sequences):
    """The model's own (cache-free) forward inputs for ``sequences`` = one unpadded prompt + generated tokens."""
    rows, extra = sequences.shape[0], sequences.shape[1] - single["input_ids"].shape[1]
    token_types = torch.cat([single["token_type_ids"], single["token_type_ids"].new_zeros((1, extra))], dim=-1)
    return dict(input_ids=sequences, pixel_values=single["pixel_values"].expand(rows, -1, -1, -1),
                token_type_ids=token_types.expand(rows, -1), use_cache=False)


def test_opera_full_length_cache_keeps_the_sliding_window(gemma):
    """Gemma 3's own masks over a cache of full-length DynamicLayers (what OPERA uses) give exactly what its
    sliding-window cache (which drops keys) and a cache-free forward give, prefill (bidirectional image
    tokens via token_type_ids) and decoding past the window; with the window switched off they differ."""
    _, model, processor = gemma
    inputs = _inputs(processor)
    length = inputs["input_ids"].shape[1]
    sequences = model.generate(**inputs, max_new_tokens=GEMMA_NEW, do_sample=False)
    mask = torch.cat([inputs["attention_mask"], inputs["attention_mask"].new_ones((3, GEMMA_NEW))], dim=-1)

    def decode(cache):
        with torch.no_grad():
            logits = [model(**inputs, **internals.cache_keyword(cache), use_cache=True).logits[:, -1]]
            for i in range(GEMMA_NEW - 1):
                logits.append(model(input_ids=sequences[:, length + i, None], attention_mask=mask[:, : length + i + 1],
                                    **internals.cache_keyword(cache), use_cache=True).logits[:, -1])
        return torch.stack(logits, dim=1), cache

    full, full_cache = decode(internals.new_cache())
    windowed, windowed_cache = decode(internals.new_cache(model))
    sliding = model.config.text_config.layer_types.index("sliding_attention")
    assert full_cache.layers[sliding].keys.shape[-2] == length + GEMMA_NEW - 1  # every key kept
    assert windowed_cache.layers[sliding].keys.shape[-2] < 8  # the sliding layer dropped them
    assert torch.allclose(full, windowed, atol=1e-5)
    with torch.no_grad():
        direct = model(input_ids=sequences[:, :-1], attention_mask=mask[:, :-1], pixel_values=inputs["pixel_values"],
                       token_type_ids=torch.cat([inputs["token_type_ids"], inputs["token_type_ids"].new_zeros(
                           (3, GEMMA_NEW - 1))], dim=-1), use_cache=False).logits[:, length - 1:]
    assert torch.allclose(full, direct, atol=1e-5)
    text = model.config.text_config
    window, text.sliding_window = text.sliding_window, 10**6
    try:
        unwindowed, _ = decode(internals.new_cache())
    finally:
        text.sliding_window = window
    assert (unwindowed - full).abs().max() > 1e-3  # the window matters in this test


def test_opera_penalty_off_equals_beam_search_on_gemma3(gemma):
    _, model, processor = gemma
    assert GEMMA_NEW > model.config.text_config.sliding_window
    _opera_penalty_off_equals_beam_search(model, processor, GEMMA_NEW)


def test_opera_rolling_batch_equals_single_runs_on_gemma3(gemma):
    name, model, processor = gemma
    inputs = _inputs(processor)
    with torch.no_grad():
        before = model(**inputs).logits
    length = inputs["input_ids"].shape[1]
    method = SpyOPERA(num_beams=3, scale_factor=25.0, threshold=0)
    beams = model.generate(**inputs, max_new_tokens=GEMMA_ROLL, num_beams=3, do_sample=False)[:, length:]
    batched = model.generate(**inputs, max_new_tokens=GEMMA_ROLL, custom_generate=method)[:, length:]
    assert any(e["kind"] == "rollback" for e in method.events)
    assert not torch.equal(batched, beams)
    for row in range(len(PROMPTS)):
        single = _inputs(processor, [row])
        spy = SpyOPERA(num_beams=3, scale_factor=25.0, threshold=0)
        alone = model.generate(**single, max_new_tokens=GEMMA_ROLL, custom_generate=spy)
        assert torch.equal(batched[row:row + 1], alone[:, single["input_ids"].shape[1]:]), f"{name} row {row}"
        # a rollback recomputes the generated tokens' cache: its logits are the model's own (sliding masks, no cache)
        for event in (e for e in spy.events if e["kind"] == "rollback"):
            with torch.no_grad():
                direct = model(**_model_inputs(single, event["sequences"])).logits[:, -1]
            assert torch.allclose(event["logits"], direct, atol=1e-4), f"{name} row {row} rollback to {event['to']}"
    assert not hooks_installed(model)
    with torch.no_grad():
        assert torch.equal(model(**inputs).logits, before)


def test_opera_attention_rows_of_a_sliding_last_layer(gemma):
    """OPERA's window rows are the last layer's attention over the full-length keys: on a sliding last layer
    (MedGemma) exactly 0 on the generated tokens outside the window and positive inside it, and the image
    bonus 0 once every image token has left the window; on a full last layer positive everywhere."""
    name, model, processor = gemma
    single = _inputs(processor, [1])
    length = single["input_ids"].shape[1]
    window = model.config.text_config.sliding_window
    last_image = int(image_token_mask(single["input_ids"], model.config)[0].nonzero().max())
    spy = SpyOPERA(num_beams=3, threshold=10**9)
    model.generate(**single, max_new_tokens=GEMMA_NEW, custom_generate=spy)
    steps = [e for e in spy.events if e["kind"] == "step"]
    assert len(steps) == GEMMA_NEW
    for event in steps:
        step, rows, image = event["step"], event["rows"], event["image_attention"]
        assert rows.shape[-1] == step + 1  # generated tokens 0..step (window_size 512)
        assert torch.isfinite(rows).all() and (rows.sum(-1) + image <= 1 + 1e-5).all()  # shares of one row
        query = length + step  # the candidate's cache index
        if name == "last_sliding":
            outside = max(0, step + 1 - window)  # generated tokens g with length + g <= query - window
            assert (rows[..., :outside] == 0).all() and (rows[..., outside:] > 0).all(), f"step {step}"
            assert bool((image == 0).all()) == (last_image <= query - window), f"step {step}"
        else:
            assert (rows > 0).all() and (image > 0).all()
    # both sides of the window: image tokens inside it at the first step, outside at the last
    assert last_image > length - window and last_image <= length + GEMMA_NEW - 1 - window


def test_opera_refuses_caches_it_cannot_crop():
    """A caller's cache whose sliding layers drop keys (or a static one) is refused, naming model and fix."""
    from transformers import DynamicCache, StaticCache

    model, processor = build_tiny("gemma3")
    processor.tokenizer.padding_side = "left"
    inputs = _inputs(processor, [0])
    for cache, kind in [(DynamicCache(config=model.config), "DynamicCache with DynamicSlidingWindowLayer"),
                        (StaticCache(config=model.config, max_cache_len=64), "StaticCache")]:
        with pytest.raises(MitigationError, match=f"OPERA on Gemma3ForConditionalGeneration: .* is a {kind}.*"
                                                  "pass no cache"):
            model.generate(**inputs, max_new_tokens=2, **internals.cache_keyword(cache),
                           custom_generate=OPERA(num_beams=2))
    assert not hooks_installed(model)
    # generate's own hybrid (static, sliding) cache from the generation config is replaced, not refused
    vocab = model.config.get_text_config().vocab_size
    neutral = OPERA(num_beams=2, penalty_weights=0.0, threshold=10**9, num_attn_candidates=vocab)
    expected = model.generate(**inputs, max_new_tokens=4, num_beams=2, do_sample=False)
    assert torch.equal(model.generate(**inputs, max_new_tokens=4, custom_generate=neutral,
                                      cache_implementation="hybrid"), expected)
