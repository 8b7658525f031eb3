"""Convert an original LLaVA-Med v1.5 checkpoint to the Hugging Face LLaVA format.

``microsoft/llava-med-v1.5-mistral-7b`` ships in the LLaVA code base's own layout
(``LlavaMistralForCausalLM``), which ``transformers`` cannot load. This writes an equivalent
``LlavaForConditionalGeneration`` + ``LlavaProcessor`` directory that ``AutoModelForImageTextToText``,
:class:`medheval.backends.hf.HFBackend`, the mitigations and ``medheval run --model DIR`` use::

    python -m medheval.backends.convert_llava_med /path/to/llava-med-v1.5-mistral-7b /path/to/llava-med-v1.5-hf \\
        [--vision-tower /path/to/clip-vit-large-patch14-336]

Weights (original name -> HF name):

==================================================== =====================================================
``model.embed_tokens.weight``                        ``model.language_model.embed_tokens.weight`` (+1 row)
``model.layers.N.*``, ``model.norm.weight``          ``model.language_model.layers.N.*``, ``...norm.weight``
``lm_head.weight``                                   ``lm_head.weight`` (+1 row)
``model.mm_projector.0.*`` / ``model.mm_projector.2.*`` ``model.multi_modal_projector.linear_1.*`` / ``linear_2.*``
``model.vision_tower.vision_tower.vision_model.*``   ``model.vision_tower.*``
==================================================== =====================================================

The vision tower (CLIP ViT-L/14-336) is taken from the checkpoint, or, when the checkpoint lacks
it (its config only names ``mm_vision_tower``), from ``--vision-tower DIR`` (a CLIP or CLIP vision
checkpoint; its ``vision_model.*`` weights are used, the text tower is ignored). Unknown or missing
weights stop the conversion with their names; only buffers (``position_ids``, ``inv_freq``) are dropped.

Config: ``MistralConfig`` from the original text fields, ``CLIPVisionConfig`` (from ``--vision-tower``,
or the known CLIP-L/14(-336) shape named by ``mm_vision_tower``), ``mm_projector_type`` ``mlp2x_gelu``
-> ``projector_hidden_act="gelu"``, ``mm_vision_select_layer`` -> ``vision_feature_layer`` (-2), and
``mm_vision_select_feature="patch"`` -> ``vision_feature_select_strategy="default"`` (CLS dropped).

The original splices the image features in place of a ``-200`` id; the HF format needs a real
``<image>`` token, so one is added to the tokenizer and to both embedding matrices. Its new rows are
the mean of the existing rows, and ``generation_config.suppress_tokens`` forbids generating it, so
the converted model's next-token distribution over the original vocabulary is the original one.

Processor: ``image_aspect_ratio="pad"`` becomes ``LlavaImageProcessor(do_pad=True)`` (the image is
padded to a square with the CLIP mean colour, then resized to 336 and centre-cropped, as LLaVA's
``expand2square``); the chat template is LLaVA-Med's ``mistral_instruct`` conversation
(``[INST] <image>\\n{question} [/INST]``, BOS from the tokenizer, a system message as a LLaMA-2
``<<SYS>>`` block). MedHEval's baseline and mitigation scripts prompted with LLaVA's ``vicuna_v1``
conversation instead: ``medheval run --protocol medheval-baseline`` (or ``medheval-mitigation``) gives the
converted model that template, read from MedHEval's pinned ``conversation.py``
(:mod:`medheval.backends.conversation`), and ``--chat-template vicuna_v1`` does under any protocol; this
script's ``--chat-template FILE`` replaces the saved Jinja template itself.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import torch

IMAGE_TOKEN = "<image>"

# LLaVA-Med's "mistral_instruct" conversation (LLaMA-2 separators, empty default system): our template.
MISTRAL_INSTRUCT_TEMPLATE = (
    "{% set ns = namespace(system='') %}"
    "{% for message in messages %}"
    "{% if message['content'] is string %}{% set parts = [{'type': 'text', 'text': message['content']}] %}"
    "{% else %}{% set parts = message['content'] %}{% endif %}"
    "{% if message['role'] == 'system' %}"
    "{% set ns.system = '<<SYS>>\n' + (parts | selectattr('type', 'equalto', 'text') | map(attribute='text')"
    " | join(' ')) + '\n<</SYS>>\n\n' %}"
    "{% elif message['role'] == 'user' %}"
    "{{ '[INST] ' + ns.system }}{% set ns.system = '' %}"
    "{% for part in parts | selectattr('type', 'equalto', 'image') %}{{ '<image>\n' }}{% endfor %}"
    "{{ parts | selectattr('type', 'equalto', 'text') | map(attribute='text') | join(' ') }}{{ ' [/INST]' }}"
    "{% else %}"
    "{{ ' ' + (parts | selectattr('type', 'equalto', 'text') | map(attribute='text') | join(' ')) + ' ' + eos_token }}"
    "{% endif %}{% endfor %}"
)

# Vision towers named by ``mm_vision_tower`` whose shape we know (OpenAI CLIP ViT-L/14 and its 336-pixel variant).
KNOWN_VISION_TOWERS = {
    "openai/clip-vit-large-patch14-336": {"image_size": 336},
    "openai/clip-vit-large-patch14": {"image_size": 224},
}
_CLIP_L14 = {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24, "num_attention_heads": 16,
             "patch_size": 14, "projection_dim": 768, "hidden_act": "quick_gelu", "layer_norm_eps": 1e-5}

# Original config fields that go to the Mistral text config as they are.
_TEXT_FIELDS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "head_dim", "hidden_act", "max_position_embeddings", "rms_norm_eps",
                "rope_theta", "sliding_window", "attention_dropout", "bos_token_id", "eos_token_id",
                "tie_word_embeddings", "initializer_range")

# The original LLaVA code base's model types and the HF text model each wraps.
_TEXT_MODEL_TYPES = {"llava_mistral": "mistral", "llava_llama": "llama", "llava": "llama"}

_BUFFER = re.compile(r"(\.position_ids|\.rotary_emb\.inv_freq)$")
_TEXT = re.compile(r"^model\.(embed_tokens\.weight|norm\.weight|layers\.\d+\..+)$")
_PROJECTOR = re.compile(r"^model\.mm_projector\.([02])\.(weight|bias)$")
_VISION = "model.vision_tower.vision_tower.vision_model."
_CLIP_IGNORED = re.compile(r"^(text_model\.|text_projection\.|visual_projection\.|logit_scale$)")


class ConversionError(ValueError):
    """The checkpoint is not in the layout this converter knows; the message says what and where."""


def load_state_dict(folder: Path) -> dict[str, torch.Tensor]:
    """All tensors of a checkpoint folder (``*.safetensors`` shards, else ``pytorch_model*.bin``)."""
    files = sorted(folder.glob("*.safetensors"))
    if files:
        from safetensors.torch import load_file

        state: dict[str, torch.Tensor] = {}
        for file in files:
            state.update(load_file(str(file)))
        return state
    files = sorted(folder.glob("pytorch_model*.bin"))
    if not files:
        raise ConversionError(f"{folder}: no *.safetensors or pytorch_model*.bin weights found")
    state = {}
    for file in files:
        state.update(torch.load(file, map_location="cpu", weights_only=True))
    return state


def rename_key(key: str) -> str | None:
    """The HF ``LlavaForConditionalGeneration`` name of an original LLaVA-Med weight; ``None`` for an unknown one."""
    if key == "lm_head.weight":
        return key
    if match := _TEXT.match(key):
        return f"model.language_model.{match.group(1)}"
    if match := _PROJECTOR.match(key):
        linear = {"0": "linear_1", "2": "linear_2"}[match.group(1)]
        return f"model.multi_modal_projector.{linear}.{match.group(2)}"
    if key.startswith(_VISION):
        return "model.vision_tower." + key[len(_VISION):]
    return None


def rename_state_dict(original: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Original LLaVA-Med weights under HF names; a :class:`ConversionError` names every unknown key."""
    renamed, unknown = {}, []
    for key, tensor in original.items():
        if _BUFFER.search(key):
            continue
        new = rename_key(key)
        if new is None:
            unknown.append(key)
        else:
            renamed[new] = tensor
    if unknown:
        raise ConversionError(
            f"{len(unknown)} weight(s) not in the LLaVA-Med v1.5 layout (LlavaMistralForCausalLM with an mlp2x_gelu "
            f"projector and a CLIP tower): {', '.join(sorted(unknown)[:20])}{' ...' if len(unknown) > 20 else ''}")
    return renamed


