"""PAI's ``cfg_stream="raw_question"``: the text-only (CFG) stream as MedHEval's released script builds it.

- the stream's ids are BOS + the question's own tokens (known answer spelled out word by word on the tiny
  word-level tokenizer), and its logits those of that prompt run alone;
- through :class:`HFBackend` under the ``medheval-mitigation`` protocol, the question is the protocol's
  instruction text (suffixes included), not the vicuna_v1-templated prompt;
- invariants: neutral setting = ``templated`` = plain greedy; a left-padded batch = single runs; one pass = two
  pass; on every family PAI supports, and on the static-cache (compiled) path;
- clear errors: bad option value, missing or mismatched question ids, image tokens in a question;
- the released script's ``init_cfg_processor`` call, read with :mod:`ast` (skipped without ``../shared``).
"""

from __future__ import annotations

import ast
import os
import shutil

import numpy as np
import pytest
import torch

from medheval.decoding import MitigationError, compiled, internals
from medheval.mitigations import PAI, get_mitigation, selftest
from medheval.mitigations.m3id import text_only_stream
from medheval.mitigations.pai import CFG_STREAMS, RAW_QUESTION_IDS, raw_question_ids, raw_question_stream

from conftest import SHARED_UPSTREAM

QUESTIONS = ["is there a pleural effusion ?", "what is the size of the heart shown in this chest image ?"]
MOVING = dict(alpha=0.5, gamma=3.0)  # strong: the tiny models' few image tokens weigh little
NEW = 6


class SpyPAI(PAI):
    """PAI that keeps, from its first step, the text-only stream and every stream's logits."""

    def scores(self, ctx, logits):
        if ctx.step == 0:
            self.stream = ctx.group_of("text_only").streams[0]
            self.first = {name: value.clone() for name, value in logits.items()}
        if ctx.step == 1:
            self.separate = dict(ctx.state.get("separate_streams", {}))
        self.compiled_steps = bool(ctx.state.get("compiled"))
        return super().scores(ctx, logits)


class StreamingNeutralPAI(PAI):
    """PAI that runs its text-only stream at γ = 1 too (PAI skips it there): joined to the clean batch, the stream
    must leave the clean rows' tokens as they are."""

    def contrast_streams(self, ctx):
        return [raw_question_stream(ctx) if self.cfg_stream == "raw_question" else text_only_stream(ctx)]

    def question_inputs(self, tokenizer, questions):
        return {RAW_QUESTION_IDS: raw_question_ids(tokenizer, questions)} if self.cfg_stream == "raw_question" else {}


def _llava_inputs(processor, questions):
    from PIL import Image

    texts = [f"USER: <image>\n{q} ASSISTANT:" for q in questions]
    images = [Image.fromarray(np.random.RandomState(len(q)).randint(0, 255, (30, 30, 3), dtype=np.uint8))
              for q in questions]  # seeded by the question: a row keeps its image alone and in a batch
    return processor(text=texts, images=images, padding=True, return_tensors="pt")


def _new(model, inputs, method=None, **kwargs):
    kwargs.setdefault("max_new_tokens", NEW)
    if method is not None:
        kwargs["custom_generate"] = method
    out = model.generate(**inputs, do_sample=False, **kwargs)
    return out[:, inputs["input_ids"].shape[1]:]


def _raw(method: PAI, tokenizer, questions) -> dict:
    return {"method_inputs": method.question_inputs(tokenizer, list(questions))}


def _row(stream, index: int) -> list[int]:
    return stream.input_ids[index][stream.attention_mask[index].bool()].tolist()


# -- the stream's tokens -----------------------------------------------------------------------
def test_raw_question_stream_is_bos_plus_the_question_tokens(llava):
    model, processor = llava
    tok = processor.tokenizer
    inputs = _llava_inputs(processor, QUESTIONS)
    spy = SpyPAI(**MOVING, cfg_stream="raw_question")
    _new(model, inputs, spy, max_new_tokens=2, **_raw(spy, tok, QUESTIONS))
    words = [["is", "there", "a", "pleural", "effusion", "?"],
             ["what", "is", "the", "size", "of", "the", "heart", "shown", "in", "this", "chest", "image", "?"]]
    for index, row_words in enumerate(words):  # BOS, then the words: no USER/ASSISTANT, no image, no newline
        expected = tok.convert_tokens_to_ids(["<s>", *row_words])
        assert _row(spy.stream, index) == expected
        with torch.no_grad():  # its logits are that prompt's, run alone without pixels
            direct = model(input_ids=torch.tensor([expected])).logits[0, -1]
        assert torch.allclose(spy.first["text_only"][index], direct, atol=1e-4)
    assert spy.stream.attention_mask[0].tolist() == [0] * 7 + [1] * 7  # the shorter row is left-padded
    assert spy.stream.input_ids[0, :7].tolist() == [tok.pad_token_id] * 7


