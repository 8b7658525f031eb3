"""ClinHallu prompts: the project's wording, the upstream constants read from the pinned files
(byte-equal to the files in ../shared), and request rendering for every setting."""

from __future__ import annotations

import hashlib
import importlib.util
import re
import shutil
import sys
import string

import pytest

from clinhallu_fixture import shared_upstream
from medheval.families.clinhallu import prompts as P
from medheval.families.clinhallu.trace import parse_trace
from medheval.data.fetch import AnnotationUnavailable

UPSTREAM = shared_upstream() / "clinhallu"
requires_upstream = pytest.mark.skipif(not (UPSTREAM / "prompts").is_dir(),
                                       reason="../shared/data/upstream/clinhallu is absent")

GOLD = {"visual_recognition": "Chest CT with a spiculated mass in the right upper lobe.",
        "knowledge_recall": "Spiculated masses in smokers are often malignant.",
        "reasoning": "A spiculated mass favours lung cancer.", "answer": "C. Lung cancer"}
RECORD = {"id": "clinhallu/medxpertqa/MM-26", "question": "What is the diagnosis?", "answer": "C. Lung cancer",
          "answer_type": "multiple_choice", "choices": ["Pneumonia", "Abscess", "Lung cancer"],
          "meta": {"options": ["A. Pneumonia", "B. Abscess", "C. Lung cancer"]}}


def _fields(template: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(template) if name}


PLACEHOLDERS = {
    "org_user_image": {"question", "options_text"}, "org_user_text": {"question", "options_text"},
    "continue_rep_v": {"question", "options_text", "visual_recognition"},
    "continue_rep_k": {"question", "options_text", "visual_recognition", "knowledge_recall"},
    "continue_rep_vk": {"question", "options_text", "visual_recognition", "knowledge_recall"},
    "answer_judge_user": {"question", "ground_truth", "predicted_answer"},
    "step_judge_visual_recognition": {"question", "ground_truth", "reference_text", "candidate_text"},
    "step_judge_knowledge_recall": {"question", "ground_truth", "reference_text", "candidate_text", "support_context"},
    "step_judge_reasoning": {"question", "ground_truth", "reference_text", "candidate_text", "support_context"},
}


def _check_placeholders(prompts: P.PromptSet) -> None:
    for name, allowed in PLACEHOLDERS.items():
        assert _fields(getattr(prompts, name)) <= allowed, name
    for name in ("trace_system", "answer_judge_system", "step_judge_system"):
        assert not _fields(getattr(prompts, name)), name


def test_own_prompts_name_the_markers_and_fill_known_placeholders():
    own = P.prompt_set("own")
    _check_placeholders(own)
    for marker in ("[Visual Recognition]", "[Knowledge Recall]", "[Reasoning]", "[Answer]"):
        assert marker in own.trace_system
    assert own.describe()["version"] == P.OWN_VERSION and own.given_stages_in == "assistant"
    assert '"answer_correct"' in own.answer_judge_user.format(question="q", ground_truth="g", predicted_answer="p")
    with pytest.raises(ValueError, match="unknown prompt style 'paper'"):
        P.prompt_set("paper")


def test_own_org_and_continuation_requests():
    own = P.own_prompts()
    org = P.trace_request(own, RECORD, "org", GOLD)
    assert "Options:\nA. Pneumonia\nB. Abscess\nC. Lung cancer\n\n" in org.user
    assert org.assistant_prefix == "" and org.full_trace(" x ") == "x"
    rep_v = P.trace_request(own, RECORD, "rep_v", GOLD)
    assert rep_v.assistant_prefix == f"[Visual Recognition]\n{GOLD['visual_recognition']}\n\n[Knowledge Recall]\n"
    reply = "Masses with spicules are often cancer.\n\n[Reasoning]\nThe mass is spiculated, hence cancer.\n[Answer] C"
    trace = parse_trace(rep_v.full_trace(reply))
    assert trace.valid and trace.visual_recognition == GOLD["visual_recognition"] and trace.answer == "C"
    rep_k = P.trace_request(own, RECORD, "rep_k", GOLD, own_vr="A round opacity in the lung.")
    assert rep_k.assistant_prefix.startswith("[Visual Recognition]\nA round opacity in the lung.\n\n[Knowledge Recall]")
    assert rep_k.assistant_prefix.endswith("[Reasoning]\n")
    rep_vk = P.trace_request(own, RECORD, "rep_vk", GOLD)
    assert GOLD["knowledge_recall"] in rep_vk.assistant_prefix and GOLD["visual_recognition"] in rep_vk.assistant_prefix
    text_only = P.trace_request(own, {**RECORD, "meta": {}}, "org", GOLD, has_images=False)
    assert "No image" in text_only.user and "A. Pneumonia" in text_only.user  # lettered from choices
    with pytest.raises(ValueError, match="unknown setting"):
        P.trace_request(own, RECORD, "rep_x", GOLD)


