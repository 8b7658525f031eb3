"""The model under test behind an API (``--model openai:<model>@<base_url>``): requests checked on a
server on 127.0.0.1 (images as data URLs with the record's pixels, the prompt as build_prompt builds
it, settings, auth, continuation body), retries, the cache, failures, the credentialed guard and its
proxies, secrets, and end-to-end runs of a MedHEval fixture split and of ClinHallu."""

from __future__ import annotations

import base64
import io
import json
import logging
import time
from pathlib import Path

import pytest
from PIL import Image

from clinhallu_fixture import write_snapshot
from judge_servers import JudgeServer, Reply, image_parts, recording_proxy, user_text  # noqa: F401 - fixture
from medheval.backends.api import APIBackend, is_api_model, strip_echo
from medheval.backends.base import BackendError
from medheval.data.benchmarks import prepare_benchmark
from medheval.families.clinhallu.trace import render_stages
from medheval.judges import CredentialedDataError
from medheval.run.prompts import build_prompt

SECRET = "sk-test-Zq81-never-in-files"


def _records(fixture, benchmark="mm_vishal", config="slake", limit=3):
    loaded = prepare_benchmark(benchmark, config, data_dir=fixture["data_dir"], image_roots=fixture["image_roots"],
                               limit=limit)
    records = loaded.dataset.to_list()
    return records, [loaded.resolver.load_record_images(r) for r in records]


def _pixels_of_data_url(url: str) -> tuple[str, tuple[int, int], bytes]:
    head, data = url.split(",", 1)
    assert head == "data:image/png;base64"
    image = Image.open(io.BytesIO(base64.b64decode(data)))
    return image.mode, image.size, image.tobytes()


def _file_pixels(fixture, record) -> list[tuple[str, tuple[int, int], bytes]]:
    root = Path(fixture["image_roots"][record["source"]])
    out = []
    for name in record["images"]:
        image = Image.open(root / name).convert("RGB")
        out.append((image.mode, image.size, image.tobytes()))
    return out


def _content(request_json):
    (message,) = request_json["messages"]
    assert message["role"] == "user"
    return message["content"]


def test_spec_detection_and_echo_stripping(tmp_path):
    assert is_api_model("openai:llava@http://127.0.0.1:8000/v1") and is_api_model("anthropic:claude-x")
    assert is_api_model("azure:dep@https://r.openai.azure.com")
    assert not is_api_model("llava-hf/llava-1.5-7b-hf") and not is_api_model("tiny-random-llava")
    folder = tmp_path / "openai:weird"
    folder.mkdir()
    assert not is_api_model(str(folder))  # an existing folder is a local model
    assert strip_echo("[R]\nabc", "[R]\n") == "abc" and strip_echo("  [R] abc", "[R]\n") == " abc"
    assert strip_echo("abc", "[R]\n") == "abc" and strip_echo("abc", "") == "abc"


def test_requests_carry_the_records_images_prompt_settings_and_key(fixture_benchmark, monkeypatch, tmp_path):
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    records, images = _records(fixture_benchmark, limit=3)
    with JudgeServer("openai", reply=lambda body: f"answer to {user_text(body)[:12]}", api_key=SECRET) as server:
        monkeypatch.setenv("MEDHEVAL_API_KEY_HOSTS", server.base_url)  # the user names the server for the key
        backend = APIBackend(f"openai:served-llava@{server.base_url}", max_new_tokens=12, do_sample=True,
                             temperature=0.5, top_p=0.9, seed=7, cache_dir=tmp_path / "c")
        outputs = backend.generate(records, images)
        received = list(server.requests)
    assert outputs == [f"answer to {build_prompt(r)[:12]}" for r in records]
    assert len(received) == len(records)
    by_prompt = {}
    for request in received:
        body = request.json
        assert request.headers["Authorization"] == f"Bearer {SECRET}"
        assert (body["model"], body["temperature"], body["max_tokens"], body["top_p"], body["seed"]) == (
            "served-llava", 0.5, 12, 0.9, 7)
        assert "response_format" not in body and "continue_final_message" not in body
        content = _content(body)
        assert [part["type"] for part in content][-1] == "text"  # images first, then the prompt
        by_prompt[content[-1]["text"]] = [_pixels_of_data_url(p["image_url"]["url"]) for p in image_parts(body)]
    for record in records:
        assert by_prompt[build_prompt(record)] == _file_pixels(fixture_benchmark, record)
    usage = backend.usage()
    assert (usage["requests"], usage["cached"], usage["input_tokens"], usage["output_tokens"]) == (3, 0, 33, 21)
    settings = backend.settings()
    assert settings["backend"] == "api" and settings["temperature"] == 0.5 and settings["seed"] == 7
    assert SECRET not in json.dumps(settings)