def test_raw_question_ids_without_a_bos_token():
    class NoBos:
        bos_token_id = None

        def __call__(self, text, add_special_tokens=True):
            assert add_special_tokens is False
            return {"input_ids": [len(word) for word in text.split()]}

    assert raw_question_ids(NoBos(), ["ab cde"]) == [[2, 3]]
    with pytest.raises(MitigationError, match="gives no token"):
        raw_question_ids(NoBos(), [""])


def test_templated_stream_is_unchanged_by_default(llava):
    model, processor = llava
    inputs = _llava_inputs(processor, QUESTIONS)
    assert PAI().cfg_stream == "templated" and PAI().question_inputs(processor.tokenizer, QUESTIONS) == {}
    spy = SpyPAI(**MOVING)
    _new(model, inputs, spy, max_new_tokens=1)
    full = inputs["input_ids"][1][inputs["attention_mask"][1].bool()]
    image = full == model.config.image_token_id
    assert _row(spy.stream, 1) == full[~image].tolist()  # the templated prompt, image tokens dropped


def test_backend_hands_over_the_protocol_instruction(llava):
    """HFBackend under medheval-mitigation: the stream is BOS + the instruction text (the question with the
    script's yes/no suffix), while the clean prompt is templated (here the processor's own template, so the test
    needs no upstream file)."""
    from medheval.backends.hf import HFBackend
    from medheval.run.paper_protocols import configure_backend, get_protocol
    from medheval.run.paper_protocols.medheval import mitigation_instruction

    model, processor = llava
    protocol = get_protocol("medheval-mitigation")
    spec = protocol.mitigation_spec("pai:alpha=0.5,gamma=3")
    assert "cfg_stream=raw_question" in spec
    spy = SpyPAI(**get_mitigation(spec).settings())
    backend = configure_backend(HFBackend(model, processor, max_new_tokens=2, compile=False,
                                          generate_kwargs={"custom_generate": spy}), protocol, chat_template="model")
    record = {"id": "r0", "benchmark": "mm_vishal", "question": "<image>\nis there a pleural effusion ?",
              "answer": "yes", "answer_type": "yes_no", "choices": [], "meta": {"question_type": "binary"}}
    text = mitigation_instruction(record, "llava-med-1.5")
    assert text == "is there a pleural effusion ? Please answer Yes or No."
    from PIL import Image

    image = Image.fromarray(np.random.RandomState(0).randint(0, 255, (30, 30, 3), dtype=np.uint8))
    backend.generate([record], [[image]])
    tok = processor.tokenizer
    assert _row(spy.stream, 0) == [tok.bos_token_id] + tok(text, add_special_tokens=False)["input_ids"]
    prompt = backend.format_prompt(record, 1)
    assert text in prompt and len(tok(prompt)["input_ids"]) > len(_row(spy.stream, 0)) + 1  # templated, with image


