"""A tiny random-weight LLaVA built entirely in-process (no downloads).

Used by the tests, the benchmarks and the offline demo: it exercises the *real*
``LlavaForConditionalGeneration`` / ``LlavaProcessor`` code paths (chat template,
image-token expansion, left padding, batched ``generate``) at a size that runs in
seconds on one CPU. The weights are random, so the answers are gibberish made of
real (medical) words; ``model.config.medheval_random_weights`` is set so that every
result produced with it is marked as such.

The recipe follows transformers' own LLaVA tests: a 2-layer Llama text model, a
tiny CLIP vision tower (30x30 images, 6x6 patches -> 25 patch tokens + CLS),
``vision_feature_layer=-1`` and the ``"default"`` strategy (CLS dropped).
"""

from __future__ import annotations

import os

import torch

IMAGE_SIZE = 30
PATCH_SIZE = 6
NUM_IMAGE_TOKENS = (IMAGE_SIZE // PATCH_SIZE) ** 2  # CLS is dropped by the "default" strategy

TINY_MODEL_NAME = "tiny-random-llava"  # the CLI's name for the built-in demo model
SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<pad>", "<image>")

# LLaVA-1.5 style: "USER: <image>\n<text> ASSISTANT:" (images first, then text).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] != 'system' %}{{ message['role'].upper() + ': ' }}{% endif %}"
    "{% if message['content'] is string %}{{ message['content'] + ' ' }}{% else %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>\n' }}{% endfor %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ content['text'] + ' ' }}{% endfor %}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ 'ASSISTANT:' }}{% endif %}"
)

# A few hundred lower-cased words of radiology / clinical vocabulary plus the words
# of the prompt templates and chat template; everything else maps to <unk>.
_VOCAB_TEXT = """
user assistant system please answer yes or no choose from the following options option
options letter with a b c d e f g h s is are was were there any this that these those
of in on at to for and by as it its be been being has have had do does did not what
which where when how why who whose image images picture scan shows show showing seen
see visible present absent evidence finding findings impression report patient
chest lung lungs left right upper lower middle lobe lobes base bases apex apical
heart cardiac cardiomegaly mediastinum mediastinal hilar hilum aorta aortic arch
trachea bronchus bronchi bronchial pleural pleura effusion effusions pneumothorax
pneumonia consolidation opacity opacities atelectasis edema pulmonary interstitial
nodule nodules mass masses lesion lesions fracture fractures rib ribs spine spinal
vertebral vertebra clavicle diaphragm hemidiaphragm costophrenic angle angles
silhouette contour contours normal abnormal unremarkable stable unchanged new
increased decreased mild moderate severe small large enlarged enlargement size
tube tubes line lines catheter device devices pacemaker support wires sternotomy
emphysema fibrosis scarring granuloma calcified calcification calcifications
infiltrate infiltrates hyperinflation hyperinflated congestion vascular
cephalization vasculature lymph node nodes lymphadenopathy thickening thickened
brain head skull ventricle ventricles hemorrhage infarct stroke ischemia white
matter gray cortex cerebral cerebellum midline shift sulci abdomen abdominal liver
kidney kidneys renal spleen pancreas bowel colon stomach gallbladder bladder
cyst cystic tumor tumors cancer metastasis metastases malignant benign organ organs
ct mri xray x ray radiograph radiography ultrasound modality view frontal lateral
pa ap axial coronal sagittal plane contrast enhanced t1 t2 flair weighted
density densities dense lucency lucent air fluid gas free sign signs
acute chronic prior compared comparison since interval improvement worsening
likely possible possibly probable suggest suggests suggestive consistent
compatible concerning concern for correlation clinical clinically recommend
recommended follow up evaluation further no acute cardiopulmonary process
measurement measures measuring cm mm width height diameter ratio index
symptom symptoms cough fever pain dyspnea shortness breath
anatomy anatomical structure structures region regions location located
side both bilateral unilateral single multiple one two three four several
than more less larger smaller higher lower most least all none some
diagnosis diagnostic disease diseases condition conditions abnormality abnormalities
hallucination true false correct incorrect question questions
tissue soft bone bones joint joints shoulder neck humerus
position positioned appropriate appropriately tip terminates projects projecting
overlying underlying adjacent surrounding within outside along near
well defined ill margin margins border borders focal diffuse patchy linear
streaky bibasilar basilar perihilar retrocardiac subsegmental segmental
there's no
. , ? : ; ' ( ) - /
"""


def _vocab_words() -> list[str]:
    seen: dict[str, None] = {}
    for word in _VOCAB_TEXT.split():
        seen.setdefault(word, None)
    return list(seen)


