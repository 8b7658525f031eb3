"""The ``clinhallu`` paper protocol: ClinHallu's released settings reach the requests a model and its judge get,
and its scorer scores them.

What ClinHallu's ``src/common.py`` sends (``CoTAPIWrapper.generate``): a system message, then one user message
whose content is the text part first and the image parts after it, ``chat_template_kwargs: {enable_thinking:
False}``; ``configs/config.yaml`` ``generation``: temperature 0.7, top-p 0.9, 4096 tokens, 50 retries; ``judge``:
temperature 0.01, top-p 0.9, 4096 tokens, 5 retries of the same request.
The upstream side is read from ``../shared`` (yaml, and ``ast`` for the .py; skipped without it); our side
is what a loopback OpenAI-compatible server receives, and what the HF backend renders."""

from __future__ import annotations

import ast
import json

import pytest
from PIL import Image

from conftest import SHARED_UPSTREAM
from judge_servers import JudgeServer, Reply, user_text

from medheval.backends.api import APIBackend
from medheval.families.clinhallu.protocol import UPSTREAM_JUDGE, clinhallu_judge, validate_answer_reply
from medheval.families.clinhallu.task import apply_run_options, protocol_config
from medheval.judges import JudgeRequest
from medheval.run.paper_protocols import get_protocol

CLINHALLU = SHARED_UPSTREAM / "clinhallu"


class _Backend:
    seed = 0


def _config():
    options = get_protocol("clinhallu").benchmark_options["clinhallu"]
    _, recorded = apply_run_options(None, options)
    return recorded, protocol_config(recorded, _Backend(), 4096)


def test_the_protocol_sets_clinhallus_run_options():
    recorded, config = _config()
    assert recorded == {"prompts": "upstream", "temperature": 0.7, "top_p": 0.9, "max_attempts": 51,
                        "order": "text_first", "enable_thinking": False, "judge_settings": "upstream"}
    assert get_protocol("clinhallu").upstream_compat is True  # Acc over valid traces, rounded (its scripts)
    assert (config.temperature, config.top_p, config.max_new_tokens, config.max_attempts) == (0.7, 0.9, 4096, 51)
    assert config.text_first is True and config.enable_thinking is False
    assert get_protocol("clinhallu").plan("none", None).for_record("clinhallu", "all", None)["max_new_tokens"] == 4096
    _, default = apply_run_options(None, {})
    assert protocol_config(default, _Backend(), 4096).text_first is False  # the clean order: images first
    with pytest.raises(ValueError, match="clinhallu.order='sideways'"):
        apply_run_options(None, {"order": "sideways"})
    with pytest.raises(ValueError, match="clinhallu.enable_thinking='maybe'"):
        apply_run_options(None, {"enable_thinking": "maybe"})
    with pytest.raises(ValueError, match="clinhallu.judge_settings='theirs'"):
        apply_run_options(None, {"judge_settings": "theirs"})


def test_the_upstream_judge_request_and_its_retries():
    """Every call carries ClinHallu's judge settings (no JSON mode); an unusable reply is sent again as it was,
    1 + 5 tries in all; this project's own judge keeps its settings."""
    seen: list[str] = []

    def reply(request):  # "a": unusable once, then usable; "b": never usable
        seen.append(user_text(request))
        return '{"answer_correct": 1}' if seen.count("grade a") == 2 and seen[-1] == "grade a" else "not json"

    with JudgeServer("openai", reply=reply) as server:
        judge = clinhallu_judge(f"openai:j@{server.base_url}", "upstream", cache_dir=False, progress=False,
                                backoff_base=0.001, backoff_max=0.01)
        first, second = judge.run([JudgeRequest(name, user=f"grade {name}", validate=validate_answer_reply)
                                   for name in ("a", "b")])
        bodies = [request.json for request in server.requests]
    assert first.ok and first.attempts == 2 and not second.ok and second.attempts == 6
    assert len(bodies) == 8 and all(len(body["messages"]) == 1 for body in bodies)  # never a corrective turn
    assert {json.dumps({k: v for k, v in body.items() if k != "messages"}, sort_keys=True) for body in bodies} == {
        json.dumps({"model": "j", "temperature": 0.01, "top_p": 0.9, "max_tokens": 4096,
                    "chat_template_kwargs": {"enable_thinking": False}}, sort_keys=True)}
    described = judge.describe()
    assert (described["invalid_reply"], described["json_mode"], described["max_tries"]) == ("resend", False, 6)
    assert "max_invalid_retries" not in described and "max_retries" not in described  # max_tries is the budget
    own = clinhallu_judge("openai:j@http://127.0.0.1:9/v1", cache_dir=False)
    assert (own.temperature, own.top_p, own.invalid_reply, own.json_mode) == (0.01, None, "follow_up", True)
    with pytest.raises(ValueError, match="judge backend 'anthropic' cannot take it"):
        clinhallu_judge("anthropic:claude@http://127.0.0.1:9", "upstream")
    assert clinhallu_judge("vllm:j@http://127.0.0.1:9/v1", "upstream", cache_dir=False).top_p == 0.9