def test_greedy_by_default_and_continuation_body(monkeypatch, tmp_path):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    prefix = "[Visual Recognition]\nA round opacity.\n\n[Knowledge Recall]\n"
    replies = iter(["plain", prefix + "Round opacities are nodules.", "no echo"])
    with JudgeServer("openai", reply=lambda body: next(replies)) as server:
        backend = APIBackend(f"openai:m@{server.base_url}", max_new_tokens=5, cache_dir=False)
        assert backend.generate([{"id": "a", "question": "Q?", "answer_type": "open"}], [[]]) == ["plain"]
        greedy = server.requests[-1].json
        assert greedy["temperature"] == 0.0 and greedy["max_tokens"] == 5
        assert "seed" not in greedy and "top_p" not in greedy and "Authorization" not in server.requests[-1].headers
        chat = [{"id": "x", "system": "Think in stages.", "user": "Is it a nodule?", "assistant_prefix": prefix,
                 "credentialed": False}]
        sampled = {"do_sample": True, "temperature": 0.7, "top_p": 0.9, "max_new_tokens": 40}
        assert backend.generate_chat(chat, [[]], seed=11, overrides=sampled) == ["Round opacities are nodules."]
        body = server.requests[-1].json
        assert body["messages"] == [{"role": "system", "content": "Think in stages."},
                                    {"role": "user", "content": "Is it a nodule?"},
                                    {"role": "assistant", "content": prefix}]
        assert body["continue_final_message"] is True and body["add_generation_prompt"] is False
        assert (body["temperature"], body["top_p"], body["max_tokens"], body["seed"]) == (0.7, 0.9, 40, 11)
        off = APIBackend(f"openai:m@{server.base_url}", cache_dir=False, continue_final_message=False)
        assert off.generate_chat(chat, [[]]) == ["no echo"]
        assert "continue_final_message" not in server.requests[-1].json
        with pytest.raises(BackendError, match="repetition_penalty"):
            backend.generate_chat(chat, [[]], overrides={"repetition_penalty": 1.1})
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    assert APIBackend("openai:gpt-4o", cache_dir=False).continue_final_message is False  # api.openai.com
    assert APIBackend("openai:m@http://10.0.0.5:8000/v1", cache_dir=False).continue_final_message is True


def test_each_request_samples_with_its_own_seed(monkeypatch, tmp_path):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with JudgeServer("openai", reply=lambda body: f"seed {body.get('seed')}") as server:
        backend = APIBackend(f"openai:m@{server.base_url}", concurrency=4, cache_dir=tmp_path / "c")
        assert backend.per_request_seed is True
        chat = [{"id": f"r{i}", "system": "", "user": f"U{i}", "assistant_prefix": "", "credentialed": False,
                 **({"seed": seed} if seed is not None else {})} for i, seed in enumerate((5, 9, None))]
        sampled = {"do_sample": True, "temperature": 0.7}
        # a request's seed goes in its own body; one without takes the call's seed
        assert backend.generate_chat(chat, seed=3, overrides=sampled) == ["seed 5", "seed 9", "seed 3"]
        assert sorted(r.json["seed"] for r in server.requests) == [3, 5, 9]
        # a reply does not depend on the other requests of its call: alone, in another order, from the cache
        assert backend.generate_chat(chat[1:2], seed=3, overrides=sampled) == ["seed 9"]
        assert backend.generate_chat(chat[::-1], seed=4, overrides=sampled) == ["seed 4", "seed 9", "seed 5"]
        # greedy: no seed is sent, whatever the requests carry
        server.reset_counts()
        assert backend.generate_chat(chat[:1], overrides={"do_sample": False}) == ["seed None"]
        assert "seed" not in server.requests[-1].json