def build_tiny_tokenizer(
    special_tokens: tuple[str, ...] = SPECIAL_TOKENS,
    *,
    bos_token: str | None = "<s>",
    eos_token: str = "</s>",
    pad_token: str | None = "<pad>",
    unk_token: str = "<unk>",
    named_tokens: dict[str, str] | None = None,
    add_bos: bool = True,
):
    """A word-level ``PreTrainedTokenizerFast`` over the medical vocabulary above.

    Lower-cases its input, splits on whitespace and punctuation, prepends ``bos_token`` when
    ``add_bos``; decoding joins words with spaces. ``special_tokens`` take the first ids (never
    split, skipped when decoding); ``named_tokens`` become tokenizer attributes a family's
    processor reads (e.g. ``{"boi_token": "<start_of_image>"}`` gives ``tokenizer.boi_token`` and
    ``tokenizer.boi_token_id``). The defaults are the LLaVA tokenizer.
    """
    from tokenizers import Tokenizer, normalizers, pre_tokenizers, processors
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(special_tokens)}
    for word in _vocab_words():
        vocab.setdefault(word, len(vocab))
    backend = Tokenizer(WordLevel(vocab=vocab, unk_token=unk_token))
    backend.normalizer = normalizers.Lowercase()
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    if add_bos and bos_token is not None:
        backend.post_processor = processors.TemplateProcessing(
            single=f"{bos_token} $A", pair=f"{bos_token} $A $B", special_tokens=[(bos_token, vocab[bos_token])]
        )
    backend.add_special_tokens(list(special_tokens))
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=bos_token,
        eos_token=eos_token,
        unk_token=unk_token,
        pad_token=pad_token,
        padding_side="left",
        model_max_length=2048,
        **({"extra_special_tokens": dict(named_tokens)} if named_tokens else {}),
    )
    return tokenizer


def build_tiny_processor(chat_template: str | None = CHAT_TEMPLATE):
    """``LlavaProcessor`` = tiny tokenizer + 30x30 CLIP image processor."""
    from transformers import LlavaProcessor

    try:  # transformers 5 without torchvision: the PIL backend, without the fallback warning
        from transformers import CLIPImageProcessorPil as _ImageProcessor
    except ImportError:  # pragma: no cover - older/newer layouts
        from transformers import CLIPImageProcessor as _ImageProcessor

    image_processor = _ImageProcessor(
        size={"shortest_edge": IMAGE_SIZE},
        crop_size={"height": IMAGE_SIZE, "width": IMAGE_SIZE},
    )
    return LlavaProcessor(
        image_processor=image_processor,
        tokenizer=build_tiny_tokenizer(),
        patch_size=PATCH_SIZE,
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,  # CLIP's CLS token (dropped again by "default")
        chat_template=chat_template,
    )


def finish_random_model(model, tokenizer, special_tokens: tuple[str, ...]):
    """A random-weight model made usable: special tokens get an all-zero output row (some real word
    always scores higher, so it never stops early or emits padding/image tokens, and every answer is
    ``max_new_tokens`` real words); the generation config takes the tokenizer's ids, greedy; and
    ``config.medheval_random_weights`` marks every result made with it."""
    with torch.no_grad():
        head = model.get_output_embeddings().weight
        for token in special_tokens:
            head[tokenizer.convert_tokens_to_ids(token)].zero_()
    gen = model.generation_config
    gen.bos_token_id, gen.eos_token_id, gen.pad_token_id = (
        tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id)
    gen.do_sample = False
    model.config.medheval_random_weights = True
    return model


def build_tiny_llava(seed: int = 0, save_dir: str | os.PathLike | None = None):
    """Build a tiny random-weight ``LlavaForConditionalGeneration`` and its processor.

    Args:
        seed: seeds the weight initialisation, so the same seed gives the same model.
        save_dir: when given, ``save_pretrained`` both model and processor there, so
            ``HFBackend(save_dir)`` loads them through the real ``from_pretrained`` path.

    Returns:
        ``(model, processor)``; the model is in eval mode, float32, on CPU, and
        ``model.config.medheval_random_weights`` is ``True``.
    """
    from transformers import LlavaConfig, LlavaForConditionalGeneration

    processor = build_tiny_processor()
    tokenizer = processor.tokenizer
    vocab_size = len(tokenizer)
    image_token_id = tokenizer.convert_tokens_to_ids("<image>")

    text_config = {
        "model_type": "llama",
        "vocab_size": vocab_size,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "hidden_act": "silu",
        "max_position_embeddings": 512,
        "initializer_range": 0.2,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
        "tie_word_embeddings": False,
    }
    vision_config = {
        "model_type": "clip_vision_model",
        "image_size": IMAGE_SIZE,
        "patch_size": PATCH_SIZE,
        "num_channels": 3,
        "hidden_size": 32,
        "intermediate_size": 64,
        "projection_dim": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "initializer_range": 0.2,
    }
    config = LlavaConfig(
        text_config=text_config,
        vision_config=vision_config,
        image_token_index=image_token_id,
        image_seq_length=NUM_IMAGE_TOKENS,
        projector_hidden_act="gelu",
        vision_feature_select_strategy="default",
        vision_feature_layer=-1,
    )

    rng_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = LlavaForConditionalGeneration(config)
    finally:
        torch.random.set_rng_state(rng_state)
    model = finish_random_model(model.to(torch.float32).eval(), tokenizer, SPECIAL_TOKENS)
    model.config.name_or_path = TINY_MODEL_NAME  # from_pretrained replaces it with the directory

    if save_dir is not None:
        os.makedirs(save_dir, exist_ok=True)
        model.save_pretrained(save_dir)
        processor.save_pretrained(save_dir)
    return model, processor


