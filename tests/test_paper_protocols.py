"""Paper protocols (medheval/run/paper_protocols) and named conversation templates, without ../shared:
hand-worked instruction texts, a template file written here in the upstream Python shape, the protocol
recorded and refused on resume, each card's conflict list against what the protocol does."""

from __future__ import annotations

import json
import textwrap

import pytest

from medheval.backends.conversation import (
    LLAVA_MED_CONVERSATION,
    TemplateError,
    check_template_name,
    conversation_template,
    parse_conversation_file,
)
from medheval.cli.main import main
from medheval.mitigations import get_mitigation
from medheval.run.paper_protocols import CLEAN, configure_backend, get_protocol, list_protocols
from medheval.run.paper_protocols.medheval import baseline_instruction, mitigation_instruction
from medheval.run.paper_protocols.others import med_hallmark_instruction
from medheval.run.runner import RunError

# A conversation.py in the upstream shape, with this test's own texts (dataclass calls, a name -> object dict).
FIXTURE_CONVERSATION = textwrap.dedent('''
    import dataclasses
    from enum import auto, Enum

    class SeparatorStyle(Enum):
        SINGLE = auto()
        TWO = auto()
        LLAMA_2 = auto()

    conv_one = Conversation(
        system="Sys one. "
               "Second part.",
        roles=("USER", "ASSISTANT"),
        version="v1",
        messages=(),
        offset=0,
        sep_style=SeparatorStyle.TWO,
        sep=" ",
        sep2="</s>",
    )

    conv_inst = Conversation(system="", roles=("USER", "ASSISTANT"), messages=(), offset=0,
                             sep_style=SeparatorStyle.LLAMA_2, sep="", sep2="</s>")
    conv_sys = Conversation(system="Be brief.", roles=("USER", "ASSISTANT"), messages=(), offset=0,
                            sep_style=SeparatorStyle.LLAMA_2, sep="<s>", sep2="</s>")
    conv_single = Conversation(system="S", roles=("Human", "Assistant"), messages=(), offset=0)

    conv_templates = {"one": conv_one, "inst": conv_inst, "sys": conv_sys, "single": conv_single}
''')


@pytest.fixture()
def fixture_templates(tmp_path):
    path = tmp_path / "conversation.py"
    path.write_text(FIXTURE_CONVERSATION)
    return path


def test_templates_are_read_from_the_file_shape(fixture_templates):
    stripping = parse_conversation_file(fixture_templates, strips=True)
    plain = parse_conversation_file(fixture_templates, strips=False)
    assert sorted(stripping) == ["inst", "one", "single", "sys"]
    one = stripping["one"]
    assert (one.system, one.roles, one.sep_style, one.sep, one.sep2) == ("Sys one. Second part.", ("USER", "ASSISTANT"),
                                                                         "TWO", " ", "</s>")
    # TWO: system + sep + "USER: " + message + sep + "ASSISTANT:"; LLaVA-Med's fork strips message and prompt
    assert one.render("<image>\nQ? ") == "Sys one. Second part. USER: <image>\nQ? ASSISTANT:"
    assert plain["one"].render("<image>\nQ? ") == "Sys one. Second part. USER: <image>\nQ?  ASSISTANT:"
    assert stripping["inst"].render("<image>\nQ?") == "[INST] <image>\nQ? [/INST]"
    # LLAMA_2 with a system: <<SYS>> block; "<s>" in front, then str.lstrip("<s>") as upstream
    assert stripping["sys"].render("Q") == "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nQ [/INST]"
    with pytest.raises(TemplateError, match="separator style SINGLE"):
        stripping["single"].render("Q")