def test_anthropic_prefill_continues_natively(monkeypatch, tmp_path):
    monkeypatch.setenv("ANTHROPIC_API_KEY", SECRET)
    with JudgeServer("anthropic", reply=lambda body: "\nKnowledge text here.", api_key=SECRET) as server:
        monkeypatch.setenv("MEDHEVAL_API_KEY_HOSTS", server.base_url)
        backend = APIBackend(f"anthropic:claude-x@{server.base_url}", cache_dir=False)
        chat = [{"id": "x", "system": "S", "user": "U", "assistant_prefix": "[Knowledge Recall]\n", "credentialed": False}]
        reply = backend.generate_chat(chat, [[]], seed=3, overrides={"do_sample": True, "temperature": 0.7})
        request = server.requests[-1]
    assert reply == ["Knowledge text here."]
    body = request.json
    assert request.headers["x-api-key"] == SECRET and body["system"] == "S"
    assert body["messages"][-1] == {"role": "assistant", "content": "[Knowledge Recall]"}  # no trailing whitespace
    assert body["temperature"] == 0.7 and "seed" not in body and "continue_final_message" not in body


def test_retry_after_then_success_and_cache_without_the_key(monkeypatch, tmp_path):
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    records = [{"id": f"r{i}", "question": f"Question {i}?", "answer_type": "yes_no"} for i in range(4)]
    with JudgeServer("openai", reply=lambda body: "Yes") as server:
        server.script(Reply(429, {"error": {"message": "slow down"}}, headers={"Retry-After": "0.3"}))
        backend = APIBackend(f"openai:m@{server.base_url}", cache_dir=tmp_path / "cache", concurrency=1)
        assert backend.generate(records, None) == ["Yes"] * 4
        times = [r.time for r in server.requests]
        assert server.request_count == 5 and backend.usage()["retries"] == 1
        assert times[1] - times[0] >= 0.3  # the retry waited for Retry-After
        # a second run (new backend, same cache, another key): no request at all
        monkeypatch.setenv("OPENAI_API_KEY", "sk-another-key-5678")
        again = APIBackend(f"openai:m@{server.base_url}", cache_dir=tmp_path / "cache")
        assert again.generate(records, None) == ["Yes"] * 4
        assert server.request_count == 5 and again.usage()["requests"] == 0 and again.usage()["cached"] == 4
        # another setting is another cache key
        APIBackend(f"openai:m@{server.base_url}", cache_dir=tmp_path / "cache", max_new_tokens=9).generate(records[:1])
        assert server.request_count == 6
    again.close()
    for path in (tmp_path / "cache").rglob("*"):
        assert SECRET.encode() not in path.read_bytes()