# Larger random LLaVA shapes (the tiny tokenizer, so every id is a real word): ``small`` makes the
# forward dominate over Python on a CPU; ``llava-1.5-7b`` has LLaVA-1.5-7B's shapes (Vicuna-7B text
# model, CLIP ViT-L/14 at 336 px, 576 image tokens) for GPU benchmarks.
RANDOM_LLAVA_SIZES: dict[str, dict] = {
    "small": {
        "text": {"hidden_size": 512, "intermediate_size": 1376, "num_hidden_layers": 8, "num_attention_heads": 8,
                 "num_key_value_heads": 8, "initializer_range": 0.05},
        "vision": {"hidden_size": 256, "intermediate_size": 1024, "projection_dim": 256, "num_hidden_layers": 4,
                   "num_attention_heads": 4},
        "image_size": 224, "patch_size": 14,
    },
    "llava-1.5-7b": {
        "text": {"hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32, "num_attention_heads": 32,
                 "num_key_value_heads": 32, "vocab_size": 32064, "initializer_range": 0.02},
        "vision": {"hidden_size": 1024, "intermediate_size": 4096, "projection_dim": 768, "num_hidden_layers": 24,
                   "num_attention_heads": 16},
        "image_size": 336, "patch_size": 14,
    },
}


def build_random_llava(size: str = "small", seed: int = 0, dtype: torch.dtype = torch.float32, device="cpu"):
    """A random-weight LLaVA of one of :data:`RANDOM_LLAVA_SIZES` with the tiny tokenizer, built on ``device``.

    Returns ``(model, processor)`` like :func:`build_tiny_llava` (eval mode, special tokens never
    generated, ``config.medheval_random_weights = True``).
    """
    from transformers import LlavaConfig, LlavaForConditionalGeneration, LlavaProcessor

    try:
        from transformers import CLIPImageProcessorPil as _ImageProcessor
    except ImportError:  # pragma: no cover - older/newer layouts
        from transformers import CLIPImageProcessor as _ImageProcessor

    if size not in RANDOM_LLAVA_SIZES:
        raise ValueError(f"unknown random LLaVA size {size!r}; choose one of {sorted(RANDOM_LLAVA_SIZES)}")
    shape = RANDOM_LLAVA_SIZES[size]
    tokenizer = build_tiny_tokenizer()
    image_size, patch = shape["image_size"], shape["patch_size"]
    processor = LlavaProcessor(
        image_processor=_ImageProcessor(size={"shortest_edge": image_size},
                                        crop_size={"height": image_size, "width": image_size}),
        tokenizer=tokenizer, patch_size=patch, vision_feature_select_strategy="default",
        num_additional_image_tokens=1, chat_template=CHAT_TEMPLATE,
    )
    config = LlavaConfig(
        text_config={"model_type": "llama", "vocab_size": len(tokenizer), "max_position_embeddings": 2048,
                     "pad_token_id": tokenizer.pad_token_id, "bos_token_id": tokenizer.bos_token_id,
                     "eos_token_id": tokenizer.eos_token_id, "tie_word_embeddings": False, **shape["text"]},
        vision_config={"model_type": "clip_vision_model", "image_size": image_size, "patch_size": patch,
                       **shape["vision"]},
        image_token_index=tokenizer.convert_tokens_to_ids("<image>"), image_seq_length=(image_size // patch) ** 2,
        projector_hidden_act="gelu", vision_feature_select_strategy="default", vision_feature_layer=-2,
    )
    rng_state = torch.random.get_rng_state()
    default_dtype = torch.get_default_dtype()
    torch.manual_seed(seed)
    try:
        torch.set_default_dtype(dtype)
        with torch.device(device):
            model = LlavaForConditionalGeneration(config).eval()
    finally:
        torch.set_default_dtype(default_dtype)
        torch.random.set_rng_state(rng_state)
    return finish_random_model(model, tokenizer, SPECIAL_TOKENS), processor


__all__ = ["TINY_MODEL_NAME", "RANDOM_LLAVA_SIZES", "build_random_llava", "build_tiny_llava", "build_tiny_processor",
           "finish_random_model",
           "build_tiny_tokenizer", "CHAT_TEMPLATE"]