def test_a_copy_with_another_sha256_is_refused(tmp_path, monkeypatch):
    import medheval.backends.conversation as conversation

    root = tmp_path / "MedHEval"
    target = root / LLAVA_MED_CONVERSATION.relpath
    target.parent.mkdir(parents=True)
    target.write_text(FIXTURE_CONVERSATION)
    monkeypatch.setenv("MEDHEVAL_UPSTREAM_CODE", str(root))
    conversation._load.cache_clear()
    with pytest.raises(TemplateError, match="not the pinned"):
        conversation_template("vicuna_v1")
    conversation._load.cache_clear()
    with pytest.raises(TemplateError, match="unknown conversation template 'vicuna_v2'"):
        conversation_template("vicuna_v2")
    with pytest.raises(TemplateError, match="known: model, vicuna_v1, mistral_instruct, llava_v1"):
        check_template_name("chatml")


def _template_unavailable() -> str:
    """The error of loading the vicuna_v1 template where its file cannot be had (the memo cleared around it)."""
    import medheval.backends.conversation as conversation
    from medheval.data.fetch import AnnotationUnavailable

    conversation._load.cache_clear()
    try:
        with pytest.raises(AnnotationUnavailable) as raised:
            conversation_template("vicuna_v1")
    finally:
        conversation._load.cache_clear()
    return str(raised.value)


