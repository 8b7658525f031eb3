"""Tiny random-weight models of every family the papers evaluate, built in-process (no downloads).

``build_tiny(family)`` returns ``(model, processor)`` for:

========== ============================================ =======================================
family     model class (``AutoModelForImageTextToText``) image placeholder in the prompt
========== ============================================ =======================================
llava      ``LlavaForConditionalGeneration``            ``<image>`` (LLaVA-1.5 / LLaVA-Med HF)
llava_next ``LlavaNextForConditionalGeneration``        ``<image>`` (any-resolution tiles)
qwen2_5_vl ``Qwen2_5_VLForConditionalGeneration``       ``<|vision_start|><|image_pad|><|vision_end|>``
qwen3_vl   ``Qwen3VLForConditionalGeneration``          ``<|vision_start|><|image_pad|><|vision_end|>``
gemma3     ``Gemma3ForConditionalGeneration``           ``<start_of_image>`` (Gemma 3, MedGemma)
internvl   ``InternVLForConditionalGeneration``         ``<IMG_CONTEXT>`` (InternVL 3/3.5 HF)
idefics3   ``Idefics3ForConditionalGeneration``         ``<image>`` (Idefics3)
smolvlm    ``SmolVLMForConditionalGeneration``          ``<image>`` (SmolVLM; its processor needs num2words)
========== ============================================ =======================================

Each is the family's real transformers model and processor classes at toy size: a 2–3 layer text
model over the word-level medical vocabulary of :mod:`medheval.backends.tiny` (plus the family's
special tokens), a 1–2 layer vision tower, the family's image processor (PIL backend) at a few
dozen pixels, and a short chat template of our own that places image markers and text the way
the family's real template does (real checkpoints bring their own). The processor expands each
placeholder into the family's image-token run, so the rendered prompt, left padding, the extra
image tensors (``image_grid_thw``, ``pixel_attention_mask``, ``image_sizes``, ``token_type_ids``)
and ``generate`` go through the same code as the real checkpoints.

As for the tiny LLaVA, the output rows of special tokens are zeroed (random weights never pick
them, so every answer is ``max_new_tokens`` words) and ``config.medheval_random_weights`` is set.
"""

from __future__ import annotations

import os
from types import SimpleNamespace
from typing import Any, Callable

import torch

from medheval.backends.tiny import CHAT_TEMPLATE as LLAVA_CHAT_TEMPLATE
from medheval.backends.tiny import IMAGE_SIZE, PATCH_SIZE, SPECIAL_TOKENS, build_tiny_tokenizer, finish_random_model

# Our own minimal chat templates (images first, then text, as in each family's real template).
_CONTENT = (
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}"
    "{% if part['type'] == 'image' %}{{ IMAGE }}{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
)

# ChatML (Qwen2.5-VL, Qwen3-VL, InternVL): <|im_start|>role\n...<|im_end|>\n
_CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n" + _CONTENT + "<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
QWEN_CHAT_TEMPLATE = _CHATML.replace("{{ IMAGE }}", "<|vision_start|><|image_pad|><|vision_end|>")
INTERNVL_CHAT_TEMPLATE = _CHATML.replace("{{ IMAGE }}", "<IMG_CONTEXT>\n")

# Gemma 3: BOS in the template; a system turn is folded into the first user turn; the reply role is "model".
GEMMA3_CHAT_TEMPLATE = (
    "{{ bos_token }}{% set system = namespace(text='') %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'system' %}{% set system.text = (message['content'] if message['content'] is string"
    " else message['content'][0]['text']) + '\n\n' %}"
    "{% else %}<start_of_turn>{{ 'model' if message['role'] == 'assistant' else message['role'] }}\n"
    "{% if message['role'] == 'user' %}{{ system.text }}{% set system.text = '' %}{% endif %}"
    + _CONTENT.replace("{{ IMAGE }}", "<start_of_image>") + "<end_of_turn>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)

# Idefics3 / SmolVLM: BOS, "User:<image>text<end_of_utterance>\n", generation prompt "Assistant:".
IDEFICS3_CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{{ message['role'] | capitalize }}:"
    + _CONTENT.replace("{{ IMAGE }}", "<image>") + "<end_of_utterance>\n{% endfor %}"
    "{% if add_generation_prompt %}Assistant:{% endif %}"
)

