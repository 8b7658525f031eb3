"""One forward per decoding step for every two-stream mitigation (issue 14, part 1).

The one-pass path (contrast streams in the clean stream's batch and KV cache, 2B rows) must give
the *same tokens* as the two-pass reference (:meth:`DecodingMethod.two_pass`: every contrast
stream in its own cache and forward), float32, on the tiny LLaVA / LLaVA-NeXT and the small
random LLaVA, for batches of 1 and 3 rows with left padding; joining really leaves one group
after the first step; hooks and attention implementations are gone afterwards; a joined
stream's logits equal those of its own cache; and what cannot join stays separate, with a reason.
Beyond LLaVA (tiny Qwen2.5-VL, Qwen3-VL, Gemma 3): M3ID/PAI's text-only stream and AvisC's
blind stream join too (M-RoPE positions, sliding-window layers, per-token type ids), with every
step's logits equal to the two-pass reference.
"""

from __future__ import annotations

import pytest
import torch
from conftest import load_benchmark

from medheval.decoding import internals
from medheval.decoding import DecodingMethod, MitigationError, Stream, StreamGroup, hooks_installed
from medheval.decoding.visual_tokens import drop_image_tokens
from medheval.mitigations import DAMRO, M3ID, PAI, VCD, AvisC
from test_mitigations import PROMPTS, _gen, _images, _inputs, _new_tokens

# every method with a contrast stream, at the settings that give each kind of stream
TWO_STREAM = {
    "vcd": lambda: VCD(),                                   # same prompt, noised pixels: prefilled together
    "m3id": lambda: M3ID(lam=0.5),                          # text-only prompt: shorter, joined after prefill
    "pai": lambda: PAI(),                                   # text-only prompt + attention hooks on the joined batch
    "avisc": lambda: AvisC(),                               # built after the clean prefill, then joined
    "avisc-official": lambda: AvisC(preset="official"),
    "avisc-drop": lambda: AvisC(masking_scheme="drop"),     # built after prefill and shorter
    "damro": lambda: DAMRO(),                               # same prompt, masked features
    "damro-official": lambda: DAMRO(preset="official"),     # "drop": shorter prompt, joined after prefill
}
CONTRAST = {"vcd": "noised", "m3id": "text_only", "pai": "text_only", "avisc": "blind", "damro": "outliers"}


class Layout:
    """Mixin: records, per step, the stream names of each group the loop forwards."""

    def scores(self, ctx, logits):
        if ctx.step == 0:
            self.layout = []
        self.layout.append([tuple(g.names) for g in ctx.groups])
        return super().scores(ctx, logits)


def _spy(method):
    spy = type(f"Layout{type(method).__name__}", (Layout, type(method)), {})
    return spy(**method.settings())


def _check_one_vs_two(model, inputs, name, max_new_tokens=6):
    method = _spy(TWO_STREAM[name]())
    implementation = model.config.get_text_config()._attn_implementation
    one = _gen(model, inputs, custom_generate=method, max_new_tokens=max_new_tokens)
    assert not hooks_installed(model)
    assert model.config.get_text_config()._attn_implementation == implementation
    reference = method.two_pass()
    assert reference.one_pass is False and method.one_pass is True
    two = _gen(model, inputs, custom_generate=reference, max_new_tokens=max_new_tokens)
    assert not hooks_installed(model)
    assert torch.equal(one, two), f"{name}: one-pass tokens differ from the two-pass reference"
    contrast = CONTRAST[name.split("-")[0]]
    # one pass: after the first step a single group of both streams; two pass: one group per stream
    assert all(step == [("main", contrast)] for step in method.layout[1:]), method.layout
    assert all(step == [("main",), (contrast,)] for step in reference.layout), reference.layout
    return one


