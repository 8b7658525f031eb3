"""LLaVA's chunked prompt tokenization (``tokenizer_image_token``) under the MedHEval paper protocols.

A tiny sentencepiece-style tokenizer is built here (Unigram with byte fallback, a Metaspace pre-tokenizer):
``prepend_scheme="always"`` behaves like a legacy Llama tokenizer (every text segment, also the one after
``<image>``, gets the word-start ``▁``), ``"first"`` like a non-legacy one (only the start of the string).
"""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from medheval.backends.llava_tokens import (
    IMAGE_INDEX, ChunkedTokensError, expand_images, first_difference, image_token_runs, left_pad,
    upstream_image_token_ids)

# id = position; the specials come first, as in the tiny LLaVA's tokenizer (so its model fits these ids)
PIECES = ["<unk>", "<s>", "</s>", "<pad>", "<image>", "<0x0A>", "▁", "▁USER", ":", "Is", "▁there", "▁X", "?",
          "▁ASSISTANT", "▁Is", "▁a", "▁Y", "▁or", "I", "s", "t", "h", "e", "r", "X", "Y", "a", "o"]
BOS, USER, COLON, SPACE, NEWLINE, IS, THERE, X, QMARK, ASSISTANT = 1, 7, 8, 6, 5, 9, 10, 11, 12, 13
PROMPT = "USER: <image>\nIs there X? ASSISTANT:"
# upstream: piece 1 "USER: " -> <s> ▁USER : ▁ ; piece 2 "\nIs there X? ASSISTANT:" tokenized alone gets its own
# word-start marker: <s> ▁ <0x0A> Is ▁there ▁X ? ▁ASSISTANT : ; its <s> dropped, the image index in between
UPSTREAM = [BOS, USER, COLON, SPACE, IMAGE_INDEX, SPACE, NEWLINE, IS, THERE, X, QMARK, ASSISTANT, COLON]


def sp_tokenizer(scheme: str, add_bos: bool = True):
    """A sentencepiece-style ``PreTrainedTokenizerFast`` over :data:`PIECES` (``<image>`` special)."""
    from tokenizers import Tokenizer, decoders, pre_tokenizers, processors
    from tokenizers.models import Unigram
    from transformers import PreTrainedTokenizerFast

    scores = [(p, 0.0 if p.startswith("<") else (-1.0 if len(p) > 1 else -10.0)) for p in PIECES]
    backend = Tokenizer(Unigram(scores, unk_id=0, byte_fallback=True))
    backend.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=scheme, split=False)
    backend.decoder = decoders.Metaspace(replacement="▁", prepend_scheme=scheme, split=False)
    if add_bos:
        backend.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A $B",
                                                               special_tokens=[("<s>", BOS)])
    backend.add_special_tokens(PIECES[:5])
    return PreTrainedTokenizerFast(tokenizer_object=backend, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                                   pad_token="<pad>", padding_side="left")


def llava_processor(scheme: str):
    from medheval.backends.tiny import build_tiny_processor

    processor = build_tiny_processor(chat_template=None)
    processor.tokenizer = sp_tokenizer(scheme)
    return processor


def llava_next_processor(scheme: str):
    from transformers import LlavaNextProcessor

    from medheval.backends.tiny_families import build_tiny_llava_next

    _, tiny = build_tiny_llava_next()
    return LlavaNextProcessor(image_processor=tiny.image_processor, tokenizer=sp_tokenizer(scheme), patch_size=6,
                              vision_feature_select_strategy="default", num_additional_image_tokens=1)


def whole_string_ids(tokenizer, prompt: str) -> list[int]:
    """The ids of one whole-string tokenization, ``<image>`` written as the upstream image index."""
    image = tokenizer.convert_tokens_to_ids("<image>")
    return [IMAGE_INDEX if token == image else token for token in tokenizer(prompt).input_ids]


# ------------------------------------------------------------------ the rule, by hand
@pytest.mark.parametrize("scheme", ["always", "first"])
def test_upstream_rule_hand_worked(scheme):
    """Legacy-like or not, each piece is a string of its own: the piece after the image starts with a lone ▁."""
    tokenizer = sp_tokenizer(scheme)
    assert tokenizer.convert_ids_to_tokens([t for t in UPSTREAM if t >= 0])[4] == "▁"  # the ids name these pieces
    assert upstream_image_token_ids(tokenizer, PROMPT) == UPSTREAM