VALID = '{"answer_correct": 1}'
BUSY = Reply(503, "busy")
NOT_JSON = Reply(200, "not json")


def _judged(settings: str, *script: Reply):
    """One record judged by the ClinHallu judge (``settings``) against a server that answers ``script`` first,
    then a usable reply: the result and the number of calls the server got."""
    with JudgeServer("openai", reply=lambda request: VALID) as server:
        server.script(*script)
        judge = clinhallu_judge(f"openai:j@{server.base_url}", settings, cache_dir=False, progress=False,
                                backoff_base=0.001, backoff_max=0.01)
        [result] = judge.run([JudgeRequest("a", user="grade a", validate=validate_answer_reply)])
        return result, server.request_count


def test_a_failed_judge_call_counts_inside_clinhallus_six_tries():
    """Under ClinHallu's judge request a 503 uses one of the record's 6 tries, as an unusable reply does; this
    project's own judge re-sends a failed call on its own budget (5 per call) beside its unusable replies'."""
    result, calls = _judged("upstream", NOT_JSON, *[BUSY] * 5)  # 1 unusable + 5 failed calls: the 6 tries are spent
    assert (result.ok, result.attempts, calls) == (False, 6, 6)
    assert result.error.startswith("gave up after 6 call(s) (max_tries=6); last error: HTTP 503")
    result, calls = _judged("own", NOT_JSON, *[BUSY] * 5)  # its own budgets: the 7th call answers
    assert (result.ok, result.attempts, calls) == (True, 7, 7)
    result, calls = _judged("upstream", BUSY, BUSY, NOT_JSON, NOT_JSON, BUSY)  # the 6th and last try answers
    assert (result.ok, result.attempts, calls) == (True, 6, 6)
    result, calls = _judged("upstream", BUSY, BUSY, BUSY, *[NOT_JSON] * 5)  # 3 failed calls + 3 unusable replies
    assert (result.ok, result.attempts, calls) == (False, 6, 6)
    assert result.error.startswith("invalid output after 3 replies in 6 calls (max_tries=6): ")
    assert UPSTREAM_JUDGE["max_tries"] == 1 + UPSTREAM_JUDGE["max_invalid_retries"]


def _tried(*script: Reply, **options):
    """One record judged by a plain openai judge (``options``) against a server that answers ``script`` first,
    then a usable reply: (ok, attempts, calls the server got, error)."""
    from medheval.judges import make_judge

    with JudgeServer("openai", reply=lambda request: VALID) as server:
        server.script(*script)
        judge = make_judge(f"openai:j@{server.base_url}", cache_dir=False, progress=False, backoff_base=0.001,
                           backoff_max=0.01, **options)
        [result] = judge.run([JudgeRequest("a", user="grade a", validate=validate_answer_reply)])
        return result.ok, result.attempts, server.request_count, result.error or ""