@pytest.mark.parametrize("name", sorted(TWO_STREAM))
@pytest.mark.parametrize("rows", [[2], [0, 1, 2]], ids=["batch1", "batch3"])
def test_one_pass_equals_two_pass_tiny(tiny, name, rows):
    kind, model, processor = tiny
    inputs = _inputs(kind, processor, rows)
    if len(rows) > 1:
        assert (inputs["attention_mask"] == 0).any()  # really left-padded
    _check_one_vs_two(model, inputs, name)


@pytest.fixture(scope="module")
def small():
    from medheval.backends.tiny import build_random_llava

    return build_random_llava("small", seed=0)


@pytest.mark.parametrize("name", sorted(TWO_STREAM))
def test_one_pass_equals_two_pass_small(small, name):
    model, processor = small
    rows = [1, 2, 3]
    texts = [f"USER: <image>\n{PROMPTS[i]} ASSISTANT:" for i in rows]
    images = [image.resize((224, 224)) for image in _images("llava", rows)]
    batch = processor(text=texts, images=images, padding=True, return_tensors="pt")
    assert (batch["attention_mask"] == 0).any()
    batched = _check_one_vs_two(model, batch, name, max_new_tokens=3)
    if name in ("m3id", "avisc-drop", "damro-official"):  # joined after prefill, at another length
        # a left-padded batch equals single runs (row 0 alone, the one with the most padding)
        alone = processor(text=texts[:1], images=images[:1], return_tensors="pt")
        single = _gen(model, alone, custom_generate=TWO_STREAM[name](), max_new_tokens=3)
        assert torch.equal(_new_tokens(batched, batch)[:1], _new_tokens(single, alone))


@pytest.mark.parametrize("name", ["m3id", "pai", "damro-official", "avisc-drop"])
def test_joined_batch_of_three_equals_single_runs(tiny, name):
    kind, model, processor = tiny
    batch = _inputs(kind, processor, [0, 1, 2])
    batched = _new_tokens(_gen(model, batch, custom_generate=TWO_STREAM[name]()), batch)
    for i in range(3):
        single = _inputs(kind, processor, [i])
        alone = _new_tokens(_gen(model, single, custom_generate=TWO_STREAM[name]()), single)
        assert torch.equal(batched[i : i + 1], alone), f"{name} row {i}"


def test_return_dict_keeps_the_clean_cache_only(llava):
    model, processor = llava
    inputs = _inputs("llava", processor, [0, 1, 2])
    out = _gen(model, inputs, custom_generate=M3ID(), return_dict_in_generate=True)
    plain = _gen(model, inputs, return_dict_in_generate=True)
    assert (internals.first_layer_keys(internals.output_cache(out)).shape
            == internals.first_layer_keys(internals.output_cache(plain)).shape)


# ---------------------------------------------------------------------------------------
# StreamGroup.join directly
# ---------------------------------------------------------------------------------------
def test_joined_stream_logits_equal_its_own_cache(llava):
    model, processor = llava
    inputs = _inputs("llava", processor, [0, 1, 2])
    pad = processor.tokenizer.pad_token_id
    main = Stream("main", inputs["input_ids"], inputs["attention_mask"], {"pixel_values": inputs["pixel_values"]})
    text_ids, text_mask = drop_image_tokens(inputs["input_ids"], inputs["attention_mask"], model.config, pad)
    text = Stream("text", text_ids, text_mask)
    joined, alone, reference = StreamGroup(model, [main]), StreamGroup(model, [text]), StreamGroup(model, [text])
    with torch.no_grad():
        for group in (joined, alone, reference):
            group.forward()
        token = torch.tensor([7, 8, 9])
        for group in (joined, alone, reference):
            group.append(token)
        width = inputs["input_ids"].shape[1] - text_ids.shape[1]
        assert width > 0
        joined.join(alone, pad)
        assert joined.names == ["main", "text"] and joined.rows("text") == slice(3, 6)
        keys = joined.cache.layers[0].keys
        assert keys.shape[0] == 6 and keys.shape[2] == inputs["input_ids"].shape[1]
        assert not keys[3:, :, :width].any()  # left padding: zero keys ...
        mask = joined.model_kwargs["attention_mask"]
        assert not mask[3:, :width].any() and torch.equal(mask[3:, width:], reference.model_kwargs["attention_mask"])
        assert torch.equal(joined.model_kwargs["position_ids"][3:, width:], reference.model_kwargs["position_ids"])
        assert not joined.image_mask[3:].any() and torch.equal(joined.image_mask[:3], main.input_ids == model.config.image_token_id)
        both, own = joined.forward(), reference.forward()
    assert torch.allclose(both.logits[3:, -1], own.logits[:, -1], atol=1e-5)


