"""ClinHallu trace generation phase by phase over chunks: an API model gets whole chunks at once
(concurrent requests, one seed each) and writes what one request at a time writes; the HF backend
batches greedy and sampled traces (one generator per row); resume (a log cut as a kill leaves it)
equals an uninterrupted run; trace length/temperature run options; mitigations."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import load_benchmark

from clinhallu_fixture import scripted_trace_reply
from judge_servers import JudgeServer
from medheval.backends.api import APIBackend
from medheval.families.clinhallu.prompts import prompt_set, trace_request
from medheval.families.clinhallu.protocol import (
    GENERATIONS,
    JUDGMENTS,
    LOG_FIELDS,
    RUN_INFO,
    ClinHalluRun,
    ProtocolConfig,
    attempt_seed,
)
from medheval.run.control import Control
from medheval.run.predictions_log import read_log
from medheval.families.clinhallu.task import apply_run_options, protocol_config

REPO = Path(__file__).resolve().parents[1]


def _log(folder) -> list[str]:
    return sorted(json.dumps(e, sort_keys=True) for e in read_log(Path(folder) / GENERATIONS, required=LOG_FIELDS))


def _cut(full: Path, into: Path, keep: int) -> list[dict]:
    """``into`` holds the first ``keep`` lines of ``full``'s log plus a torn line, as a kill leaves it."""
    lines = (full / GENERATIONS).read_text().splitlines(keepends=True)
    into.mkdir(parents=True)
    (into / GENERATIONS).write_text("".join(lines[:keep]) + lines[keep][: len(lines[keep]) // 2])
    return [json.loads(line) for line in lines[keep:]]




def _run(backend, loaded, out, **kwargs):
    return ClinHalluRun(backend, None, prompt_set("own"), out, images_for=loaded.resolver.load_record_images,
                        progress=False, **kwargs)


# --------------------------------------------------------------------- API model: concurrent, same traces

def test_api_model_gets_chunks_concurrently_and_writes_what_one_at_a_time_writes(loaded, tmp_path):
    records = loaded.dataset.to_list()
    with JudgeServer("openai", reply=scripted_trace_reply, latency=0.05) as server:
        spec = f"openai:vlm@{server.base_url}"
        entries = _run(APIBackend(spec, concurrency=8, cache_dir=False), loaded, tmp_path / "par").generate(records)
        peak, sent = server.max_in_flight, [r.json for r in server.requests]
        server.reset_counts()
        one = APIBackend(spec, concurrency=1, batch_size=1, cache_dir=False)
        one.per_request_seed = False  # the one-request-per-call path, seed given per call
        _run(one, loaded, tmp_path / "seq").generate(records)
        assert server.max_in_flight == 1

        # a run killed after 5 entries, resumed with other chunks: the rest only, same log
        rest = _cut(tmp_path / "par", tmp_path / "resumed", keep=5)
        server.reset_counts()
        _run(APIBackend(spec, concurrency=4, cache_dir=False), loaded, tmp_path / "resumed",
             chunk_size=2).generate(records)
        assert server.request_count == sum(entry["attempts"] for entry in rest)

    assert peak > 1 and len(entries) == 4 * len(records)
    assert _log(tmp_path / "par") == _log(tmp_path / "seq") == _log(tmp_path / "resumed")
    # every attempt sampled with its own seed, sent in its body (0.7 / 0.9, ClinHallu's 4096 tokens)
    expected = sorted(attempt_seed(0, e["id"], e["setting"], a) for e in entries for a in range(e["attempts"]))
    assert sorted(body["seed"] for body in sent) == expected
    assert {(b["temperature"], b["top_p"], b["max_tokens"]) for b in sent} == {(0.7, 0.9, 4096)}
    attempts = [e["attempts"] for e in entries if e["setting"] == "org"]
    assert max(attempts) > 1
    # every setting asks an invalid trace again, up to max_attempts (3): pathvqa/1's short gold VR never parses
    invalid_reps = [e for e in entries if not e["valid"] and e["setting"] != "org"]
    assert {e["setting"] for e in invalid_reps} == {"rep_v", "rep_k", "rep_vk"}
    assert all(e["attempts"] == 3 for e in entries if not e["valid"])
    assert all(e["attempts"] == 1 for e in entries if e["valid"] and e["setting"] != "org")
    assert all(not e["valid"] for e in entries if e["reply"].startswith("no markers"))
    # Rep-K starts from the model's own ORG VR
    org = {e["id"]: e for e in entries if e["setting"] == "org"}
    for entry in (e for e in entries if e["setting"] == "rep_k"):
        assert entry["stages"]["visual_recognition"] == org[entry["id"]]["stages"]["visual_recognition"]


def _model_or_judge(body):
    if body["model"] == "fake-judge":
        return json.dumps({"hallucinated": len(json.dumps(body)) % 2, "reason": "parity", "answer_correct": 1,
                           "answer_reasoning": "r"})
    return scripted_trace_reply(body)


def test_api_model_resume_after_sigkill_equals_an_uninterrupted_run(snapshot, tmp_path):
    """tests/clinhallu_protocol_job.py with an API model (chunks of concurrent requests, 200 ms each):
    killed once some entries are logged, then run again; logs equal an uninterrupted run's."""
    import clinhallu_protocol_job

    def job(out, tag):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")]), "HF_HUB_OFFLINE": "1"}
        return subprocess.Popen([sys.executable, str(REPO / "tests" / "clinhallu_protocol_job.py"),
                                 snapshot["data_dir"], str(out), server.base_url, str(tmp_path / f"c{tag}"),
                                 str(tmp_path / f"d{tag}"), server.base_url], env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE)

    with JudgeServer("openai", reply=_model_or_judge, latency=0.2) as server:
        full = tmp_path / "full"
        clinhallu_protocol_job.main(snapshot["data_dir"], str(full), server.base_url, str(tmp_path / "c1"),
                                    str(tmp_path / "d1"), server.base_url)
        killed = tmp_path / "killed"
        running = job(killed, 2)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and running.poll() is None:
            if (killed / GENERATIONS).exists() and (killed / GENERATIONS).read_text().count("\n") >= 1:
                running.send_signal(signal.SIGKILL)
                break
            time.sleep(0.02)
        running.wait(timeout=60)
        assert running.returncode == -signal.SIGKILL, "the run finished before it could be killed"
        logged = (killed / GENERATIONS).read_text().count("\n")
        assert 1 <= logged < 12
        assert job(killed, 2).wait(timeout=300) == 0

    assert _log(killed) == _log(full) and len(_log(full)) == 3 * 4
    judged = [sorted(json.dumps({**e, "steps": {k: {kk: vv for kk, vv in v.items() if kk != "cached"}
                                                for k, v in e["steps"].items()}}, sort_keys=True)
                     for e in read_log(folder / JUDGMENTS, required=LOG_FIELDS)) for folder in (killed, full)]
    assert judged[0] == judged[1]


def test_a_folder_resumes_only_with_the_settings_of_its_traces(loaded, tmp_path):
    records = loaded.dataset.to_list()[:2]
    with JudgeServer("openai", reply=scripted_trace_reply) as server:
        backend = APIBackend(f"openai:vlm@{server.base_url}", concurrency=4, cache_dir=False)
        first = _run(backend, loaded, tmp_path, config=ProtocolConfig(max_new_tokens=8))
        first.generate(records[:1])  # (a run killed here finds the settings of its traces recorded)
        assert json.loads((tmp_path / RUN_INFO).read_text())["protocol"]["max_new_tokens"] == 8
        sent = server.request_count
        for config, message in ((ProtocolConfig(max_new_tokens=16), "max_new_tokens=8 (now 16)"),
                                (ProtocolConfig(max_new_tokens=8, temperature=0), "temperature=0.7 (now 0)"),
                                (ProtocolConfig(max_new_tokens=8, seed=1), "seed=0 (now 1)")):
            with pytest.raises(ValueError, match=re.escape(message)):
                _run(backend, loaded, tmp_path, config=config).generate(records)
        # traces that saw the images never mix with image-blind ones (--control, medheval.run.control)
        assert json.loads((tmp_path / RUN_INFO).read_text())["control"] == {"kind": "none"}
        with pytest.raises(ValueError, match=re.escape("control={'kind': 'none'} (now {'kind': 'blank'})")):
            _run(backend, loaded, tmp_path, config=ProtocolConfig(max_new_tokens=8),
                 control=Control("blank")).generate(records)
        assert server.request_count == sent
        # the same settings resume; a different chunking or concurrency is no change
        _run(APIBackend(f"openai:vlm@{server.base_url}", concurrency=1, cache_dir=False), loaded, tmp_path,
             config=ProtocolConfig(max_new_tokens=8), chunk_size=1).generate(records)
    assert len(read_log(tmp_path / GENERATIONS, required=LOG_FIELDS)) == 8


# --------------------------------------------------------------------- HF backend: tiny random LLaVA

class Recording:
    """Wraps a backend, recording the size and seed of every generate_chat call."""

    def __init__(self, backend):
        self.backend, self.calls = backend, []

    def __getattr__(self, name):
        return getattr(self.backend, name)

    def generate_chat(self, requests, images=None, *, seed=None, overrides=None):
        self.calls.append((len(requests), seed, [r.get("seed") for r in requests]))
        return self.backend.generate_chat(requests, images, seed=seed, overrides=overrides)


@pytest.fixture(scope="module")
def tiny():
    from medheval.backends.tiny import build_tiny_llava

    return build_tiny_llava(seed=0)


def _hf(tiny, batch_size):
    from medheval.backends.hf import HFBackend

    model, processor = tiny
    return Recording(HFBackend(model, processor, batch_size=batch_size, max_new_tokens=64))


def test_hf_greedy_traces_are_batched_and_equal_one_at_a_time_and_resume(loaded, tiny, tmp_path):
    records = loaded.dataset.to_list()[1::2]  # every source; 1 or 3 images per item
    assert len(records) == 4 and {len(r["images"]) for r in records} == {1, 3}
    greedy = ProtocolConfig(temperature=0, max_new_tokens=6)
    batched = _hf(tiny, batch_size=4)
    entries = _run(batched, loaded, tmp_path / "batched", config=greedy).generate(records)
    single = _hf(tiny, batch_size=1)
    _run(single, loaded, tmp_path / "single", config=greedy, chunk_size=1).generate(records)
    rest = _cut(tmp_path / "batched", tmp_path / "resumed", keep=5)
    resumed = _hf(tiny, batch_size=4)
    _run(resumed, loaded, tmp_path / "resumed", config=greedy, chunk_size=3).generate(records)

    assert _log(tmp_path / "batched") == _log(tmp_path / "single") == _log(tmp_path / "resumed")
    # one call per phase of the chunk (all 4 items: ORG, Rep-V + Rep-VK, Rep-K); the backend batches by 4
    assert [n for n, _, _ in batched.calls] == [len(records), 2 * len(records), len(records)]
    assert sum(n for n, _, _ in resumed.calls) == len(rest)
    # greedy: a regenerated trace would repeat the first, so one attempt each (random weights: invalid)
    assert {e["attempts"] for e in entries} == {1} and not any(e["valid"] for e in entries if e["setting"] == "org")


class OneRequestPerCall(Recording):
    """The path of a backend without per-request seeds: ClinHallu sends it one sampled request per call."""

    per_request_seed = False


def test_hf_sampled_traces_are_batched_and_equal_one_request_per_call(loaded, tiny, tmp_path):
    """Each sampled row draws from the generator of (its request's seed, its id): a chunk in one call writes
    what one request per call with its attempt's seed writes (the path before), and what a resumed run writes."""
    records = loaded.dataset.to_list()[:3]
    config = ProtocolConfig(max_new_tokens=6, max_attempts=2, seed=4)
    backend = _hf(tiny, batch_size=4)
    assert backend.per_request_seed is True
    entries = _run(backend, loaded, tmp_path / "batched", config=config).generate(records)
    # ORG for 3 items, its re-asks, Rep-V + Rep-VK for 3, Rep-K for 3: requests share calls, each with its seed
    assert max(n for n, _, _ in backend.calls) > 1
    assert sorted(s for _, _, seeds in backend.calls for s in seeds) == sorted(
        attempt_seed(4, e["id"], e["setting"], a) for e in entries for a in range(e["attempts"]))
    single = OneRequestPerCall(_hf(tiny, batch_size=1).backend)
    _run(single, loaded, tmp_path / "single", config=config).generate(records)
    assert all(n == 1 and seed == seeds[0] for n, seed, seeds in single.calls)
    rest = _cut(tmp_path / "batched", tmp_path / "resumed", keep=4)
    resumed = _hf(tiny, batch_size=2)
    _run(resumed, loaded, tmp_path / "resumed", config=config, chunk_size=2).generate(records)
    assert sum(n for n, _, _ in resumed.calls) == sum(e["attempts"] for e in rest)
    assert _log(tmp_path / "batched") == _log(tmp_path / "single") == _log(tmp_path / "resumed")
    # random weights write no valid trace: every setting of every item is asked max_attempts (2) times
    assert len(single.calls) == sum(e["attempts"] for e in entries) == 3 * 4 * 2
    # the reply of an entry is what one generate_chat call with its seed gives
    by_key = {(e["id"], e["setting"]): e for e in entries}
    fresh = _hf(tiny, batch_size=1)
    record = records[1]
    images = loaded.resolver.load_record_images(record)
    gold = record["meta"]["gold_trace"]
    for setting in ("org", "rep_k"):
        entry = by_key[(record["id"], setting)]
        own_vr = by_key[(record["id"], "org")]["stages"]["visual_recognition"]
        request = trace_request(prompt_set("own"), record, setting, gold, own_vr=own_vr, has_images=True)
        chat = {"id": record["id"], "system": request.system, "user": request.user,
                "assistant_prefix": request.assistant_prefix}
        assert fresh.generate_chat([chat], [images], seed=entry["seed"],
                                   overrides=config.generation_overrides()) == [entry["reply"]]
    # a custom_generate that is not built on the decoding loop draws from the global RNG: one request per call
    fresh.backend.generate_kwargs["custom_generate"] = lambda *args, **kwargs: None
    assert fresh.per_request_seed is False


# --------------------------------------------------------------------- run options, mitigations (run_eval)

def test_trace_temperature_is_a_run_option_and_the_length_a_generation_setting():
    from medheval.run.generation import GenerationPlan
    from medheval.families.clinhallu.task import trace_length

    _, recorded = apply_run_options(None, {})
    assert recorded == {"prompts": "own", "temperature": 0.7}
    _, recorded = apply_run_options(None, {"temperature": "0"})
    config = protocol_config(recorded, SimpleNamespace(max_new_tokens=64, seed=3), 12)  # the backend's own not used
    assert (config.max_new_tokens, config.temperature, config.seed, config.samples) == (12, 0.0, 3, False)
    assert config.generation_overrides() == {"do_sample": False, "max_new_tokens": 12}
    assert protocol_config({}, SimpleNamespace(seed=0)).max_new_tokens == 4096  # ClinHallu's config.yaml
    loaded = SimpleNamespace(name="clinhallu", config="vqa_rad")
    backend = SimpleNamespace(max_new_tokens=64)
    assert trace_length(SimpleNamespace(generation=GenerationPlan()), loaded, backend) == 4096  # the built-in table
    assert trace_length(SimpleNamespace(generation=GenerationPlan(fixed={"max_new_tokens": 12})), loaded, backend) == 12
    assert trace_length(SimpleNamespace(generation=GenerationPlan(benchmarks={"clinhallu:vqa_rad": {
        "max_new_tokens": 20}})), loaded, backend) == 20
    assert trace_length(SimpleNamespace(generation=None), loaded, backend) == 64  # --max-new-tokens 64: no plan
    assert trace_length(SimpleNamespace(generation=None), loaded, SimpleNamespace()) == 4096
    for bad, message in (({"temperature": "-1"}, "clinhallu.temperature='-1': must be >= 0"),
                         ({"max_new_tokens": "8"}, "unknown clinhallu run option"),
                         ({"top_k": "5"}, "unknown clinhallu run option")):
        with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(".", r"\.")):
            apply_run_options(None, bad)


def _judge_reply(body):
    return json.dumps({"hallucinated": 0, "reason": "checked", "answer_correct": 0, "answer_reasoning": "r"})


def _cli(snapshot, out, judge_url, *extra):
    roots = [arg for key, path in snapshot["image_roots"].items() for arg in ("--image-root", f"{key}={path}")]
    return ["run", "--benchmark", "clinhallu:vqa_rad", "--data-dir", snapshot["data_dir"], *roots,
            "--output", str(out), "--model", "tiny-random-llava", "--judge", f"openai:j@{judge_url}",
            "--max-new-tokens", "6", "--limit", "2", *extra]


@pytest.mark.parametrize("temperature, neutral", [("0.7", "vcd:alpha=0,beta=0"), ("0", "vcd:alpha=0")])
def test_a_neutral_mitigation_writes_the_traces_of_none(snapshot, tmp_path, temperature, neutral):
    """VCD at alpha=0 (and beta=0 when sampling: no plausibility cutoff) is plain decoding, so the grid's
    two runs write the same traces; each run records its mitigation; full VCD changes greedy traces."""
    from medheval.cli import main

    grid = ["--mitigation", "none", "--mitigation", neutral] + (["--mitigation", "vcd"] if temperature == "0" else [])
    with JudgeServer("openai", reply=_judge_reply) as server:
        assert main(_cli(snapshot, tmp_path, server.base_url, "--benchmark-option",
                         f"clinhallu.temperature={temperature}", *grid)) == 0
    runs = json.loads((tmp_path / "results.json").read_text())["runs"]
    folders = [Path(run["benchmarks"]["clinhallu:vqa_rad"]["logs"]) for run in runs]
    assert _log(folders[0]) == _log(folders[1]) and len(_log(folders[0])) == 4 * 2
    infos = [json.loads((folder / RUN_INFO).read_text()) for folder in folders]
    assert [info["mitigation"] for info in infos] == [run["settings"]["mitigation"] for run in runs]
    assert infos[0]["mitigation"] == "none"
    assert infos[1]["mitigation"].startswith("vcd:") and "alpha=0" in infos[1]["mitigation"]
    assert {info["protocol"]["temperature"] for info in infos} == {float(temperature)}
    if temperature == "0":
        assert _log(folders[2]) != _log(folders[0])


def test_a_mitigation_that_cannot_sample_is_refused_before_any_generation(snapshot, tmp_path, capsys):
    from medheval.cli import main

    with JudgeServer("openai", reply=_judge_reply) as server:
        assert main(_cli(snapshot, tmp_path / "a", server.base_url, "--mitigation", "opera")) == 2
        err = capsys.readouterr().err
        assert "benchmark clinhallu: mitigation opera" in err and "cannot sample" in err
        assert "clinhallu.temperature=0" in err
        assert main(_cli(snapshot, tmp_path / "b", server.base_url, "--benchmark-option",
                         "clinhallu.temperature=warm")) == 2
        assert "clinhallu.temperature='warm': expected a number >= 0" in capsys.readouterr().err
        assert server.request_count == 0
    assert not (tmp_path / "a" / "clinhallu").exists() and not (tmp_path / "b" / "clinhallu").exists()


def test_hf_chunk_benchmark_writes_the_log_of_one_request_per_call():
    """``benchmarks/bench_clinhallu_hf.py`` (the speed-up of chunks over one request per call) on 2 items."""
    bench = load_benchmark("bench_clinhallu_hf")
    measured = bench.main(["--items", "2", "--batch-size", "2", "--max-new-tokens", "3"])
    assert measured["same_log"] == 1.0 and measured["chunks_items_per_s"] > 0 < measured["one_per_call_items_per_s"]