def test_failed_records_stop_the_batch_and_a_rerun_asks_only_for_them(tmp_path, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    records = [{"id": f"r{i}", "question": f"Question {i}?", "answer_type": "open"} for i in range(3)]

    def reply(body):
        if "Question 1?" in user_text(body) and not state["fixed"]:
            return Reply(400, {"error": {"message": "image too large"}})
        return "ok"

    state = {"fixed": False}
    with JudgeServer("openai", reply=reply) as server:
        backend = APIBackend(f"openai:m@{server.base_url}", cache_dir=tmp_path / "c")
        with pytest.raises(BackendError, match=r"1 of 3 record\(s\) got no reply \('r1'\).*image too large"):
            backend.generate(records)
        assert server.request_count == 3
        state["fixed"] = True
        assert backend.generate(records) == ["ok"] * 3
        assert server.request_count == 4  # only r1 was asked again
    # a dead server: records failing in a row stop the batch at once
    with JudgeServer("openai") as dead:
        url = dead.base_url
    backend = APIBackend(f"openai:m@{url}", cache_dir=False, max_retries=0, concurrency=1, max_consecutive_failures=2)
    many = [{"id": f"d{i}", "question": "Q?", "answer_type": "open"} for i in range(20)]
    with pytest.raises(BackendError, match="2 records in a row failed for good"):
        backend.generate(many)
    assert backend.usage()["requests"] == 2
    with JudgeServer("openai", api_key="right-key") as server:
        monkeypatch.setenv("OPENAI_API_KEY", "wrong-key")
        with pytest.raises(BackendError, match="refused the credentials"):
            APIBackend(f"openai:m@{server.base_url}", cache_dir=False).generate(records)


def test_credentialed_records_never_leave_without_the_host_named(fixture_benchmark, recording_proxy, monkeypatch,
                                                                 tmp_path):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)  # keyless: a key never crosses plain http
    records, images = _records(fixture_benchmark, "cxr_vishal", "mimic_cxr", limit=2)
    remote = "openai:m@http://models.example.org/v1"
    backend = APIBackend(remote, cache_dir=False, max_retries=0)
    with pytest.raises(CredentialedDataError) as info:
        backend.check_records(records)
    message = str(info.value)
    assert records[0]["id"] in message and "allow_remote_credentialed='models.example.org'" in message
    with pytest.raises(CredentialedDataError):
        backend.generate(records, images)
    # a chat request that does not say whether it is credentialed counts as credentialed
    with pytest.raises(CredentialedDataError, match="nothing says whether"):
        backend.generate_chat([{"id": "c1", "user": "U", "system": "", "assistant_prefix": ""}], [[]])
    assert recording_proxy.hits == []  # nothing was sent
    opted = APIBackend(remote, cache_dir=False, max_retries=0, allow_remote_credentialed="models.example.org")
    opted.check_records(records)
    # approved for credentialed records, yet never through a proxy from the environment (issue 31) ...
    with pytest.raises(BackendError):
        opted.generate(records, images)
    assert recording_proxy.hits == []
    # ... unless the user names the host for the proxy too (--proxy-for / MEDHEVAL_PROXY_FOR)
    monkeypatch.setenv("MEDHEVAL_PROXY_FOR", "models.example.org")
    proxied = APIBackend(remote, cache_dir=False, max_retries=0, allow_remote_credentialed="models.example.org")
    assert proxied.generate(records, images) == ['{"score": 4}'] * 2  # answered through the proxy
    assert recording_proxy.hits == ["http://models.example.org/v1/chat/completions"] * 2


def test_a_dead_proxy_in_the_environment_does_not_carry_local_traffic(monkeypatch, tmp_path):
    for name in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")  # nothing listens there
    with JudgeServer("openai", reply=lambda body: "direct") as server:
        backend = APIBackend(f"openai:m@{server.base_url}", cache_dir=False, max_retries=0)
        record = {"id": "mimic", "question": "Q?", "answer_type": "open", "source": "mimic_cxr", "meta": {}}
        assert backend.generate([record]) == ["direct"]
        assert server.request_count == 1


def _run_args(fixture, out, model, *extra):
    roots = [a for s, r in fixture["image_roots"].items() for a in ("--image-root", f"{s}={r}")]
    return ["run", "--benchmark", "mm_vishal:slake,cxr_vishal:mimic_cxr", "--model", model, "--output", str(out),
            "--data-dir", fixture["data_dir"], *roots, "--max-new-tokens", "6", *extra]