_CHATML_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<unk>")


def _text_config(tokenizer, model_type: str, **overrides: Any) -> dict:
    config = {
        "model_type": model_type, "vocab_size": len(tokenizer), "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 1024,
        "initializer_range": 0.2, "bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id, "tie_word_embeddings": False,
    }
    config.update(overrides)
    return config


def _finish(model, tokenizer, special_tokens: tuple[str, ...], name: str):
    """Eval mode, float32; special tokens never win; generation config from the tokenizer; random-weights flag."""
    model = finish_random_model(model.to(torch.float32).eval(), tokenizer, special_tokens)
    model.config.name_or_path = name
    return model


def _seeded(model_class, config, seed: int):
    rng = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        return model_class(config)
    finally:
        torch.random.set_rng_state(rng)


def _clip_vision(**overrides: Any) -> dict:
    config = {
        "model_type": "clip_vision_model", "image_size": IMAGE_SIZE, "patch_size": PATCH_SIZE, "hidden_size": 32,
        "intermediate_size": 64, "projection_dim": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
        "initializer_range": 0.2,
    }
    config.update(overrides)
    return config


def build_tiny_llava_next(seed: int = 0):
    """LLaVA-NeXT: the tiny LLaVA tokenizer and template; a 30x30 CLIP tower with 6x6 patches and
    any-resolution pinpoints up to 60x90, so images of different shapes get different numbers of tiles
    and image tokens (base + tiles + row newlines); grouped-query attention and 3 text layers."""
    from transformers import LlavaNextConfig, LlavaNextForConditionalGeneration, LlavaNextProcessor

    try:
        from transformers import LlavaNextImageProcessorPil as ImageProcessor
    except ImportError:  # pragma: no cover
        from transformers import LlavaNextImageProcessor as ImageProcessor

    tokenizer = build_tiny_tokenizer()
    pinpoints = [[30, 30], [30, 60], [60, 30], [60, 60], [30, 90], [90, 30]]
    image_processor = ImageProcessor(
        size={"shortest_edge": IMAGE_SIZE}, crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE},
        image_grid_pinpoints=pinpoints,
    )
    processor = LlavaNextProcessor(
        image_processor=image_processor, tokenizer=tokenizer, patch_size=PATCH_SIZE,
        vision_feature_select_strategy="default", num_additional_image_tokens=1, chat_template=LLAVA_CHAT_TEMPLATE,
    )
    config = LlavaNextConfig(
        text_config=_text_config(tokenizer, "llama", num_hidden_layers=3, max_position_embeddings=512),
        vision_config=_clip_vision(),
        image_token_index=tokenizer.convert_tokens_to_ids("<image>"), image_grid_pinpoints=pinpoints,
        vision_feature_select_strategy="default", vision_feature_layer=-1, projector_hidden_act="gelu",
    )
    model = _seeded(LlavaNextForConditionalGeneration, config, seed)
    return _finish(model, tokenizer, SPECIAL_TOKENS, "tiny-random-llava-next"), processor


def _without_video(processor_class):
    """``processor_class`` minus its video processor: transformers' video processors need torchvision, which
    these image-only tiny models do without (a real checkpoint's processor loads with torchvision installed).
    The subclass keeps the family's image and text handling unchanged."""

    class ImageOnlyProcessor(processor_class):
        @classmethod
        def get_attributes(cls):
            return [name for name in super().get_attributes() if name != "video_processor"]

    ImageOnlyProcessor.__name__ = ImageOnlyProcessor.__qualname__ = f"Tiny{processor_class.__name__}"
    return ImageOnlyProcessor


def _qwen_tokenizer():
    tokens = _CHATML_TOKENS + ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
    tokenizer = build_tiny_tokenizer(tokens, bos_token=None, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                     add_bos=False)
    return tokenizer, tokens