# -- invariants ----------------------------------------------------------------------------------
def test_neutral_raw_equals_templated_equals_plain_greedy(tiny):
    kind, model, processor = tiny
    inputs = _llava_inputs(processor, QUESTIONS)
    raw = PAI(alpha=0.0, gamma=1.0, cfg_stream="raw_question")
    plain = _new(model, inputs)
    assert torch.equal(_new(model, inputs, raw, **_raw(raw, processor.tokenizer, QUESTIONS)), plain)
    assert torch.equal(_new(model, inputs, PAI(alpha=0.0, gamma=1.0)), plain)
    for stream in CFG_STREAMS:  # with the (unused) stream joined to the clean batch, as PAI ran it at γ = 1 before
        joined = StreamingNeutralPAI(alpha=0.0, gamma=1.0, cfg_stream=stream)
        assert torch.equal(_new(model, inputs, joined, **_raw(joined, processor.tokenizer, QUESTIONS)), plain)
    # with the boost on (α ≠ 0, γ = 1): dropping the stream changes no token of what PAI gave before, the boosted
    # clean rows of the joined batch
    boosted = _new(model, inputs, PAI(alpha=0.5, gamma=1.0))
    assert not torch.equal(boosted, plain)  # the boost moves this output: the comparison below can fail
    for stream in CFG_STREAMS:
        joined = StreamingNeutralPAI(alpha=0.5, gamma=1.0, cfg_stream=stream)
        assert torch.equal(_new(model, inputs, joined, **_raw(joined, processor.tokenizer, QUESTIONS)), boosted)


def test_raw_question_moves_the_output_and_batch_equals_single(tiny):
    kind, model, processor = tiny
    tok = processor.tokenizer
    method = PAI(**MOVING, cfg_stream="raw_question")
    inputs = _llava_inputs(processor, QUESTIONS)
    batched = _new(model, inputs, method, **_raw(method, tok, QUESTIONS))
    assert not torch.equal(batched, _new(model, inputs, PAI(**MOVING)))  # another stream, other scores
    for index, question in enumerate(QUESTIONS):
        alone = _llava_inputs(processor, [question])
        assert torch.equal(_new(model, alone, method, **_raw(method, tok, [question])), batched[index:index + 1])
    two_pass = method.two_pass()
    assert torch.equal(_new(model, inputs, two_pass, **_raw(two_pass, tok, QUESTIONS)), batched)


@pytest.mark.parametrize("family", [f for f in selftest.FAMILIES if f in selftest.METHODS["pai"].families])
def test_every_family(family):
    """On each family PAI runs on: the stream is BOS (when the tokenizer has one) + the question's tokens, it
    joins the clean batch, neutral = plain greedy, a batch = single runs."""
    model, processor = selftest._build(family)
    tok = processor.tokenizer
    prompts = list(selftest.PROMPTS)
    batch = selftest._inputs(processor, range(len(prompts)))
    spy = SpyPAI(**MOVING, cfg_stream="raw_question")
    moved = _new(model, batch, spy, **_raw(spy, tok, prompts))
    bos = [tok.bos_token_id] if tok.bos_token_id is not None else []
    for index, question in enumerate(prompts):
        assert _row(spy.stream, index) == bos + tok(question, add_special_tokens=False)["input_ids"]
    assert spy.separate == {}, spy.separate  # joined the clean batch: one forward per step
    neutral = StreamingNeutralPAI(alpha=0.0, gamma=1.0, cfg_stream="raw_question")  # the stream joined, unused
    assert torch.equal(_new(model, batch, neutral, **_raw(neutral, tok, prompts)), _new(model, batch))
    for index in range(len(prompts)):
        alone = selftest._inputs(processor, [index])
        assert torch.equal(_new(model, alone, spy, **_raw(spy, tok, prompts[index:index + 1])),
                           moved[index:index + 1]), f"{family} row {index}"


def test_static_cache_path_gives_the_eager_tokens(llava, monkeypatch):
    """The compiled decode path (static cache; an eager "compiler" so nothing is compiled here): the eager
    tokens, with the raw-question stream joined to the clean batch."""
    monkeypatch.setattr(internals, "compiled_forward", lambda model, mode: model)
    monkeypatch.setattr(compiled, "MIN_ROWS", 1)
    model, processor = llava
    tok = processor.tokenizer
    inputs = _llava_inputs(processor, QUESTIONS)
    eager, static = SpyPAI(**MOVING, cfg_stream="raw_question"), SpyPAI(**MOVING, cfg_stream="raw_question")
    with compiled.compiled_decoding(False):
        expected = _new(model, inputs, eager, **_raw(eager, tok, QUESTIONS))
    steps = compiled.STATS.steps
    with compiled.compiled_decoding(True):
        assert torch.equal(_new(model, inputs, static, **_raw(static, tok, QUESTIONS)), expected)
    assert static.compiled_steps and not eager.compiled_steps and compiled.STATS.steps > steps
    assert static.separate == {}


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("g++") is None and shutil.which("c++") is None,
                    reason="torch's CPU inductor needs a C++ compiler")