def test_run_eval_with_an_api_model_end_to_end(fixture_benchmark, monkeypatch, tmp_path, capsys, caplog):
    from medheval.cli import main

    caplog.set_level(logging.DEBUG)
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)
    monkeypatch.setenv("MEDHEVAL_CACHE", str(tmp_path / "cache"))
    with JudgeServer("openai", reply=lambda body: "Yes", api_key=SECRET) as server:
        model = f"openai:served-llava@{server.base_url}"
        assert main(_run_args(fixture_benchmark, tmp_path / "a", model, "--api-concurrency", "4")) == 0
        n = server.request_count
        results = json.loads((tmp_path / "a" / "results.json").read_text())
        split_sizes = [entry["n_records"] for entry in results["benchmarks"].values()]
        assert n == sum(split_sizes) and all(size > 0 for size in split_sizes)
        assert results["usage"]["requests"] == n and results["usage"]["cached"] == 0
        assert results["settings"]["backend"]["backend"] == "api" and results["settings"]["model"] == "served-llava"
        predictions = [json.loads(line) for line in (tmp_path / "a" / "predictions.jsonl").read_text().splitlines()]
        assert {p["prediction"] for p in predictions} == {"Yes"} and len(predictions) == n
        assert {p["model"] for p in predictions} == {"served-llava"}
        # every request holds its record's prompt, and as many images as the record has
        loaded = [prepare_benchmark(*spec, data_dir=fixture_benchmark["data_dir"]).dataset.to_list()
                  for spec in (("mm_vishal", "slake"), ("cxr_vishal", "mimic_cxr"))]
        expected = sorted((build_prompt(r), len(r["images"])) for rows in loaded for r in rows)
        assert sorted((_content(r.json)[-1]["text"], len(image_parts(r.json))) for r in server.requests) == expected
        # a second run into a new folder comes from the cache: no request
        assert main(_run_args(fixture_benchmark, tmp_path / "b", model)) == 0
        assert server.request_count == n
        again = json.loads((tmp_path / "b" / "results.json").read_text())
        assert again["usage"]["requests"] == 0 and again["usage"]["cached"] == n
        assert again["benchmarks"]["mm_vishal:slake"]["metrics"] == results["benchmarks"]["mm_vishal:slake"]["metrics"]
    logged = capsys.readouterr()
    texts = [logged.out, logged.err, caplog.text] + [p.read_text(errors="replace") for p in tmp_path.rglob("*")
                                                     if p.is_file() and "cache" not in p.parts]
    assert not [t for t in texts if SECRET in t]


def test_run_eval_refusals_for_an_api_model(fixture_benchmark, tmp_path, capsys, recording_proxy, monkeypatch):
    from medheval.cli import main

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)  # keyless: a key never crosses plain http
    remote = "openai:m@http://models.example.org/v1"
    assert main(_run_args(fixture_benchmark, tmp_path / "a", remote)) == 2
    err = capsys.readouterr().err
    assert "cxr_vishal/mimic_cxr/" in err and "--allow-remote-credentialed models.example.org" in err
    assert recording_proxy.hits == []  # refused before any request, the public split included
    assert main(_run_args(fixture_benchmark, tmp_path / "b", remote, "--mitigation", "vcd")) == 2
    assert "--mitigation" in capsys.readouterr().err
    assert main(_run_args(fixture_benchmark, tmp_path / "c", remote, "--device", "cuda")) == 2
    assert "--device" in capsys.readouterr().err
    assert recording_proxy.hits == []
    # approved for credentialed records: sent, yet not through the environment's proxy unless named (issue 31)
    assert main(_run_args(fixture_benchmark, tmp_path / "d", remote, "--allow-remote-credentialed",
                          "models.example.org", "--api-option", f"cache_dir={tmp_path / 'c2'}",
                          "--api-option", "max_retries=0")) == 2
    assert recording_proxy.hits == []
    assert main(_run_args(fixture_benchmark, tmp_path / "e", remote, "--allow-remote-credentialed",
                          "models.example.org", "--proxy-for", "models.example.org",
                          "--api-option", f"cache_dir={tmp_path / 'c2'}")) == 0
    assert recording_proxy.hits and set(recording_proxy.hits) == {"http://models.example.org/v1/chat/completions"}