def test_whole_string_differs_where_it_should():
    """A non-legacy tokenizer's whole-string ids lack the lone ▁ after the image; a legacy-like one's have it."""
    first, always = sp_tokenizer("first"), sp_tokenizer("always")
    assert whole_string_ids(first, PROMPT) == [t for i, t in enumerate(UPSTREAM) if i != 5]
    assert first_difference(whole_string_ids(first, PROMPT), UPSTREAM) == 5
    assert whole_string_ids(always, PROMPT) == UPSTREAM


def test_bos_only_from_the_first_piece_and_several_images():
    tokenizer = sp_tokenizer("first")
    two = "USER: <image>\n<image>\nIs there X? ASSISTANT:"
    assert upstream_image_token_ids(tokenizer, two) == [BOS, USER, COLON, SPACE, IMAGE_INDEX, SPACE, NEWLINE,
                                                        IMAGE_INDEX, *UPSTREAM[5:]]
    # a prompt that starts with the image: the first piece is BOS alone
    assert upstream_image_token_ids(tokenizer, "<image>\nIs") == [BOS, IMAGE_INDEX, SPACE, NEWLINE, IS]
    # a tokenizer that adds no BOS: nothing is dropped
    plain = sp_tokenizer("first", add_bos=False)
    assert upstream_image_token_ids(plain, PROMPT) == UPSTREAM[1:]


def test_expansion_runs_padding_and_differences():
    assert image_token_runs([1, 4, 4, 4, 5, 4, 4, 6], 4) == [3, 2]
    assert expand_images([1, IMAGE_INDEX, 5, IMAGE_INDEX], 4, [3, 2]) == [1, 4, 4, 4, 5, 4, 4]
    with pytest.raises(ChunkedTokensError, match="1 image marker"):
        expand_images([1, IMAGE_INDEX, 5], 4, [3, 2])
    ids, mask = left_pad([[7, 8, 9], [5]], 3)
    assert ids.tolist() == [[7, 8, 9], [3, 3, 5]] and mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert first_difference([1, 2], [1, 2]) is None and first_difference([1, 2], [1, 2, 3]) == 2
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1


# ------------------------------------------------------------------ the backend
def _backend(processor, upstream: bool, **kwargs):
    from medheval.backends.hf import HFBackend
    from medheval.backends.tiny import build_tiny_llava

    model, _ = build_tiny_llava(seed=0)
    model.resize_token_embeddings(len(processor.tokenizer))  # replies decode with the tiny tokenizer
    model.config.image_token_id = processor.tokenizer.convert_tokens_to_ids("<image>")
    backend = HFBackend(model, processor, device="cpu", max_new_tokens=4, **kwargs)
    backend.upstream_tokens = upstream
    return backend


def _fed_ids(backend, records, images) -> list[list[int]]:
    """What ``model.generate`` receives, one list per row, padding removed; the replies are generated too."""
    seen: list[list[int]] = []
    generate = backend.model.generate

    def spy(**kwargs):
        ids, mask = kwargs["input_ids"], kwargs["attention_mask"]
        seen.extend(row[m.bool()].tolist() for row, m in zip(ids, mask))
        return generate(**kwargs)

    backend.model.generate = spy
    try:
        backend.replies = backend.generate(records, images)
    finally:
        del backend.model.generate
    return seen


RECORDS = [{"id": "a", "question": "Is there X?"}, {"id": "b", "question": "Is there X? Is there Y or X?"},
           {"id": "c", "question": "Is there a Y?"}]


def _image(width: int, height: int) -> Image.Image:
    return Image.new("RGB", (width, height), (200, 30, 90))


def _instruction(record: dict) -> str:
    return record["question"]


def test_protocol_run_feeds_upstream_ids_and_batches_like_single():
    processor = llava_processor("first")
    images = [[_image(30, 30)] for _ in RECORDS]
    batched = _backend(processor, True, batch_size=3, instruction=_instruction)
    single = _backend(processor, True, batch_size=1, instruction=_instruction)
    fed = _fed_ids(batched, RECORDS, images)
    assert fed == _fed_ids(single, RECORDS, images)
    assert batched.replies == single.replies and all(batched.replies)
    image_id = processor.tokenizer.convert_tokens_to_ids("<image>")
    for record, ids in zip(RECORDS, fed):
        text = batched.format_prompt(record, 1)
        assert text.startswith("USER: <image>\n")
        expected = expand_images(upstream_image_token_ids(processor.tokenizer, text), image_id, [25])
        assert ids == expected and ids[4 + 25:][:2] == [SPACE, NEWLINE]  # 25 image tokens, then the lone ▁
    assert batched.settings()["tokenization"] == "upstream_chunked"


