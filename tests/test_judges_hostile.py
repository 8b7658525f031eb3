"""Model and judge endpoints that misbehave (issue 23, points 1 and 4-6), each reproduced on 127.0.0.1 first:

1. a redirect to another host is refused (the second listener receives nothing), naming both hosts;
   a same-origin 307/308 is followed with its body; a 301/302/303 is refused;
4. a server trickling one byte at a time (headers or body) fails within the deadline plus the retries;
5. replies of the wrong shape, or far larger than ``max_tokens`` allows, are failed records (retried, never
   predictions); a judge reply with two different JSON objects is unparsed;
6. a key the server echoes never reaches a prediction, ``scored.jsonl`` or the report.
"""

from __future__ import annotations

import json
import time

import pytest

from judge_servers import Drip, JudgeServer, Reply
from medheval.backends.api import APIBackend
from medheval.backends.base import BackendError
from medheval.judges import JudgeError, JudgeRequest, make_judge
from medheval.judges.structured import parse_json_object

KEY = "sk-canary-Hx81-never-anywhere"
PATH = "/v1/chat/completions"


def _judge(server: JudgeServer, **options):
    options = {"cache_dir": False, "progress": False, "max_retries": 0, "api_key": KEY, **options}
    return make_judge({"backend": "openai", "model": "m", "base_url": server.base_url, **options})


def _raw(rid: str = "r1") -> JudgeRequest:
    return JudgeRequest(id=rid, messages=[{"role": "user", "content": "Is there an effusion?"}], reply_format="raw")


# -- 1. redirects ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_redirect_to_another_host_is_refused_and_the_other_host_gets_nothing(status):
    with JudgeServer("openai", reply=lambda body: "Yes") as elsewhere, JudgeServer("openai") as endpoint:
        endpoint.script(Reply(status, "", headers={"Location": f"{elsewhere.root_url}{PATH}"}))
        with pytest.raises(JudgeError) as caught:
            _judge(endpoint).run([_raw()])
        message = str(caught.value)
        assert f"127.0.0.1:{endpoint.port}" in message and f"127.0.0.1:{elsewhere.port}" in message
        assert "another host" in message and KEY not in message
        assert endpoint.request_count == 1 and elsewhere.request_count == 0


def test_another_port_or_scheme_is_another_host_too():
    with JudgeServer("openai") as endpoint:
        for location in (f"http://127.0.0.1:{endpoint.port + 1}{PATH}", f"https://127.0.0.1:{endpoint.port}{PATH}",
                         f"http://localhost:{endpoint.port}{PATH}"):
            endpoint.script(Reply(307, "", headers={"Location": location}))
            with pytest.raises(JudgeError, match="another host"):
                _judge(endpoint).run([_raw()])
        assert endpoint.request_count == 3


def test_a_same_origin_307_is_followed_with_its_body_and_key():
    with JudgeServer("openai", reply=lambda body: "No.", api_key=KEY) as endpoint:
        endpoint.script(Reply(307, "", headers={"Location": f"{PATH}?moved=1"}))
        (result,) = _judge(endpoint).run([_raw()])
        assert result.ok and result.value == "No."
        first, second = endpoint.requests
        assert second.path == f"{PATH}?moved=1" and second.json == first.json
        assert second.headers.get("Authorization") == f"Bearer {KEY}"


@pytest.mark.parametrize("status", [301, 302, 303])
def test_a_same_origin_redirect_that_drops_the_body_is_refused(status):
    with JudgeServer("openai", reply=lambda body: "Yes") as endpoint:
        endpoint.script(Reply(status, "", headers={"Location": f"{PATH}?moved=1"}))
        with pytest.raises(JudgeError, match=f"answered {status} .*turns the POST into a GET"):
            _judge(endpoint).run([_raw()])
        assert endpoint.request_count == 1


def test_the_model_under_test_refuses_a_cross_host_redirect(fixture_benchmark):
    with JudgeServer("openai", reply=lambda body: "Yes") as elsewhere, JudgeServer("openai") as endpoint:
        endpoint.script(*[Reply(307, "", headers={"Location": f"{elsewhere.root_url}{PATH}"})] * 4)
        backend = APIBackend(f"openai:m@{endpoint.base_url}", api_key=KEY, cache_dir=False, max_retries=0)
        with pytest.raises((BackendError, JudgeError), match=f"127.0.0.1:{elsewhere.port}"):
            backend.generate([{"id": "mm_vishal/slake/1", "question": "Is it normal?", "answer_type": "yes_no",
                               "choices": [], "source": "slake", "meta": {}}], [[]])
        assert elsewhere.request_count == 0


# -- 4. a total deadline ------------------------------------------------------------------------------
@pytest.mark.parametrize("part", ["headers", "body"])
def test_a_dripping_server_fails_within_the_deadline_and_the_retry_budget(part):
    deadline, retries = 1.0, 1
    with JudgeServer("openai") as endpoint:
        endpoint.script(*[Drip(interval=0.2, part=part)] * (retries + 1))  # 80 s each if let run
        judge = _judge(endpoint, timeout=3, deadline=deadline, max_retries=retries, backoff_base=0.05,
                       backoff_max=0.1)
        began = time.monotonic()
        (result,) = judge.run([_raw()])
        elapsed = time.monotonic() - began
    assert not result.ok and "deadline=1s" in result.error and result.attempts == retries + 1
    # about 2.1 s (the deadline per attempt and a backoff); the margin is for a loaded machine, the bound still
    # far below one attempt's 80 s drip (a deadline that fired late, or on the first attempt only)
    assert elapsed < 20, elapsed