def _trace(prefix: str) -> str:
    """A valid trace, or its continuation after ``prefix`` (which ends with the next stage's marker)."""
    full = render_stages(visual_recognition="An opaque region in the left lower zone.",
                         knowledge_recall="Opaque basal regions often mean pleural fluid.",
                         reasoning="The opacity fits an effusion on the left side.", answer="yes")
    if not prefix:
        return full
    last_marker = prefix.rstrip().splitlines()[-1]
    return full.split(last_marker, 1)[1]


def clinhallu_reply(model_bodies: list[dict]):
    """A loopback server's reply function for a ClinHallu run: the judge (model "judge") always agrees, the
    model under test writes a trace (continuing an assistant turn); the model's request bodies are kept."""
    def reply(body: dict) -> str:
        if body["model"] == "judge":
            return json.dumps({"hallucinated": 0, "reason": "checked", "answer_correct": 1, "answer_reasoning": "same"})
        model_bodies.append(body)
        last = body["messages"][-1]
        return _trace(last["content"] if last["role"] == "assistant" else "")

    return reply


def test_clinhallu_through_the_api_backend(tmp_path, monkeypatch):
    from medheval.cli import main

    snapshot = write_snapshot(tmp_path / "snap")
    monkeypatch.setenv("MEDHEVAL_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    model_bodies: list[dict] = []
    reply = clinhallu_reply(model_bodies)

    roots = [a for key, path in snapshot["image_roots"].items() for a in ("--image-root", f"{key}={path}")]
    args = ["run", "--benchmark", "clinhallu:vqa_rad", "--data-dir", snapshot["data_dir"], *roots,
            "--output", str(tmp_path / "out"), "--max-new-tokens", "64"]
    with JudgeServer("openai", reply=reply) as server:
        assert main(args + ["--model", f"openai:vlm@{server.base_url}", "--judge", f"openai:judge@{server.base_url}"]) == 0
        first = server.request_count
        results = json.loads((tmp_path / "out" / "results.json").read_text())
        entry = results["benchmarks"]["clinhallu:vqa_rad"]
        n = entry["n_records"]
        assert len(model_bodies) == 4 * n and results["usage"]["requests"] == 4 * n
        continuations = [b for b in model_bodies if b["messages"][-1]["role"] == "assistant"]
        assert len(continuations) == 3 * n
        assert all(b["continue_final_message"] is True and b["add_generation_prompt"] is False for b in continuations)
        assert all(b["temperature"] == 0.7 and b["top_p"] == 0.9 and b["max_tokens"] == 64 for b in model_bodies)
        originals = [b for b in model_bodies if b["messages"][-1]["role"] == "user"]
        assert all(image_parts(b) for b in originals)  # the item's images go with every trace request
        counts = entry["clinhallu_run"]["counts"]
        assert all(counts[s]["n_invalid"] == 0 for s in ("org", "rep_v", "rep_k", "rep_vk"))
        metric = entry["metrics"]["clinhallu"]
        assert metric["acc"] == 1.0 and metric["acc_rep_v"] == 1.0 and metric["h_v"] == 0.0
        # a second identical run resumes from the logs: no model or judge request
        assert main(args + ["--model", f"openai:vlm@{server.base_url}", "--judge", f"openai:judge@{server.base_url}"]) == 0
        assert server.request_count == first


def test_azure_deployment_url_key_header_and_no_vllm_fields(monkeypatch):
    monkeypatch.setenv("AZURE_OPENAI_API_KEY", SECRET)
    with JudgeServer("azure", reply=lambda body: "No") as server:
        monkeypatch.setenv("AZURE_OPENAI_ENDPOINT", server.root_url)  # the provider's own host: the key goes there
        backend = APIBackend(f"azure:my-deploy@{server.root_url}", cache_dir=False)
        chat = [{"id": "x", "system": "", "user": "U", "assistant_prefix": "[Answer]", "credentialed": False}]
        image = Image.new("RGB", (4, 4), (1, 2, 3))
        assert backend.generate_chat(chat, [[image]]) == ["No"]
        request = server.requests[-1]
    assert request.path.startswith("/openai/deployments/my-deploy/chat/completions?api-version=")
    assert request.headers["api-key"] == SECRET and "Authorization" not in request.headers
    body = request.json
    assert "continue_final_message" not in body and backend.settings()["continue_final_message"] is False
    user = body["messages"][0]
    assert [part["type"] for part in user["content"]] == ["image_url", "text"]
    assert _pixels_of_data_url(user["content"][0]["image_url"]["url"]) == ("RGB", (4, 4), image.tobytes())
    assert body["messages"][-1] == {"role": "assistant", "content": "[Answer]"}


def test_api_model_takes_the_generation_length_of_each_answer_type(fixture_benchmark, monkeypatch, tmp_path):
    """Without --max-new-tokens, each record's request carries its answer type's built-in length
    (medheval.run.generation), and the prediction records the prompt sent and the settings used."""
    from medheval.cli import main
    from medheval.run.generation import BUILTIN_BY_ANSWER_TYPE

    monkeypatch.setenv("MEDHEVAL_CACHE", str(tmp_path / "cache"))
    with JudgeServer("openai", reply=lambda body: "Yes") as server:
        args = _run_args(fixture_benchmark, tmp_path / "a", f"openai:m@{server.base_url}")
        cut = args.index("--max-new-tokens")
        assert main(args[:cut] + args[cut + 2:]) == 0
        lengths = {(_content(r.json)[-1]["text"], r.json["max_tokens"]) for r in server.requests}
    records = [r for spec in (("mm_vishal", "slake"), ("cxr_vishal", "mimic_cxr"))
               for r in prepare_benchmark(*spec, data_dir=fixture_benchmark["data_dir"]).dataset.to_list()]
    assert {r["answer_type"] for r in records} == {"yes_no", "multiple_choice"}
    assert lengths == {(build_prompt(r), BUILTIN_BY_ANSWER_TYPE[r["answer_type"]]["max_new_tokens"]) for r in records}
    logged = {e["id"]: e for e in map(json.loads, (tmp_path / "a" / "predictions.jsonl").read_text().splitlines())}
    for record in records:
        entry = logged[record["id"]]
        assert entry["prompt"] == build_prompt(record)
        assert entry["generation"]["max_new_tokens"] == BUILTIN_BY_ANSWER_TYPE[record["answer_type"]]["max_new_tokens"]


@pytest.mark.parametrize("option, said", [
    ("deadlne=5", "--api-option 'deadlne' is not an option of an API model (did you mean 'deadline'?)"),
    ("json_mode=true", "--api-option 'json_mode' is not an option of an API model"),
    ("api_version=2024-06-01", "--api-option 'api_version' does not apply to openai: models (it is for azure"),
])
def test_a_wrong_api_option_names_the_model_option_not_a_judge(option, said, tmp_path, capsys):
    """A typo in --api-option used to say "unknown option(s) ['deadlne'] for the openai judge", listing internal
    judge options; the model's own documented options are named instead, with the closest one."""
    from medheval.cli import main

    code = main(["run", "--model", "openai:m@http://127.0.0.1:9/v1", "--benchmark", "mm_vishal:slake",
                 "--output", str(tmp_path / "run"), "--api-option", option])
    err = capsys.readouterr().err
    assert code == 2 and said in err and "judge" not in err
    assert "timeout, deadline, max_retries" in err or "does not apply" in err


def test_deadline_is_an_api_option(tmp_path):
    import argparse

    from medheval.run.options import build_api_backend

    args = argparse.Namespace(model="openai:m@http://127.0.0.1:9/v1", device=None, dtype=None, prefix_cache=False,
                              chat_template=None, api_option=["deadline=5", "timeout=2"], max_new_tokens=4,
                              do_sample=False, temperature=None, top_p=None, seed=0, api_concurrency=1, batch_size=1,
                              allow_remote_credentialed=[])
    backend = build_api_backend(args)
    assert (backend._client.deadline, backend._client.timeout) == (5, 2.0)
