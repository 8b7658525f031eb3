"""VCD, M3ID, PAI, DoLa and AvisC beyond LLaVA (DAMRO: a clear refusal): Qwen2.5-VL, Qwen3-VL and Gemma 3 (MedGemma), tiny random weights.

The invariants of ``test_mitigations.py`` on each family's real model and processor classes:

- the neutral setting equals plain greedy ``generate`` token for token (left-padded batch of 3);
- a left-padded batch of 3 equals three single runs at a non-neutral setting that changes the output;
- no hook is left behind, and the model computes exactly what it computed before;
- the family-specific parts: image tokens found from ``image_token_id`` (Qwen) / ``image_token_index``
  (Gemma 3), Qwen's M-RoPE position ids (its text-only stream joins the clean batch), VCD's noise on
  Qwen's flattened patch layout, PAI's image columns on Gemma 3's sliding-window layers, AvisC's masked
  features handed back in Gemma 3's tensor form; DAMRO refuses towers without a [CLS] token (SigLIP, Qwen-VL).
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


def _skip_unsupported(name, method):
    if name == "qwen3_vl" and method == "avisc":
        pytest.skip("AvisC on Qwen3-VL refuses (DeepStack features): see test_avisc_refuses_deepstack")


@pytest.mark.parametrize("method", sorted(NEUTRAL))
def test_neutral_setting_equals_greedy(family, method):
    name, model, processor = family
    _skip_unsupported(name, method)
    inputs = _inputs(processor)
    expected = _gen(model, inputs)
    assert torch.equal(_gen(model, inputs, custom_generate=NEUTRAL[method]), expected)
    assert not hooks_installed(model)


@pytest.mark.parametrize("method", sorted(STRONG))
def test_batch_equals_single_runs_and_output_changes(family, method):
    name, model, processor = family
    _skip_unsupported(name, method)
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


def test_avisc_refuses_deepstack():
    from medheval.decoding import MissingInternalError

    model, processor = build_tiny("qwen3_vl")
    processor.tokenizer.padding_side = "left"
    with pytest.raises(MissingInternalError, match="AvisC on Qwen3VLForConditionalGeneration.*DeepStack"):
        _gen(model, _inputs(processor, [0]), custom_generate=AvisC())
    assert not hooks_installed(model)


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