def test_join_refusals(llava):
    model, processor = llava
    inputs = _inputs("llava", processor, [0, 1])
    main = Stream("main", inputs["input_ids"], inputs["attention_mask"], {"pixel_values": inputs["pixel_values"]})
    short = Stream("short", inputs["input_ids"][:, -3:])
    longer = Stream("longer", torch.nn.functional.pad(inputs["input_ids"], (1, 0), value=0),
                    torch.nn.functional.pad(inputs["attention_mask"], (1, 0)), {"pixel_values": inputs["pixel_values"]})
    group, small, big = StreamGroup(model, [main]), StreamGroup(model, [short]), StreamGroup(model, [longer])
    assert "prefilled" in group.join_refusal(small)
    with torch.no_grad():
        for g in (group, small, big):
            g.forward()
            g.append(torch.tensor([5, 5]))
    assert group.join_refusal(small) is None
    assert "longer" in group.join_refusal(big)
    one_row = StreamGroup(model, [Stream("one", inputs["input_ids"][:1, -3:])])
    with torch.no_grad():
        one_row.forward()
    one_row.append(torch.tensor([5]))
    assert "batch 1" in group.join_refusal(one_row)
    small.model_kwargs["token_type_ids"] = torch.zeros_like(small.input_ids)
    with pytest.raises(MitigationError, match="token_type_ids"):
        group.join(small, 0)


class Longer(DecodingMethod):
    """A contrast stream one (padding) column longer than the clean prompt: it cannot join."""

    name = "longer"

    def contrast_streams(self, ctx):
        ids = torch.nn.functional.pad(ctx.main.input_ids, (1, 0), value=ctx.pad_token_id)
        mask = ctx.main.attention_mask
        mask = torch.nn.functional.pad(mask if mask is not None else torch.ones_like(ctx.main.input_ids), (1, 0))
        return [Stream("longer", ids, mask, dict(ctx.main.inputs))]

    def scores(self, ctx, logits):
        self.layout = [tuple(g.names) for g in ctx.groups]
        self.separate = dict(ctx.state.get("separate_streams", {}))
        assert torch.allclose(logits["main"], logits["longer"], atol=1e-4)  # same tokens, more padding
        return logits["main"]


def test_a_stream_that_cannot_join_stays_separate(llava):
    model, processor = llava
    inputs = _inputs("llava", processor, [0, 1])
    method = Longer()
    got = _gen(model, inputs, custom_generate=method, max_new_tokens=3)
    assert torch.equal(got, _gen(model, inputs, max_new_tokens=3))
    assert method.layout == [("main",), ("longer",)]
    assert "longer than the clean prompt" in method.separate["longer"]


# ---------------------------------------------------------------------------------------
# the benchmark's models and a smoke run (no timing asserted)
# ---------------------------------------------------------------------------------------
def test_llava_7b_shaped_model_has_llava_1_5_7b_parameter_count():
    from medheval.backends.tiny import build_random_llava

    model, processor = build_random_llava("llava-1.5-7b", dtype=torch.bfloat16, device="meta")
    assert sum(p.numel() for p in model.parameters()) == 7_063_427_072  # llava-hf/llava-1.5-7b-hf
    assert next(model.parameters()).dtype == torch.bfloat16 and model.config.image_seq_length == 576
    with pytest.raises(ValueError, match="unknown random LLaVA size"):
        build_random_llava("huge")