def test_max_tries_is_the_one_budget_when_set():
    """With max_tries set, a record's calls end only when it is spent: max_retries (per run of failed calls)
    and max_invalid_retries no longer apply, as ClinHallu counts every failure within its tries."""
    assert _tried(BUSY, BUSY, max_tries=6, max_retries=1)[:3] == (True, 3, 3)
    assert _tried(NOT_JSON, NOT_JSON, max_tries=3, max_invalid_retries=0, invalid_reply="resend")[:3] == (True, 3, 3)
    ok, attempts, calls, error = _tried(BUSY, NOT_JSON, BUSY, max_tries=3, max_retries=0, max_invalid_retries=0,
                                        invalid_reply="resend")
    assert (ok, attempts, calls) == (False, 3, 3) and error.startswith("gave up after 3 call(s) (max_tries=3)")
    assert _tried(BUSY, BUSY, max_retries=1)[:3] == (False, 2, 2)  # without it, each budget its own


@pytest.mark.parametrize("backend", ["openai", "anthropic", "azure", "vllm"])
def test_a_judge_records_the_budgets_that_apply(backend):
    """describe() names max_tries when it is set, and then not max_retries / max_invalid_retries, which no longer
    apply; without it, those two as before."""
    from medheval.judges import make_judge

    spec = f"{backend}:j@https://127.0.0.1:9/v1"
    tries = make_judge(spec, cache_dir=False, max_tries=4, max_retries=3, max_invalid_retries=1).describe()
    assert tries["max_tries"] == 4 and not {"max_retries", "max_invalid_retries"} & set(tries)
    plain = make_judge(spec, cache_dir=False, max_retries=3, max_invalid_retries=1).describe()
    assert (plain["max_retries"], plain["max_invalid_retries"]) == (3, 1) and "max_tries" not in plain
    assert {key: value for key, value in tries.items() if key != "max_tries"} == {
        key: value for key, value in plain.items() if key not in ("max_retries", "max_invalid_retries")}


def test_a_rewritten_request_after_a_400_counts_within_max_tries():
    """A 400 the backend works around (max_tokens -> max_completion_tokens) is a call of the record's budget: a
    record whose last try it was ends there instead of calling once more."""
    adapt = Reply(400, {"error": {"message": "use max_completion_tokens instead"}})
    ok, attempts, calls, error = _tried(NOT_JSON, adapt, max_tries=2, invalid_reply="resend", json_mode=False)
    assert (ok, attempts, calls) == (False, 2, 2)
    assert error.startswith("gave up after 2 call(s) (max_tries=2); last error: HTTP 400: use max_completion_tokens")
    assert _tried(NOT_JSON, adapt, max_tries=3, invalid_reply="resend", json_mode=False)[:3] == (True, 3, 3)


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "6"])
def test_max_tries_must_be_a_positive_integer(bad):
    with pytest.raises(ValueError, match=rf"max_tries must be an integer >= 1 or None, got {bad!r}"):
        clinhallu_judge("openai:j@http://127.0.0.1:9/v1", cache_dir=False, max_tries=bad)
    assert "max_tries" not in clinhallu_judge("openai:j@http://127.0.0.1:9/v1", cache_dir=False).describe()

def test_an_api_model_gets_text_first_and_no_thinking():
    image = Image.new("RGB", (8, 8), (10, 20, 30))
    with JudgeServer("openai", reply=lambda request: "[Answer] yes") as server:
        backend = APIBackend(f"openai:m@{server.base_url}", max_new_tokens=16, cache_dir=False)
        request = {"id": "a", "system": "SYS", "user": "USER TEXT", "text_first": True, "enable_thinking": False,
                   "credentialed": False}
        backend.generate_chat([request, {**request, "id": "b", "text_first": False, "enable_thinking": None}],
                              [[image], [image]])
        sent = {r.json["messages"][1]["content"][0]["type"] + str(r.json.get("chat_template_kwargs")): r.json
                for r in server.requests}
    first = sent["text{'enable_thinking': False}"]
    assert [m["role"] for m in first["messages"]] == ["system", "user"]
    assert [part["type"] for part in first["messages"][1]["content"]] == ["text", "image_url"]
    assert "images_first" not in first
    assert "image_urlNone" in sent  # without the keys: images first, nothing about thinking