def _qwen_image_processor(patch_size: int):
    try:
        from transformers import Qwen2VLImageProcessorPil as ImageProcessor
    except ImportError:  # pragma: no cover
        from transformers import Qwen2VLImageProcessor as ImageProcessor

    # 2x2 merge of 4x4 patches: a 30x30 image becomes 32x32, an 8x8 grid, 16 image tokens.
    factor = patch_size * 2
    return ImageProcessor(patch_size=patch_size, merge_size=2, temporal_patch_size=2,
                          size={"shortest_edge": (2 * factor) ** 2, "longest_edge": (6 * factor) ** 2})


def _qwen_ids(tokenizer) -> dict:
    ids = tokenizer.convert_tokens_to_ids
    return {"image_token_id": ids("<|image_pad|>"), "video_token_id": ids("<|video_pad|>"),
            "vision_start_token_id": ids("<|vision_start|>"), "vision_end_token_id": ids("<|vision_end|>")}


def build_tiny_qwen2_5_vl(seed: int = 0):
    """Qwen2.5-VL: ChatML template, 4x4 patches merged 2x2, 3D (M-RoPE) positions, windowed vision attention."""
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2_5_VLProcessor

    tokenizer, tokens = _qwen_tokenizer()
    processor = _without_video(Qwen2_5_VLProcessor)(image_processor=_qwen_image_processor(4), tokenizer=tokenizer,
                                    chat_template=QWEN_CHAT_TEMPLATE)
    text = _text_config(tokenizer, "qwen2_5_vl_text",
                        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]})
    vision = {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 4, "patch_size": 4,
              "spatial_merge_size": 2, "temporal_patch_size": 2, "window_size": 16, "out_hidden_size": 64,
              "fullatt_block_indexes": [1], "initializer_range": 0.2}
    config = Qwen2_5_VLConfig(text_config=text, vision_config=vision, **_qwen_ids(tokenizer))
    model = _seeded(Qwen2_5_VLForConditionalGeneration, config, seed)
    return _finish(model, tokenizer, tokens, "tiny-random-qwen2.5-vl"), processor


def build_tiny_qwen3_vl(seed: int = 0):
    """Qwen3-VL: as Qwen2.5-VL, plus interleaved M-RoPE, learned vision positions and DeepStack features."""
    from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration, Qwen3VLProcessor

    tokenizer, tokens = _qwen_tokenizer()
    processor = _without_video(Qwen3VLProcessor)(image_processor=_qwen_image_processor(4), tokenizer=tokenizer,
                                 chat_template=QWEN_CHAT_TEMPLATE)
    text = _text_config(tokenizer, "qwen3_vl_text", head_dim=16,
                        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3],
                                         "mrope_interleaved": True})
    vision = {"depth": 2, "hidden_size": 32, "intermediate_size": 64, "num_heads": 4, "patch_size": 4,
              "spatial_merge_size": 2, "temporal_patch_size": 2, "out_hidden_size": 64,
              "num_position_embeddings": 64, "deepstack_visual_indexes": [0], "initializer_range": 0.2}
    config = Qwen3VLConfig(text_config=text, vision_config=vision, **_qwen_ids(tokenizer))
    model = _seeded(Qwen3VLForConditionalGeneration, config, seed)
    return _finish(model, tokenizer, tokens, "tiny-random-qwen3-vl"), processor