def test_deadline_defaults_for_judges_and_models():
    with JudgeServer("openai") as endpoint:
        assert _judge(endpoint).deadline == 300.0
        assert APIBackend(f"openai:m@{endpoint.base_url}", cache_dir=False)._client.deadline == 900.0
        with pytest.raises(ValueError, match="deadline must be positive"):
            _judge(endpoint, deadline=0)


# -- 5. strict replies -----------------------------------------------------------------------------------
GARBAGE = [
    ({"text": "Yes"}, "message.content is a dict, not text"),
    (12345, "message.content is a int, not text"),
    (None, "message.content is null, not text"),
    ([{"type": "text", "text": 5}], "whose text is not a string"),
    (["Yes"], "is a str, not a content part"),
    ([{"type": "image_url", "image_url": {"url": "data:"}}], "has no text part"),
]


@pytest.mark.parametrize("content, reason", GARBAGE, ids=[r for _, r in GARBAGE])
def test_a_reply_of_the_wrong_shape_is_a_failed_record_retried_never_a_prediction(content, reason, tmp_path):
    body = {"choices": [{"message": {"role": "assistant", "content": content}, "finish_reason": "stop"}]}
    with JudgeServer("openai", reply=lambda request: body) as endpoint:
        (result,) = _judge(endpoint, max_retries=1, backoff_base=0.01, backoff_max=0.02).run([_raw()])
        assert not result.ok and reason in result.error and result.value is None
        assert endpoint.request_count == 2  # retried like any other failure
        backend = APIBackend(f"openai:m@{endpoint.base_url}", cache_dir=str(tmp_path), max_retries=0)
        with pytest.raises(BackendError, match=reason):
            backend.generate([{"id": "x/y/1", "question": "Is it normal?", "answer_type": "yes_no", "choices": [],
                               "source": "slake", "meta": {}}], [[]])


def test_a_valid_text_part_list_and_a_plain_string_are_read():
    for content in ("Yes.", [{"type": "text", "text": "Ye"}, {"type": "reasoning", "x": 1}, {"type": "text", "text": "s."}]):
        body = {"choices": [{"message": {"role": "assistant", "content": content}, "finish_reason": "stop"}]}
        with JudgeServer("openai", reply=lambda request: body) as endpoint:
            (result,) = _judge(endpoint).run([_raw()])
        assert result.ok and result.value == "Yes."


def test_a_reply_far_larger_than_max_tokens_is_refused():
    huge = "yes " * (10 * 1024 * 1024 // 4)  # a 10 MB reply to a 16-token request
    small = "y" * 3000  # within the body cap, but far more text than 16 tokens can be
    with JudgeServer("openai", reply=lambda request: huge) as endpoint:
        (result,) = _judge(endpoint, max_tokens=16).run([_raw()])
        assert not result.ok and "exceeds" in result.error and "bytes" in result.error
    with JudgeServer("openai", reply=lambda request: small) as endpoint:
        (result,) = _judge(endpoint, max_tokens=16).run([_raw()])
        assert not result.ok and "3000 characters is far longer than max_tokens=16" in result.error


def test_two_different_json_objects_are_ambiguous_the_same_one_twice_is_not():
    with pytest.raises(ValueError, match="holds 2 different JSON objects"):
        parse_json_object('{"score": 1} and on reflection {"score": 2}')
    assert parse_json_object('```json\n{"score": 1}\n``` so: {"score": 1}') == {"score": 1}
    assert parse_json_object('the format is {score: <int>}; answer: {"score": 2}') == {"score": 2}


def test_an_ambiguous_judge_reply_is_asked_again_then_failed():
    request = JudgeRequest(id="j1", messages=[{"role": "user", "content": "Score it."}])
    with JudgeServer("openai", reply=lambda body: '{"score": 0} {"score": 3}') as endpoint:
        (result,) = _judge(endpoint, max_invalid_retries=1).run([request])
    assert not result.ok and "2 different JSON objects" in result.error and endpoint.request_count == 2


# -- 6. an echoed key --------------------------------------------------------------------------------------
def test_an_echoed_key_never_reaches_predictions_scored_items_or_the_report(fixture_benchmark, monkeypatch, tmp_path):
    from medheval.cli import main

    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setenv("MEDHEVAL_CACHE", str(tmp_path / "cache"))
    roots = [a for s, r in fixture_benchmark["image_roots"].items() for a in ("--image-root", f"{s}={r}")]
    with JudgeServer("openai", reply=lambda body: f"Yes. Your key is {KEY}.", api_key=KEY) as endpoint:
        assert main(["run", "--benchmark", "mm_vishal:slake", "--model", f"openai:m@{endpoint.base_url}",
                     "--output", str(tmp_path / "run"), "--data-dir", fixture_benchmark["data_dir"], *roots,
                     "--max-new-tokens", "16"]) == 0
        assert endpoint.request_count > 0
    predictions = [json.loads(line) for line in (tmp_path / "run" / "predictions.jsonl").read_text().splitlines()]
    assert {p["prediction"] for p in predictions} == {"Yes. Your key is ***."}
    for path in [p for p in tmp_path.rglob("*") if p.is_file()]:
        assert KEY.encode() not in path.read_bytes(), path


def test_model_calls_are_not_called_judge_records_in_the_logs(caplog):
    import logging

    caplog.set_level(logging.INFO, logger="medheval.judges")
    body = {"choices": [{"message": {"role": "assistant", "content": None}, "finish_reason": "stop"}]}
    with JudgeServer("openai", reply=lambda request: body) as endpoint:
        backend = APIBackend(f"openai:m@{endpoint.base_url}", cache_dir=False, max_retries=0)
        with pytest.raises(BackendError):
            backend.generate([{"id": "x/y/1", "question": "Is it normal?", "answer_type": "yes_no", "choices": [],
                               "source": "slake", "meta": {}}], [[]])
    assert "model record" in caplog.text and "judge record" not in caplog.text