def test_judge_messages_and_support_context():
    own = P.own_prompts()
    system, user = P.answer_judge_messages(own, RECORD, "C")
    assert "Reference answer: C. Lung cancer" in user and "Model's answer: C" in user
    candidate = {"visual_recognition": "A mass.", "knowledge_recall": "", "reasoning": "So cancer."}
    _, kr_user = P.step_judge_messages(own, RECORD, "knowledge_recall", candidate, GOLD)
    assert P.support_context(GOLD, candidate, own.support_fallback) == (
        f"Reference Visual Recognition: {GOLD['visual_recognition']}\n"
        f"Reference Knowledge Recall: {GOLD['knowledge_recall']}\nCandidate Visual Recognition: A mass.")
    assert "Reference Knowledge Recall:" in kr_user
    assert P.support_context({}, {}, own.support_fallback) == "(no visual or knowledge lines to compare against)"
    assert "Options:\nA. Pneumonia" in user  # this project's answer judge sees the options
    _, vr_user = P.step_judge_messages(own, RECORD, "visual_recognition", candidate, {})
    assert "(empty)" in vr_user and "Other context" not in vr_user
    with pytest.raises(ValueError, match="unknown stage"):
        P.step_judge_messages(own, RECORD, "answer", candidate, GOLD)


def test_read_string_constants_uses_ast_only(tmp_path):
    path = tmp_path / "p.py"
    path.write_text('import os\nA = ("x "\n     "y")\nB = A + "z"\nC = B\nD = 3\nE = f"{A}"\nos.system("exit 1")\n')
    assert P.read_string_constants(path) == {"A": "x y", "B": "x yz", "C": "x yz"}


@requires_upstream
def test_pins_match_the_files_in_shared():
    for name, pinned in P.UPSTREAM_FILES.items():
        assert hashlib.sha256((UPSTREAM / pinned.relpath).read_bytes()).hexdigest() == pinned.sha256, name
        assert pinned.url.endswith(f"/{P.UPSTREAM_COMMIT}/{pinned.relpath}")


@requires_upstream
def test_upstream_constants_are_byte_equal_to_the_modules():
    prompts = P.prompt_set("upstream", data_dir=UPSTREAM)
    _check_placeholders(prompts)
    assert prompts.given_stages_in == "user" and {f["origin"] for f in prompts.files} == {"data_dir"}
    for slot, (name, constant) in P.UPSTREAM_NAMES.items():
        spec = importlib.util.spec_from_file_location(f"clinhallu_prompts_{name}", UPSTREAM / "prompts" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)  # test only: the reference values to compare with
        assert getattr(prompts, slot).encode() == getattr(module, constant).encode(), slot


@requires_upstream
def test_upstream_continuation_puts_given_stages_in_the_user_prompt():
    prompts = P.prompt_set("upstream", data_dir=UPSTREAM)
    request = P.trace_request(prompts, RECORD, "rep_k", GOLD, own_vr="A round opacity in the lung.")
    assert request.assistant_prefix == ""
    assert "A round opacity in the lung." in request.user and GOLD["knowledge_recall"] in request.user
    assert "What is the diagnosis?\n\nOptions:\nA. Pneumonia" in request.user
    trace = parse_trace(request.full_trace("[Reasoning]\nThe opacity fits a malignant mass here.\n[Answer] C"))
    assert trace.valid and trace.knowledge_recall == GOLD["knowledge_recall"]


