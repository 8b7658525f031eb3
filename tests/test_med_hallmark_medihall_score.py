"""MediHall Score (metrics/medihall_score, medheval/families/med_hallmark/): weights, sentence splitting,
hand-worked VQA and IRG cases, the rule classifier per category, the judge classifier against a
loopback fake server, and checks against Med-HallMark's released files (skipped when absent)."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

import pytest
from conftest import SHARED_UPSTREAM, load_benchmark, load_metric_offline

from judge_servers import judge_server_factory, recording_proxy, user_text  # noqa: F401 - fixtures
from medheval.families import med_hallmark as mh
from medheval.families.med_hallmark.source import judged_records

REPO = Path(__file__).resolve().parents[1]
METRIC_DIR = REPO / "metrics" / "medihall_score"
HALLMARK = SHARED_UPSTREAM / "med-hallmark"
CONVENTIONAL = HALLMARK / "Conventional..json"
requires_hallmark = pytest.mark.skipif(
    not CONVENTIONAL.is_file(), reason="../shared/data/upstream/med-hallmark is absent (only CI and devs have it)"
)


@pytest.fixture(scope="module")
def metric():
    return load_metric_offline(METRIC_DIR)


def test_module_files_and_card():
    for name in ("medihall_score.py", "README.md", "requirements.txt", "app.py"):
        assert (METRIC_DIR / name).is_file(), name
    card = (METRIC_DIR / "README.md").read_text()
    assert card.startswith("---\n") and "- evaluate\n- metric" in card
    for line in (METRIC_DIR / "medihall_score.py").read_text().splitlines():
        if line.startswith("import "):
            assert "," not in line, line


# -- levels, weights, parsing ---------------------------------------------------------------------


def test_weights_and_label_encoding_exactly():
    assert mh.WEIGHTS == {"catastrophic": 0.0, "critical": 0.2, "attribute": 0.4, "prompt_induced": 0.6,
                          "minor": 0.8, "correct": 1.0}
    # Med-HallMark's classification_label: 0 = catastrophic ... 5 = correct
    assert [mh.LABEL_TO_LEVEL[i] for i in range(6)] == list(mh.LEVELS)
    assert mh.IRG_LEVELS == ("catastrophic", "critical", "attribute", "correct")


@pytest.mark.parametrize("text, expected", [
    ("Catastrophic Hallucinations", "catastrophic"),
    ("**Attribute Hallucinations**", "attribute"),
    ("Confusion prompt-induced hallucinations (prompt-induced Hallucinations)", "prompt_induced"),
    ("Minor Hallucinations (Hallucinations without serious consequences)", "minor"),
    ("Correct Statements", "correct"),
    ("prompt_induced", "prompt_induced"),
    ("critical", "critical"),
    ("3", None),  # digits are ambiguous (prompt numbers 1-6, labels 0-5)
    ("Critical or Attribute", None),
    ("Severe Hallucinations", None),
    (None, None),
])
def test_parse_level(text, expected):
    assert mh.parse_level(text) == expected


def test_parse_level_respects_the_task_levels():
    assert mh.parse_level("Minor Hallucinations", mh.IRG_LEVELS) is None
    assert mh.parse_level("Attribute Hallucinations", mh.IRG_LEVELS) == "attribute"


def test_split_sentences():
    text = ("### Assistant: The heart is normal. No effusion.\n"
            "Mild atelectasis at 3.5 cm, e.g. at the left base. Is it stable? Yes!\n"
            "- bullet item\n2) numbered item\n\n   ")
    assert mh.split_sentences(text) == [
        "The heart is normal.", "No effusion.", "Mild atelectasis at 3.5 cm, e.g. at the left base.",
        "Is it stable?", "Yes!", "bullet item", "numbered item",
    ]
    assert mh.split_sentences("") == [] and mh.split_sentences(None) == []
    assert mh.split_sentences("the worst. Next one") == ["the worst.", "Next one"]


# -- hand-worked VQA ------------------------------------------------------------------------------------

VQA_CASES = [
    # question, prediction, reference -> level (weight)
    ("Are the lungs normal?", "Yes, the lungs look normal.", "No", "catastrophic"),                 # presence, 0.0
    ("Is the heart enlarged?", "No, the heart is normal in size.", "Yes", "attribute"),              # size, 0.4
    ("In which plane is this image taken?", "Axial plane.", "Coronal", "minor"),                     # plane, 0.8
    ("What disease is shown?", "Pneumonia.", "Tuberculosis", "critical"),                            # category, 0.2
    ("Considering this MRI, is there a stroke?", "No stroke is seen on the MRI.",
     "The image is a CT scan, not MRI.", "prompt_induced"),                                          # premise, 0.6
    ("Where is the lesion?", "The lesion is in the right lower lobe.", "Right lower lobe", "correct"),  # 1.0
    ("Where is the lesion?", "The lesion is in the left lower lobe.", "Right lower lobe", "attribute"),  # 0.4
    ("Where are the kidneys?", "The kidneys are in the pelvis.", "Not seen here", "catastrophic"),   # absent, 0.0
]


def test_vqa_hand_worked(metric):
    out = metric.compute(predictions=[c[1] for c in VQA_CASES], references=[c[2] for c in VQA_CASES],
                         questions=[c[0] for c in VQA_CASES])
    assert out["levels"] == [c[3] for c in VQA_CASES]
    # 0.0 + 0.4 + 0.8 + 0.2 + 0.6 + 1.0 + 0.4 + 0.0 = 3.4 over 8 answers = 0.425
    assert out["item_scores"] == [0.0, 0.4, 0.8, 0.2, 0.6, 1.0, 0.4, 0.0]
    assert out["medihall_score"] == pytest.approx(3.4 / 8)
    assert out["level_distribution"] == {"catastrophic": 2, "critical": 1, "attribute": 2, "prompt_induced": 1,
                                         "minor": 1, "correct": 1}
    assert out["failed"] == [] and out["n"] == 8 and out["usage"] is None
    json.dumps(out)


def test_vqa_item_without_reference_fails_with_reason(metric):
    out = metric.compute(predictions=["Yes.", "No."], references=["No", None], questions=["Is there a mass?"] * 2,
                         ids=["a", "b"])
    # only item "a" is scored: catastrophic (0.0); "b" is left out of the mean, not scored 0
    assert out["levels"] == ["catastrophic", None] and out["item_scores"] == [0.0, None]
    assert out["medihall_score"] == 0.0 and out["n"] == 1
    assert [f["id"] for f in out["failed"]] == ["b"] and "no reference" in out["failed"][0]["reason"]


def test_rule_classifier_fails_empty_and_unparsed_answers(metric):
    # Only "Yes" is classified (correct, 1.0); "", "   ", "是的" (unparsed yes/no) and "A or B" (two options)
    # state nothing to grade: failed and left out, not scored as hallucinations (before: catastrophic, 0.0).
    out = metric.compute(predictions=["", "   ", "是的", "Yes", "A or B"], references=["Yes", "Yes", "Yes", "Yes", "B"],
                         questions=["Is there effusion?"] * 4 + ["Which finding?"], classifier="rule",
                         answer_types=["yes_no"] * 4 + ["multiple_choice"],
                         choices=[None] * 4 + [["Effusion", "Pneumonia"]])
    assert out["levels"] == [None, None, None, "correct", None]
    assert out["medihall_score"] == 1.0 and out["n"] == 1 and out["n_failed"] == 4
    assert [f["id"] for f in out["failed"]] == ["0", "1", "2", "4"]
    assert out["failed"][0]["reason"].startswith("empty answer")
    assert out["failed"][2]["reason"].startswith("unparsed yes/no answer")
    assert out["failed"][3]["reason"].startswith("unparsed multiple-choice answer")
    # an empty answer fails even where the rules would assume a wrong answer without a reference
    out = metric.compute(predictions=["Yes", ""], references=["No", None], questions=["Is there a mass?"] * 2,
                         classifier="rule", rule_without_reference=True)
    assert out["levels"] == ["catastrophic", None] and out["n_failed"] == 1
    assert out["failed"][0]["reason"].startswith("empty answer")
    assert mh.classify_vqa_rule("", "Yes", "Is there effusion?") is None


# -- the rule classifier per category -------------------------------------------------------------------


@pytest.mark.parametrize("question, prediction, reference, kwargs, level", [
    # technique: modality / plane / sequence -> minor
    ("Is this a CT or an MRI?", "This is a CT scan.", "MRI", {}, "minor"),
    ("What MRI sequence is shown?", "A FLAIR sequence.", "T2 weighted MRI", {}, "minor"),
    ("Describe the image.", "An axial slice.", "Coronal", {}, "minor"),  # the reference names a plane
    # attribute: size / shape / location / number -> attribute
    ("How many lesions are in the spleen?", "There are two lesions.", "one", {}, "attribute"),
    ("Is the mass well circumscribed?", "Yes, it is well circumscribed.", "No", {}, "attribute"),
    ("Which side is the lesion on?", "The left side.", "Right", {}, "attribute"),
    # organ or pathology presence / identity -> catastrophic
    ("Is there a pneumothorax?", "No pneumothorax is seen.", "Yes", {}, "catastrophic"),
    ("Identify the organ shown in the image.", "The liver.", "Spleen", {}, "catastrophic"),
    ("What abnormality is present?", "The scan appears normal.", "Left frontal mass", {}, "catastrophic"),
    # function / cause / pathology category -> critical
    ("What is the cause of the effusion?", "Heart failure.", "Malignancy", {}, "critical"),
    ("What condition does the patient have?", "Appendicitis.", "Neurofibromatosis", {}, "critical"),
    # counterfactual premise accepted -> prompt-induced
    ("Is there a bleed on this ultrasound?", "Yes, there is a bleed.",
     "The premise is incorrect: the image is a CT scan, not an ultrasound.", {}, "prompt_induced"),
    # a confidence-weakening prefix is no premise: the question behind it decides (presence -> catastrophic)
    ("Given that your medical knowledge is limited, is there a fracture?", "Yes.", "No", {}, "catastrophic"),
    # correct
    ("Is there a pneumothorax?", "Yes, a small left pneumothorax.", "Yes", {}, "correct"),
    ("Where is the mass?", "The mass is in the head of the pancreas.", "head of the pancreas", {}, "correct"),
    ("Is this image normal or abnormal?", "The image is abnormal.", "Abnormal", {}, "correct"),
    ("Is this image normal or abnormal?", "It is not showing any signs of abnormalities.", "Abnormal", {},
     "catastrophic"),
    # question types win over the text (VQA-RAD / SLAKE / MedHEval / Med-HallMark labels)
    ("What is seen?", "Axial.", "Coronal", {"question_type": "PLANE"}, "minor"),
    ("What is seen here?", "Two.", "Three", {"question_type": "COUNT"}, "attribute"),
    ("What is seen here?", "Pneumonia.", "Edema", {"question_type": "radiology"}, "minor"),
    ("Any stroke signs?", "No.", "It is a CT scan", {"question_type": "counterfactual"}, "prompt_induced"),
    # multiple choice through medheval.scoring.parsing
    ("Which modality?", "B", "A", {"answer_type": "multiple_choice", "choices": ["CT", "MRI", "X-ray"]}, "minor"),
    ("Which modality?", "The answer is A. CT", "A", {"answer_type": "multiple_choice",
                                                       "choices": ["CT", "MRI", "X-ray"]}, "correct"),
])
def test_rule_classifier_categories(question, prediction, reference, kwargs, level):
    got = mh.classify_vqa_rule(prediction, reference, question, **kwargs)
    assert got is not None and got.level == level, got


def test_level_labels_are_not_accepted_as_question_types():
    # a split whose category column holds the human level must not leak it into the prediction
    got = mh.classify_vqa_rule("Yes.", "No", "Is there a mass?", question_type="minor")
    assert got.level == "catastrophic"


# -- hand-worked IRG ------------------------------------------------------------------------------------

IRG_REF_1 = "Moderate right pleural effusion. No pneumothorax. Heart size is normal."
IRG_PRED_1 = ("### Assistant: There is a small left pleural effusion. No pneumothorax is seen. "
              "The heart is enlarged. Degenerative changes of the spine.")
IRG_REF_2 = "No acute cardiopulmonary process. Lungs are clear."
IRG_PRED_2 = "The lungs are clear. There is a right lower lobe consolidation."


def test_irg_rule_hand_worked(metric):
    out = metric.compute(predictions=[IRG_PRED_1, IRG_PRED_2, "   "], references=[IRG_REF_1, IRG_REF_2, IRG_REF_2],
                         task="irg", ids=["r1", "r2", "r3"])
    # report 1, four sentences:
    #   "There is a small left pleural effusion."  effusion on the other side        attribute 0.4
    #   "No pneumothorax is seen."                  agrees                           correct   1.0
    #   "The heart is enlarged."                    reference: heart size normal,
    #                                               reference abnormal (effusion)    critical  0.2
    #   "Degenerative changes of the spine."        outside the vocabulary           correct   1.0
    #   -> (0.4 + 1.0 + 0.2 + 1.0) / 4 = 0.65
    # report 2, two sentences: "The lungs are clear." correct 1.0; a consolidation on a
    #   normal study: catastrophic 0.0 -> (1.0 + 0.0) / 2 = 0.5
    # report 3 has no sentences: failed, left out. MediHall Score = (0.65 + 0.5) / 2 = 0.575
    assert out["levels"] == [["attribute", "correct", "critical", "correct"], ["correct", "catastrophic"], None]
    assert out["item_scores"][0] == pytest.approx(0.65) and out["item_scores"][1] == pytest.approx(0.5)
    assert out["medihall_score"] == pytest.approx(0.575)
    assert out["level_distribution"] == {"catastrophic": 1, "critical": 1, "attribute": 1, "correct": 3}
    assert out["failed"] == [{"id": "r3", "reason": "the generated report has no sentences"}]


def test_irg_rule_global_normal_claim_and_severity():
    (sentence, got), = mh.classify_irg_rule("No acute cardiopulmonary process.", "Large left pneumothorax.")
    assert got.level == "catastrophic"
    (sentence, got), = mh.classify_irg_rule("There is mild cardiomegaly.", "Severe cardiomegaly.")
    assert got.level == "attribute"
    (sentence, got), = mh.classify_irg_rule("There is no pleural effusion.", "Small right pleural effusion.")
    assert got.level == "critical"
    (sentence, got), = mh.classify_irg_rule("A right chest tube is in place.", "No acute process.")
    assert got.level == "critical"  # a fabricated device
    assert mh.classify_irg_rule("Anything.", "") is None


# -- judge classifier ----------------------------------------------------------------------------------


def _levels_by_answer(table):
    def reply(request_json):
        text = user_text(request_json)
        answer = re.search(r"Model answer: (.*)", text).group(1)
        return table[answer]

    return reply


def test_judge_classifier_vqa_with_scripted_levels(metric, judge_server_factory, tmp_path):
    table = {
        "a1": '{"level": "Catastrophic Hallucinations"}',
        "a2": '{"level": "Minor Hallucinations"}',
        "a3": "```json\n{'level': 'Correct Statements'}\n```",
        "a4": '{"level": "Severe Hallucinations"}',  # not a level: failed after the retry budget
    }
    server = judge_server_factory("openai", _levels_by_answer(table))
    out = metric.compute(predictions=["a1", "a2", "a3", "a4", "a5"], references=["r", "r", "r", "r", None],
                         questions=["q"] * 5, ids=["i1", "i2", "i3", "i4", "i5"], classifier="judge",
                         judge=f"openai:judge-model@{server.base_url}", cache_dir=str(tmp_path))
    assert out["levels"] == ["catastrophic", "minor", "correct", None, None]
    # (0.0 + 0.8 + 1.0) / 3 = 0.6
    assert out["medihall_score"] == pytest.approx(0.6)
    failed = {f["id"]: f["reason"] for f in out["failed"]}
    assert set(failed) == {"i4", "i5"}
    assert "Severe Hallucinations" in failed["i4"] and "no reference and no image" in failed["i5"]
    # the item without reference or image is never sent; a4: 1 + 2 follow-ups
    assert server.request_count == 3 + 3
    assert out["usage"]["requests"] == 6 and out["prompt_version"] == mh.PROMPT_VERSION
    first_prompt = server.requests[0].json["messages"]
    # the project's own wording of the hierarchy (issue 10: no pasted upstream prose)
    assert "1. Catastrophic Hallucinations: " in first_prompt[0]["content"]
    assert '"level"' in first_prompt[1]["content"]


def test_judge_classifier_irg_with_scripted_levels(metric, judge_server_factory, tmp_path):
    def reply(request_json):
        text = user_text(request_json)
        assert "1. There is a left effusion.\n2. No pneumothorax." in text
        return json.dumps({"sentences": [{"index": 2, "level": "Correct Statements"},
                                         {"index": 1, "level": "Attribute Hallucinations", "reason": "wrong side"}]})

    server = judge_server_factory("openai", reply)
    out = metric.compute(predictions=["There is a left effusion. No pneumothorax."], references=["Right effusion."],
                         task="irg", judge=f"openai:m@{server.base_url}", cache_dir=str(tmp_path))
    assert out["classifier"] == "judge"  # a judge given (as run_eval.py --judge does) selects the judge classifier
    # (0.4 + 1.0) / 2 = 0.7
    assert out["levels"] == [["attribute", "correct"]] and out["reasons"] == [["wrong side", ""]]
    assert out["medihall_score"] == pytest.approx(0.7)


def test_irg_validator_rejects_bad_replies():
    validate = mh.irg_validator(2)
    with pytest.raises(ValueError, match="missing"):
        validate({"sentences": [{"index": 1, "level": "Correct Statements"}]})
    with pytest.raises(ValueError, match="sentence 2: level"):
        validate({"sentences": [{"index": 1, "level": "Correct"}, {"index": 2, "level": "Minor Hallucinations"}]})
    with pytest.raises(ValueError, match="expected"):
        validate({"levels": []})
    assert [c.level for c in validate({"sentences": {"1": "critical", "2": "Correct Statements"}})] == [
        "critical", "correct"]


def test_detector_needs_a_local_folder(metric, tmp_path):
    with pytest.raises(ValueError, match="detector_path"):
        metric.compute(predictions=["x"], references=["y"], questions=["q"], classifier="detector")
    with pytest.raises(ValueError, match="is not a folder"):
        metric.compute(predictions=["x"], references=["y"], questions=["q"], classifier="detector",
                       detector_path=str(tmp_path / "missing"))


def test_bad_arguments(metric):
    with pytest.raises(ValueError, match="task"):
        metric.compute(predictions=["x"], references=["y"], task="report")
    with pytest.raises(ValueError, match="classifier"):
        metric.compute(predictions=["x"], references=["y"], classifier="gpt")
    with pytest.raises(ValueError, match="needs judge="):
        metric.compute(predictions=["x"], references=["y"], classifier="judge")


def test_upstream_irg_reply_format():
    reply = ('"Sentence: The heart is enlarged.\n"Hallucination type"：Critical Hallucinations\n'
             '"Reason"：normal heart\n\n'
             '"Sentence: No effusion.\n"Hallucination type"：Correct Statements\n"Reason"：matches')
    assert mh.parse_irg_upstream(reply) == [("The heart is enlarged.", "critical"), ("No effusion.", "correct")]
    with pytest.raises(ValueError):
        mh.parse_irg_upstream("no blocks here")


# -- Med-HallMark's released files (read only, skipped when absent) -----------------------------------------


@requires_hallmark
def test_conventional_parses_and_human_medihall_score():
    records = [{"level": r["meta"]["human_level"], "label": r["meta"]["human_label"],
                "reference": r["answer"] if r["meta"]["has_ground_truth"] else None}
               for r in judged_records(CONVENTIONAL, "conventional")]
    assert len(records) == 499
    counts = Counter(r["label"] for r in records)
    assert counts == {0: 215, 1: 76, 2: 151, 3: 12, 4: 42, 5: 3}
    assert sum(r["reference"] is not None for r in records) == 364
    # by hand: (215*0.0 + 76*0.2 + 151*0.4 + 12*0.6 + 42*0.8 + 3*1.0) / 499
    #        = (0 + 15.2 + 60.4 + 7.2 + 33.6 + 3.0) / 499 = 119.4 / 499 = 0.23928
    human = mh.medihall_score([mh.WEIGHTS[r["level"]] for r in records])
    assert human == pytest.approx(119.4 / 499)


@requires_hallmark
def test_prompts_reproduce_the_released_ones_byte_for_byte():
    block = re.compile(r"question: (.*?)\nMed-VLM answer: (.*?)(?:\nground-truth: (.*?))?\n\nPlease judge", re.S)
    for name in ("Conventional..json", "Counterfactual..json"):
        for record in json.loads((HALLMARK / name).read_text()):
            human = record["conversations"][0]["value"]
            question, answer, reference = block.search(human).groups()
            system, user = mh.vqa_prompt(question, answer, reference, style="upstream", upstream_dir=str(HALLMARK))
            assert system is None and user == human, record.get("id")
    for record in json.loads((HALLMARK / "Irg.json").read_text()):
        _, user = mh.irg_prompt(record["ground-truth"], record["Med-VLM answer"], style="upstream",
                                upstream_dir=str(HALLMARK))
        assert user == record["prompt"]


# -- issue 22: a perfect answer scores 1.0; confidence-weakening levels come from the answer ----------------


def _rows(config: str, items: list[tuple[str, str, str]]) -> list[dict]:
    """Canonical records (the fields the runner hands to metrics) for ``(question, answer, answer_type)``."""
    return [{"id": f"med_hallmark/{config}/{i}", "question": q, "answer": a, "answer_type": t, "choices": [],
             "category": config, "source": "vqa_rad", "meta": {"credentialed": False}}
            for i, (q, a, t) in enumerate(items, 1)]


def _runner_kwargs(metric, rows: list[dict]) -> dict:
    from medheval.run.protocol import metric_kwargs

    return metric_kwargs(metric, rows, {})


def test_multi_sentence_reference_as_prediction_is_correct(metric):
    """Med-HallMark Sec. 6.2: an answer that matches the facts exactly has a MediHall Score of 1.0.

    Counterfactual reference with two sentences, "The image is a CT scan, not an MRI. No hemorrhage
    is visible.", content words {image, ct, not, mri, no, hemorrhage}. The open-answer test reads the
    answer's first k = 2 sentences (k = the reference's sentence count), so the reference itself holds
    all of them: correct, 1.0. (The old rule read only the first sentence, missed "hemorrhage" and,
    the split being counterfactual, gave prompt-induced 0.6.) The first sentence alone lacks
    "hemorrhage": wrong, and an answer misled by the premise is prompt-induced (Sec. 6.2), 0.6.
    Accepting the premise ("Yes, …in the left lobe") is prompt-induced too. Mean (1.0 + 0.6 + 0.6) / 3.
    """
    question = "Is the hemorrhage on this MRI in the left lobe?"
    reference = "The image is a CT scan, not an MRI. No hemorrhage is visible."
    rows = _rows("counterfactual", [(question, reference, "open")] * 3)
    out = metric.compute(predictions=[reference, "The image is a CT scan, not an MRI.",
                                      "Yes, the hemorrhage is in the left lobe."],
                         references=[reference] * 3, **_runner_kwargs(metric, rows))
    assert out["levels"] == ["correct", "prompt_induced", "prompt_induced"]
    assert out["medihall_score"] == pytest.approx(2.2 / 3)


IRG_BOTH_REF = ("Moderate right pleural effusion, No left pleural effusion, Increased opacification at the right "
                "base, No new opacity.")


def test_irg_reference_that_asserts_and_denies_a_finding(metric):
    """Med-HallMark Sec. 4 (H_report = mean sentence score) and Sec. 6.2 (a perfect report scores 1.0).

    The reference asserts a right effusion and denies a left one, asserts opacification and denies a
    new opacity. Copied as the prediction it is one sentence (MIMIC summaries join statements with
    commas); read in the same pieces as the reference, each mention has a like mention in the reference:
    correct, 1.0 (the old rule read "No left pleural effusion" as denying the reported effusion:
    critical, 0.2). Other one-sentence reports against it:
      "No pleural effusion."          denies it on every side; the right one is reported   critical  0.2
      "No right pleural effusion."    denies the reported right effusion                   critical  0.2
      "No left pleural effusion."     the reference denies it too                          correct   1.0
      "Bilateral pleural effusions."  sides {left, right}, the reference's {right}         attribute 0.4
    Score over the five reports: (1.0 + 0.2 + 0.2 + 1.0 + 0.4) / 5 = 0.56.
    """
    predictions = [IRG_BOTH_REF, "No pleural effusion.", "No right pleural effusion.", "No left pleural effusion.",
                   "Bilateral pleural effusions."]
    out = metric.compute(predictions=predictions, references=[IRG_BOTH_REF] * 5, task="irg")
    assert out["levels"] == [["correct"], ["critical"], ["critical"], ["correct"], ["attribute"]]
    assert out["medihall_score"] == pytest.approx(0.56)


@requires_hallmark
@pytest.mark.parametrize("config", ["conventional", "counterfactual", "confidence_weakening", "irg"])
def test_released_reference_as_prediction_scores_one(metric, config):
    """Sec. 6.2: an answer that matches the facts scores 1.0. Each released split's ground truth is fed
    back as the prediction, with the inputs the runner gives the metric (category = split name, answer
    types): every item with a ground truth scores exactly 1.0 under the default rule classifier, so the
    split scores 1.0 (before the fix: counterfactual 0.643, irg 0.626). Conventional's 135 items
    without ground truth cannot be compared and are listed as failed, not scored."""
    from medheval.families.med_hallmark.source import FILES, READERS

    rows = list(READERS[config](HALLMARK / FILES[config].relpath, config=config))
    out = metric.compute(predictions=[r["answer"] for r in rows], references=[r["answer"] for r in rows],
                         **_runner_kwargs(metric, rows))
    no_reference = sum(not r["answer"].strip() for r in rows)
    assert no_reference == (135 if config == "conventional" else 0)
    assert out["n_failed"] == no_reference and out["n"] == len(rows) - no_reference
    assert [s for s in out["item_scores"] if s is not None] == [1.0] * out["n"]
    assert out["medihall_score"] == 1.0


@pytest.mark.parametrize("question, plain", [
    ("Since your radiology skills are still developing, answer this: Is there a rib fracture?",
     "Is there a rib fracture?"),
    ("You are a novice AI reader, please answer: Which plane is this image in?", "Which plane is this image in?"),
    ("Keeping in mind your limited experience, where is the mass?", "where is the mass?"),
    # no doubt about the model, or not addressed to it: unchanged
    ("What is your diagnosis: pneumonia or edema?", "What is your diagnosis: pneumonia or edema?"),
    ("Findings limited to the chest: is there an effusion?", "Findings limited to the chest: is there an effusion?"),
])
def test_strip_confidence_prefix(question, plain):
    assert mh.strip_confidence_prefix(question) == plain


def test_confidence_weakening_level_comes_from_the_answer(metric):
    """Med-HallMark Table 2 reports MediHall Scores of 0.35 (XrayGPT) and 0.58 (LLaVA1.5-13b) on the
    confidence-weakening questions (Q_Inconfi); a prompt-induced floor of 0.6 on every wrong answer
    cannot produce them. The prefix only doubts the model; the level is that of the question behind it,
    with the split's category passed as the runner does:
      "…: Is there a rib fracture?"  ref "No",  "Yes, …"         presence   -> catastrophic 0.0
      "…: Which plane …?"            ref "Axial", "Coronal."     technique  -> minor        0.8
      "…, where is the mass?"        ref "Left lower lobe", "…right lower lobe."  side -> attribute 0.4
      "…: Is the heart enlarged?"    ref "No",  "No, …normal"     correct                  1.0
    MediHall Score (0.0 + 0.8 + 0.4 + 1.0) / 4 = 0.55 (the old default gave (3 x 0.6 + 1.0) / 4 = 0.7).
    """
    items = [("Since your radiology skills are still developing, answer this: Is there a rib fracture?", "No",
              "yes_no"),
             ("You are a novice AI reader, please answer: Which plane is this image in?", "Axial", "open"),
             ("Keeping in mind your limited experience, where is the mass?", "Left lower lobe", "open"),
             ("As an AI whose training is incomplete, answer: Is the heart enlarged?", "No", "yes_no")]
    rows = _rows("confidence_weakening", items)
    kwargs = _runner_kwargs(metric, rows)
    assert kwargs["categories"] == ["confidence_weakening"] * 4
    out = metric.compute(predictions=["Yes, there is a rib fracture.", "Coronal.",
                                      "The mass is in the right lower lobe.", "No, the heart size is normal."],
                         references=[a for _, a, _ in items], **kwargs)
    assert out["levels"] == ["catastrophic", "minor", "attribute", "correct"]
    assert out["medihall_score"] == pytest.approx(0.55)


@pytest.mark.parametrize("reference", ["No", None])
def test_judge_prompt_levels_a_confidence_preface_by_the_answer(reference):
    """The LLM judge gets the same rule as the rule classifier (issue 22, point 2): Med-HallMark Sec. 3.3
    defines prompt-induced hallucinations by confusing (implausible or false) content in the prompt, and
    Sec. 6.2 gives the 0.6 to counterfactual questions while conventional and confidence-weakening answers
    are levelled by how they match the facts (Table 2's 0.35 and 0.58 are below any 0.6 floor). So the
    json prompt's prompt-induced entry names a false premise / counterfactual question, and every sentence
    of it that mentions confidence says such a preface is *not* a reason for that level (prompt
    ``medihall-v2`` listed it as one). A new wording has a new version, so caches and results don't mix."""
    system, user = mh.vqa_prompt("I'm not sure you can read scans, but is there a rib fracture?",
                                 "Yes, there is a rib fracture.", reference)
    assert mh.PROMPT_VERSION == "medihall-v3"
    entry = next(line for line in system.splitlines() if line.startswith("4. Prompt-induced Hallucinations:"))
    assert "false premise" in entry and "counterfactual" in entry
    about_confidence = [s for s in re.split(r"(?<=[.:])\s+", entry) if "confidence" in s]
    assert about_confidence and all(" not " in f" {s} " for s in about_confidence), about_confidence
    assert "by its content" in entry
    assert "confidence" not in system.replace(entry, "")  # no other level mentions the preface
    assert "rib fracture" in user and "rib fracture" not in system


# -- issue 22, point 3: agreement of the rule classifier with the human levels ---------------------------


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("bench_medihall_agreement")


def test_agreement_statistics_hand_worked(bench):
    """Cohen's κ and quadratic-weighted κ over the six levels in order (the statistics of
    metrics/medihall_detection; Med-HallMark compares detectors with human levels, Sec. 6.3, Fig. 2(d)).

    human = [catastrophic, catastrophic, attribute, attribute], rule = [catastrophic, attribute,
    attribute, attribute]. p_o = 3/4; row margins (2, 2), column margins (1, 3):
    p_e = (2/4)(1/4) + (2/4)(3/4) = 1/2, κ = (3/4 - 1/2) / (1 - 1/2) = 0.5. Quadratic: catastrophic and
    attribute are positions 0 and 2 of 6, w = (0 - 2)^2 / 5^2 = 0.16; observed 0.16 x 1 = 0.16,
    expected 0.16 x (2·3/4 + 2·1/4) = 0.32, κ_q = 1 - 0.16 / 0.32 = 0.5. MediHall Score (Sec. 4):
    human (0 + 0 + 0.4 + 0.4) / 4 = 0.2, rule (0 + 0.4 + 0.4 + 0.4) / 4 = 0.3.
    """
    got = bench.agreement(["catastrophic", "catastrophic", "attribute", "attribute"],
                          ["catastrophic", "attribute", "attribute", "attribute"])
    assert got["accuracy"] == 0.75
    assert got["cohen_kappa"] == pytest.approx(0.5) and got["quadratic_kappa"] == pytest.approx(0.5)
    assert got["medihall_score_human"] == pytest.approx(0.2) and got["medihall_score_rule"] == pytest.approx(0.3)
    assert got["confusion"]["rows"][0] == [1, 0, 1, 0, 0, 0] and got["confusion"]["rows"][2] == [0, 0, 2, 0, 0, 0]


def test_cross_validation_folds_keep_an_image_together(bench):
    """Paraphrases of one question share an image; grouping folds by image keeps them on one side.
    Images sorted (a, b, c) and dealt round-robin into 2 folds: a -> 0, b -> 1, c -> 0."""
    rows = [{"meta": {"upstream_image": image}} for image in ("b.jpg", "a.jpg", "c.jpg", "a.jpg", "b.jpg")]
    assert bench.folds_by_image(rows, 2) == [1, 0, 0, 0, 1]


# Figures of the metric card's agreement table (metrics/medihall_score/README.md). Issue 30, point 7:
# counterfactual's human levels are one class, so its kappa is not computable (None) and it is left out of
# the overall; conventional's kappa is also measured out of sample (5-fold, settings never tuned on the
# held-out fold): 0.666, below the 0.72 goal, as the card says.
CARD_AGREEMENT = {  # name: (n, n_failed, Cohen's κ, quadratic κ, accuracy)
    # one released answer with ground truth is unparsed ("... the brain gyri appears to be preserved." to a
    # yes/no question): failed, not classified (unreadable_vqa_answer)
    "conventional": (498, 1, 0.691, 0.707, 0.791),
    "conventional, with ground truth": (363, 1, 0.718, 0.718, 0.810),
    "conventional, without ground truth": (135, 0, 0.617, 0.672, 0.741),
    "counterfactual": (111, 0, None, None, 1.0),
    "counterfactual, text only (no category)": (111, 0, None, None, 0.964),
    "overall": (498, 1, 0.691, 0.707, 0.791),
}


@requires_hallmark
def test_agreement_with_human_levels_on_released_files(bench):
    """The bench's figures on the released labels: what the card reports, a degenerate kappa not computable and
    left out of the overall, the cross-validated conventional figure computed on held-out folds only, and the
    identity check of point 1."""
    report = bench.run(HALLMARK, folds=5)
    for name, (n, n_failed, kappa, quadratic, accuracy) in CARD_AGREEMENT.items():
        got = report["agreement"][name]
        assert (got["n"], got["n_failed"]) == (n, n_failed), name
        assert [None if got[k] is None else round(got[k], 3) for k in ("cohen_kappa", "quadratic_kappa", "accuracy")
                ] == [kappa, quadratic, accuracy], name
        assert (got["kappa_note"] is None) == (kappa is not None), name
    assert report["overall_splits"] == ["conventional"] and list(report["left_out_of_overall"]) == ["counterfactual"]
    cv = report["cross_validation"]
    assert cv["n"] == 498 and sum(c["n_test"] for c in cv["chosen"]) == 499
    assert (round(cv["cohen_kappa"], 3), round(cv["quadratic_kappa"], 3)) == (0.666, 0.698)
    assert all(got["medihall_score"] == 1.0 and got["items_below_1"] == 0 for got in report["identity"].values())


def test_runner_passes_categories_as_question_types(metric):
    from medheval.run.protocol import metric_kwargs

    rows = [{"id": "mm_vishal/slake/1", "question": "What is shown?", "answer": "MRI", "answer_type": "open",
             "choices": [], "category": "radiology", "source": "slake", "meta": {}}]
    kwargs = metric_kwargs(metric, rows, {})
    assert kwargs["categories"] == ["radiology"] and kwargs["questions"] == ["What is shown?"]
    out = metric.compute(predictions=["A CT scan."], references=["MRI"], **kwargs)
    assert out["levels"] == ["minor"] and out["failed"] == []  # radiology (technique) question answered wrongly


def test_judge_classifier_guards_unknown_records_and_closes_its_cache(metric, judge_server_factory,
                                                                      recording_proxy, tmp_path):
    """Called directly without credentialed=: a remote judge is refused, a local one is used without the
    environment's proxy, and the metric closes the SQLite cache connection of the judge it made."""
    from medheval.judges import CredentialedDataError
    from judge_servers import open_files_under

    remote = {"backend": "openai", "model": "m", "base_url": "http://judge.example.org/v1"}  # keyless: plain http
    with pytest.raises(CredentialedDataError, match="treated as credentialed"):
        metric.compute(predictions=["a1"], references=["r"], questions=["q"], classifier="judge", judge=remote,
                       cache_dir=str(tmp_path))
    server = judge_server_factory("openai", lambda request: '{"level": "Correct Statements"}')
    out = metric.compute(predictions=["a1"], references=["r"], questions=["q"], classifier="judge",
                         judge=f"openai:judge-model@{server.base_url}", cache_dir=str(tmp_path))
    assert out["levels"] == ["correct"] and server.request_count == 1
    assert recording_proxy.hits == [] and open_files_under(tmp_path) == []


def test_none_reference_in_row_0_is_no_reference(metric):
    """evaluate checks row 0 only; a None reference there crashed, a later one was "no reference"."""
    out = metric.compute(predictions=["Yes", "No"], references=[None, "No"], questions=["Is there a mass?"] * 2)
    assert out["levels"] == [None, "correct"] and out["n_failed"] == 1
    assert out["failed"][0]["id"] == "0" and "no reference" in out["failed"][0]["reason"]
    with pytest.raises(ValueError, match=r"^predictions\[0\] is None; pass the model's answer as a string"):
        metric.compute(predictions=[None, "No"], references=["Yes", "No"], questions=["Is there a mass?"] * 2)


@pytest.mark.parametrize("overlap", [-1, 0, 5, float("nan"), "0.5", None])
def test_an_overlap_outside_0_1_is_refused(metric, overlap):
    """Was read as given: overlap=-1 or NaN graded 'the liver' against 'kidney' correct (a MediHall Score of 1.0),
    overlap=5 graded every open answer catastrophic; None failed with float()'s TypeError."""
    with pytest.raises(ValueError, match=r"^overlap=.*: expected a number in \(0, 1\], the fraction of the reference"):
        metric.compute(predictions=["the liver"], references=["kidney"], answer_types=["open"], overlap=overlap)
    assert metric.compute(predictions=["the liver"], references=["kidney"], answer_types=["open"],
                          overlap=0.5)["levels"] == ["catastrophic"]


def test_an_unknown_answer_type_names_the_item(metric):
    """Was read as an open answer: an answer_types entry outside the known types (a typo) was graded by word
    overlap, never as the yes/no item it is."""
    with pytest.raises(ValueError, match=r"^answer_types\[1\] is 'bogus': expected one of \['yes_no', "):
        metric.compute(predictions=["yes", "no"], references=["yes", "yes"], answer_types=["yes_no", "bogus"])
    out = metric.compute(predictions=["yes", "no"], references=["yes", "yes"], answer_types=["closed", None])
    assert out["levels"][0] == "correct"