def test_a_local_model_gets_text_first(llava, monkeypatch):
    """The user turn's parts go to the chat template text first (the tiny templates place images first
    whatever the order, so the messages handed to the template are checked), and without a template too."""
    from medheval.backends.hf import HFBackend

    backend = HFBackend(*llava, device="cpu")
    seen = []
    original = backend.processor.apply_chat_template
    monkeypatch.setattr(backend.processor, "apply_chat_template",
                        lambda messages, **kw: seen.append((messages, kw)) or original(messages, **kw))
    backend.format_chat("SYS", "USER TEXT", "", 1, text_first=True, enable_thinking=False)
    backend.format_chat("SYS", "USER TEXT", "", 1)
    assert [part["type"] for part in seen[0][0][1]["content"]] == ["text", "image"]
    assert seen[0][1]["enable_thinking"] is False and "enable_thinking" not in seen[1][1]
    assert [part["type"] for part in seen[1][0][1]["content"]] == ["image", "text"]
    backend._use_chat_template = False  # a processor without a chat template: the LLaVA-1.5 form
    assert backend.format_chat("", "USER TEXT", "", 1, text_first=True) == "USER: USER TEXT\n<image> ASSISTANT:"
    assert backend.format_chat("", "USER TEXT", "", 1) == "USER: <image>\nUSER TEXT ASSISTANT:"


@pytest.mark.skipif(not CLINHALLU.is_dir(), reason="../shared/data/upstream/clinhallu is absent")
def test_the_settings_are_clinhallus_released_ones():
    import yaml

    generation = yaml.safe_load((CLINHALLU / "configs" / "config.yaml").read_text())["generation"]
    _, config = _config()
    assert (config.temperature, config.top_p, config.max_new_tokens) == (
        generation["temperature"], generation["top_p"], generation["max_tokens"])
    assert config.max_attempts == 1 + generation["retry_attempts"]
    tree = ast.parse((CLINHALLU / "src" / "common.py").read_text())
    wrapper = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "CoTAPIWrapper")
    generate = next(node for node in wrapper.body if isinstance(node, ast.FunctionDef) and node.name == "generate")
    source = ast.unparse(generate)
    # the user content starts as [text] and the images are appended after it
    assert "content: List[Dict[str, Any]] = [{'type': 'text', 'text': user_prompt}]" in source
    assert "content.append({'type': 'image_url'" in source
    assert "'chat_template_kwargs': {'enable_thinking': False}" in source
    assert source.index("'role': 'system'") < source.index("'role': 'user'")


@pytest.mark.skipif(not CLINHALLU.is_dir(), reason="../shared/data/upstream/clinhallu is absent")
def test_the_judge_settings_are_clinhallus_released_ones():
    """configs/config.yaml ``judge`` and common.py's request (top_p and max_tokens on every call, no
    response_format), and the judge functions' loop: the same request item sent again, no turn added."""
    import yaml

    judge = yaml.safe_load((CLINHALLU / "configs" / "config.yaml").read_text())["judge"]
    assert (UPSTREAM_JUDGE["temperature"], UPSTREAM_JUDGE["top_p"], UPSTREAM_JUDGE["max_tokens"],
            UPSTREAM_JUDGE["timeout"]) == (judge["temperature"], judge["top_p"], judge["max_tokens"], judge["timeout"])
    assert UPSTREAM_JUDGE["max_invalid_retries"] == judge["retry_attempts"]  # 02/04: max_attempts = retries + 1
    source = (CLINHALLU / "src" / "common.py").read_text()
    assert "response_format" not in source and "json_object" not in source
    for relpath, function in (("answer_judge.py", "judge_answer_correctness"),
                              ("step_hallucination_judge.py", "judge_step_hallucination")):
        tree = ast.parse((CLINHALLU / "src" / "model_evaluation" / relpath).read_text())
        body = next(node for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == function)
        (loop,) = [node for node in ast.walk(body) if isinstance(node, ast.For)
                   and isinstance(node.iter, ast.Call) and ast.unparse(node.iter) == "range(max_attempts)"]
        assert "judge_api.generate(request_item)" in ast.unparse(loop)
        assigned = {ast.unparse(target) for node in ast.walk(loop) if isinstance(node, (ast.Assign, ast.AugAssign))
                    for target in (node.targets if isinstance(node, ast.Assign) else [node.target])}
        assert not any(name.startswith("request_item") for name in assigned)  # re-sent as it was
        assert "time.sleep(backoff_time)" in ast.unparse(loop)