@requires_upstream
def test_modified_or_missing_upstream_files_are_refused(tmp_path, monkeypatch):
    copy = tmp_path / "clinhallu"
    shutil.copytree(UPSTREAM / "prompts", copy / "prompts")
    with open(copy / "prompts" / "judge.py", "a", encoding="utf-8") as handle:
        handle.write("\n# edited\n")
    with pytest.raises(ValueError, match=r"judge\.py: sha256 .* differs from the pin"):
        P.prompt_set("upstream", data_dir=copy)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(AnnotationUnavailable, match="raw.githubusercontent.com/alibaba-damo-academy/ClinHallu"):
        P.prompt_set("upstream")


@requires_upstream
def test_own_wording_shares_no_long_run_of_words_with_upstream():
    upstream = P.prompt_set("upstream", data_dir=UPSTREAM)
    own = P.own_prompts()

    def runs(text, k=7):
        words = re.findall(r"[a-z']+", re.sub(r"\{\w+\}", " ", text).lower())  # placeholders are shared names
        return {" ".join(words[i:i + k]) for i in range(len(words) - k + 1)}

    theirs = set().union(*(runs(getattr(upstream, slot)) for slot in P.UPSTREAM_NAMES))
    for slot in P.UPSTREAM_NAMES:
        assert not runs(getattr(own, slot)) & theirs, slot


# ---------------------------------------------------------------- against ClinHallu's judge code (../shared)

@pytest.fixture
def upstream_code(monkeypatch):
    """Loads one of ClinHallu's modules from ../shared (test only: what the released code builds), with its
    own imports (``common``, ``prompts.*``) resolvable; sys.path and sys.modules are restored afterwards."""
    monkeypatch.syspath_prepend(str(UPSTREAM))
    monkeypatch.syspath_prepend(str(UPSTREAM / "src"))
    before = set(sys.modules)

    def load(relpath):
        spec = importlib.util.spec_from_file_location(f"clinhallu_code_{relpath.replace('/', '_')}", UPSTREAM / relpath)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    yield load
    for name in set(sys.modules) - before:
        del sys.modules[name]


class _Capture:
    """ClinHallu's judge API stand-in: keeps the request item it is sent, replies with ``reply``."""

    def __init__(self, reply):
        self.reply, self.items = reply, []

    def generate(self, item):
        self.items.append(item)
        return self.reply


@requires_upstream
def test_the_answer_judge_sees_the_bare_question_as_upstream(upstream_code):
    """02_judge_answers.py passes sample["question"] (no options) to answer_judge.judge_answer_correctness."""
    answer_judge = upstream_code("src/model_evaluation/answer_judge.py")
    api = _Capture('{"answer_correct": 1, "answer_reasoning": "same"}')
    answer_judge.judge_answer_correctness(api, RECORD["question"], "C", RECORD["answer"], max_attempts=1)
    (item,) = api.items
    prompts = P.prompt_set("upstream", data_dir=UPSTREAM)
    assert P.answer_judge_messages(prompts, RECORD, "C") == (item["messages"]["system"], item["messages"]["prompt"])
    assert "Options:" not in item["messages"]["prompt"] and prompts.judge_sees_options is False


@requires_upstream
def test_the_support_context_fallback_is_upstreams(upstream_code):
    """Neither trace has a VR or KR line: the reasoning judge's prompt is the one the released step judge builds,
    its fallback sentence read from the pinned script (ast), not written here."""
    step_judge = upstream_code("src/model_evaluation/step_hallucination_judge.py")
    api = _Capture('{"hallucinated": 0, "reason": "fine"}')
    candidate = {"reasoning": "The mass is spiculated, hence cancer."}
    step_judge.judge_step_hallucination(api, "reasoning", RECORD["question"], RECORD["answer"], candidate["reasoning"],
                                        GOLD["reasoning"], {"gold_cot": {}}, {"cot": {}}, max_attempts=1)
    (item,) = api.items
    prompts = P.prompt_set("upstream", data_dir=UPSTREAM)
    assert prompts.support_fallback == step_judge._build_support_context({}, {})
    gold = {"reasoning": GOLD["reasoning"]}
    assert P.step_judge_messages(prompts, RECORD, "reasoning", candidate, gold) == (
        item["messages"]["system"], item["messages"]["prompt"])