def vision_tower_weights(folder: Path) -> dict[str, torch.Tensor]:
    """CLIP vision weights of a ``--vision-tower`` folder under HF names (``model.vision_tower.*``)."""
    weights, unknown = {}, []
    for key, tensor in load_state_dict(folder).items():
        if _BUFFER.search(key) or _CLIP_IGNORED.match(key):
            continue
        rest = key.removeprefix("vision_model.")
        if not rest.startswith(("embeddings.", "pre_layrnorm.", "encoder.", "post_layernorm.")):
            unknown.append(key)
            continue
        weights["model.vision_tower." + rest] = tensor
    if unknown:
        raise ConversionError(f"--vision-tower {folder}: weights that are not a CLIP vision tower: "
                              f"{', '.join(sorted(unknown)[:20])}")
    return weights


def vision_config(original: dict, vision_folder: Path | None) -> dict:
    """The CLIP vision config: from ``--vision-tower``'s config.json, else the known shape of ``mm_vision_tower``."""
    if vision_folder is not None:
        path = vision_folder / "config.json"
        if not path.is_file():
            raise ConversionError(f"--vision-tower {vision_folder}: no config.json")
        config = json.loads(path.read_text())
        config = config.get("vision_config", config)  # a full CLIPModel nests it
        return {k: v for k, v in config.items() if k not in ("architectures", "transformers_version", "dtype",
                                                             "torch_dtype", "_name_or_path")}
    name = str(original.get("mm_vision_tower", ""))
    known = KNOWN_VISION_TOWERS.get(name.rstrip("/").removeprefix("https://huggingface.co/"))
    if known is None:
        raise ConversionError(
            f"the checkpoint's mm_vision_tower is {name!r}, whose shape this converter does not know: pass "
            "--vision-tower DIR (a local copy of that CLIP checkpoint, with its config.json)")
    return {"model_type": "clip_vision_model", **_CLIP_L14, **known}