def test_benchmark_runs_and_skips_the_gpu_model_without_cuda(tmp_path, capsys, monkeypatch):
    import json

    bench = load_benchmark("bench_mitigations")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    out = tmp_path / "bench.json"
    assert bench.main(["--models", "tiny", "llava-1.5-7b", "--device", "cpu", "--prompts", "2", "--batch-size", "2",
                       "--max-new-tokens", "2", "--repeats", "1", "--methods", "m3id", "m3id-2pass",
                       "--json", str(out)]) == 0
    assert "model=llava-1.5-7b: skipped (needs a CUDA device" in capsys.readouterr().out
    [summary] = json.loads(out.read_text())
    results = summary["results"]
    assert set(results) == {"none", "floor2B", "m3id", "m3id-2pass"}
    assert results["floor2B"]["same_tokens_as_none"] is True  # the doubled batch decodes the same rows
    assert results["m3id-2pass"]["same_tokens_as_one_pass"] is True
    assert results["none"]["x_greedy"] == 1.0 and results["floor2B"]["x_floor"] == 1.0



def test_benchmark_two_pass_rows_give_the_same_tokens_at_32_tokens(capsys):
    """Issue 22, point 13: ``benchmarks/bench_mitigations.py`` at its default 32 new tokens shows the same
    tokens for every ``-2pass`` row. The one-pass method runs the same per-stream computation as its
    two-pass reference, only batched into one forward of 2B rows, so greedy decoding over 32 steps picks the
    same token at every step (torch.equal on both rows of a left-padded batch of the tiny model)."""
    bench = load_benchmark("bench_mitigations")
    methods = [m for name in sorted(bench.TWO_STREAM) for m in (name, f"{name}-2pass")]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a tiny model: one thread is fastest on a shared machine
    try:
        summary = bench.bench_model("tiny", bench.argparse.Namespace(
            device="cpu", prompts=2, batch_size=2, max_new_tokens=32, repeats=1, methods=methods, preset="medheval",
            compile_mode="eager", budget_s=None), bench.time.perf_counter())
    finally:
        torch.set_num_threads(threads)
    rows = {key: entry.get("same_tokens_as_one_pass") for key, entry in summary["results"].items()
            if key.endswith("-2pass")}
    assert rows == {f"{name}-2pass": True for name in bench.TWO_STREAM}
    assert "same tokens" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------
# beyond LLaVA: Qwen-VL's M-RoPE positions, Gemma 3's sliding-window layers and token types
# ---------------------------------------------------------------------------------------
FAMILY_METHODS = {
    "m3id": lambda: M3ID(lam=1.0, beta=0.0),         # text-only prompt, joined after prefill
    "pai": lambda: PAI(alpha=0.5, gamma=3.0),        # text-only prompt + attention hooks on the joined batch
    "avisc": lambda: AvisC(alpha=3.0, beta=0.0, top_k=2),  # the clean prompt, built after prefill, joined
}


class StepLogits:
    """Mixin: keeps every step's logits of every stream and the group layout."""

    def scores(self, ctx, logits):
        if ctx.step == 0:
            self.steps, self.layout = [], []
        self.steps.append({k: v.clone() for k, v in logits.items()})
        self.layout.append([tuple(g.names) for g in ctx.groups])
        self.separate = dict(ctx.state.get("separate_streams", {}))
        return super().scores(ctx, logits)


@pytest.fixture(scope="module", params=["qwen2_5_vl", "qwen3_vl", "gemma3"])
def family(request):
    from medheval.backends.tiny_families import build_tiny

    model, processor = build_tiny(request.param)
    processor.tokenizer.padding_side = "left"
    return request.param, model, processor


