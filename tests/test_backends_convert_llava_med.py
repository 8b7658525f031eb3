"""LLaVA-Med v1.5 original checkpoint -> HF LLaVA, on a tiny checkpoint written in the original key layout.

The reference is an independent computation of the original model: the text weights loaded under their
original names into ``MistralForCausalLM`` (strict), the CLIP weights into ``CLIPVisionModel``, the
``mm_projector`` as Linear-GELU-Linear, image features (layer -2, CLS dropped) spliced in where the image
placeholder stands. The converted folder, loaded with ``AutoModelForImageTextToText``, must give the
same logits over the original vocabulary.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from medheval.backends.tiny import build_tiny_tokenizer
from medheval.backends.convert_llava_med import ConversionError, convert, main, rename_key

VISION = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
          "image_size": 30, "patch_size": 6, "projection_dim": 16, "hidden_act": "quick_gelu"}
PREFIX = "model.vision_tower.vision_tower.vision_model."


def _tiny_parts(seed: int = 0):
    from transformers import CLIPVisionConfig, CLIPVisionModel, MistralConfig, MistralForCausalLM

    tokenizer = build_tiny_tokenizer(("<unk>", "<s>", "</s>", "[INST]", "[/INST]"), pad_token=None)
    text_config = MistralConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                                sliding_window=None, bos_token_id=tokenizer.bos_token_id,
                                eos_token_id=tokenizer.eos_token_id, initializer_range=0.2)
    torch.manual_seed(seed)
    text = MistralForCausalLM(text_config).eval()
    vision = CLIPVisionModel(CLIPVisionConfig(**VISION, initializer_range=0.2)).eval()
    projector = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 64)).eval()
    return tokenizer, text, vision, projector


def _original_config(text, vision_tower: str = "tiny/clip-test") -> dict:
    config = {k: v for k, v in text.config.to_dict().items() if k in (
        "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads", "hidden_act", "max_position_embeddings", "rms_norm_eps", "rope_theta",
        "sliding_window", "bos_token_id", "eos_token_id", "tie_word_embeddings")}
    if "rope_theta" not in config:
        config["rope_theta"] = text.config.rope_parameters["rope_theta"]
    config.update(architectures=["LlavaMistralForCausalLM"], model_type="llava_mistral", mm_hidden_size=32,
                  mm_projector_type="mlp2x_gelu", mm_vision_select_layer=-2, mm_vision_select_feature="patch",
                  image_aspect_ratio="pad", mm_vision_tower=vision_tower, mm_use_im_start_end=False,
                  mm_use_im_patch_token=False, torch_dtype="float32")
    return config


def _write_original(folder, *, with_vision: bool = True, extra: dict | None = None, drop: str | None = None):
    """A tiny checkpoint in LLaVA-Med v1.5's own layout (keys, config fields, tokenizer without <image>)."""
    from safetensors.torch import save_file

    tokenizer, text, vision, projector = _tiny_parts()
    state = dict(text.state_dict())
    state.update({f"model.mm_projector.{k}": v for k, v in projector.state_dict().items()})
    if with_vision:
        state.update({PREFIX + k: v for k, v in vision.state_dict().items()})
        state[PREFIX + "embeddings.position_ids"] = torch.arange(26)[None]  # an old-transformers buffer
    state.update(extra or {})
    state.pop(drop, None)
    folder.mkdir(parents=True, exist_ok=True)
    half = len(state) // 2  # two shards, as the real checkpoint has several
    keys = list(state)
    save_file({k: state[k].contiguous() for k in keys[:half]}, str(folder / "model-00001-of-00002.safetensors"))
    save_file({k: state[k].contiguous() for k in keys[half:]}, str(folder / "model-00002-of-00002.safetensors"))
    (folder / "config.json").write_text(json.dumps(_original_config(text)))
    tokenizer.save_pretrained(folder)
    return tokenizer, text, vision, projector