def build_config(original: dict, vision: dict, image_token_id: int, vocab_size: int):
    """``LlavaConfig`` for the converted model (see the module docstring for the field mapping)."""
    from transformers import LlavaConfig

    projector = original.get("mm_projector_type", "linear")
    if projector != "mlp2x_gelu":
        raise ConversionError(f"mm_projector_type {projector!r}: only LLaVA-1.5's 'mlp2x_gelu' maps to HF LLaVA")
    feature = original.get("mm_vision_select_feature", "patch")
    if feature not in ("patch", "cls_patch"):
        raise ConversionError(f"mm_vision_select_feature {feature!r}: expected 'patch' or 'cls_patch'")
    if original.get("mm_use_im_start_end"):
        raise ConversionError("mm_use_im_start_end=True (image start/end tokens) has no HF LLaVA equivalent")
    text_type = _TEXT_MODEL_TYPES.get(original.get("model_type", ""))
    if text_type is None:
        raise ConversionError(f"model_type {original.get('model_type')!r}: expected one of {sorted(_TEXT_MODEL_TYPES)} "
                              "(the original LLaVA code base's LlavaMistralForCausalLM / LlavaLlamaForCausalLM)")
    text = {k: original[k] for k in _TEXT_FIELDS if k in original}
    text.update(model_type=text_type, vocab_size=vocab_size)
    return LlavaConfig(
        text_config=text,
        vision_config=vision,
        image_token_index=image_token_id,
        projector_hidden_act="gelu",
        vision_feature_layer=int(original.get("mm_vision_select_layer", -2)),
        vision_feature_select_strategy="default" if feature == "patch" else "full",
        image_seq_length=(vision["image_size"] // vision["patch_size"]) ** 2,
        tie_word_embeddings=bool(original.get("tie_word_embeddings", False)),
    )


def build_processor(tokenizer, config, original: dict, chat_template: str):
    """``LlavaProcessor``: CLIP preprocessing (pad-to-square when ``image_aspect_ratio`` is ``pad``) + template."""
    from transformers import LlavaProcessor

    try:  # without torchvision: the PIL backend
        from transformers import LlavaImageProcessorPil as ImageProcessor
    except ImportError:  # pragma: no cover
        from transformers import LlavaImageProcessor as ImageProcessor

    vision = config.vision_config
    size = vision.image_size
    image_processor = ImageProcessor(size={"shortest_edge": size}, crop_size={"height": size, "width": size},
                                     do_pad=original.get("image_aspect_ratio") == "pad")
    return LlavaProcessor(image_processor=image_processor, tokenizer=tokenizer, patch_size=vision.patch_size,
                          vision_feature_select_strategy=config.vision_feature_select_strategy,
                          num_additional_image_tokens=1, chat_template=chat_template)


def _add_rows(matrix: torch.Tensor, rows: int) -> torch.Tensor:
    """``matrix`` with ``rows`` extra rows, each the mean of the existing ones."""
    if rows <= 0:
        return matrix
    mean = matrix.float().mean(dim=0, keepdim=True).to(matrix.dtype)
    return torch.cat([matrix, mean.expand(rows, -1)], dim=0)


def convert(src: str | Path, dst: str | Path, *, vision_tower: str | Path | None = None,
            chat_template: str | None = None, dtype: str | None = None) -> Path:
    """Convert the original LLaVA-Med v1.5 folder ``src`` into an HF LLaVA folder ``dst``; returns ``dst``.

    ``vision_tower``: a CLIP checkpoint folder, needed when ``src`` has no vision weights (and used
    for the vision config when given). ``chat_template``: Jinja text replacing ``mistral_instruct``.
    ``dtype``: ``"float16"``/``"bfloat16"``/``"float32"``; default: the checkpoint's.
    """
    from transformers import AutoTokenizer, LlavaForConditionalGeneration

    src, dst = Path(src), Path(dst)
    config_path = src / "config.json"
    if not config_path.is_file():
        raise ConversionError(f"{src}: no config.json (expected an original LLaVA-Med v1.5 checkpoint folder)")
    original = json.loads(config_path.read_text())
    vision_folder = Path(vision_tower) if vision_tower is not None else None

    weights = rename_state_dict(load_state_dict(src))
    if not any(k.startswith("model.vision_tower.") for k in weights):
        if vision_folder is None:
            raise ConversionError(
                f"{src} holds no vision tower weights (model.vision_tower.vision_tower.vision_model.*); pass "
                f"--vision-tower DIR with a local copy of {original.get('mm_vision_tower', 'the CLIP tower')!r}")
        weights.update(vision_tower_weights(vision_folder))

    tokenizer = AutoTokenizer.from_pretrained(src)
    if IMAGE_TOKEN in tokenizer.get_vocab():
        raise ConversionError(f"{src}: the tokenizer already has {IMAGE_TOKEN!r}; is this already converted?")
    tokenizer.add_tokens([IMAGE_TOKEN], special_tokens=True)
    image_token_id = tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
    rows = weights["model.language_model.embed_tokens.weight"].shape[0]
    vocab_size = max(rows, len(tokenizer))
    for key in ("model.language_model.embed_tokens.weight", "lm_head.weight"):
        if key in weights:
            weights[key] = _add_rows(weights[key], vocab_size - weights[key].shape[0])

    vision = vision_config(original, vision_folder)
    config = build_config(original, vision, image_token_id, vocab_size)
    torch_dtype = getattr(torch, dtype) if dtype else next(iter(weights.values())).dtype
    config.dtype = torch_dtype
    with torch.device("meta"):
        model = LlavaForConditionalGeneration(config)
    expected = set(model.state_dict())
    if config.tie_word_embeddings:
        expected.discard("lm_head.weight")
    missing, unexpected = sorted(expected - set(weights)), sorted(set(weights) - expected)
    if missing or unexpected:
        raise ConversionError(
            "the renamed weights do not match LlavaForConditionalGeneration: "
            + (f"missing {', '.join(missing[:20])}; " if missing else "")
            + (f"unexpected {', '.join(unexpected[:20])}" if unexpected else ""))
    for key, target in model.state_dict().items():
        if key in weights and tuple(weights[key].shape) != tuple(target.shape):
            raise ConversionError(
                f"weight {key}: shape {tuple(weights[key].shape)} in the checkpoint, {tuple(target.shape)} expected "
                "from the config (check --vision-tower / config.json)")
    model.load_state_dict({k: v.to(torch_dtype) for k, v in weights.items()}, strict=False, assign=True)
    if config.tie_word_embeddings:
        model.tie_weights()
    model.eval()

    gen = model.generation_config
    gen.bos_token_id, gen.eos_token_id = tokenizer.bos_token_id, tokenizer.eos_token_id
    gen.suppress_tokens = [image_token_id]
    gen.do_sample = False

    processor = build_processor(tokenizer, config, original, chat_template or MISTRAL_INSTRUCT_TEMPLATE)
    dst.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(dst)
    processor.save_pretrained(dst)
    return dst


__all__ = ["ConversionError", "MISTRAL_INSTRUCT_TEMPLATE", "convert", "main", "rename_key", "rename_state_dict"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m medheval.backends.convert_llava_med", description=__doc__.split("\n")[0])
    parser.add_argument("src", help="original LLaVA-Med v1.5 folder (config.json, weights, tokenizer)")
    parser.add_argument("dst", help="output folder for the HF LLaVA model and processor")
    parser.add_argument("--vision-tower", help="local CLIP checkpoint folder (when SRC lacks the vision weights)")
    parser.add_argument("--chat-template", help="file with a Jinja chat template replacing mistral_instruct")
    parser.add_argument("--dtype", choices=["float16", "bfloat16", "float32"], help="default: the checkpoint's")
    args = parser.parse_args(argv)
    template = Path(args.chat_template).read_text() if args.chat_template else None
    try:
        out = convert(args.src, args.dst, vision_tower=args.vision_tower, chat_template=template, dtype=args.dtype)
    except (ConversionError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {out} (load it with AutoModelForImageTextToText / medheval run --model {out})")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