@pytest.mark.parametrize("name", sorted(FAMILY_METHODS))
def test_one_pass_equals_two_pass_beyond_llava(family, name):
    """Same tokens, and every step's logits of every stream, as each contrast stream in its own cache;
    16 new tokens run every row past Gemma 3's 8-token window."""
    from test_mitigations_families import _inputs as family_inputs

    kind, model, processor = family
    inputs = family_inputs(processor)
    assert (inputs["attention_mask"] == 0).any()
    method = FAMILY_METHODS[name]()
    one = type("One", (StepLogits, type(method)), {})(**method.settings())
    two = type("Two", (StepLogits, type(method)), {})(**method.settings()).two_pass()
    first = _gen(model, inputs, custom_generate=one, max_new_tokens=16)
    second = _gen(model, inputs, custom_generate=two, max_new_tokens=16)
    assert not hooks_installed(model)
    assert torch.equal(first, second), f"{kind} {name}: one-pass tokens differ from the two-pass reference"
    contrast = CONTRAST[name]
    assert one.separate == {} and all(step == [("main", contrast)] for step in one.layout[1:]), one.layout
    assert all(step == [("main",), (contrast,)] for step in two.layout), two.layout
    assert (one.steps[0]["main"] - one.steps[0][contrast]).abs().max() > 1e-3, "the contrast view changed nothing"
    for step, (a, b) in enumerate(zip(one.steps, two.steps)):
        for stream in ("main", contrast):
            assert torch.allclose(a[stream], b[stream], atol=1e-4), f"{kind} {name} step {step} {stream}"


def test_join_pads_sliding_window_layers():
    """Gemma 3: a 4-token stream joins a 20-token one (window 8: the short one's window is not full, the
    clean one's is); for 10 steps its logits equal those of its own cache, and its padded window is zero."""
    from medheval.backends.tiny_families import build_tiny
    from transformers.cache_utils import DynamicSlidingWindowLayer

    model, _ = build_tiny("gemma3")
    window = model.config.get_text_config().sliding_window
    long_ids = torch.arange(10, 30)[None].repeat(2, 1)
    short_ids = torch.tensor([[2, 40, 41, 42], [2, 50, 51, 52]])
    clean, alone, reference = (StreamGroup(model, [Stream("main", long_ids)]),
                               StreamGroup(model, [Stream("short", short_ids)]),
                               StreamGroup(model, [Stream("short", short_ids)]))
    with torch.no_grad():
        for group in (clean, alone, reference):
            group.forward()
            group.append(torch.tensor([5, 6]))
        clean.join(alone, pad_token_id=0)
        sliding = [i for i, layer in enumerate(clean.cache.layers) if isinstance(layer, DynamicSlidingWindowLayer)]
        assert sliding, "the tiny Gemma 3 has sliding-window layers"
        keys = clean.cache.layers[sliding[0]].keys
        assert keys.shape[-2] == window - 1 and not keys[2:, :, : window - 1 - 4].any()
        for step in range(10):
            both, own = clean.forward(), reference.forward()
            assert torch.allclose(both.logits[2:, -1], own.logits[:, -1], atol=1e-5), f"step {step}"
            token = own.logits[:, -1].argmax(-1)
            clean.append(token)
            reference.append(token)