def test_llava_next_keeps_the_processors_image_token_count_per_image():
    """Images of other shapes get other anyres counts; each row keeps its own, batched or alone."""
    processor = llava_next_processor("first")
    backend = _backend(processor, True, instruction=_instruction)
    texts = [backend.format_prompt(record, 1) for record in RECORDS]
    images = [[_image(30, 30)], [_image(60, 30)], [_image(30, 90)]]
    image_id = processor.tokenizer.convert_tokens_to_ids("<image>")

    def rows(batch_texts, batch_images):
        inputs = processor(text=batch_texts, images=batch_images, padding=True, return_tensors="pt")
        counts = [image_token_runs(r[m.bool()].tolist(), image_id) for r, m in
                  zip(inputs["input_ids"], inputs["attention_mask"])]
        out = backend.upstream_inputs(inputs, batch_texts)
        return counts, [r[m.bool()].tolist() for r, m in zip(out["input_ids"], out["attention_mask"])]

    counts, batched = rows(texts, images)
    assert len({c[0] for c in counts}) == 3  # three different counts
    alone = [rows([t], [i])[1][0] for t, i in zip(texts, images)]
    assert batched == alone
    for ids, count in zip(batched, counts):
        assert image_token_runs(ids, image_id) == count
        assert ids[ids.index(image_id) + count[0]:][:2] == [SPACE, NEWLINE]


def test_outside_the_protocols_the_processors_ids_are_fed():
    processor = llava_processor("first")
    backend = _backend(processor, False, batch_size=3, instruction=_instruction)
    images = [[_image(30, 30)] for _ in RECORDS]
    texts = [backend.format_prompt(record, 1) for record in RECORDS]
    inputs = processor(text=texts, images=images, padding=True, return_tensors="pt")
    expected = [r[m.bool()].tolist() for r, m in zip(inputs["input_ids"], inputs["attention_mask"])]
    assert _fed_ids(backend, RECORDS, images) == expected
    assert "tokenization" not in backend.settings()
    same = processor(text=texts, images=images, padding=True, return_tensors="pt")
    assert torch.equal(backend.upstream_inputs(same, texts)["input_ids"], inputs["input_ids"])


@pytest.mark.parametrize("protocol", ["medheval-baseline", "medheval-mitigation"])
def test_configure_backend_turns_it_on_for_llava_types_only(llava, llava_next, protocol):
    from medheval.backends.hf import HFBackend
    from medheval.run.paper_protocols import configure_backend, get_protocol

    for model, processor in (llava, llava_next):
        backend = HFBackend(model, processor, device="cpu")
        assert configure_backend(backend, get_protocol(protocol)).upstream_tokens is True
        assert backend.upstream_tokens is False  # a copy, the original kept
        assert configure_backend(backend, get_protocol("clean")).upstream_tokens is False
    model, processor = llava
    backend = HFBackend(model, processor, device="cpu")
    model.config.model_type = "qwen2_5_vl"  # another family under the same protocol keeps the processor's ids
    try:
        assert configure_backend(backend, get_protocol(protocol)).upstream_tokens is False
    finally:
        model.config.model_type = "llava"


def test_a_template_that_writes_bos_gets_it_once():
    processor = llava_processor("first")
    backend = _backend(processor, True, instruction=_instruction)
    texts = ["<s>" + backend.format_prompt(RECORDS[0], 1)]
    inputs = processor(text=texts, images=[[_image(30, 30)]], add_special_tokens=False, return_tensors="pt")
    ids = backend.upstream_inputs(inputs, texts)["input_ids"][0].tolist()
    assert ids[:4] == [BOS, USER, COLON, SPACE] and ids.count(BOS) == 1


def test_prefix_cache_keeps_the_upstream_ids():
    """--prefix-cache (greedy, one image shared by the records) answers as the plain path under the chunked rule."""
    processor = llava_processor("first")
    image = _image(30, 30)
    images = [[image] for _ in RECORDS]
    cached = _backend(processor, True, batch_size=3, instruction=_instruction, prefix_cache=True)
    plain = _backend(processor, True, batch_size=1, instruction=_instruction)
    assert cached.generate(RECORDS, images) == plain.generate(RECORDS, images)
    assert cached._prefix_cache.prefix_encodings >= 1