def build_tiny_gemma3(seed: int = 0):
    """Gemma 3 / MedGemma: SigLIP tower on 28x28 images (7x7 patches, 16 patches pooled to 4 soft tokens),
    BOS in the chat template, bidirectional attention over each image's tokens, sliding-window layers."""
    from transformers import Gemma3Config, Gemma3ForConditionalGeneration, Gemma3Processor

    try:
        from transformers import Gemma3ImageProcessorPil as ImageProcessor
    except ImportError:  # pragma: no cover
        from transformers import Gemma3ImageProcessor as ImageProcessor

    tokens = ("<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>",
              "<end_of_image>", "<image_soft_token>")
    tokenizer = build_tiny_tokenizer(
        tokens, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
        named_tokens={"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>",
                      "image_token": "<image_soft_token>"})
    mm_tokens = 4
    processor = Gemma3Processor(image_processor=ImageProcessor(size={"height": 28, "width": 28}),
                                tokenizer=tokenizer, image_seq_length=mm_tokens, chat_template=GEMMA3_CHAT_TEMPLATE)
    text = _text_config(tokenizer, "gemma3_text", head_dim=16, query_pre_attn_scalar=16, sliding_window=8,
                        layer_types=["sliding_attention", "full_attention"], hidden_activation="gelu_pytorch_tanh")
    vision = {"model_type": "siglip_vision_model", "image_size": 28, "patch_size": 7, "hidden_size": 32,
              "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4}
    ids = tokenizer.convert_tokens_to_ids
    config = Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=mm_tokens,
                          boi_token_index=ids("<start_of_image>"), eoi_token_index=ids("<end_of_image>"),
                          image_token_index=ids("<image_soft_token>"), initializer_range=0.2,
                          tie_word_embeddings=False)
    model = _seeded(Gemma3ForConditionalGeneration, config, seed)
    # transformers initialises the projector's weight to zeros: the image would have no effect at all
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        weight = model.model.multi_modal_projector.mm_input_projection_weight
        weight.copy_(torch.randn(weight.shape, generator=generator) * 0.2)
    return _finish(model, tokenizer, tokens, "tiny-random-gemma3"), processor


def build_tiny_internvl(seed: int = 0):
    """InternVL 3 / 3.5 (HF format): InternViT on 28x28 images (7x7 patches, pixel-shuffled 2x2 -> 4 tokens),
    Qwen2 text model, ChatML template with one ``<IMG_CONTEXT>`` per image; the processor tiles as for the real
    checkpoints (28x28 tiles plus a thumbnail for a non-square image), one ``<img>...</img>`` run per image."""
    from transformers import InternVLConfig, InternVLForConditionalGeneration, InternVLProcessor

    try:
        from transformers import GotOcr2ImageProcessorPil as ImageProcessor
    except ImportError:  # pragma: no cover
        from transformers import GotOcr2ImageProcessor as ImageProcessor

    tokens = _CHATML_TOKENS + ("<img>", "</img>", "<IMG_CONTEXT>", "<video>")
    tokenizer = build_tiny_tokenizer(
        tokens, bos_token=None, eos_token="<|im_end|>", pad_token="<|endoftext|>", add_bos=False,
        named_tokens={"start_image_token": "<img>", "end_image_token": "</img>",
                      "context_image_token": "<IMG_CONTEXT>", "video_token": "<video>"})
    image_seq_length = (28 // 7) ** 2 // 4
    processor = _without_video(InternVLProcessor)(
        image_processor=ImageProcessor(size={"height": 28, "width": 28}, crop_to_patches=False),
        tokenizer=tokenizer, image_seq_length=image_seq_length, chat_template=INTERNVL_CHAT_TEMPLATE)
    vision = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 64,
              "image_size": [28, 28], "patch_size": [7, 7], "initializer_range": 0.2}
    config = InternVLConfig(vision_config=vision, text_config=_text_config(tokenizer, "qwen2"),
                            image_token_id=tokenizer.convert_tokens_to_ids("<IMG_CONTEXT>"),
                            image_seq_length=image_seq_length, downsample_ratio=0.5, tie_word_embeddings=False)
    model = _seeded(InternVLForConditionalGeneration, config, seed)
    return _finish(model, tokenizer, tokens, "tiny-random-internvl"), processor