def _clip_config(folder):
    """A folder with only the tiny CLIP's config.json (its shape is not one the converter knows by name)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({"model_type": "clip", "vision_config": {
        "model_type": "clip_vision_model", **VISION}}))
    return folder


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    root = tmp_path_factory.mktemp("llava_med")
    parts = _write_original(root / "original")
    convert(root / "original", root / "hf", vision_tower=_clip_config(root / "clip"))
    return root, parts


def _image(size=(30, 30), seed=0):
    return Image.fromarray(np.random.RandomState(seed).randint(0, 255, (*size, 3), dtype=np.uint8))


def test_rename_key_maps_every_original_family():
    assert rename_key("model.embed_tokens.weight") == "model.language_model.embed_tokens.weight"
    assert (rename_key("model.layers.31.self_attn.q_proj.weight")
            == "model.language_model.layers.31.self_attn.q_proj.weight")
    assert rename_key("model.norm.weight") == "model.language_model.norm.weight"
    assert rename_key("lm_head.weight") == "lm_head.weight"
    assert rename_key("model.mm_projector.0.bias") == "model.multi_modal_projector.linear_1.bias"
    assert rename_key("model.mm_projector.2.weight") == "model.multi_modal_projector.linear_2.weight"
    assert (rename_key(PREFIX + "encoder.layers.23.mlp.fc1.weight")
            == "model.vision_tower.encoder.layers.23.mlp.fc1.weight")
    assert rename_key("model.mm_projector.1.weight") is None and rename_key("model.image_newline") is None


def test_converted_config_and_tokenizer(converted):
    from transformers import AutoConfig, AutoProcessor, GenerationConfig

    root, (tokenizer, text, _, _) = converted
    config = AutoConfig.from_pretrained(root / "hf")
    processor = AutoProcessor.from_pretrained(root / "hf")
    image_id = processor.tokenizer.convert_tokens_to_ids("<image>")
    assert config.model_type == "llava" and config.text_config.model_type == "mistral"
    assert config.vision_config.model_type == "clip_vision_model" and config.vision_config.image_size == 30
    assert (config.vision_feature_layer, config.vision_feature_select_strategy) == (-2, "default")
    assert config.image_token_index == image_id == len(tokenizer)  # appended after the original vocabulary
    assert config.text_config.vocab_size == len(tokenizer) + 1
    assert GenerationConfig.from_pretrained(root / "hf").suppress_tokens == [image_id]
    assert processor.image_processor.do_pad is True


def test_logits_equal_the_original_computation(converted):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    root, (tokenizer, text, vision, projector) = converted
    model = AutoModelForImageTextToText.from_pretrained(root / "hf", dtype=torch.float32).eval()
    processor = AutoProcessor.from_pretrained(root / "hf")
    messages = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "is there a nodule ?"}]}]
    prompt = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    inputs = processor(text=[prompt], images=[_image((30, 40))], return_tensors="pt")
    image_id = model.config.image_token_index
    positions = (inputs["input_ids"][0] == image_id).nonzero().flatten()
    assert len(positions) == 25  # (30 / 6)^2 patches, CLS dropped
    with torch.no_grad():
        got = model(**inputs).logits[0, :, : len(tokenizer)]
        feats = vision(inputs["pixel_values"], output_hidden_states=True).hidden_states[-2][:, 1:]
        embeds = text.model.embed_tokens(inputs["input_ids"].clamp(max=len(tokenizer) - 1))
        embeds[0, positions] = projector(feats)[0]
        want = text(inputs_embeds=embeds).logits[0]
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # the added <image> row never wins: its logit is the mean of the others
    full = model(**inputs).logits[0]
    assert torch.allclose(full[:, image_id], full[:, : len(tokenizer)].mean(-1), atol=1e-4)


def test_prompt_is_llava_med_mistral_instruct_and_pad_to_square(converted):
    from medheval.backends.hf import HFBackend

    root, _ = converted
    backend = HFBackend(str(root / "hf"), max_new_tokens=3)
    record = {"id": "q1", "question": "Is the heart enlarged?", "answer_type": "yes_no"}
    assert backend.format_prompt(record, 1) == "[INST] <image>\nIs the heart enlarged? Please answer Yes or No. [/INST]"
    assert backend.format_chat("Be brief.", "Any effusion?", "", 1) == (
        "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\n<image>\nAny effusion? [/INST]")
    # image_aspect_ratio "pad": a 30x40 image is padded to 40x40 with the CLIP mean colour, then resized
    processor = backend.processor
    tall = _image((40, 30), seed=3)
    mean = tuple(int(x * 255) for x in processor.image_processor.image_mean)
    square = Image.new("RGB", (40, 40), mean)
    square.paste(tall, (5, 0))
    got = processor.image_processor(tall, return_tensors="pt")["pixel_values"]
    want = processor.image_processor(square, do_pad=False, return_tensors="pt")["pixel_values"]
    torch.testing.assert_close(got, want)
    out = backend.generate([record], [[tall]])
    assert len(out) == 1 and isinstance(out[0], str) and out[0]


def test_vision_tower_from_a_separate_clip_folder(tmp_path):
    """Checkpoints without the CLIP weights: --vision-tower gives them (CLIPModel layout, text tower ignored)."""
    from safetensors.torch import save_file
    from transformers import AutoModelForImageTextToText

    tokenizer, text, vision, projector = _write_original(tmp_path / "original", with_vision=False)
    with pytest.raises(ConversionError, match="no vision tower weights.*--vision-tower.*tiny/clip-test"):
        convert(tmp_path / "original", tmp_path / "hf")
    clip = _clip_config(tmp_path / "clip")
    state = {f"vision_model.{k}": v for k, v in vision.state_dict().items()}
    state.update({"text_model.embeddings.token_embedding.weight": torch.zeros(4, 8), "logit_scale": torch.ones(())})
    save_file(state, str(clip / "model.safetensors"))
    assert main([str(tmp_path / "original"), str(tmp_path / "hf"), "--vision-tower", str(clip)]) == 0
    model = AutoModelForImageTextToText.from_pretrained(tmp_path / "hf", dtype=torch.float32)
    got = model.model.vision_tower.state_dict()
    assert all(torch.equal(got[k], v) for k, v in vision.state_dict().items())


def test_unknown_and_missing_keys_are_named(tmp_path, capsys):
    clip = _clip_config(tmp_path / "clip")
    _write_original(tmp_path / "a", extra={"model.image_newline": torch.zeros(64)})
    with pytest.raises(ConversionError, match="model.image_newline"):
        convert(tmp_path / "a", tmp_path / "out_a", vision_tower=clip)
    _write_original(tmp_path / "b", drop="model.layers.1.mlp.up_proj.weight")
    assert main([str(tmp_path / "b"), str(tmp_path / "out_b"), "--vision-tower", str(clip)]) == 2
    assert "missing model.language_model.layers.1.mlp.up_proj.weight" in capsys.readouterr().err
    assert not (tmp_path / "out_b").exists()
    with pytest.raises(ConversionError, match="no config.json"):
        convert(tmp_path / "nowhere", tmp_path / "out_c")
    # an unknown tower name without --vision-tower; a known name (24 CLIP layers) the 2-layer weights contradict
    with pytest.raises(ConversionError, match="mm_vision_tower is 'tiny/clip-test'.*--vision-tower"):
        convert(tmp_path / "b", tmp_path / "out_d")
    config = json.loads((tmp_path / "b" / "config.json").read_text())
    config["mm_vision_tower"] = "openai/clip-vit-large-patch14-336"
    (tmp_path / "b" / "config.json").write_text(json.dumps(config))
    _write_original(tmp_path / "e")
    (tmp_path / "e" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConversionError, match=r"missing model\.vision_tower\.encoder\.layers\.\d+\."):
        convert(tmp_path / "e", tmp_path / "out_e")


def test_shape_mismatch_names_the_weight(tmp_path):
    folder = tmp_path / "clip"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({**VISION, "model_type": "clip_vision_model",
                                                    "intermediate_size": 48}))
    _write_original(tmp_path / "original")
    with pytest.raises(ConversionError, match=r"weight model\.vision_tower\.encoder\.layers\.0\.mlp\.fc1\.weight: "
                                              r"shape \(64, 32\) in the checkpoint, \(48, 32\) expected"):
        convert(tmp_path / "original", tmp_path / "hf", vision_tower=folder)


# --- the MedHEval protocols' grey canvas for grayscale images (medheval.backends.grey_padding) ------------------


def _stored(tmp_path, name: str, image: Image.Image):
    """``image`` written as a PNG in its own mode and read back through the resolver (decoded as RGB)."""
    from medheval.data.images import ImageResolver

    image.save(tmp_path / name)
    return ImageResolver({"cxr": str(tmp_path)}).open("cxr", name)


def test_grayscale_canvas_known_answer(tmp_path):
    """CLIP's mean (0.48145466, 0.4578275, 0.40821073) averages 0.449164, × 255 = 114.54: grey 114, where the RGB
    canvas is (122, 116, 104). A 4-wide, 2-high grayscale image sits on rows 1-2 of a 4 × 4 grey square."""
    from medheval.backends.grey_padding import grey_for, pad_grayscale
    from medheval.data.images import SOURCE_MODE

    clip = (0.48145466, 0.4578275, 0.40821073)
    assert grey_for(clip) == 114 and tuple(int(255 * m) for m in clip) == (122, 116, 104)
    pixels = np.array([[10, 20, 30, 40], [50, 60, 70, 80]], dtype=np.uint8)
    wide = _stored(tmp_path, "wide.png", Image.fromarray(pixels, mode="L"))
    assert wide.mode == "RGB" and wide.info[SOURCE_MODE] == "L"
    got = np.asarray(pad_grayscale(wide, clip))
    assert got.shape == (4, 4, 3) and (got[..., 0] == got[..., 2]).all()
    assert got[..., 0].tolist() == [[114] * 4, [10, 20, 30, 40], [50, 60, 70, 80], [114] * 4]
    tall = _stored(tmp_path, "tall.png", Image.fromarray(pixels.T.copy(), mode="L"))  # 2 wide, 4 high: columns 1-2
    assert np.asarray(pad_grayscale(tall, clip))[..., 1].tolist() == [[114, 10, 50, 114], [114, 20, 60, 114],
                                                                       [114, 30, 70, 114], [114, 40, 80, 114]]
    colour = _stored(tmp_path, "colour.png", Image.fromarray(np.stack([pixels] * 3, -1)))
    assert colour.info[SOURCE_MODE] == "RGB" and pad_grayscale(colour, clip) is colour  # an RGB file: unchanged
    square = _stored(tmp_path, "square.png", Image.fromarray(np.zeros((3, 3), np.uint8), mode="L"))
    assert pad_grayscale(square, clip) is square
    made_here = Image.fromarray(np.stack([pixels] * 3, -1))  # no stored mode (a control's image): unchanged
    assert pad_grayscale(made_here, clip) is made_here


def _pixels_seen(backend, record, images):
    """The pixel_values the vision tower receives while ``backend`` answers ``record``."""
    seen = []
    tower = backend.model.model.vision_tower
    handle = tower.register_forward_pre_hook(lambda module, args, kwargs: seen.append(
        (args[0] if args else kwargs["pixel_values"]).detach().clone()), with_kwargs=True)
    try:
        backend.generate([record], [images])
    finally:
        handle.remove()
    return seen[0]


@pytest.mark.parametrize("prefix_cache", [False, True])
def test_medheval_protocols_give_llava_med_grayscale_images_its_grey_canvas(converted, tmp_path, prefix_cache):
    """Under medheval-baseline the converted LLaVA-Med model's vision tower gets a grayscale X-ray on the grey-114
    square, exactly what the processor makes of that square; under ``clean`` it gets the RGB-mean square (the HF
    processor's own padding); ``run.json`` records the difference, so a folder does not resume across it."""
    from medheval.backends.hf import HFBackend
    from medheval.run.paper_protocols import configure_backend, get_protocol

    root, _ = converted
    backend = HFBackend(str(root / "hf"), max_new_tokens=2, prefix_cache=prefix_cache)
    xray = _stored(tmp_path, "xray.png", Image.fromarray(
        np.random.RandomState(5).randint(0, 255, (40, 30), dtype=np.uint8), mode="L"))  # 30 wide, 40 high
    record = {"id": "q1", "question": "Is the heart enlarged?", "answer_type": "yes_no"}
    paper = configure_backend(backend, get_protocol("medheval-baseline"), chat_template="model")  # no upstream file
    assert (paper.grey_padding, paper.pads_grayscale(), backend.pads_grayscale()) == (True, True, False)
    assert paper.settings()["grey_padding"] is True and "grey_padding" not in backend.settings()
    assert configure_backend(backend, get_protocol("clean")) is backend

    grey = Image.new("RGB", (40, 40), (114, 114, 114))
    grey.paste(xray, (5, 0))
    want = backend.processor.image_processor(grey, do_pad=False, return_tensors="pt")["pixel_values"]
    torch.testing.assert_close(_pixels_seen(paper, record, [xray]), want)
    assert (paper._prefix_cache is not None and paper._prefix_cache.prefix_encodings == 1) == prefix_cache
    rgb_mean = backend.processor.image_processor(xray, return_tensors="pt")["pixel_values"]
    torch.testing.assert_close(_pixels_seen(backend, record, [xray]), rgb_mean)
    assert not torch.equal(want, rgb_mean)  # the padded band differs (0.12–0.14 in normalised units)
    colour = _image((40, 30), seed=3)  # an RGB image gets the RGB canvas under either
    torch.testing.assert_close(_pixels_seen(paper, record, [colour]), _pixels_seen(backend, record, [colour]))


def test_grey_padding_leaves_processors_without_a_square_canvas_alone(tmp_path):
    """The tiny LLaVA's CLIP processor resizes and crops without padding: the protocol's switch is on but there
    is no canvas to colour, so the images and the recorded settings are as under ``clean``."""
    from medheval.backends.hf import HFBackend
    from medheval.backends.tiny import build_tiny_llava
    from medheval.run.paper_protocols import configure_backend, get_protocol

    model, processor = build_tiny_llava(seed=0)
    backend = configure_backend(HFBackend(model, processor, max_new_tokens=2), get_protocol("medheval-mitigation"))
    xray = _stored(tmp_path, "xray.png", Image.fromarray(np.zeros((40, 30), np.uint8), mode="L"))
    assert backend.grey_padding and not backend.pads_grayscale()
    assert backend.model_images([xray])[0] is xray and "grey_padding" not in backend.settings()


def test_a_protocol_run_of_llava_med_records_the_grey_canvas(converted, fixture_benchmark, tmp_path, capsys):
    """``medheval run`` of the converted LLaVA-Med under medheval-baseline writes ``settings.backend.grey_padding``
    (what the Reproduction table checks for LLaVA-Med-1.5's cells); under ``clean`` the setting is absent, and that
    folder does not resume under the protocol."""
    from medheval.cli import main

    root, _ = converted
    roots = [a for s, r in fixture_benchmark["image_roots"].items() for a in ("--image-root", f"{s}={r}")]
    base = ["run", "--model", str(root / "hf"), "--benchmark", "mm_vishal:slake", "--data-dir",
            fixture_benchmark["data_dir"], *roots, "--limit", "2", "--max-new-tokens", "2", "--chat-template", "model"]
    paper, clean = tmp_path / "paper", tmp_path / "clean"
    assert main([*base, "--output", str(paper), "--protocol", "medheval-baseline"]) == 0, capsys.readouterr().err
    assert json.loads((paper / "results.json").read_text())["settings"]["backend"]["grey_padding"] is True
    assert main([*base, "--output", str(clean)]) == 0, capsys.readouterr().err
    assert "grey_padding" not in json.loads((clean / "results.json").read_text())["settings"]["backend"]
    capsys.readouterr()
    assert main([*base, "--output", str(clean), "--protocol", "medheval-baseline"]) == 2
    assert "this run asks for protocol 'medheval-baseline'" in capsys.readouterr().err
