"""The HF backend on every model family the papers evaluate (tiny random weights, CPU, float32).

Per family (LLaVA-1.5, LLaVA-NeXT, Qwen2.5-VL, Qwen3-VL, Gemma 3, InternVL, Idefics3):

- ``HFBackend.generate`` on three records, one with two images of different sizes, gives one string
  per record made of exactly ``max_new_tokens`` words (only the new tokens are decoded);
- batch invariance: ``batch_size=1`` and ``batch_size=3`` give the same tokens (greedy, left padding);
- the rendered prompt holds the family's image marker once per image, and the processor's input ids
  hold the family's image-token run once per image, with one BOS only;
- the family's extra image tensors (``image_grid_thw``, ``token_type_ids``, ``pixel_attention_mask``,
  ``image_sizes``) reach ``generate``;
- ``generate_chat`` with a system message and an ``assistant_prefix``;
- text-only and image records in one batch; bfloat16 image tensors; ``--prefix-cache`` equal or refused;
- a saved tiny model directory runs through ``medheval run --model DIR``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from medheval.backends.hf import HFBackend
from medheval.backends.tiny_families import FAMILIES, build_tiny

NEW_TOKENS = 4
RECORDS = [
    {"id": "r1", "question": "Is there a nodule in the left lung?", "answer_type": "yes_no"},
    {"id": "r2", "question": "Which lobe shows the opacity?", "answer_type": "open"},
    {"id": "r3", "question": "Is the heart enlarged?", "answer_type": "yes_no"},
]
IMAGE_SIZES = [[(30, 30)], [(40, 30), (30, 60)], [(36, 36)]]  # record r2: two images (MedFrameQA-style)

# family -> (marker the chat template writes per image, token whose count in input_ids is per image,
#            that token's count per image (None: varies with the image), extra tensor passed to generate)
FAMILY_TABLE = {
    "llava": ("<image>", "<image>", 25, None),
    "llava_next": ("<image>", "<image>", None, "image_sizes"),
    "qwen2_5_vl": ("<|vision_start|><|image_pad|><|vision_end|>", "<|vision_start|>", 1, "image_grid_thw"),
    "qwen3_vl": ("<|vision_start|><|image_pad|><|vision_end|>", "<|vision_start|>", 1, "image_grid_thw"),
    "gemma3": ("<start_of_image>", "<image_soft_token>", 4, "token_type_ids"),
    "internvl": ("<IMG_CONTEXT>", "<img>", 1, None),
    "idefics3": ("<image>", "<fake_token_around_image>", 2, "pixel_attention_mask"),
    "smolvlm": ("<image>", "<fake_token_around_image>", 2, "pixel_attention_mask"),
}


def _images(sizes_per_record):
    return [
        [Image.fromarray(np.random.RandomState(10 * i + j).randint(0, 255, (*size, 3), dtype=np.uint8))
         for j, size in enumerate(sizes)]
        for i, sizes in enumerate(sizes_per_record)
    ]


@pytest.fixture(scope="module", params=FAMILIES)
def family(request):
    model, processor = build_tiny(request.param, seed=0)
    return request.param, model, processor


def _capture_generate(monkeypatch, model) -> list[dict]:
    """Record the keyword arguments of every ``model.generate`` call (then run it)."""
    calls: list[dict] = []
    original = model.generate

    def generate(**kwargs):
        out = original(**kwargs)
        calls.append({**kwargs, "new_tokens": out[:, kwargs["input_ids"].shape[1]:]})
        return out

    monkeypatch.setattr(model, "generate", generate)
    return calls


def test_table_covers_every_family():
    assert set(FAMILY_TABLE) == set(FAMILIES)


def test_generate_is_batch_invariant_and_decodes_only_new_tokens(family, monkeypatch):
    name, model, processor = family
    images = _images(IMAGE_SIZES)
    one = HFBackend(model, processor, batch_size=1, max_new_tokens=NEW_TOKENS)
    three = HFBackend(model, processor, batch_size=3, max_new_tokens=NEW_TOKENS)
    calls = _capture_generate(monkeypatch, model)
    singles = one.generate(RECORDS, images)
    batched = three.generate(RECORDS, images)
    assert [type(o) for o in batched] == [str] * 3
    # special tokens never win with the tiny weights: every new token is one word, the prompt is not decoded
    assert [len(o.split()) for o in batched] == [NEW_TOKENS] * 3
    assert singles == batched
    # token for token, not only after decoding
    assert len(calls) == 4 and calls[3]["input_ids"].shape[0] == 3
    assert torch.equal(torch.cat([c["new_tokens"] for c in calls[:3]]), calls[3]["new_tokens"])
    assert one.settings()["random_weights"] is True and model.dtype == torch.float32


def test_prompt_markers_and_image_tokens_once_per_image(family, monkeypatch):
    name, model, processor = family
    marker, token, per_image, extra = FAMILY_TABLE[name]
    backend = HFBackend(model, processor, batch_size=3, max_new_tokens=1)
    for n in (1, 2, 3):
        prompt = backend.format_prompt(RECORDS[0], n)
        assert prompt.count(marker) == n, (name, prompt)
        assert prompt.index(marker) < prompt.index("Is there a nodule")  # images first, then the text
    calls = _capture_generate(monkeypatch, model)
    backend.generate(RECORDS, _images(IMAGE_SIZES))
    inputs = calls[0]
    ids = inputs["input_ids"]
    mask = inputs["attention_mask"].bool()
    token_id = processor.tokenizer.convert_tokens_to_ids(token)
    counts = (ids == token_id).sum(1).tolist()
    if per_image is not None:
        assert counts == [per_image * len(s) for s in IMAGE_SIZES]
    else:  # LLaVA-NeXT: tiles depend on the image shape; two images give more tokens than one
        assert counts[1] > counts[0] > 0 and counts[2] > 0
    assert mask[:, -1].all() and not mask[:, 0].all()  # left padding
    bos = processor.tokenizer.bos_token_id
    if bos is not None:
        assert [(row[m] == bos).sum().item() for row, m in zip(ids, mask)] == [1, 1, 1]
    if extra is not None:
        assert extra in inputs
    assert inputs["pixel_values"].dtype == model.dtype


def test_generate_chat_with_system_and_assistant_prefix(family):
    name, model, processor = family
    backend = HFBackend(model, processor, batch_size=2, max_new_tokens=NEW_TOKENS)
    prompt = backend.format_chat("Be careful with findings.", "Describe the image.", "The chest", 1)
    assert "Be careful with findings." in prompt and prompt.endswith("The chest")
    before = prompt[: -len("The chest")]
    assert before.endswith(("\n", " ")) and not before.endswith(("\n ", "  "))  # no stray space after a newline
    requests = [
        {"id": "c1", "system": "Be careful with findings.", "user": "Describe the image.",
         "assistant_prefix": "The chest"},
        {"id": "c2", "user": "Any effusion?", "assistant_prefix": ""},
    ]
    images = _images([[(30, 30)], [(30, 30), (30, 40)]])
    replies = backend.generate_chat(requests, images)
    assert [len(r.split()) for r in replies] == [NEW_TOKENS] * 2
    single = HFBackend(model, processor, batch_size=1, max_new_tokens=NEW_TOKENS).generate_chat(requests, images)
    assert single == replies


def test_text_only_records_mix_with_image_records(family):
    name, model, processor = family
    backend = HFBackend(model, processor, batch_size=2, max_new_tokens=NEW_TOKENS)
    images = [_images([[(30, 30)]])[0], []]
    batched = backend.generate(RECORDS[:2], images)
    singles = HFBackend(model, processor, batch_size=1, max_new_tokens=NEW_TOKENS).generate(RECORDS[:2], images)
    assert batched == singles and all(len(o.split()) == NEW_TOKENS for o in batched)


def test_build_tiny_is_seeded_and_names_unknown_families():
    a, _ = build_tiny("gemma3", seed=0)
    b, _ = build_tiny("gemma3", seed=0)
    c, _ = build_tiny("gemma3", seed=1)
    key = "model.language_model.layers.0.self_attn.q_proj.weight"
    assert torch.equal(a.state_dict()[key], b.state_dict()[key])
    assert not torch.equal(a.state_dict()[key], c.state_dict()[key])
    with pytest.raises(ValueError, match="unknown tiny model family 'qwen9'.*gemma3"):
        build_tiny("qwen9")


@pytest.mark.parametrize("name", ["gemma3", "idefics3"])
def test_saved_tiny_model_runs_through_the_cli(name, fixture_benchmark, tmp_path):
    """``save_pretrained`` a tiny family, then ``medheval run --model DIR`` loads it with the Auto classes."""
    import json

    from medheval.cli import main

    model_dir = tmp_path / name
    model, _ = build_tiny(name, seed=0, save_dir=model_dir)
    out = tmp_path / "run"
    roots = [a for s, r in fixture_benchmark["image_roots"].items() for a in ("--image-root", f"{s}={r}")]
    code = main(["run", "--benchmark", "context", "--model", str(model_dir), "--output", str(out), "--data-dir",
                 fixture_benchmark["data_dir"], "--limit", "2", "--max-new-tokens", str(NEW_TOKENS), *roots])
    assert code == 0
    lines = [json.loads(line) for f in sorted(out.rglob("predictions.jsonl")) for line in f.read_text().splitlines()]
    assert len(lines) == 2 and all(len(e["prediction"].split()) == NEW_TOKENS for e in lines)
    # the loaded copy answers as the in-memory model does
    from medheval.backends.tiny_families import build_tiny as rebuild

    fresh, processor = rebuild(name, seed=0)
    loaded = HFBackend(str(model_dir), max_new_tokens=NEW_TOKENS)
    images = _images([[(30, 30)]])
    assert loaded.generate(RECORDS[:1], images) == HFBackend(fresh, processor, max_new_tokens=NEW_TOKENS).generate(
        RECORDS[:1], images)
    assert loaded.settings()["random_weights"] is True


def test_a_folder_whose_processor_cannot_be_built_is_a_clear_error(tmp_path):
    """AutoProcessor silently falls back to the tokenizer when the processor class is unknown; the backend says so."""
    from medheval.backends.base import BackendError

    build_tiny("gemma3", seed=0, save_dir=tmp_path)
    for name in ("processor_config.json", "tokenizer_config.json"):
        path = tmp_path / name
        path.write_text(path.read_text().replace('"Gemma3Processor"', '"NoSuchProcessor"'))
    with pytest.raises(BackendError, match="only a .*Tokenizer.* no image processor"):
        HFBackend(str(tmp_path))
    with pytest.raises(ValueError, match="no video processor"):
        build_tiny("qwen2_5_vl", save_dir=tmp_path / "q")


@pytest.mark.parametrize("name", FAMILIES)
def test_bfloat16_converts_the_image_tensors(name, monkeypatch):
    """A bfloat16 model gets bfloat16 ``pixel_values`` whatever the family's pixel layout."""
    model, processor = build_tiny(name, seed=0)
    backend = HFBackend(model, processor, batch_size=2, max_new_tokens=2, dtype="bfloat16")
    calls = _capture_generate(monkeypatch, model)
    out = backend.generate(RECORDS[:2], _images(IMAGE_SIZES[:2]))
    assert calls[0]["pixel_values"].dtype == torch.bfloat16 == model.dtype
    assert [len(o.split()) for o in out] == [2, 2]


def test_prefix_cache_matches_plain_generation_or_refuses(family):
    """--prefix-cache: same answers where the processor's output is ids + pixel_values, a clear refusal elsewhere."""
    from medheval.backends.base import BackendError

    name, model, processor = family
    image = _images([[(30, 30)]])[0]
    images = [image] * 3
    plain = HFBackend(model, processor, batch_size=3, max_new_tokens=3).generate(RECORDS, images)
    cached = HFBackend(model, processor, batch_size=3, max_new_tokens=3, prefix_cache=True)
    if name in ("llava", "internvl"):
        assert cached.generate(RECORDS, images) == plain
    else:
        extra = FAMILY_TABLE[name][3]
        with pytest.raises(BackendError, match=f"--prefix-cache supports .*also needs .*{extra}"):
            cached.generate(RECORDS, images)