def test_returned_fallback_reads_the_literal_after_or(tmp_path):
    path = tmp_path / "m.py"
    path.write_text('import os\n\ndef build(a):\n    lines = []\n    return "\\n".join(lines) or "Nothing here."\n'
                    'os.system("exit 1")\n')
    assert P.returned_fallback(path, "build") == "Nothing here."
    with pytest.raises(P.UnsupportedConstant, match="no function other"):
        P.returned_fallback(path, "other")


@requires_upstream
def test_upstream_files_are_found_by_env_then_data_dir_with_a_clear_error(tmp_path, monkeypatch):
    """$MEDHEVAL_CLINHALLU_CODE (a copy of the repository) first and only; else a data folder holding the
    files; else the cache or a download. Nothing found: the error names the file, where it looked, the fix."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("MEDHEVAL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv(P.CODE_DIR_ENV, str(UPSTREAM))
    found = P.prompt_set("upstream", data_dir=tmp_path / "hub_snapshot")
    assert {f["origin"] for f in found.files} == {"data_dir"} and found.version == P.UPSTREAM_VERSION
    monkeypatch.setenv(P.CODE_DIR_ENV, str(tmp_path / "empty"))
    with pytest.raises(AnnotationUnavailable) as error:
        P.prompt_set("upstream", data_dir=UPSTREAM)  # the variable, when set, is the only place looked in
    message = str(error.value)
    assert f"'prompts/cot_generation.py' is not available (not in ${P.CODE_DIR_ENV}={tmp_path / 'empty'}" in message
    assert str(tmp_path / "empty" / "prompts" / "cot_generation.py") in message
    assert f"git -C <folder> checkout {P.UPSTREAM_COMMIT[:8]}" in message and "clinhallu.prompts=own" in message
    monkeypatch.delenv(P.CODE_DIR_ENV)
    assert P.prompt_set("upstream", data_dir=UPSTREAM).files[0]["origin"] == "data_dir"
    (tmp_path / "hub_snapshot").mkdir()
    with pytest.raises(AnnotationUnavailable) as error:
        P.prompt_set("upstream", data_dir=tmp_path / "hub_snapshot")
    message = str(error.value)
    assert "'prompts/cot_generation.py' is not available (offline mode" in message
    assert f"${P.CODE_DIR_ENV} (not set)" in message
    assert str(tmp_path / "hub_snapshot" / "prompts" / "cot_generation.py") + " (the data folder: absent)" in message
    assert f"the cache {tmp_path / 'cache' / 'annotations'}" in message and "--protocol clinhallu" in message


@requires_upstream
def test_a_run_parses_the_upstream_files_once_and_another_location_afresh(tmp_path, monkeypatch):
    """The early check, check() and run_split each ask for the upstream prompts: the files are located each time
    and parsed once; files at another location are parsed again (the memo never serves another place's)."""
    from medheval.families.clinhallu.task import check_inputs

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("MEDHEVAL_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv(P.CODE_DIR_ENV, raising=False)
    first, second = tmp_path / "first", tmp_path / "second"
    for folder in (first, second):
        for pinned in P.UPSTREAM_FILES.values():
            (folder / pinned.relpath).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(UPSTREAM / pinned.relpath, folder / pinned.relpath)
    parsed = []
    read = P.read_string_constants
    monkeypatch.setattr(P, "read_string_constants", lambda path: parsed.append(path) or read(path))
    check_inputs("clinhallu", {"prompts": "upstream"}, first, None)  # before the model loads
    check_inputs("clinhallu", {"prompts": "upstream"}, first, None)  # check()
    prompts = P.prompt_set("upstream", first)  # run_split
    assert sorted(parsed) == sorted(first / pinned.relpath for pinned in P.UPSTREAM_FILES.values())
    parsed.clear()
    monkeypatch.setenv(P.CODE_DIR_ENV, str(second))
    again = P.prompt_set("upstream", first)
    assert sorted(parsed) == sorted(second / pinned.relpath for pinned in P.UPSTREAM_FILES.values())
    assert again == prompts and again.files is not prompts.files