def test_an_unavailable_template_file_says_how_to_get_it_or_do_without(tmp_path, monkeypatch):
    """Offline with nothing cached, the error named the template file an "annotation file" and sent the user to
    --data-dir (a copy of benchmark_data/, which never holds code/); it names the file, the variable that points
    at a copy of the repository, and the ways to run without it."""
    monkeypatch.delenv("MEDHEVAL_UPSTREAM_CODE", raising=False)
    monkeypatch.setenv("MEDHEVAL_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("MEDHEVAL_OFFLINE", "1")
    message = _template_unavailable()
    assert message.startswith("conversation template file of MedHEval's release "
                              f"'{LLAVA_MED_CONVERSATION.relpath}' is not available (offline mode")
    assert "MEDHEVAL_UPSTREAM_CODE=<folder>" in message and "--chat-template model" in message
    assert "--protocol clean" in message and "--data-dir" not in message and "annotation file" not in message


def test_a_repository_copy_without_the_template_file_is_named_by_its_variable(tmp_path, monkeypatch):
    """$MEDHEVAL_UPSTREAM_CODE set to a folder without the file: the error names the variable and the path looked
    at (it used to speak of a data_dir the user never gave)."""
    monkeypatch.setenv("MEDHEVAL_UPSTREAM_CODE", str(tmp_path))
    message = _template_unavailable()
    assert f"is not available (not in $MEDHEVAL_UPSTREAM_CODE={tmp_path}, looked at " \
           f"{tmp_path / LLAVA_MED_CONVERSATION.relpath})" in message and "data_dir" not in message


# ------------------------------------------------------------------ instruction texts, worked by hand
def _visual(question_type: str, choices: str, answer_type: str, benchmark: str = "mm_vishal") -> dict:
    return {"id": "x", "benchmark": benchmark, "question": "Where is it?", "answer_type": answer_type,
            "choices": [], "meta": {"question_type": question_type, "raw_choices": choices}}


def test_baseline_instruction_texts():
    mc = _visual("multi-choice", "A: Liver, B: Heart", "multiple_choice")
    assert baseline_instruction(mc, "llava-med-1.5") == \
        "Where is it? Please select from the following choices: A: Liver, B: Heart"
    yes_no = _visual("binary", "", "yes_no")
    assert baseline_instruction(yes_no, "llava-med-1.5") == "Where is it? Please answer Yes or No."
    assert baseline_instruction(yes_no, "llava-1.6") == "Where is it? Please answer Yes or No in a short answer."
    knowledge_open = {"question": "What is X? ", "answer_type": "open", "benchmark": "knowledge",
                      "meta": {"question_type": "type4_Knowledge", "raw_choices": None}}
    assert baseline_instruction(knowledge_open, "llava-med-1.5") == "What is X?"
    assert baseline_instruction(knowledge_open, "llava-1.6") == "What is X? Generate a short but precise answer:"
    context = {"question": "Is it?", "answer_type": "yes_no", "benchmark": "context",
               "meta": {"question_type": "binary", "raw_choices": ""}}
    assert baseline_instruction(context, "llava-med-1.5") == "Is it? Please answer Yes or No."


def test_mitigation_instruction_texts():
    long_choices = "A: Liver, B: Heart"  # 18 characters: > 10, so the options are appended
    assert mitigation_instruction(_visual("multi-choice", long_choices, "multiple_choice"), "llava-med-1.5") == \
        "Where is it? Please choose from the following options: A: Liver, B: Heart"
    assert mitigation_instruction(_visual("multi-choice", "A: x, B: y", "multiple_choice"), "llava-med-1.5") == \
        "Where is it?"  # 10 characters: the script appends nothing
    assert mitigation_instruction(_visual("binary", long_choices, "yes_no"), "llava-med-1.5") == \
        "Where is it? Please choose from the following options: A: Liver, B: Heart Please answer Yes or No."
    knowledge_closed = _visual("binary", "", "yes_no", benchmark="knowledge")  # ground_truth_type in the file
    assert mitigation_instruction(knowledge_closed, "llava-med-1.5") == "Where is it?"
    report = {"question": "Describe. <image>", "answer_type": "report", "benchmark": "vishal_report", "meta": {}}
    assert mitigation_instruction(report, "llava-med-1.5") == "Describe."


def test_med_hallmark_confidence_weakening_gets_no_suffix_and_open_lengths():
    protocol = get_protocol("med-hallmark")
    weakened = {"id": "w", "config": "confidence_weakening", "question": "I doubt it: is there a mass?",
                "answer_type": "yes_no", "choices": []}
    assert med_hallmark_instruction(weakened, "") == "I doubt it: is there a mass?"
    conventional = {**weakened, "config": "conventional", "question": "Is there a mass?"}
    assert med_hallmark_instruction(conventional, "") == "Is there a mass? Please answer Yes or No."
    plan = protocol.plan("none", None)
    assert plan.for_record("med_hallmark", "confidence_weakening", "yes_no")["max_new_tokens"] == 256
    assert plan.for_record("med_hallmark", "conventional", "yes_no")["max_new_tokens"] == 16


# ------------------------------------------------------------------ plans, mitigation options, checks
def test_mitigation_protocol_settings_per_method_and_user_options_win():
    protocol = get_protocol("medheval-mitigation")
    assert protocol.plan("none", None).for_record("mm_vishal", "slake", "yes_no") == {
        "do_sample": True, "temperature": 0.7, "top_p": 1.0, "top_k": 50, "num_beams": 1, "max_new_tokens": 1024}
    assert protocol.plan("pai", None).for_record("context", "default", "yes_no")["do_sample"] is False
    assert protocol.plan("opera", None).for_record("context", "default", "yes_no")["max_new_tokens"] == 128
    # an API model takes no top_k/num_beams: they are dropped, not sent
    assert "top_k" not in protocol.plan("vcd", None, accepted=("do_sample", "temperature", "top_p",
                                                               "max_new_tokens")).for_record("context", "default", None)
    from medheval.run.generation import GenerationPlan

    typed = protocol.plan("vcd", GenerationPlan(fixed={"max_new_tokens": 8}, answer_types={"yes_no": {"top_p": 0.5}}))
    assert typed.for_record("context", "default", "yes_no") == {
        "do_sample": True, "temperature": 1.0, "top_p": 0.5, "top_k": 50, "num_beams": 1, "max_new_tokens": 8}
    opera = get_mitigation(protocol.mitigation_spec("opera"))
    assert (opera.scale_factor, opera.threshold, opera.num_beams) == (25.0, 25, 5)
    mine = get_mitigation(protocol.mitigation_spec("opera:threshold=30"))
    assert (mine.scale_factor, mine.threshold) == (25.0, 30)
    assert protocol.mitigation_spec("opera:preset=medheval") == "opera:preset=medheval"
    assert get_mitigation(protocol.mitigation_spec("avisc")).top_k is None
    with pytest.raises(RunError, match="no settings for mitigation 'vcd'"):
        get_protocol("medheval-baseline").plan("vcd", None)
    with pytest.raises(RunError, match="covers only mm_vishal"):
        get_protocol("medheval-baseline").check_benchmarks(["mm_vishal:slake", "med_hallmark:conventional"])
    with pytest.raises(ValueError, match="unknown --protocol 'medheval'.*clean, medheval-baseline"):
        get_protocol("medheval")
    assert get_protocol(None).name == CLEAN and get_protocol(CLEAN).plan("none", None) is None


def test_each_card_lists_the_protocols_conflicts_and_they_hold():
    """The card on disk is the one the protocol's data writes; each listed conflict is what the protocol does
    by default (the code's value), and its option gives the paper's value."""
    from medheval.run.paper_protocols.cards import DOCS, card

    for protocol in list_protocols():
        path = DOCS / f"{protocol.name}.md"
        assert path.read_text(encoding="utf-8") == card(protocol), f"{path} is stale: python -m medheval.run.paper_protocols.cards"
        rows = [line for line in path.read_text().splitlines() if line.startswith("| ") and "`--" in line]
        assert len(rows) == len(protocol.conflicts)
        for conflict in protocol.conflicts:
            kind, _, setting = conflict.setting.partition(" ")
            name, _, option = setting.partition(".")
            if kind == "metric":  # a scoring option: the protocol's metric option, and the paper's by --metric-option
                assert protocol.metric_options[name][option] == conflict.code, conflict
                assert conflict.paper_option == f"--metric-option {name}.{option}={conflict.paper}", conflict
                continue
            assert kind == "mitigation", conflict
            assert getattr(get_mitigation(protocol.mitigation_spec(name)), option) == conflict.code, conflict
            paper_spec = conflict.paper_option.removeprefix("--mitigation ")
            assert getattr(get_mitigation(protocol.mitigation_spec(paper_spec)), option) == conflict.paper, conflict
    assert {c.setting for c in get_protocol("medheval-mitigation").conflicts} == {
        "mitigation opera.scale_factor", "mitigation opera.threshold", "mitigation avisc.top_k", "metric chair.variant"}
    assert {c.setting for c in get_protocol("medheval-baseline").conflicts} == {"metric chair.variant"}


# ------------------------------------------------------------------ a run records its protocol
def _args(fixture_benchmark, output, *extra):
    roots = [a for s, r in fixture_benchmark["image_roots"].items() for a in ("--image-root", f"{s}={r}")]
    return ["run", "--model", "tiny-random-llava", "--benchmark", "mm_vishal:slake", "--data-dir",
            fixture_benchmark["data_dir"], *roots, "--limit", "2", "--output", str(output), *extra]


def test_a_rescore_keeps_the_input_settings_of_the_run_that_answered(fixture_benchmark, tmp_path, capsys):
    """A re-score (`--predictions` on a protocol run's predictions.jsonl) generated nothing itself: the settings
    that decided what the model saw (the piecewise prompt ids) come from the run beside the file, so the
    Reproduction check does not call the re-score's answers "tokenized whole"."""
    from medheval.report.published import RunConditions
    from medheval.run.provenance import input_settings

    output = tmp_path / "run"
    assert main(_args(fixture_benchmark, output, "--protocol", "medheval-baseline", "--chat-template", "model",
                      "--max-new-tokens", "3")) == 0, capsys.readouterr().err
    rescore = tmp_path / "rescore"
    assert main(["run", "--benchmark", "mm_vishal:slake", "--data-dir", fixture_benchmark["data_dir"],
                 "--predictions", str(output / "predictions.jsonl"), "--limit", "2", "--output", str(rescore)]) == 0, \
        capsys.readouterr().err
    results = json.loads((rescore / "results.json").read_text())
    assert results["settings"]["backend"]["backend"] == "predictions_file"
    assert input_settings(results)["tokenization"] == "upstream_chunked"
    assert RunConditions.of(results, ["mm_vishal:slake"]).chunked_tokens
    del results["provenance"]["made_with"]["inputs"]  # a re-score of answers from before the inputs were carried
    assert input_settings(results) == {} and not RunConditions.of(results, ["mm_vishal:slake"]).chunked_tokens


def test_protocol_recorded_and_refused_on_resume(fixture_benchmark, tmp_path, capsys):
    output = tmp_path / "run"
    # --chat-template model: the processor's template, so no upstream file is needed here
    code = main(_args(fixture_benchmark, output, "--protocol", "medheval-baseline", "--chat-template", "model",
                      "--max-new-tokens", "3"))
    assert code == 0, capsys.readouterr().err
    results = json.loads((output / "results.json").read_text())
    assert results["protocol"]["name"] == "medheval-baseline"
    assert results["scoring"]["upstream_compat"] is True  # the paper's scorer comes with its protocol
    run_json = json.loads((output / "run.json").read_text())
    assert run_json["protocol"]["name"] == "medheval-baseline"
    assert run_json["backend"]["tokenization"] == "upstream_chunked"  # LLaVA's tokenizer_image_token ids
    entries = [json.loads(line) for line in (output / "predictions.jsonl").read_text().splitlines()]
    assert {json.dumps(e["generation"], sort_keys=True) for e in entries} == {json.dumps(
        {"do_sample": True, "temperature": 0.2, "top_p": 1.0, "top_k": 50, "num_beams": 1, "max_new_tokens": 3},
        sort_keys=True)}
    assert all(" Please answer Yes or No." in e["prompt"] or "Please select from the following choices:" in e["prompt"]
               for e in entries)
    capsys.readouterr()
    assert main(_args(fixture_benchmark, output, "--max-new-tokens", "3")) == 2
    err = capsys.readouterr().err
    assert "protocol 'medheval-baseline'" in err and "protocol 'clean'" in err and "--protocol medheval-baseline" in err


def test_the_protocols_scorer_is_the_default_and_the_user_can_refuse_it(fixture_benchmark, tmp_path, capsys):
    """MedHEval's cells were scored by its released scorer (first-sentence yes/no, closest option, its S_h
    prompt): its protocols score that way unless --no-upstream-compat; clean scores with ours unless asked."""
    from medheval.run.runner import RunSpec, _options_for

    refused = tmp_path / "ours"
    assert main(_args(fixture_benchmark, refused, "--protocol", "medheval-mitigation", "--chat-template", "model",
                      "--max-new-tokens", "2", "--no-upstream-compat")) == 0, capsys.readouterr().err
    assert json.loads((refused / "results.json").read_text())["scoring"]["upstream_compat"] is False
    asked = tmp_path / "clean"
    assert main(_args(fixture_benchmark, asked, "--max-new-tokens", "2", "--upstream-compat")) == 0
    assert json.loads((asked / "results.json").read_text())["scoring"]["upstream_compat"] is True

    protocol = RunSpec(benchmarks=["knowledge:open"], output=tmp_path / "o", protocol="medheval-baseline",
                       upstream_compat=True)
    options = _options_for(protocol, ["sh_judge", "text_generation"])
    assert options["sh_judge"]["prompt_style"] == "upstream" and options["text_generation"]["upstream_compat"] is True
    report = RunSpec(benchmarks=["vishal_report"], output=tmp_path / "o", protocol="medheval-mitigation",
                     upstream_compat=True)
    assert _options_for(report, ["chair"])["chair"] == {"variant": "medheval_code", "upstream_compat": True}
    mine = RunSpec(benchmarks=["knowledge:open"], output=tmp_path / "o", protocol="medheval-baseline",
                   metric_options={"sh_judge": {"prompt_style": "json"}})
    assert _options_for(mine, ["sh_judge"])["sh_judge"]["prompt_style"] == "json"  # the user's option wins
    clean = RunSpec(benchmarks=["knowledge:open"], output=tmp_path / "o")
    assert "prompt_style" not in _options_for(clean, ["sh_judge"])["sh_judge"]


@pytest.mark.parametrize("protocol", ["medheval-baseline", "medheval-mitigation", None])
def test_medheval_protocols_score_reports_as_the_released_chair_code(fixture_benchmark, tmp_path, capsys, protocol):
    """MedHEval's CHAIR came from run_chair.py: predictions cleaned as its report CSV holds them, then its
    calculate_metrics formula (chair variant medheval_code). Three fixture reports (qids 0, 1, 5; hand-worked in
    tests/test_metric_chair.py): under either protocol CHAIR 2/4 and Recall 1/5, where the paper's formula on the
    text as given (the clean protocol) gives 1/3 and 2/5. The report's generation metrics get the same
    cleaning: "Effusion." (9 characters) is scored as "No report generated.", which shares no word with its
    reference (ROUGE-1 0, against 8.0 as given)."""
    predictions = {0: "Mild cardiomegaly. No pneumonia.", 1: "Effusion.", 5: "A 2 cm lung nodule. No pleural effusion"}
    path = tmp_path / "answers.jsonl"
    path.write_text("".join(json.dumps({"id": f"vishal_report/default/{qid}", "prediction": text}) + "\n"
                            for qid, text in predictions.items()))
    output = tmp_path / "run"
    assert main(["run", "--benchmark", "vishal_report", "--predictions", str(path), "--data-dir",
                 fixture_benchmark["data_dir"], "--allow-missing-predictions", "--output", str(output),
                 *(["--protocol", protocol] if protocol else [])]) == 0, capsys.readouterr().err
    metrics = json.loads((output / "results.json").read_text())["benchmarks"]["vishal_report:default"]["metrics"]
    chair = metrics["chair"]
    rouge1 = {row["id"]: row["rouge1_per_item"]
              for row in map(json.loads, (output / "scored.jsonl").read_text().splitlines())}
    if protocol:
        assert (chair["variant"], chair["upstream_compat"], chair["labeler"]) == ("medheval_code", True, "chexpert_rules")
        assert (chair["chair"], chair["recall"]) == pytest.approx((2 / 4, 1 / 5))
        assert rouge1["vishal_report/default/1"] == 0.0 and metrics["text_generation"]["upstream_compat"] is True
    else:
        assert (chair["variant"], chair["upstream_compat"]) == ("paper", False)
        assert (chair["chair"], chair["recall"]) == pytest.approx((1 / 3, 2 / 5))
        assert rouge1["vishal_report/default/1"] == pytest.approx(8.0)


@pytest.mark.parametrize("protocol, device, expected", [
    ("medheval-baseline", "cuda", "float16"), ("medheval-mitigation", "cuda:1", "float16"),
    ("medheval-baseline", "cpu", None), ("clean", "cuda", None), ("med-stepbench", "cuda", None),
])
def test_medheval_protocols_load_the_model_in_float16_on_a_gpu(protocol, device, expected):
    """Every llava/model/builder.py of MedHEval's release loads float16 (a given --dtype is used instead; a CPU
    run keeps the backend's float32)."""
    from medheval.run.options import protocol_dtype

    assert protocol_dtype(protocol, device) == expected


def test_a_folder_without_a_recorded_protocol_resumes_as_clean(fixture_benchmark, tmp_path, capsys):
    output = tmp_path / "run"
    assert main(_args(fixture_benchmark, output, "--max-new-tokens", "3")) == 0
    run_json = json.loads((output / "run.json").read_text())
    assert run_json["protocol"] == {"name": "clean"}
    del run_json["protocol"]  # as written before protocols were recorded
    (output / "run.json").write_text(json.dumps(run_json))
    assert main(_args(fixture_benchmark, output, "--max-new-tokens", "3")) == 0
    capsys.readouterr()
    assert main(_args(fixture_benchmark, output, "--max-new-tokens", "3", "--protocol", "med-stepbench")) == 2
    assert "covers only med_stepbench" in capsys.readouterr().err


def test_configure_backend_picks_the_template_by_model_type(llava, llava_next):
    from medheval.backends.hf import HFBackend

    protocol = get_protocol("medheval-baseline")
    for (model, processor), template in ((llava, "vicuna_v1"), (llava_next, "llava_v1")):
        backend = HFBackend(model, processor, device="cpu")
        configured = configure_backend(backend, protocol)
        assert configured.conversation == template and backend.conversation is None  # a copy, the original kept
        assert configure_backend(backend, protocol, "model").conversation is None
        assert configured.settings()["conversation_template"] == template
        assert configured.settings()["prompt_version"] == "medheval-baseline@7f7d980e"


# ------------------------------------------------------------------ medheval inputs
def test_inputs_shows_what_run_sends(fixture_benchmark, tmp_path, capsys):
    """`medheval inputs` prints, per item, the text and settings `medheval run` then records for it."""
    output = tmp_path / "run"
    flags = ["--protocol", "medheval-baseline", "--chat-template", "model", "--max-new-tokens", "3"]
    assert main(_args(fixture_benchmark, output, *flags)) == 0
    recorded = {e["id"]: e for e in map(json.loads, (output / "predictions.jsonl").read_text().splitlines())}
    capsys.readouterr()
    selection = [a for a in _args(fixture_benchmark, output)[1:] if a not in ("--output", str(output))]
    assert main(["inputs", *selection, *flags, "--json"]) == 0
    items = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [item["id"] for item in items] == sorted(recorded)
    for item in items:
        assert item["prompt"] == recorded[item["id"]]["prompt"]
        assert item["generation"] == recorded[item["id"]]["generation"]
        assert item["protocol"]["name"] == "medheval-baseline" and item["n_images"] == 1
        assert item["preprocessed"]["pixel_values"][0] == 1
        # the tiny LLaVA expands one <image> into its patch tokens, shown once with the count
        assert "<image>×" in item["rendered"] and item["rendered"].count("<image>") == 1


def test_inputs_cli_exit_codes(fixture_benchmark, tmp_path):
    import os
    import subprocess
    import sys

    base = [sys.executable, "-m", "medheval.cli", "inputs", "--model", "tiny-random-llava", "--benchmark",
            "context", "--data-dir", fixture_benchmark["data_dir"], "--image-root",
            f"mimic_cxr={fixture_benchmark['image_roots']['mimic_cxr']}", "--limit", "1"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(base, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "=== context:default" in done.stdout and "Please answer Yes or No." in done.stdout
    assert '"max_new_tokens": 16' in done.stdout  # clean: the yes/no length
    bad = subprocess.run([*base, "--protocol", "medheval-v9"], capture_output=True, text=True, env=env, timeout=600)
    assert bad.returncode == 2 and "unknown --protocol 'medheval-v9'" in bad.stderr


def test_a_grid_names_its_protocol():
    from medheval.run.grids import GridConfigError, parse_grid_config, run_spec

    base = {"output": "runs/x", "models": ["m/x"], "benchmarks": ["context"]}
    config = parse_grid_config({**base, "protocol": "medheval-baseline", "chat_template": "vicuna_v1"})
    spec = run_spec(config, "m/x", {})
    assert (spec.protocol, spec.chat_template) == ("medheval-baseline", "vicuna_v1")
    assert run_spec(parse_grid_config(base), "m/x", {}).protocol == "clean"
    with pytest.raises(GridConfigError, match="protocol: unknown --protocol 'medheval-v9'"):
        parse_grid_config({**base, "protocol": "medheval-v9"})
    with pytest.raises(GridConfigError, match="chat_template: unknown --chat-template 'chatml'"):
        parse_grid_config({**base, "chat_template": "chatml"})


def test_list_and_help_name_every_protocol(capsys):
    assert main(["list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)["protocols"]
    assert list(listed) == ["clean", "medheval-baseline", "medheval-mitigation", "med-hallmark", "clinhallu",
                            "med-stepbench"]
    assert all(title for title in listed.values())
    with pytest.raises(SystemExit):
        main(["run", "--help"])
    help_text = "".join(capsys.readouterr().out.split())  # argparse wraps lines (also after hyphens)
    assert all(f"{name}:{''.join(title.split())}" in help_text for name, title in listed.items())
