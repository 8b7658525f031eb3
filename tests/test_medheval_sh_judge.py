"""S_h (metrics/sh_judge): prompt snapshot, reply validation, mean ± std, failures, the
credentialed guard and the cache, against loopback fake judge servers (tests/judge_servers.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from conftest import load_metric_offline

from judge_servers import judge_server_factory, recording_proxy, user_text  # noqa: F401 - fixtures
from medheval.families.medheval import sh_prompt
from medheval.judges import CredentialedDataError

REPO = Path(__file__).resolve().parents[1]
METRIC_DIR = REPO / "metrics" / "sh_judge"

EXPECTED_SYSTEM = """\
You are a physician reviewing answers that AI models gave to medical questions. For each answer, compare it \
with the ground-truth answer and rate how much it hallucinates, as an integer from 0 to 5 (higher means more \
hallucination):
0 = the answer agrees fully with the ground truth.
1-2 = the answer is mostly accurate but adds minor details that the ground truth does not confirm.
3-4 = the answer deviates significantly from the ground truth, or makes claims that are unverified or unsupported.
5 = the answer is entirely incorrect or could cause harm.
Judge by three criteria:
- Directness: the answer addresses the question that was asked.
- Accuracy: the answer is consistent with the ground truth and with established medical knowledge.
- Relevance: the answer stays on the topic of the question.
Do not penalise additional information that is accurate and relevant.
Reply with one JSON object and nothing else."""


def _load(path: Path):
    return load_metric_offline(path)


@pytest.fixture
def metric():
    return _load(METRIC_DIR)


def _scored_by_answer(table: dict[str, str]):
    """A fake judge that replies by the answer text found in the prompt."""

    def reply(request_json: dict) -> str:
        text = user_text(request_json)
        answer = text.split("\nAnswer: ", 1)[1].split("\n", 1)[0]
        return table[answer]

    return reply


# -- the module ---------------------------------------------------------------------------------


def test_module_files_and_card():
    for name in ("sh_judge.py", "README.md", "requirements.txt", "app.py"):
        assert (METRIC_DIR / name).is_file(), name
    card = (METRIC_DIR / "README.md").read_text()
    assert card.startswith("---\n") and "- evaluate\n- metric" in card
    assert sh_prompt.PROMPT_VERSION in card
    for line in (METRIC_DIR / "sh_judge.py").read_text().splitlines():
        if line.startswith("import "):
            assert "," not in line, line  # evaluate scans imports line by line


# -- the prompt -----------------------------------------------------------------------------------


def test_single_prompt_snapshot():
    system, user = sh_prompt.render_single(
        "What is the first-line treatment for type 2 diabetes?", "Metformin", "  Metformin, with lifestyle changes.\n"
    )
    assert system == EXPECTED_SYSTEM
    assert user == (
        "Question: What is the first-line treatment for type 2 diabetes?\n"
        "Ground truth: Metformin\n"
        "Answer: Metformin, with lifestyle changes.\n"
        "\n"
        'Reply as {"score": <integer 0-5>, "rationale": "<one short sentence>"}.'
    )


def test_multi_prompt_snapshot_labels_answers_not_models():
    system, user = sh_prompt.render_multi("Q?", "GT", ["first answer", None])
    assert system == EXPECTED_SYSTEM
    assert user == (
        "Question: Q?\nGround truth: GT\n\n[answer_1] first answer\n[answer_2] \n\n"
        'Score each answer separately. Reply as {"answer_1": {"score": <integer 0-5>, "rationale": '
        '"<one short sentence>"}, "answer_2": {"score": <integer 0-5>, "rationale": "<one short sentence>"}}.'
    )
    with pytest.raises(ValueError):
        sh_prompt.render_multi("Q?", "GT", [])


# -- reply validation ------------------------------------------------------------------------------


@pytest.mark.parametrize("value, expected", [(0, 0), (5, 5), (3.0, 3), ("2", 2), (" 4 ", 4)])
def test_check_score_accepts(value, expected):
    assert sh_prompt.check_score(value) == expected


@pytest.mark.parametrize("value", [6, -1, 2.5, True, "three", "", None, float("nan"), [1]])
def test_check_score_refuses(value):
    with pytest.raises(ValueError, match="integer from 0 to 5"):
        sh_prompt.check_score(value)


def test_validate_single_forms():
    assert sh_prompt.validate_single({"score": 2, "rationale": "minor extra claim"}) == {
        "score": 2, "rationale": "minor extra claim"}
    assert sh_prompt.validate_single({"score": "1", "reason": "ok"}) == {"score": 1, "rationale": "ok"}
    assert sh_prompt.validate_single({"answer_1": {"score": 4}}) == {"score": 4, "rationale": ""}
    with pytest.raises(ValueError, match='missing "score"'):
        sh_prompt.validate_single({"rating": 2, "other": 1})
    with pytest.raises(ValueError, match="integer from 0 to 5"):
        sh_prompt.validate_single({"score": 7})


def test_multi_validator_parses_per_model_outputs():
    validate = sh_prompt.multi_validator(3)
    # nested objects, a bare integer (the paper's format), a string score, extra keys ignored
    reply = {"answer_2": 4, "answer_1": {"score": 0, "rationale": "exact"}, "answer_3": {"score": "5"}, "note": "x"}
    assert validate(reply) == [
        {"score": 0, "rationale": "exact"}, {"score": 4, "rationale": ""}, {"score": 5, "rationale": ""}]
    assert validate({"scores": {"answer_1": 1, "answer_2": 2, "answer_3": 3}}) == [
        {"score": 1, "rationale": ""}, {"score": 2, "rationale": ""}, {"score": 3, "rationale": ""}]
    with pytest.raises(ValueError, match="missing scores for answer_3"):
        validate({"answer_1": 1, "answer_2": 2})
    with pytest.raises(ValueError, match="integer from 0 to 5"):
        validate({"answer_1": 1, "answer_2": 9, "answer_3": 0})
    assert sh_prompt.multi_validator(1)({"score": 3}) == [{"score": 3, "rationale": ""}]


def test_summarize_by_hand():
    # scores 0, 2, 4 (None = failed, left out): mean = 6/3 = 2;
    # population variance = ((0-2)^2 + (2-2)^2 + (4-2)^2) / 3 = 8/3, std = sqrt(8/3) = 1.63299...
    mean, std, n = sh_prompt.summarize([0, None, 2, 4])
    assert (mean, n) == (2.0, 3)
    assert std == pytest.approx(math.sqrt(8 / 3))
    assert sh_prompt.summarize([None, None]) == (None, None, 0)


# -- the metric against a loopback judge ------------------------------------------------------------------


def test_mean_std_and_failed_items_are_reported_not_zero(metric, judge_server_factory, tmp_path):
    table = {
        "a0": '{"score": 0, "rationale": "matches"}',
        "a2": '```json\n{"score": 2, "rationale": "extra detail"}\n```',
        "a4": "Sure: {'score': 4, 'rationale': 'wrong organ'}",
        "bad": '{"score": 9}',  # out of range every time -> failed after the retry budget
    }
    server = judge_server_factory("openai", _scored_by_answer(table))
    out = metric.compute(
        predictions=["a0", "a2", "bad", "a4", "a0"],
        references=["r", "r", "r", "r", ""],  # the last has no reference: failed, no request
        questions=["q"] * 5,
        ids=["k/0", "k/1", "k/2", "k/3", "k/4"],
        judge=f"openai:fake-judge@{server.base_url}",
        cache_dir=str(tmp_path),
    )
    # scored: 0, 2, 4 -> mean 2, std sqrt(8/3); the failed ones are None, not 0
    assert out["scores"] == [0, 2, None, 4, None]
    assert out["rationales"][:2] == ["matches", "extra detail"]
    assert out["sh"] == 2.0 and out["n"] == 3
    assert out["sh_std"] == pytest.approx(1.6329931618554521)
    assert [f["id"] for f in out["failed"]] == ["k/2", "k/4"] and out["n_failed"] == 2
    assert "integer from 0 to 5" in out["failed"][0]["reason"]
    assert "no reference" in out["failed"][1]["reason"]
    # 3 good records + the bad one asked 1 + 2 corrective follow-ups = 6 calls; none for k/4
    assert server.request_count == 6
    assert out["usage"]["requests"] == 6 and out["usage"]["failures"] == 1
    assert out["judge"]["model"] == "fake-judge" and out["prompt_version"] == sh_prompt.PROMPT_VERSION
    json.dumps(out)  # results are JSON-serialisable as the runner writes them


def test_second_run_sends_zero_requests(judge_server_factory, tmp_path):
    server = judge_server_factory("openai", lambda request: '{"score": 1, "rationale": "r"}')
    spec = f"openai:fake@{server.base_url}"
    kwargs = dict(predictions=["x", "y", "z"], references=["r"] * 3, questions=["q"] * 3, judge=spec,
                  cache_dir=str(tmp_path))
    first = _load(METRIC_DIR).compute(**kwargs)
    assert server.request_count == 3 and first["usage"]["requests"] == 3
    second = _load(METRIC_DIR).compute(**kwargs)  # a fresh module instance: the disk cache answers
    assert server.request_count == 3
    assert second["usage"]["requests"] == 0 and second["usage"]["cached"] == 3
    assert second["scores"] == first["scores"] == [1, 1, 1]


def test_one_judge_per_metric_instance(metric, judge_server_factory, tmp_path):
    server = judge_server_factory("openai", lambda request: '{"score": 0}')
    for _ in range(2):
        metric.compute(predictions=["x"], references=["r"], questions=["q"], judge=f"openai:m@{server.base_url}",
                       cache_dir=str(tmp_path))
    assert len(metric._judges) == 1


def test_credentialed_refused_for_remote_endpoint_without_sending(metric, tmp_path):
    judge = {"backend": "openai", "model": "gpt-4o", "base_url": "https://api.example.com/v1",
             "api_key": "sk-test-not-a-real-key", "max_retries": 0}
    with pytest.raises(CredentialedDataError, match="No request was sent") as info:
        metric.compute(predictions=["x", "y"], references=["r", "r"], questions=["q", "q"],
                       credentialed=[False, True], ids=["a", "mimic/1"], judge=judge, cache_dir=str(tmp_path))
    assert "mimic/1" in str(info.value) and "sk-test" not in str(info.value)
    (remote,) = metric._judges.values()
    assert remote.usage()["requests"] == 0


def test_credentialed_allowed_on_loopback(metric, judge_server_factory, tmp_path):
    server = judge_server_factory("openai", lambda request: '{"score": 3, "rationale": "r"}')
    out = metric.compute(predictions=["x"], references=["r"], questions=["q"], credentialed=[True],
                         judge=f"openai:local-model@{server.base_url}", cache_dir=str(tmp_path))
    assert out["scores"] == [3] and server.request_count == 1
    assert out["judge"]["local"] is True


def test_multi_mode_one_call_per_question(metric, judge_server_factory, tmp_path):
    def reply(request_json):
        text = user_text(request_json)
        if "[answer_3]" in text:
            return '{"answer_1": {"score": 0, "rationale": "ok"}, "answer_2": 5, "answer_3": {"score": 2}}'
        return '{"answer_1": 1, "answer_2": 3}'

    server = judge_server_factory("anthropic", reply)
    out = metric.compute(
        predictions=[{"llava_med": "a", "chexagent": "b", "radfm": "c"},
                     {"llava_med": "d", "chexagent": None, "radfm": "f"}],
        references=["r1", "r2"], questions=["q1", "q2"], ids=["i1", "i2"],
        judge={"backend": "anthropic", "model": "claude-test", "base_url": server.base_url, "api_key": "k-test"},
        cache_dir=str(tmp_path),
    )
    assert server.request_count == 2  # one call per question
    assert out["mode"] == "multi" and out["models"] == ["llava_med", "chexagent", "radfm"]
    assert out["scores"] == [{"llava_med": 0, "chexagent": 5, "radfm": 2},
                             {"llava_med": 1, "chexagent": None, "radfm": 3}]
    assert out["sh"] == {"llava_med": 0.5, "chexagent": 5.0, "radfm": 2.5}
    assert out["sh_std"] == {"llava_med": 0.5, "chexagent": 0.0, "radfm": 0.5}
    assert out["failed"] == [{"id": "i2", "model": "chexagent", "reason": "no answer from this model"}]
    # the same inputs as a dict of per-model answer lists
    again = metric.compute(models={"llava_med": ["a", "d"], "chexagent": ["b", None], "radfm": ["c", "f"]},
                           references=["r1", "r2"], questions=["q1", "q2"], ids=["i1", "i2"],
                           judge={"backend": "anthropic", "model": "claude-test", "base_url": server.base_url,
                                  "api_key": "k-test"}, cache_dir=str(tmp_path))
    assert again["scores"] == out["scores"] and server.request_count == 2


def test_missing_judge_is_a_clear_error(metric):
    with pytest.raises(ValueError, match="needs judge="):
        metric.compute(predictions=["x"], references=["r"], questions=["q"])


def test_runner_passes_record_fields_and_options(metric):
    from medheval.run.protocol import metric_kwargs

    rows = [{"id": "knowledge/open/1", "question": "Q", "answer": "A", "answer_type": "open", "choices": [],
             "category": None, "source": "mimic_cxr", "meta": {"credentialed": True}}]
    kwargs = metric_kwargs(metric, rows, {"judge": "openai:m@http://127.0.0.1:9/v1", "mode": "single"})
    assert kwargs == {"ids": ["knowledge/open/1"], "questions": ["Q"], "credentialed": [True],
                      "judge": "openai:m@http://127.0.0.1:9/v1", "mode": "single"}


def test_run_eval_knowledge_open_with_a_loopback_judge(fixture_benchmark, judge_server_factory, tmp_path):
    from medheval import load_benchmark
    from medheval.cli import main

    rows = load_benchmark("knowledge", config="open", data_dir=fixture_benchmark["data_dir"]).to_list()
    assert rows and all(r["meta"]["credentialed"] for r in rows)  # MIMIC-derived: must stay local
    preds = tmp_path / "preds.jsonl"
    preds.write_text("".join(json.dumps({"id": r["id"], "prediction": r["answer"]}) + "\n" for r in rows))
    server = judge_server_factory("openai", lambda request: '{"score": 1, "rationale": "adds a detail"}')
    out = tmp_path / "run"
    args = ["run", "--benchmark", "knowledge:open", "--predictions", str(preds), "--output", str(out),
            "--data-dir", fixture_benchmark["data_dir"], "--metrics", "sh_judge",
            "--judge", f"openai:local-judge@{server.base_url}"]
    assert main(args) == 0
    results = json.loads((out / "results.json").read_text())
    sh = results["benchmarks"]["knowledge:open"]["metrics"]["sh_judge"]
    assert sh["sh"] == 1.0 and sh["sh_std"] == 0.0 and sh["n"] == len(rows) and sh["failed"] == []
    assert sh["judge"]["model"] == "local-judge" and sh["prompt_version"] == sh_prompt.PROMPT_VERSION
    scored = [json.loads(line) for line in (out / "scored.jsonl").read_text().splitlines()]
    assert [s["scores"] for s in scored] == [1] * len(rows) and scored[0]["rationales"] == "adds a detail"
    assert server.request_count == len(rows)


def test_list_predictions_need_multi_mode_and_take_model_names(metric, judge_server_factory, tmp_path):
    server = judge_server_factory("openai", lambda request: '{"answer_1": 2, "answer_2": 3}')
    spec = f"openai:m@{server.base_url}"
    with pytest.raises(ValueError, match="mode='multi'"):
        metric.compute(predictions=[["a", "b"]], references=["r"], questions=["q"], judge=spec, cache_dir=str(tmp_path))
    out = metric.compute(predictions=[["a", "b"]], references=["r"], questions=["q"], judge=spec, mode="multi",
                         models=["m1", "m2"], cache_dir=str(tmp_path))
    assert out["scores"] == [{"m1": 2, "m2": 3}] and out["sh"] == {"m1": 2.0, "m2": 3.0}


# -- the guard when the metric is called directly (issue 9, part 8) ---------------------------------
def test_direct_compute_without_credentialed_is_refused_for_a_remote_endpoint(metric, recording_proxy, tmp_path):
    """evaluate.load(...).compute(...) on rows of unknown origin: treated as credentialed, nothing sent."""
    judge = {"backend": "openai", "model": "m", "base_url": "http://judge.example.org/v1",  # keyless: no key
             "max_retries": 0}  # crosses plain http
    with pytest.raises(CredentialedDataError, match="treated as credentialed"):
        metric.compute(predictions=["x", "y"], references=["r", "r"], questions=["q", "q"], ids=["m/1", "m/2"],
                       judge=judge, cache_dir=str(tmp_path))
    with pytest.raises(CredentialedDataError, match="treated as credentialed"):  # one unknown item is enough
        metric.compute(predictions=["x", "y"], references=["r", "r"], questions=["q", "q"],
                       credentialed=[False, None], judge=judge, cache_dir=str(tmp_path))
    assert recording_proxy.hits == []
    # told the data is not credentialed, the request goes out (here through the environment's proxy)
    out = metric.compute(predictions=["x"], references=["r"], questions=["q"], credentialed=False, judge=judge,
                         cache_dir=str(tmp_path))
    assert out["scores"] == [4] and recording_proxy.hits == ["http://judge.example.org/v1/chat/completions"]
    with pytest.raises(ValueError, match=r"credentialed\[0\] must be True, False or None"):
        metric.compute(predictions=["x"], references=["r"], questions=["q"], credentialed=["yes"], judge=judge)


def test_direct_compute_without_credentialed_goes_to_a_local_judge_directly(metric, judge_server_factory,
                                                                            recording_proxy, tmp_path):
    server = judge_server_factory("openai", lambda request: '{"score": 2, "rationale": "r"}')
    out = metric.compute(predictions=["x"], references=["r"], questions=["q"],
                         judge=f"openai:local-model@{server.base_url}", cache_dir=str(tmp_path))
    assert out["scores"] == [2] and server.request_count == 1
    assert recording_proxy.hits == []  # HTTP_PROXY/ALL_PROXY point at it, but local traffic bypasses it


def test_metric_closes_the_cache_connection_of_its_judge(metric, judge_server_factory, tmp_path):
    from judge_servers import open_files_under

    server = judge_server_factory("openai", lambda request: '{"score": 1}')
    spec = f"openai:local-model@{server.base_url}"
    for _ in range(2):
        out = metric.compute(predictions=["x"], references=["r"], questions=["q"], judge=spec, cache_dir=str(tmp_path))
        assert out["scores"] == [1]
        assert open_files_under(tmp_path) == []  # no SQLite connection (or WAL file) left open
    assert server.request_count == 1  # the second call was answered from the reopened cache


def test_runner_counts_a_record_without_the_flag_by_its_source(metric):
    from medheval.run.protocol import metric_kwargs

    rows = [{"id": f"b/c/{i}", "question": "Q", "answer": "A", "answer_type": "open", "choices": [], "category": None,
             "source": source, "meta": meta}
            for i, (source, meta) in enumerate([("mimic_cxr", {}), ("vqa_rad", None), ("mimic_cxr", {"credentialed": False})])]
    assert metric_kwargs(metric, rows, {})["credentialed"] == [True, False, False]
