"""The close_ended_accuracy evaluate module, loaded offline from its local folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import UPSTREAM_MEDHEVAL, load_metric_offline

from medheval.scoring import parsing
from medheval.data.schema import HALLUCINATION_TYPE_TO_CATEGORY

REPO = Path(__file__).resolve().parents[1]
METRIC_DIR = REPO / "metrics" / "close_ended_accuracy"
UPSTREAM = UPSTREAM_MEDHEVAL  # ../shared, or $MEDHEVAL_SHARED
FINE_GRAINED = UPSTREAM / "Visual_Misinterpretation_Hallucination" / "close-ended" / "fine-grained"
KNOWLEDGE_CLOSE = UPSTREAM / "Knowledge_Deficiency_Hallucination" / "close-ended" / "MIMIC-CXR_sampled.json"
CONTEXT_CLOSE = UPSTREAM / "Context_Misalignment_Hallucination" / "MIMIC-CXR_pairs.json"

CXR = ["Pleural effusion", "Pneumonia", "Cardiomegaly", "Pulmonary edema"]


@pytest.fixture(scope="module")
def metric():
    return load_metric_offline(METRIC_DIR)


def test_module_files_present():
    for name in ("close_ended_accuracy.py", "README.md", "requirements.txt", "app.py"):
        assert (METRIC_DIR / name).is_file(), name
    card = (METRIC_DIR / "README.md").read_text()
    assert card.startswith("---\n") and "- evaluate\n- metric" in card
    # One import per line: evaluate scans imports with a line regex.
    for line in (METRIC_DIR / "close_ended_accuracy.py").read_text().splitlines():
        if line.startswith("import "):
            assert "," not in line, line


def test_known_answers(metric):
    # idx  prediction                    reference             type  category     -> correct / parsed / ref ok
    # 0    "Yes, there is an effusion."  "Yes"                 yn    anatomy      -> T / T / T
    # 1    "No."                         "Yes"                 yn    anatomy      -> F / T / T
    # 2    "Cannot be determined."       "No"                  yn    measurement  -> F / F / T
    # 3    "The answer is C."            "C. Cardiomegaly"     mc    measurement  -> T / T / T
    # 4    "Pneumonia"                   "B"                   mc    symptom      -> T / T / T
    # 5    "There is no pneumothorax."   "No"                  yn    symptom      -> T / T / T
    # 6    "Yes"                         "Abnormal"            yn    radiology    -> F / T / F
    # 7    "D"                           "A. Pleural effusion" mc    radiology    -> F / T / T
    # 8    "Unsure"                      "A"                   mc    radiology    -> F / F / T
    preds = [
        "Yes, there is an effusion.", "No.", "Cannot be determined.", "The answer is C.", "Pneumonia",
        "There is no pneumothorax.", "Yes", "D", "Unsure",
    ]
    refs = ["Yes", "Yes", "No", "C. Cardiomegaly", "B", "No", "Abnormal", "A. Pleural effusion", "A"]
    types = ["yes_no", "yes_no", "yes_no", "multiple_choice", "multiple_choice", "yes_no", "yes_no",
             "multiple_choice", "multiple_choice"]
    choices = [[], [], [], CXR, CXR, [], [], CXR, CXR]
    cats = ["anatomy", "anatomy", "measurement", "measurement", "symptom", "symptom", "radiology",
            "radiology", "radiology"]
    r = metric.compute(predictions=preds, references=refs, answer_types=types, choices=choices, categories=cats)
    assert r["correct"] == [True, False, False, True, True, True, False, False, False]
    assert r["parsed"] == [True, True, False, True, True, True, True, True, False]
    assert r["n"] == 9
    assert r["accuracy"] == pytest.approx(4 / 9)
    assert r["accuracy_by_category"] == pytest.approx(
        {"anatomy": 0.5, "measurement": 0.5, "symptom": 1.0, "radiology": 0.0}
    )
    assert r["accuracy_by_answer_type"] == pytest.approx({"yes_no": 2 / 5, "multiple_choice": 2 / 4})
    assert r["n_unparsed"] == 2
    assert r["n_bad_reference"] == 1


def test_optional_inputs(metric):
    r = metric.compute(predictions=["Yes", "no"], references=["Yes", "Yes"], answer_types=["binary", "yes_no"])
    assert r["accuracy"] == 0.5 and r["accuracy_by_category"] == {} and r["n"] == 2
    # Raw choices strings are accepted in place of parsed lists.
    r = metric.compute(
        predictions=["Option B"], references=["Pneumonia"], answer_types=["multi-choice"],
        choices=["A. Pleural effusion, B. Pneumonia"],
    )
    assert r["accuracy"] == 1.0


def test_n_unparsed_counts_only_unreadable_predictions(metric):
    preds = ["", "I'm not sure.", "It is not possible to tell.", "Maybe", "No", "E"]
    refs = ["Yes", "No", "Yes", "No", "No", "B"]
    types = ["yes_no"] * 5 + ["multiple_choice"]
    choices = [[]] * 5 + [CXR]
    r = metric.compute(predictions=preds, references=refs, answer_types=types, choices=choices)
    assert r["n_unparsed"] == 5
    assert r["accuracy"] == pytest.approx(1 / 6)
    assert r["n_bad_reference"] == 0


def test_length_mismatch_raises(metric):
    with pytest.raises(ValueError, match="Mismatch"):
        metric.compute(predictions=["Yes", "No"], references=["Yes"], answer_types=["yes_no", "yes_no"])
    with pytest.raises(ValueError, match="categories"):
        metric.compute(predictions=["Yes"], references=["Yes"], answer_types=["yes_no"], categories=["a", "b"])


def test_unknown_answer_type_raises(metric):
    with pytest.raises(ValueError, match=r"item 1: unknown answer_type 'open'"):
        metric.compute(predictions=["Yes", "x"], references=["Yes", "y"], answer_types=["yes_no", "open"])
    with pytest.raises(ValueError, match="item 0"):
        metric.compute(predictions=["B"], references=["B"], answer_types=["multiple_choice"])


def test_upstream_compat_known_answers(metric):
    # Groups (no sources given): (None, category). Yes/no groups: anatomy [u0, u1], symptom [u2].
    # u0 "Not sure." vs "Yes": tokens Not/sure -> 1 == 1               correct
    # u1 "Abnormal" vs "No": 1 vs 0                                     wrong
    # u2 "" vs "Yes": the last (only) answer of its group is empty, so upstream's stale
    #    variable makes the group unanswered (-1)                        wrong, unparsed
    # u3 "C. Cardiomegaly" vs "C. Cardiomegaly": same option (ratio 1)  correct
    # u4 raw "A, Stent; B, CHF": no option B                           skipped
    # u5 "Pneumonia" -> "B. Pneumonia" (ratio 18/21), label -> C       wrong
    preds = ["Not sure.", "Abnormal", "", "C. Cardiomegaly", "Stent", "Pneumonia"]
    refs = ["Yes", "No", "Yes", "C. Cardiomegaly", "A, Stent", "C. Cardiomegaly"]
    types = ["yes_no", "yes_no", "yes_no", "multiple_choice", "multiple_choice", "multiple_choice"]
    choices = [[], [], [], CXR, ["Stent", "CHF"], CXR]
    raw = ["", "", "", "", "A, Stent; B, CHF", ""]
    r = metric.compute(
        predictions=preds, references=refs, answer_types=types, choices=choices, raw_choices=raw,
        categories=["anatomy", "anatomy", "symptom", "symptom", "symptom", "radiology"], upstream_compat=True,
    )
    assert r["correct"] == [True, False, False, True, None, False]
    assert r["n"] == 5 and r["n_skipped_upstream"] == 1
    assert r["n_unparsed"] == 1
    # Upstream's weighted means (issue 9, part 2; before, skipped items were left out: 2/5 overall,
    # symptom 1/2). anatomy: 1/2 over 2 items. symptom: yes/no 0/1, MC 1/1 scored but weighted by
    # its 2 items (the skipped one too): (0*1 + 1*2)/3 = 2/3. radiology: 0/1.
    # Overall: (0.5*2 + 2/3*3 + 0*1) / 6 = 0.5.
    assert r["accuracy"] == pytest.approx(0.5)
    assert r["accuracy_by_category"] == pytest.approx({"anatomy": 0.5, "symptom": 2 / 3, "radiology": 0.0})
    # The same inputs natively: "Not sure." is unparsed, "Abnormal" vs "No" unparsed.
    r2 = metric.compute(predictions=preds, references=refs, answer_types=types, choices=choices)
    assert "n_skipped_upstream" not in r2 and r2["n"] == 6


def test_upstream_compat_groups_by_source_and_category(metric):
    # Two yes/no groups of one category, one per source. Source "a" ends with ". yes" (its whole
    # group is wrong); source "b" has an empty answer in the middle, read as "yes".
    preds = ["Yes", "No", ". yes", "No", "", "No"]
    refs = ["Yes", "No", "Yes", "No", "Yes", "No"]
    r = metric.compute(
        predictions=preds, references=refs, answer_types=["yes_no"] * 6,
        categories=["symptom"] * 6, sources=["a", "a", "a", "b", "b", "b"], upstream_compat=True,
    )
    assert r["correct"] == [False, False, False, True, True, True]
    assert r["parsed"] == [False, False, False, True, True, True]
    assert r["accuracy"] == pytest.approx(0.5) and r["accuracy_by_category"] == {"symptom": pytest.approx(0.5)}
    # Without sources the six answers are one group whose last answer is fine.
    r = metric.compute(predictions=preds, references=refs, answer_types=["yes_no"] * 6, upstream_compat=True)
    assert r["correct"] == [True, True, True, True, True, True]


def test_native_mode_reads_answers_with_their_questions(metric):
    q = "Is there a pleural effusion?"
    r = metric.compute(
        predictions=["There is a small pleural effusion.", "The lungs are clear.", "No effusion is seen."],
        references=["Yes", "No", "No"], answer_types=["yes_no"] * 3, questions=[q, q, q],
    )
    assert r["correct"] == [True, False, True] and r["n_unparsed"] == 1
    # Without the questions the copula sentence asserts nothing either; "There is ..." still does.
    r = metric.compute(
        predictions=["There is a small pleural effusion.", "The lungs are clear."],
        references=["Yes", "No"], answer_types=["yes_no"] * 2,
    )
    assert r["correct"] == [True, False] and r["n_unparsed"] == 1


# --- the released MedHEval files (read only; skipped when absent) --------------------------------


def _load_upstream_items():
    files = sorted(FINE_GRAINED.glob("*.json")) if FINE_GRAINED.is_dir() else []
    if not files:
        pytest.skip("upstream MedHEval data not available")
    out = {}
    named = [(p.stem, p) for p in files]
    named += [(n, p) for n, p in (("knowledge", KNOWLEDGE_CLOSE), ("context", CONTEXT_CLOSE)) if p.is_file()]
    for name, path in named:
        records = json.loads(path.read_text())
        items = []
        for rec in records:
            kind = rec.get("question_type") or rec.get("ground_truth_type")
            items.append(
                {
                    "answer": rec["answer"],
                    "answer_type": "yes_no" if kind == "binary" else "multiple_choice",
                    "choices": parsing.split_choices(rec.get("choices") or ""),
                    "raw_choices": rec.get("choices") or "",
                    "category": HALLUCINATION_TYPE_TO_CATEGORY.get(rec.get("hallucination_type")),
                }
            )
        out[name] = items
    return out


def test_references_score_against_themselves(metric):
    data = _load_upstream_items()
    bad = {}
    for name, items in data.items():
        r = metric.compute(
            predictions=[it["answer"] for it in items],
            references=[it["answer"] for it in items],
            answer_types=[it["answer_type"] for it in items],
            choices=[it["choices"] for it in items],
            categories=[it["category"] for it in items],
        )
        usable = r["n"] - r["n_bad_reference"]
        # Every usable reference, used as a prediction, is read back as itself.
        assert sum(r["correct"]) == usable, name
        bad[name] = r["n_bad_reference"]
        if name not in ("knowledge", "context"):
            assert set(r["accuracy_by_category"]) <= {"anatomy", "measurement", "symptom", "radiology"}
    print("unusable references per file:", bad)
    assert bad["mimic_cxr_closed_pairs"] > 0
    if "knowledge" in bad:
        assert bad["knowledge"] == 4  # "Unclear" x3, "Equivocal" x1
    if "context" in bad:
        assert bad["context"] == 0  # plain Yes/No


def test_upstream_mode_on_released_references(metric):
    data = _load_upstream_items()
    items = data["mimic_cxr_closed_pairs"]
    r = metric.compute(
        predictions=[it["answer"] for it in items],
        references=[it["answer"] for it in items],
        answer_types=[it["answer_type"] for it in items],
        choices=[it["choices"] for it in items],
        raw_choices=[it["raw_choices"] for it in items],
        upstream_compat=True,
    )
    # The upstream rule applied to the same text on both sides always agrees.
    assert r["accuracy"] == 1.0
    # "A, x; B, y" choice strings have no option B for upstream's regex.
    assert r["n_skipped_upstream"] == 3


def test_docstring_example(metric):
    r = metric.compute(
        predictions=["No, there is no effusion.", "The answer is B.", "Cannot be determined."],
        references=["No", "B. Pneumonia", "Yes"],
        answer_types=["yes_no", "multiple_choice", "yes_no"],
        choices=[[], ["Pleural effusion", "Pneumonia"], []],
        categories=["symptom", "symptom", "anatomy"],
    )
    assert (round(r["accuracy"], 4), r["n_unparsed"], r["accuracy_by_category"]) == (
        0.6667, 1, {"anatomy": 0.0, "symptom": 1.0}
    )


def test_empty_input(metric):
    """No item scored has no accuracy (None, as CHAIR, text_generation and the others give), not 0 %: nothing
    scored is not everything wrong."""
    r = metric.compute(predictions=[], references=[], answer_types=[])
    assert r["n"] == 0 and r["accuracy"] is None and r["correct"] == []


@pytest.mark.parametrize("index", [0, 2])
def test_none_prediction_is_an_error_naming_it_at_any_index(metric, index):
    predictions = ["Yes", "No", "Yes"]
    predictions[index] = None
    with pytest.raises(ValueError, match=rf"^predictions\[{index}\] is None; pass the model's answer as a string"):
        metric.compute(predictions=predictions, references=["Yes", "No", "Yes"], answer_types=["yes_no"] * 3)


def test_none_reference_and_answer_type_are_errors_naming_them(metric):
    with pytest.raises(ValueError, match=r"^references\[0\] is None; pass the reference as a string"):
        metric.compute(predictions=["Yes", "No"], references=[None, "No"], answer_types=["yes_no"] * 2)
    with pytest.raises(ValueError, match=r"^answer_types\[1\] is None; pass \"yes_no\" or \"multiple_choice\""):
        metric.compute(predictions=["Yes", "No"], references=["Yes", "No"], answer_types=["yes_no", None])


def test_none_option_is_an_error_naming_item_and_option(metric):
    with pytest.raises(ValueError, match=r"^choices\[1\]\[1\] is None; pass every option as a string"):
        metric.compute(predictions=["Yes", "A"], references=["Yes", "A"], answer_types=["yes_no", "multiple_choice"],
                       choices=[[], ["x", None]])