def test_join_pads_m_rope_positions_and_token_types():
    """Qwen2.5-VL: the joined positions are [4, 2B, T] with the text-only rows' positions left-padded
    and their mm_token_type_ids 0; the joined rows' logits equal those of their own cache."""
    from medheval.backends.tiny_families import build_tiny
    from medheval.decoding.streams import token_type_inputs
    from test_mitigations_families import _inputs as family_inputs

    model, processor = build_tiny("qwen2_5_vl")
    processor.tokenizer.padding_side = "left"
    inputs = family_inputs(processor, [0, 2])
    pad = processor.tokenizer.pad_token_id
    prefill = {"pixel_values": inputs["pixel_values"], "image_grid_thw": inputs["image_grid_thw"]}
    types = {"mm_token_type_ids": inputs["mm_token_type_ids"]}
    main = Stream("main", inputs["input_ids"], inputs["attention_mask"], prefill)
    text_ids, text_mask = drop_image_tokens(inputs["input_ids"], inputs["attention_mask"], model.config, pad)
    text = Stream("text", text_ids, text_mask)
    own_types = token_type_inputs(model, main, text, types)
    assert not own_types["mm_token_type_ids"].any() and own_types["mm_token_type_ids"].shape == text_ids.shape
    assert token_type_inputs(model, main, main.replace("same"), types)["mm_token_type_ids"] is types["mm_token_type_ids"]
    clean = StreamGroup(model, [main], common_kwargs=types)
    alone, reference = (StreamGroup(model, [text], common_kwargs=own_types) for _ in range(2))
    with torch.no_grad():
        for group in (clean, alone, reference):
            group.forward()
            group.append(torch.tensor([7, 8]))
        width = inputs["input_ids"].shape[1] - text_ids.shape[1]
        clean.join(alone, pad)
        positions = clean.model_kwargs["position_ids"]
        assert positions.shape == (4, 4, inputs["input_ids"].shape[1] + 1)
        assert torch.equal(positions[:, 2:, width:], reference.model_kwargs["position_ids"])
        assert not positions[:, 2:, :width].any()
        assert not clean.model_kwargs["mm_token_type_ids"][2:].any()
        both, own = clean.forward(), reference.forward()
    assert torch.allclose(both.logits[2:, -1], own.logits[:, -1], atol=1e-5)


def test_deepstack_features_are_batched_layer_by_layer():
    """Qwen3-VL: two streams with the clean prompt and their own encoder outputs (DeepStack rows zeroed in
    the second) prefilled in one batch give each stream's own logits: the per-layer DeepStack lists are
    joined layer by layer (end to end they would not even fit the image tokens)."""
    from medheval.backends.tiny_families import build_tiny
    from medheval.mitigations.image_masking import mask_deepstack_features
    from test_mitigations_families import _inputs as family_inputs

    model, processor = build_tiny("qwen3_vl")
    processor.tokenizer.padding_side = "left"
    inputs = family_inputs(processor, [0, 2])
    with torch.no_grad():
        encoded = model.model.get_image_features(pixel_values=inputs["pixel_values"],
                                                 image_grid_thw=inputs["image_grid_thw"], return_dict=True)
    features = list(encoded.pooler_output)
    keep = [torch.zeros(f.shape[0], dtype=torch.bool) for f in features]
    clean = type(encoded)(pooler_output=features, deepstack_features=encoded.deepstack_features)
    masked = type(encoded)(pooler_output=features,
                           deepstack_features=mask_deepstack_features(encoded.deepstack_features, keep, "zeros"))
    grid, types = inputs["image_grid_thw"], {"mm_token_type_ids": inputs["mm_token_type_ids"]}
    ids, mask = inputs["input_ids"], inputs["attention_mask"]
    streams = [Stream(name, ids, mask, {"mm_encoder_outputs": {"image": out}, "image_grid_thw": grid})
               for name, out in (("main", clean), ("masked", masked))]
    group = StreamGroup(model, streams, common_kwargs=types)
    with torch.no_grad():
        both = group.forward().logits[:, -1]
        direct = {name: model(input_ids=ids, attention_mask=mask, image_grid_thw=grid, **types,
                              mm_encoder_outputs={"image": out}).logits[:, -1]
                  for name, out in (("main", clean), ("masked", masked))}
        plain = model(**inputs).logits[:, -1]
    assert torch.allclose(direct["main"], plain, atol=1e-5)
    assert (direct["main"] - direct["masked"]).abs().max() > 1e-3  # the DeepStack rows matter
    assert torch.allclose(both[group.rows("main")], direct["main"], atol=1e-5)
    assert torch.allclose(both[group.rows("masked")], direct["masked"], atol=1e-5)