def _idefics_family(seed: int, smolvlm: bool):
    """Idefics3 or SmolVLM (the same architecture, separate classes): SigLIP-style tower on 28x28 images
    (7x7 patches, pixel-shuffled 2x2 -> 4 tokens), image splitting off, ``pixel_attention_mask`` for padded
    images, BOS in the template. The SmolVLM processor is built without its video part (torchvision);
    its chat-template call reads the video defaults (``num_frames``, ``fps``), unused for images, so they
    are ``None`` here."""
    import transformers

    prefix = "SmolVLM" if smolvlm else "Idefics3"
    image_processor_class = getattr(transformers, f"{prefix}ImageProcessorPil", None) or getattr(
        transformers, f"{prefix}ImageProcessor")
    tokens = ("<|begin_of_text|>", "<|end_of_text|>", "<pad>", "<unk>", "<image>", "<fake_token_around_image>",
              "<global-img>", "<end_of_utterance>")
    tokenizer = build_tiny_tokenizer(tokens, bos_token="<|begin_of_text|>", eos_token="<end_of_utterance>",
                                     pad_token="<pad>")
    image_processor = image_processor_class(do_image_splitting=False, size={"longest_edge": 28},
                                            max_image_size={"longest_edge": 28})
    kwargs = dict(image_processor=image_processor, tokenizer=tokenizer, image_seq_len=4,
                  chat_template=IDEFICS3_CHAT_TEMPLATE)
    if smolvlm:
        processor = _without_video(transformers.SmolVLMProcessor)(video_processor=None, **kwargs)
        processor.video_processor = SimpleNamespace(num_frames=None, fps=None)
    else:
        processor = transformers.Idefics3Processor(**kwargs)
    vision = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
              "image_size": 28, "patch_size": 7, "initializer_range": 0.2}
    config = getattr(transformers, f"{prefix}Config")(
        vision_config=vision, text_config=_text_config(tokenizer, "llama"),
        image_token_id=tokenizer.convert_tokens_to_ids("<image>"), scale_factor=2, tie_word_embeddings=False)
    model = _seeded(getattr(transformers, f"{prefix}ForConditionalGeneration"), config, seed)
    return _finish(model, tokenizer, tokens, f"tiny-random-{prefix.lower()}"), processor


def build_tiny_idefics3(seed: int = 0):
    """Idefics3 (:func:`_idefics_family`)."""
    return _idefics_family(seed, smolvlm=False)


def build_tiny_smolvlm(seed: int = 0):
    """SmolVLM (:func:`_idefics_family`; its processor needs ``num2words``)."""
    return _idefics_family(seed, smolvlm=True)


def _build_llava(seed: int = 0):
    from medheval.backends.tiny import build_tiny_llava

    return build_tiny_llava(seed=seed)


BUILDERS: dict[str, Callable[..., tuple[Any, Any]]] = {
    "llava": _build_llava,
    "llava_next": build_tiny_llava_next,
    "qwen2_5_vl": build_tiny_qwen2_5_vl,
    "qwen3_vl": build_tiny_qwen3_vl,
    "gemma3": build_tiny_gemma3,
    "internvl": build_tiny_internvl,
    "idefics3": build_tiny_idefics3,
    "smolvlm": build_tiny_smolvlm,
}
FAMILIES = tuple(BUILDERS)
_IMAGE_ONLY_PROCESSORS = ("qwen2_5_vl", "qwen3_vl", "internvl", "smolvlm")  # built with _without_video


def build_tiny(family: str, seed: int = 0, save_dir: str | os.PathLike | None = None):
    """``(model, processor)`` of the tiny random-weight ``family`` (one of :data:`FAMILIES`).

    ``seed`` seeds the weights (same seed, same model); ``save_dir``: ``save_pretrained`` model and
    processor there, so ``HFBackend(save_dir)`` / ``medheval run --model save_dir`` load them through
    ``AutoModelForImageTextToText`` / ``AutoProcessor`` (not for the Qwen, InternVL and SmolVLM families,
    whose tiny processors lack the video part a saved folder needs).
    """
    try:
        builder = BUILDERS[family]
    except KeyError:
        raise ValueError(f"unknown tiny model family {family!r}; use one of {', '.join(FAMILIES)}") from None
    if save_dir is not None and family in _IMAGE_ONLY_PROCESSORS:
        raise ValueError(
            f"build_tiny({family!r}, save_dir=...): the tiny {family} processor has no video processor (transformers "
            "builds those only with torchvision), so AutoProcessor could not load it back from the folder; build it "
            "in memory and pass model and processor to HFBackend")
    model, processor = builder(seed=seed)
    if save_dir is not None:
        os.makedirs(save_dir, exist_ok=True)
        model.save_pretrained(save_dir)
        processor.save_pretrained(save_dir)
    return model, processor


__all__ = ["BUILDERS", "FAMILIES", "build_tiny", "build_tiny_llava_next"]
