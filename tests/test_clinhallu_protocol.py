"""The ClinHallu protocol: a scripted model for hand-checked flows, the tiny random LLaVA through the
real HF code path, a judge server on 127.0.0.1, and resume after SIGKILL."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from judge_servers import JudgeServer, image_parts, user_text
from medheval.backends.base import BackendError
from medheval.families.clinhallu.prompts import prompt_set
from medheval.families.clinhallu.protocol import (
    GENERATIONS,
    JUDGMENTS,
    LOG_FIELDS,
    PROCEDURE,
    RUN_INFO,
    ClinHalluRun,
    ProtocolConfig,
    attempt_seed,
    clinhallu_judge,
    metric_inputs,
    validate_answer_reply,
    validate_step_reply,
)
from medheval.run.predictions_log import read_log

REPO = Path(__file__).resolve().parents[1]


def _trace(vr="The image shows a clear finding here.", kr="Textbook facts apply to this case.",
           reasoning="Combining both gives the answer below.", answer="yes"):
    return f"[Visual Recognition]\n{vr}\n\n[Knowledge Recall]\n{kr}\n\n[Reasoning]\n{reasoning}\n[Answer] {answer}"


class ScriptedModel:
    """A model under test whose replies are scripted per (item, setting, attempt)."""

    name = "scripted"

    def __init__(self, script):
        self.script = script  # (id, setting) -> list of replies (attempt order)
        self.calls = []

    def generate_chat(self, requests, images, *, seed=None, overrides=None):
        (request,), (imgs,) = requests, images
        prefix = request["assistant_prefix"]
        setting = ("org" if not prefix else "rep_v" if prefix.endswith("[Knowledge Recall]\n")
                   else "rep_vk" if "blunting" in prefix or "spiculated" in prefix else "rep_k")
        attempt = sum(1 for call in self.calls if call[:2] == (request["id"], setting))
        self.calls.append((request["id"], setting, seed, len(imgs), overrides))
        replies = self.script[(request["id"], setting)]
        return [replies[min(attempt, len(replies) - 1)]]

    def settings(self):
        return {"backend": "scripted"}


# ids used below
EFF, HEART, LUNG = "clinhallu/vqa_rad/5", "clinhallu/vqa_rad/9", "clinhallu/medxpertqa/MM-26"
SCRIPT = {
    # ORG valid and right; Rep-V right; Rep-K wrong; Rep-VK right
    (EFF, "org"): [_trace(answer="yes")],
    (EFF, "rep_v"): ["Effusions blunt the angle.\n\n[Reasoning]\nThe angle is blunted here.\n[Answer] yes"],
    (EFF, "rep_k"): ["The fluid is not really there.\n[Answer] no"],
    (EFF, "rep_vk"): ["Blunted angle means fluid present.\n[Answer] yes"],
    # ORG invalid twice (missing KR), valid on the third attempt, wrong; Rep-V invalid; Rep-K right; Rep-VK right
    (HEART, "org"): ["[Visual Recognition]\nA wide heart shadow.\n[Reasoning]\nso big\n[Answer] lungs",
                     "no markers at all",
                     _trace(vr="A WRONG description of the chest.", answer="the lungs")],
    (HEART, "rep_v"): ["Cardiomegaly is a big heart."],
    (HEART, "rep_k"): ["The silhouette is wide so the heart.\n[Answer] the heart"],
    (HEART, "rep_vk"): ["Wide silhouette therefore an enlarged heart.\n[Answer] the heart"],
    # ORG always invalid (answer missing)
    (LUNG, "org"): [_trace(answer="")],
    (LUNG, "rep_v"): ["Spiculated masses are WRONG facts here.\n\n[Reasoning]\nThe mass is malignant.\n[Answer] C"],
    (LUNG, "rep_k"): ["The mass looks malignant to me.\n[Answer] C. Lung cancer"],
    (LUNG, "rep_vk"): ["A spiculated mass is a cancer.\n[Answer] B"],
}


def _judge_reply(request_json):
    text = user_text(request_json)
    if "Model's answer:" in text:
        reference = re.search(r"Reference answer: (.*)", text).group(1).strip()
        answer = re.search(r"Model's answer: (.*)", text).group(1).strip()
        correct = answer == reference or answer == reference.split(".")[0]
        return json.dumps({"answer_correct": int(correct), "answer_reasoning": "compared"})
    candidate = text.split("Model's ", 1)[1]
    return json.dumps({"hallucinated": int("WRONG" in candidate), "reason": "checked"})


def _records(loaded, ids):
    rows = {r["id"]: r for r in loaded.dataset.to_list()}
    return [rows[i] for i in ids]


def test_scripted_flow_regeneration_judging_and_metric_columns(loaded, tmp_path):
    records = _records(loaded, [EFF, HEART, LUNG])
    model = ScriptedModel(SCRIPT)
    with JudgeServer("openai", reply=_judge_reply) as server:
        judge = clinhallu_judge(f"openai:j@{server.base_url}", cache_dir=tmp_path / "cache", progress=False)
        run = ClinHalluRun(model, judge, prompt_set("own"), tmp_path / "out", ProtocolConfig(max_attempts=3),
                           images_for=loaded.resolver.load_record_images, progress=False)
        result = run.run(records)
        sent = list(server.requests)
    generations = {(e["id"], e["setting"]): e for e in read_log(tmp_path / "out" / GENERATIONS, required=LOG_FIELDS)}
    assert len(generations) == 12
    assert [generations[(i, "org")]["attempts"] for i in (EFF, HEART, LUNG)] == [1, 3, 3]
    assert generations[(HEART, "org")]["attempt_reasons"] == [
        "missing stage [Knowledge Recall]", "missing stage [Visual Recognition]", "ok"]
    assert generations[(LUNG, "org")]["reason"] == "no [Answer] in the [Reasoning] stage"
    # a Rep setting's invalid trace is asked again too (ClinHallu's generator serves every setting alike)
    assert generations[(HEART, "rep_v")]["attempts"] == 3 and generations[(EFF, "rep_v")]["attempts"] == 1
    assert [call[:2] for call in model.calls].count((HEART, "rep_v")) == 3
    assert generations[(HEART, "rep_k")]["stages"]["visual_recognition"] == "A WRONG description of the chest."
    assert generations[(EFF, "rep_v")]["stages"]["visual_recognition"] == (
        "Frontal chest radiograph with blunting of the left costophrenic angle.")
    # sampling at the paper's temperature, a different seed per attempt, images passed to the model
    seeds = [call[2] for call in model.calls if call[:2] == (HEART, "org")]
    assert len(set(seeds)) == 3 and seeds[0] == attempt_seed(0, HEART, "org", 0)
    assert all(call[4]["temperature"] == 0.7 and call[4]["do_sample"] for call in model.calls)
    assert {call[3] for call in model.calls} == {1}

    cols = result["metric_inputs"]
    assert cols["correct"] == [1, 0, None]
    assert cols["correct_rep_v"] == [1, None, 1]
    assert cols["correct_rep_k"] == [0, 1, 1]
    assert cols["correct_rep_vk"] == [1, 1, 0]
    assert cols["h_v"] == [0, 1, 0]  # VR of the Rep-K trace (the ORG VR it was given), even from an invalid ORG
    assert cols["h_k"] == [0, 0, 1]
    assert cols["h_r"] == [0, 0, 0]
    assert cols["sources"] == ["vqa_rad", "vqa_rad", "medxpertqa"]

    # answers judged only for valid traces; images only with the VR judge
    answer_requests = [r for r in sent if "Model's answer:" in user_text(r.json)]
    assert len(answer_requests) == 12 - 2  # the two invalid traces (LUNG ORG, HEART Rep-V) are not judged
    vr_requests = [r for r in sent if "Section checked: Visual Recognition" in user_text(r.json)]
    assert len(vr_requests) == 3 and all(len(image_parts(r.json)) == 1 for r in vr_requests)
    assert all(not image_parts(r.json) for r in sent if r not in vr_requests)
    assert all(r.json["temperature"] == 0.01 for r in sent)
    judgments = {(e["id"], e["setting"]): e for e in read_log(tmp_path / "out" / JUDGMENTS, required=LOG_FIELDS)}
    assert all(judgments[(i, "org")]["steps"] == {} for i in (EFF, HEART, LUNG))  # H^V is read from Rep-K
    assert all(list(judgments[(i, "rep_k")]["steps"]) == ["visual_recognition"] for i in (EFF, HEART, LUNG))

    info = json.loads((tmp_path / "out" / RUN_INFO).read_text())
    assert info["procedure"] == PROCEDURE == 2
    assert info["protocol"]["max_attempts"] == 3 and info["protocol"]["temperature"] == 0.7
    assert info["judge"]["temperature"] == 0.01 and info["prompts"]["version"] == "clinhallu-own-v1"
    assert info["counts"]["org"]["n_invalid"] == 1 and info["counts"]["org"]["attempts"] == {"1": 1, "3": 2}
    assert info["counts"]["rep_v"]["invalid_reasons"] == {"missing stage [Reasoning]": 1}

    # a second run resumes: no generation, no judge call
    calls, requests = len(model.calls), len(sent)
    with JudgeServer("openai", reply=_judge_reply) as server:
        judge = clinhallu_judge(f"openai:j@{server.base_url}", cache_dir=False, progress=False)
        again = ClinHalluRun(model, judge, prompt_set("own"), tmp_path / "out", ProtocolConfig(max_attempts=3),
                             images_for=loaded.resolver.load_record_images, progress=False).run(records)
        assert server.request_count == 0
    assert len(model.calls) == calls and again["metric_inputs"] == cols and requests == len(sent)


def test_metric_module_reads_the_protocol_columns(loaded, tmp_path):
    import evaluate

    records = _records(loaded, [EFF, HEART, LUNG])
    with JudgeServer("openai", reply=_judge_reply) as server:
        judge = clinhallu_judge(f"openai:j@{server.base_url}", cache_dir=False, progress=False)
        cols = ClinHalluRun(ScriptedModel(SCRIPT), judge, prompt_set("own"), tmp_path, progress=False,
                            images_for=loaded.resolver.load_record_images).run(records)["metric_inputs"]
    metric = evaluate.load(str(REPO / "metrics" / "clinhallu"), keep_in_memory=True)
    r = metric.compute(**cols)
    assert r["acc"] == pytest.approx(1 / 3) and r["acc_rep_k"] == pytest.approx(2 / 3)
    assert r["fix_rate"]["rep_k"] == 1.0 and r["break_rate"]["rep_k"] == 1.0
    assert r["per_source"]["medxpertqa"]["acc"] == 0.0


def test_h_v_is_the_vr_of_the_rep_k_trace_the_last_one_written(loaded, tmp_path):
    """A Rep-K reply that writes the VR section again: the trace's VR is its last non-empty one (ClinHallu's
    parser), and that is what the VR judge sees (with the images), not the ORG VR the run started from."""
    records = _records(loaded, [EFF])
    script = {**SCRIPT, (EFF, "rep_k"): ["The angle is blunted, so fluid.\n[Answer] yes\n\n[Visual Recognition]\n"
                                         "A WRONG second look at the film."]}
    with JudgeServer("openai", reply=_judge_reply) as server:
        judge = clinhallu_judge(f"openai:j@{server.base_url}", cache_dir=False, progress=False)
        out = ClinHalluRun(ScriptedModel(script), judge, prompt_set("own"), tmp_path, progress=False,
                           images_for=loaded.resolver.load_record_images).run(records)
        (vr,) = [r.json for r in server.requests if "Section checked: Visual Recognition" in user_text(r.json)]
    assert "Model's Visual Recognition:\nA WRONG second look at the film." in user_text(vr)
    assert len(image_parts(vr)) == 1
    assert out["metric_inputs"]["h_v"] == [1] and out["metric_inputs"]["correct_rep_k"] == [1]


def test_logs_of_the_first_procedure_are_read_but_not_resumed(loaded, tmp_path):
    """Logs written before PROCEDURE 2 judged H^V on the ORG trace: a report still reads them, a run refuses
    to add to them (their Rep traces had one attempt)."""
    old = [{"id": "x", "setting": "org", "answer_correct": 1, "steps": {"visual_recognition": {"hallucinated": 1}}},
           {"id": "x", "setting": "rep_k", "answer_correct": 0, "steps": {}}]
    assert metric_inputs([{"id": "x", "config": "c"}], old)["h_v"] == [1]
    new = [{"id": "x", "setting": "org", "answer_correct": 1, "steps": {}},
           {"id": "x", "setting": "rep_k", "answer_correct": 0, "steps": {"visual_recognition": {"hallucinated": 0}}}]
    assert metric_inputs([{"id": "x", "config": "c"}], new)["h_v"] == [0]
    records = _records(loaded, [EFF])
    run = ClinHalluRun(ScriptedModel(SCRIPT), None, prompt_set("own"), tmp_path, progress=False)
    run.generate(records)
    info = json.loads((tmp_path / RUN_INFO).read_text())
    assert info["procedure"] == PROCEDURE
    del info["procedure"]  # as a folder of the first procedure has it
    (tmp_path / RUN_INFO).write_text(json.dumps(info))
    with pytest.raises(ValueError, match="procedure 1 of the protocol .* choose another --output folder"):
        ClinHalluRun(ScriptedModel(SCRIPT), None, prompt_set("own"), tmp_path, progress=False).generate(records)


def test_an_old_run_file_without_traces_is_rewritten_so_the_folder_stays_resumable(loaded, tmp_path):
    """A folder holding an old-format clinhallu_run.json (no procedure: read as procedure 1) and no trace:
    the run writes its own settings there before its traces, so a resume after it is killed is not refused."""
    records = _records(loaded, [EFF])
    (tmp_path / RUN_INFO).write_text(json.dumps({"protocol": {"max_attempts": 3}, "prompts": {"version": "old"}}))
    ClinHalluRun(ScriptedModel(SCRIPT), None, prompt_set("own"), tmp_path, progress=False).generate(records)
    info = json.loads((tmp_path / RUN_INFO).read_text())  # as a run killed after its traces leaves it
    assert info["procedure"] == PROCEDURE and info["prompts"]["version"] == prompt_set("own").version
    model = ScriptedModel(SCRIPT)
    ClinHalluRun(model, None, prompt_set("own"), tmp_path, progress=False).generate(records)  # resumed
    assert model.calls == []


def test_a_resume_under_other_judge_settings_is_refused(loaded, tmp_path):
    """Each judgment records the judge that made it (judge_settings, backend, model): a resume that changes
    clinhallu.judge_settings or the judge would mix judgments made under both, so it is refused."""
    records = _records(loaded, [EFF])
    with JudgeServer("openai", reply=_judge_reply) as server:
        spec = f"openai:j@{server.base_url}"

        def run(settings: str, model_spec: str = spec) -> dict:
            judge = clinhallu_judge(model_spec, settings, cache_dir=False, progress=False)
            return ClinHalluRun(ScriptedModel(SCRIPT), judge, prompt_set("own"), tmp_path, progress=False,
                                images_for=loaded.resolver.load_record_images, judge_settings=settings).run(records)

        run("own")
        judged = read_log(tmp_path / JUDGMENTS, required=LOG_FIELDS)
        assert {json.dumps(entry["judge"], sort_keys=True) for entry in judged} == {
            json.dumps({"backend": "openai", "judge_settings": "own", "model": "j"}, sort_keys=True)}
        assert json.loads((tmp_path / RUN_INFO).read_text())["judge_settings"] == "own"
        sent = server.request_count
        run("own")  # the same judge resumes
        for settings, model_spec in (("upstream", spec), ("own", f"openai:other@{server.base_url}")):
            with pytest.raises(ValueError, match=r"judgments made under other judge settings cannot be mixed\. "
                                                 r"Resume with the same --judge and --benchmark-option "
                                                 r"clinhallu\.judge_settings=own, or choose a new --output folder"):
                run(settings, model_spec)
        assert server.request_count == sent
    assert read_log(tmp_path / JUDGMENTS, required=LOG_FIELDS) == judged


def test_a_resume_under_another_max_tries_is_refused(loaded, tmp_path):
    """max_tries decides which records end as failed judgments (logged, never judged again on resume): a judge
    with another budget, or a log written before upstream judgments had one, is not resumed; own settings (no
    max_tries) record none."""
    records = _records(loaded, [EFF])
    with JudgeServer("openai", reply=_judge_reply) as server:
        def run(**options) -> dict:
            judge = clinhallu_judge(f"openai:j@{server.base_url}", "upstream", cache_dir=False, progress=False,
                                    **options)
            return ClinHalluRun(ScriptedModel(SCRIPT), judge, prompt_set("own"), tmp_path, progress=False,
                                images_for=loaded.resolver.load_record_images, judge_settings="upstream").run(records)

        run()
        judged = read_log(tmp_path / JUDGMENTS, required=LOG_FIELDS)
        assert {json.dumps(entry["judge"], sort_keys=True) for entry in judged} == {json.dumps(
            {"backend": "openai", "judge_settings": "upstream", "max_tries": 6, "model": "j"}, sort_keys=True)}
        run()  # the same judge resumes
        described = json.loads((tmp_path / RUN_INFO).read_text())["judge"]  # the budget that applies, alone
        assert described["max_tries"] == 6 and not {"max_retries", "max_invalid_retries"} & set(described)
        run(max_retries=0, max_invalid_retries=0)  # budgets that do not apply under max_tries: the same judge
        with pytest.raises(ValueError, match=r'"max_tries": 6.* not .*"max_tries": 3.*cannot be mixed'):
            run(max_tries=3)
        (tmp_path / JUDGMENTS).write_text("".join(  # as a log written before max_tries was recorded
            json.dumps({**entry, "judge": {k: v for k, v in entry["judge"].items() if k != "max_tries"}}) + "\n"
            for entry in judged))
        with pytest.raises(ValueError, match=r"made before the judge recorded its max_tries .* cannot be mixed with "
                                             r"judgments under max_tries=6\. Choose a new --output folder$"):
            run()


def test_an_item_whose_image_fails_while_judging_is_said_to_be_skipped_while_judging(loaded, tmp_path):
    """An image that decoded for the traces and not for the VR judge: the item is left out while judging, and
    the warning says judging (a re-run judges it; its traces are kept), not generation."""
    import dataclasses

    from medheval.data.images import ImageDecodeError
    from medheval.run.runner import record_skipped_undecodable

    records = _records(loaded, [EFF, HEART])
    calls = []

    def images_for(record):
        calls.append(record["id"])
        if record["id"] == HEART and calls.count(HEART) > 1:  # after its traces were generated
            raise ImageDecodeError("image file is truncated", "img.png", "vqa_rad")
        return loaded.resolver.load_record_images(record)

    with JudgeServer("openai", reply=_judge_reply) as server:
        judge = clinhallu_judge(f"openai:j@{server.base_url}", cache_dir=False, progress=False)
        result = ClinHalluRun(ScriptedModel(SCRIPT), judge, prompt_set("own"), tmp_path, progress=False,
                              images_for=images_for, skip_undecodable=True).run(records)
    assert result["skipped_judging"] == [HEART] and [r.record_id for r in result["skipped"]] == [HEART]
    split, warnings = dataclasses.replace(loaded, skipped_undecodable_images=[]), []
    record_skipped_undecodable(split, result["skipped"], warnings, during="judging")
    assert "1 record(s) skipped during judging because an image did not decode" in warnings[0]
    assert warnings[0].endswith("re-run the same command: it judges only the records left out (their answers "
                                "are kept)")


def test_failed_judge_calls_are_none_and_counted(loaded, tmp_path):
    records = _records(loaded, [EFF])

    def reply(request_json):
        if "Section checked: Reasoning" in user_text(request_json):
            return '{"hallucinated": 3}'  # never valid: the corrective budget runs out
        return _judge_reply(request_json)

    with JudgeServer("openai", reply=reply) as server:
        judge = clinhallu_judge(f"openai:j@{server.base_url}", cache_dir=False, progress=False, max_invalid_retries=1)
        out = ClinHalluRun(ScriptedModel(SCRIPT), judge, prompt_set("own"), tmp_path, progress=False).run(records)
    assert out["metric_inputs"]["h_r"] == [None]
    assert out["counts"]["rep_vk"]["n_step_judge_failed"] == 1


def test_reply_validation_and_bad_inputs(tmp_path):
    assert validate_answer_reply({"answer_correct": "1", "reasoning": "r"}) == {"answer_correct": 1, "reason": "r"}
    with pytest.raises(ValueError, match="0 or 1"):
        validate_answer_reply({"answer_correct": 2})
    with pytest.raises(ValueError, match="non-empty"):
        validate_step_reply({"hallucinated": 0, "reason": " "})
    with pytest.raises(BackendError, match="generate_chat"):
        ClinHalluRun(object(), None, prompt_set("own"), tmp_path)
    with pytest.raises(ValueError, match="rep_k needs org"):
        ProtocolConfig(settings=("rep_k",))
    run = ClinHalluRun(ScriptedModel(SCRIPT), None, prompt_set("own"), tmp_path, progress=False)
    with pytest.raises(ValueError, match="meta.gold_trace is missing"):
        run.generate([{"id": "x", "question": "q", "answer": "a", "answer_type": "open", "choices": [], "meta": {}}])
    assert metric_inputs([{"id": "x", "config": "c"}], [])["correct"] == [None]


# --------------------------------------------------------------------- tiny random LLaVA, real HF path

def _job(snapshot, out, url, cache, dcache):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")]), "HF_HUB_OFFLINE": "1"}
    return subprocess.Popen([sys.executable, str(REPO / "tests" / "clinhallu_protocol_job.py"), snapshot["data_dir"],
                             str(out), url, str(cache), str(dcache)], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)


def _strip(entries):
    return sorted((json.dumps({k: v for k, v in e.items() if k != "cached"}, sort_keys=True) for e in entries))


def _judgments(path):
    out = []
    for entry in read_log(path, required=LOG_FIELDS):
        steps = {k: {kk: vv for kk, vv in v.items() if kk != "cached"} for k, v in entry["steps"].items()}
        out.append(json.dumps({**entry, "steps": steps}, sort_keys=True))
    return sorted(out)


def test_tiny_llava_resume_after_sigkill_equals_an_uninterrupted_run(snapshot, tmp_path):
    def reply(request_json):
        return json.dumps({"hallucinated": len(user_text(request_json)) % 2, "reason": "parity",
                           "answer_correct": 0, "answer_reasoning": "r"})

    with JudgeServer("openai", reply=reply) as server:
        full = tmp_path / "full"  # uninterrupted, in this process
        import clinhallu_protocol_job

        clinhallu_protocol_job.main(snapshot["data_dir"], str(full), server.base_url, str(tmp_path / "c1"),
                                    str(tmp_path / "d1"))

        killed = tmp_path / "killed"
        job = _job(snapshot, killed, server.base_url, tmp_path / "c2", tmp_path / "d2")
        log = killed / GENERATIONS
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and job.poll() is None:
            if log.exists() and log.read_text().count("\n") >= 3:
                job.send_signal(signal.SIGKILL)
                break
            time.sleep(0.05)
        job.wait(timeout=60)
        assert job.returncode == -signal.SIGKILL, "the run finished before it could be killed"
        assert not (killed / JUDGMENTS).exists() or not read_log(killed / JUDGMENTS, required=LOG_FIELDS)
        job = _job(snapshot, killed, server.base_url, tmp_path / "c2", tmp_path / "d2")
        assert job.wait(timeout=600) == 0, job.stderr.read().decode()[-2000:]

    full_generations = read_log(full / GENERATIONS, required=LOG_FIELDS)
    assert len(full_generations) == 3 * 4
    assert _strip(read_log(killed / GENERATIONS, required=LOG_FIELDS)) == _strip(full_generations)
    assert _judgments(killed / JUDGMENTS) == _judgments(full / JUDGMENTS)
    # random weights: no valid trace, every ORG regenerated up to the bound and counted
    counts = json.loads((full / RUN_INFO).read_text())["counts"]
    assert counts["org"]["attempts"] == {"2": 3} and counts["org"]["n_invalid"] == 3
    assert json.loads((full / RUN_INFO).read_text())["backend"]["random_weights"] is True


def test_hf_backend_chat_with_an_assistant_prefix():
    from medheval.backends.hf import HFBackend
    from medheval.backends.tiny import build_tiny_llava

    model, processor = build_tiny_llava(seed=0)
    backend = HFBackend(model, processor, batch_size=2, max_new_tokens=6)
    text = backend.format_chat("Be careful.", "Is there an effusion?", "[Visual Recognition]\nA chest", 1)
    assert text.startswith("Be careful.") and "<image>" in text
    assert text.endswith("ASSISTANT: [Visual Recognition]\nA chest")
    requests = [{"id": "a", "system": "s", "user": "lungs", "assistant_prefix": "[Reasoning]\n"},
                {"id": "b", "system": "s", "user": "heart", "assistant_prefix": ""}]
    sampled = {"do_sample": True, "temperature": 0.7, "top_p": 0.9}
    first = backend.generate_chat(requests, seed=5, overrides=sampled)
    assert backend.generate_chat(requests, seed=5, overrides=sampled) == first
    assert backend.generate_chat(requests, seed=6, overrides=sampled) != first
    assert len(first) == 2 and all(isinstance(reply, str) for reply in first)
    with pytest.raises(BackendError, match="2 requests but 1 image lists"):
        backend.generate_chat(requests, [[]])


def test_judging_in_chunks_gives_the_same_judgments(loaded, tmp_path):
    records = _records(loaded, [EFF, HEART, LUNG])
    with JudgeServer("openai", reply=_judge_reply) as server:
        judge = clinhallu_judge(f"openai:j@{server.base_url}", cache_dir=False, progress=False)
        run = ClinHalluRun(ScriptedModel(SCRIPT), judge, prompt_set("own"), tmp_path, progress=False,
                           images_for=loaded.resolver.load_record_images)
        judgments = run.judge_all(records, run.generate(records), chunk_size=5)
    assert len(read_log(tmp_path / JUDGMENTS, required=LOG_FIELDS)) == 12
    cols = metric_inputs(records, judgments)
    assert (cols["correct"], cols["correct_rep_k"], cols["h_v"], cols["h_k"]) == (
        [1, 0, None], [0, 1, 1], [0, 1, 0], [0, 0, 1])