@pytest.mark.skipif(os.environ.get("MEDHEVAL_COMPILE_MATRIX") != "1",
                    reason="compiles a graph: with the compiled matrix only (make test-compiled)")
def test_really_compiled_gives_the_eager_tokens():
    """torch.compile for real (CPU inductor): the raw-question stream's batch decodes to the eager tokens."""
    model, processor = selftest._build("llava")
    tok = processor.tokenizer
    prompts = list(selftest.PROMPTS)
    batch = selftest._inputs(processor, range(len(prompts)))
    method = PAI(**MOVING, cfg_stream="raw_question")
    runs = []
    for compile in (False, True):
        steps = compiled.STATS.steps
        with compiled.compiled_decoding(compile):
            runs.append(_new(model, batch, method, max_new_tokens=10, **_raw(method, tok, prompts)))
        assert (compiled.STATS.steps > steps) == compile
    assert torch.equal(*runs)
    assert not model.__dict__.get("_medheval_compile_failed")


# -- errors ----------------------------------------------------------------------------------------
def test_bad_option_value_is_a_clear_error():
    assert CFG_STREAMS == ("templated", "raw_question")
    with pytest.raises(MitigationError, match=r"cfg_stream must be one of \['templated', 'raw_question'\], got 'raw'"):
        get_mitigation("pai:cfg_stream=raw")
    with pytest.raises(MitigationError, match="cfg_stream"):
        PAI(cfg_stream="question")
    method = get_mitigation("pai:cfg_stream=raw_question")
    assert method.cfg_stream == "raw_question" and get_mitigation(method.spec()) == method


def test_missing_or_wrong_question_ids_are_clear_errors(llava):
    model, processor = llava
    tok = processor.tokenizer
    inputs = _llava_inputs(processor, QUESTIONS)
    method = PAI(cfg_stream="raw_question")
    with pytest.raises(MitigationError, match="needs each row's question"):
        _new(model, inputs, method)
    with pytest.raises(MitigationError, match="got 1 rows of question ids .* batch of 2"):
        _new(model, inputs, method, **_raw(method, tok, QUESTIONS[:1]))
    with pytest.raises(MitigationError, match="image tokens"):
        _new(model, inputs, method, **_raw(method, tok, ["<image> lung", "lung"]))
    assert PAI(cfg_stream="raw_question", use_cfg=False).question_inputs(tok, QUESTIONS) == {}
    assert set(method.question_inputs(tok, QUESTIONS)) == {RAW_QUESTION_IDS}


# -- the released script -----------------------------------------------------------------------
RELEASED = SHARED_UPSTREAM / "medheval-code" / "code" / "baselines" / "Mitigation" / "llava-med-1.5" / "llava" / "eval"


@pytest.mark.skipif(not RELEASED.is_dir(), reason="../shared/data/upstream/medheval-code is absent")
def test_released_script_builds_its_cfg_stream_from_the_instruction_text():
    """model_vqa.py hands ``[cur_prompt]`` (the instruction text once ``<image>`` is removed and stripped) to
    ``init_cfg_processor``, which tokenizes it without special tokens and puts the BOS id in front."""
    script = ast.parse((RELEASED / "model_vqa.py").read_text())
    (call,) = [n for n in ast.walk(script)
               if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "init_cfg_processor"]
    assert ast.unparse({k.arg: k.value for k in call.keywords}["questions"]) == "[cur_prompt]"
    bodies = [[ast.unparse(statement) for statement in n.body] for n in ast.walk(script) if isinstance(n, ast.For)]
    (body,) = [b for b in bodies if "cur_prompt = qs" in b]
    assert body[body.index("cur_prompt = qs") - 1] == "qs = qs.replace(DEFAULT_IMAGE_TOKEN, '').strip()"
    loader = ast.parse((RELEASED / "PAI_files" / "model_loader.py").read_text())
    (function,) = [n for n in loader.body if isinstance(n, ast.FunctionDef) and n.name == "init_cfg_processor"]
    source = ast.unparse(function)
    assert "add_special_tokens=False" in source and "tokenizer.bos_token_id" in source
    assert "torch.cat([bos, tokens], dim=1)" in source  # no <image> in cur_prompt: this branch runs
