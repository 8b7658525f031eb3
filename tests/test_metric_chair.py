"""CHAIR / Recall (metrics/chair): hand-worked cases for both variants, offline loading, errors."""

from __future__ import annotations

import json
import os

import pytest

from medheval.labelers import CONDITIONS

from conftest import REPO, UPSTREAM_MEDHEVAL

CHAIR_DIR = REPO / "metrics" / "chair"
IDX = {name: i for i, name in enumerate(CONDITIONS)}


@pytest.fixture(scope="module")
def chair():
    os.environ.setdefault("HF_EVALUATE_OFFLINE", "1")
    import evaluate

    return evaluate.load(str(CHAIR_DIR))


# Labels by the rule labeler (checked in test_labels_of_the_worked_example):
#   P1 Cardiomegaly 1, Pleural Effusion 1        R1 Cardiomegaly 1, Pleural Effusion 0
#   P2 No Finding 1                              R2 No Finding 1
#   P3 Pneumonia 1, Pneumothorax 0               R3 Consolidation 1, Pneumothorax 1
#   P4 Atelectasis -1, Support Devices 1         R4 Atelectasis 1
PREDICTIONS = [
    "Mild cardiomegaly. Small left pleural effusion.",
    "No acute process.",
    "Right lower lobe pneumonia. No pneumothorax.",
    "Possible atelectasis. ET tube in place.",
]
REFERENCES = [
    "Mild cardiomegaly. No pleural effusion.",
    "No acute process.",
    "Right lower lobe consolidation. Small pneumothorax.",
    "Left basilar atelectasis.",
]


def _nonblank(row):
    return {CONDITIONS[i]: v for i, v in enumerate(row) if v is not None}


def test_labels_of_the_worked_example():
    from medheval.labelers.chexpert_rules import RuleLabeler

    rows = RuleLabeler().label(PREDICTIONS + REFERENCES)
    assert [_nonblank(r) for r in rows] == [
        {"Cardiomegaly": 1, "Pleural Effusion": 1},
        {"No Finding": 1},
        {"Pneumonia": 1, "Pneumothorax": 0},
        {"Atelectasis": -1, "Support Devices": 1},
        {"Cardiomegaly": 1, "Pleural Effusion": 0},
        {"No Finding": 1},
        {"Consolidation": 1, "Pneumothorax": 1},
        {"Atelectasis": 1},
    ]


def test_paper_variant_hand_worked(chair):
    out = chair.compute(predictions=PREDICTIONS, references=REFERENCES)
    # G (positive in the prediction): {CM, EFF}, {NF}, {PNA}, {SD}                 -> sum |G| = 5
    # S (positive in the reference):  {CM}, {NF}, {CO, PTX}, {AT}                  -> sum |S| = 5
    # G - S: {EFF}, {}, {PNA}, {SD}                                                -> 3 hallucinated
    # G & S: {CM}, {NF}, {}, {}                                                    -> 2 matched
    # CHAIR = 3 / 5 = 0.6; Recall = 2 / 5 = 0.4; CHAIR_s = 3 of 4 reports = 0.75
    assert out["variant"] == "paper" and out["labeler"] == "chexpert_rules"
    assert out["chair"] == pytest.approx(0.6)
    assert out["recall"] == pytest.approx(0.4)
    assert out["chair_s"] == pytest.approx(0.75)
    assert (out["n"], out["n_generated"], out["n_reference"], out["n_hallucinated"], out["n_matched"],
            out["n_missed"]) == (4, 5, 5, 3, 2, 3)
    assert out["hallucinated_findings"] == [["Pleural Effusion"], [], ["Pneumonia"], ["Support Devices"]]
    assert out["missed_findings"] == [[], [], ["Consolidation", "Pneumothorax"], ["Atelectasis"]]
    assert out["report_chair"] == [0.5, 0.0, 1.0, 1.0]
    # per report, its part of the micro counts (a report resamples reports with them)
    assert out["n_generated_per_item"] == [2, 1, 1, 1] and out["n_reference_per_item"] == [1, 1, 2, 1]
    assert out["n_hallucinated_per_item"] == [1, 0, 1, 1] and out["n_matched_per_item"] == [1, 1, 0, 0]
    per = out["per_finding"]
    assert set(per) == set(CONDITIONS)
    assert per["Cardiomegaly"] == {"n_generated": 1, "n_reference": 1, "n_hallucinated": 0, "n_matched": 1,
                                   "chair": 0.0, "recall": 1.0, "n_missed": 0}
    assert per["Pleural Effusion"]["chair"] == 1.0 and per["Pleural Effusion"]["recall"] is None
    assert per["Pneumothorax"]["chair"] is None and per["Pneumothorax"]["recall"] == 0.0
    assert per["Lung Lesion"] == {"n_generated": 0, "n_reference": 0, "n_hallucinated": 0, "n_matched": 0,
                                  "chair": None, "recall": None, "n_missed": 0}


def test_paper_variant_uncertain_as_positive(chair):
    out = chair.compute(predictions=PREDICTIONS, references=REFERENCES, uncertain_as_positive=True)
    # P4 now asserts {AT, SD}; AT is in S4 = {AT}: sum |G| = 6, hallucinated 3, matched 3 of sum |S| = 5
    assert out["chair"] == pytest.approx(0.5)
    assert out["recall"] == pytest.approx(0.6)
    assert out["hallucinated_findings"][3] == ["Support Devices"]
    assert out["missed_findings"][3] == []


def test_medheval_code_variant_hand_worked(chair):
    out = chair.compute(predictions=PREDICTIONS, references=REFERENCES, variant="medheval_code")
    # No reference cell is -1, so nothing is dropped. Cells (pred, ref):
    #   R1: CM (1, 1) TP; EFF (1, 0) FP                          N_gen 2
    #   R2: NF (1, 1) TP                                         N_gen 1
    #   R3: PNA (1, blank) counted in N_gen only; PTX (0, 1) FN; CO (blank, 1) missed      N_gen 2
    #   R4: AT (-1, 1) not in N_gen, missed; SD (1, blank) in N_gen only                  N_gen 1
    # TP 2, TN 0, FP 1, FN 1, N_gen 6, #(ref == 1) = 5 (CM, NF, CO, PTX, AT)
    # CHAIR = (1 + 1) / 6; Recall = 2 / 5; Specificity = 0 / (0 + 1); Accuracy = 2 / 4
    assert out["variant"] == "medheval_code"
    assert out["chair"] == pytest.approx(2 / 6)
    assert out["recall"] == pytest.approx(0.4)
    assert out["specificity"] == pytest.approx(0.0)
    assert out["accuracy"] == pytest.approx(0.5)
    assert (out["tp"], out["tn"], out["fp"], out["fn"]) == (2, 0, 1, 1)
    assert (out["n_generated"], out["n_reference"], out["n_hallucinated"], out["n_matched"], out["n_missed"]) == \
        (6, 5, 2, 2, 3)
    assert out["hallucinated_findings"] == [["Pleural Effusion"], [], ["Pneumothorax"], []]
    assert out["missed_findings"] == [[], [], ["Consolidation", "Pneumothorax"], ["Atelectasis"]]
    assert out["report_chair"] == [0.5, 0.0, 0.5, 0.0]
    assert out["n_generated_per_item"] == [2, 1, 2, 1] and out["n_reference_per_item"] == [1, 1, 2, 1]
    assert out["n_hallucinated_per_item"] == [1, 0, 1, 0] and out["n_matched_per_item"] == [1, 1, 0, 0]
    # a finding asserted in the prediction but blank in the reference: denominator only
    assert out["per_finding"]["Support Devices"]["n_generated"] == 1
    assert out["per_finding"]["Support Devices"]["n_hallucinated"] == 0
    assert out["per_finding"]["Pneumonia"]["chair"] == 0.0


def test_reference_uncertain_cells_are_dropped_in_medheval_code(chair):
    # reference "Possible pneumonia." is Pneumonia -1 (and No Finding blank); prediction Pneumonia 1
    kwargs = dict(predictions=["Pneumonia."], references=["Possible pneumonia."])
    code = chair.compute(variant="medheval_code", **kwargs)
    assert code["n_generated"] == 0 and code["chair"] is None and code["recall"] is None
    paper = chair.compute(**kwargs)
    assert paper["chair"] == 1.0 and paper["recall"] is None  # G = {PNA}, S = {}
    assert chair.compute(uncertain_as_positive=True, **kwargs)["chair"] == 0.0  # S = {PNA} now


class FixedLabeler:
    """A stand-in labeler: text -> a fixed 14-value row."""

    name = "fixed"

    def __init__(self, table):
        self.table = table
        self.calls = 0

    def label(self, reports):
        self.calls += 1
        return [self.table[r] for r in reports]


def _row(**values):
    row = [None] * len(CONDITIONS)
    for key, value in values.items():
        row[IDX[key.replace("_", " ")]] = value
    return row


def test_formulas_on_fixed_vectors(chair):
    table = {
        "g1": _row(Cardiomegaly=1, Edema=1, Pneumonia=0),
        "r1": _row(Cardiomegaly=1, Edema=0, Pneumonia=1, Atelectasis=-1),
        "g2": _row(Atelectasis=1, Support_Devices=1, Edema=-1),
        "r2": _row(Atelectasis=-1, Edema=1),
    }
    labeler = FixedLabeler(table)
    paper = chair.compute(predictions=["g1", "g2"], references=["r1", "r2"], labeler=labeler)
    # G1 = {CM, ED}, S1 = {CM, PNA}; G2 = {AT, SD}, S2 = {ED}
    # hallucinated: ED (1), AT + SD (2) -> 3 / 4; matched: CM -> 1 / 3
    assert paper["chair"] == pytest.approx(0.75) and paper["recall"] == pytest.approx(1 / 3)
    assert paper["labeler"] == "fixed"
    assert labeler.calls == 1  # every distinct text labelled once, in one batch
    code = chair.compute(predictions=["g1", "g2"], references=["r1", "r2"], labeler=labeler,
                         variant="medheval_code")
    # r1: CM (1,1) TP; ED (1,0) FP; PNA (0,1) FN; AT dropped (ref -1)          N_gen 3
    # r2: AT dropped (ref -1); ED (-1, 1) missed, not in N_gen; SD (1, blank)   N_gen 1
    # CHAIR = (1 + 1) / 4; Recall = 1 / 3 (CM, PNA, ED); Specificity = 0 / 1; Accuracy = 1 / 3
    assert code["chair"] == pytest.approx(0.5)
    assert code["recall"] == pytest.approx(1 / 3)
    assert code["specificity"] == 0.0
    assert code["accuracy"] == pytest.approx(1 / 3)
    # a subset of findings
    sub = chair.compute(predictions=["g1", "g2"], references=["r1", "r2"], labeler=labeler,
                        findings="Cardiomegaly, edema")
    # G = {CM, ED}, {}; S = {CM}, {ED}: hallucinated ED (1 of 2); recall 1 of 2
    assert sub["chair"] == pytest.approx(0.5) and sub["recall"] == pytest.approx(0.5)
    assert set(sub["per_finding"]) == {"Cardiomegaly", "Edema"}


IDENTICAL = [
    "Mild cardiomegaly. Small bilateral pleural effusions. No pneumothorax.",
    "ET tube terminates 4 cm above the carina. Right lower lobe consolidation concerning for pneumonia.",
    "Possible left basilar atelectasis. The cardiomediastinal silhouette is stable.",
    "No acute cardiopulmonary process.",
    "Moderate pulmonary edema with vascular congestion. Healed left rib fractures.",
]


def _upstream_references(limit=200):
    path = UPSTREAM_MEDHEVAL / "Visual_Misinterpretation_Hallucination" / "open-ended" / "MIMIC-CXR_pairs.json"
    if not path.is_file():
        return []
    return [item["answer"] for item in json.loads(path.read_text())][:limit]


@pytest.mark.parametrize("variant", ["paper", "medheval_code"])
def test_identical_reports_have_no_hallucination_and_full_recall(chair, variant):
    texts = IDENTICAL + _upstream_references()
    out = chair.compute(predictions=texts, references=texts, variant=variant)
    assert out["chair"] == 0.0
    assert out["recall"] == 1.0
    assert out["n_hallucinated"] == 0 and out["n_missed"] == 0
    assert all(not bad for bad in out["hallucinated_findings"])
    if variant == "paper":
        assert out["chair_s"] == 0.0


def test_chexbert_without_path_is_a_clear_error(chair, monkeypatch):
    monkeypatch.delenv("MEDHEVAL_CHEXBERT_PATH", raising=False)
    with pytest.raises(ValueError) as info:
        chair.compute(predictions=["No effusion."], references=["No effusion."], labeler="chexbert")
    message = str(info.value)
    assert "chexbert_path=" in message
    assert "--metric-option chair.chexbert_path=" in message
    assert "github.com/stanfordmlgroup/CheXbert" in message


def test_bad_arguments(chair):
    with pytest.raises(ValueError, match="variant"):
        chair.compute(predictions=["a"], references=["b"], variant="nope")
    with pytest.raises(ValueError, match="labeler"):
        chair.compute(predictions=["a"], references=["b"], labeler="nope")
    with pytest.raises(ValueError, match="unknown finding"):
        chair.compute(predictions=["a"], references=["b"], findings=["Lung Cancer"])
    with pytest.raises(ValueError, match="uncertain_as_positive"):
        chair.compute(predictions=["a"], references=["b"], variant="medheval_code", uncertain_as_positive=True)


def test_rule_labeler_is_created_once_per_instance(chair):
    chair.compute(predictions=["No effusion."], references=["Small effusion."])
    first = chair._labelers[("rule",)]
    chair.compute(predictions=["No effusion."], references=["Small effusion."], variant="medheval_code")
    assert chair._labelers[("rule",)] is first


def test_empty_input(chair):
    out = chair.compute(predictions=[], references=[])
    assert out["n"] == 0 and out["chair"] is None and out["recall"] is None
    assert out["hallucinated_findings"] == []


def test_runner_passes_options_and_moves_per_item_lists(chair):
    from medheval.run.protocol import metric_kwargs

    kwargs = metric_kwargs(chair, [{"id": "a"}], {"variant": "medheval_code", "labeler": "rule"})
    assert kwargs == {"variant": "medheval_code", "labeler": "rule"}
    out = chair.compute(predictions=PREDICTIONS, references=REFERENCES, **kwargs)
    per_item = [k for k, v in out.items() if isinstance(v, list) and len(v) == len(PREDICTIONS)]
    assert sorted(per_item) == ["hallucinated_findings", "missed_findings", "n_generated_per_item",
                                "n_hallucinated_per_item", "n_matched_per_item", "n_reference_per_item",
                                "report_chair"]
    json.dumps(out)  # results.json-ready


def test_card_example(chair):
    out = chair.compute(predictions=["Mild cardiomegaly. Small left pleural effusion.", "No acute process."],
                        references=["Mild cardiomegaly. No pleural effusion.", "No acute process."])
    # G = {CM, EFF}, {NF}; S = {CM}, {NF}: 1 of 3 asserted findings unsupported, both reference findings found
    assert (round(out["chair"], 4), out["recall"], out["hallucinated_findings"]) == \
        (0.3333, 1.0, [["Pleural Effusion"], []])


def test_a_bad_variant_names_the_option():
    import evaluate

    from conftest import REPO

    chair = evaluate.load(str(REPO / "metrics" / "chair"))
    with pytest.raises(ValueError, match=r"chair.variant='papers': expected one of .*--metric-option chair.variant="):
        chair.compute(predictions=["No effusion."], references=["No effusion."], variant="papers", labeler="rule")


# ------------------------------------------------------------------ MedHEval's prediction cleaning (run_chair.py)
# Three of the fixture's report items (medheval.families.medheval.fixtures.REPORT_ITEMS, qids 0, 1, 5), whose
# references the rule labeler reads as {LO 1, PNA 1, EC 0, CM 0, PTX 0, EFF 0}, {AT 1, EFF 1, CM 0}, {LL 1, EFF 0}.
CLEANED_PREDICTIONS = [
    "Mild cardiomegaly. No pneumonia.",  # CM 1, PNA 0; unchanged by the strip
    "Effusion.",  # EFF 1; 9 characters: "No report generated." (NF 1) once cleaned
    "A 2 cm lung nodule. No pleural effusion",  # LL 1, EFF 0; cleaned " 2 cm lung nodule. No pleural effusio": LL 1
]
# (variant, upstream_compat) -> (CHAIR, Recall), by hand from the labels above:
#   medheval_code, cleaned: N_gen 2 + 1 + 1, FP CM + FN PNA = 2 -> 2/4; TP LL of ref positives 2 + 2 + 1 -> 1/5
#   medheval_code, as given: N_gen 2 + 1 + 2, FP CM + FN PNA -> 2/5; TP EFF, LL -> 2/5
#   paper, cleaned: G {CM}, {NF}, {LL}; G - S = CM, NF -> 2/3; G & S = LL -> 1/5
#   paper, as given: G {CM}, {EFF}, {LL}; G - S = CM -> 1/3; G & S = EFF, LL -> 2/5
CLEANED_EXPECTED = {("medheval_code", True): (2 / 4, 1 / 5), ("medheval_code", False): (2 / 5, 2 / 5),
                    ("paper", True): (2 / 3, 1 / 5), ("paper", False): (1 / 3, 2 / 5)}


def _fixture_references(qids):
    from medheval.families.medheval.fixtures import REPORT_ITEMS

    text = {item[0]: item[2] for item in REPORT_ITEMS}
    return [text[qid] for qid in qids]


@pytest.mark.parametrize("variant, upstream_compat", sorted(CLEANED_EXPECTED))
def test_upstream_compat_labels_predictions_as_the_report_csv_holds_them(chair, variant, upstream_compat):
    references = _fixture_references([0, 1, 5])
    out = chair.compute(predictions=CLEANED_PREDICTIONS, references=references, variant=variant,
                        upstream_compat=upstream_compat)
    assert (out["chair"], out["recall"]) == pytest.approx(CLEANED_EXPECTED[(variant, upstream_compat)])
    assert out["upstream_compat"] is upstream_compat and out["variant"] == variant


RUN_CHAIR = UPSTREAM_MEDHEVAL.parent / "medheval-code" / "code" / "evaluation" / "report_eval" / "run_chair.py"


def _released_csv_loop():
    """The released run_chair.py's loop that writes the prediction CSV (``for data in pred_data: …``), taken out
    of its ``__main__`` block with ``ast`` and compiled as released; run on texts, it returns the CSV's reports."""
    import ast

    tree = ast.parse(RUN_CHAIR.read_text())
    loop = next(node for node in ast.walk(tree) if isinstance(node, ast.For) and isinstance(node.iter, ast.Name)
                and node.iter.id == "pred_data")
    code = compile(ast.Module([loop], type_ignores=[]), str(RUN_CHAIR), "exec")
    constants = [node.value for node in ast.walk(loop)
                 if isinstance(node, ast.Constant) and isinstance(node.value, str)]

    def run(texts):
        rows = []
        writer = type("Writer", (), {"writerow": staticmethod(rows.append)})
        exec(code, {"pred_data": [{"question_id": str(i), "text": t} for i, t in enumerate(texts)], "writer": writer})
        return [row["report"] for row in rows]

    return run, constants


@pytest.mark.skipif(not RUN_CHAIR.is_file(), reason="../shared/data/upstream/medheval-code is absent")
def test_cleaning_matches_the_released_run_chair_loop(chair):
    """Our cleaning (chair upstream_compat, and clean_generated_text's report CSV mode that CheXbert, RadGraph and
    text_generation's reports share) against the released loop run on the same texts: the character-set strip,
    the raw text where it leaves nothing, the placeholder under 10 characters (its sentence read from the file)."""
    import random

    from medheval.scoring.parsing import UPSTREAM_SHORT_REPORT, clean_generated_text

    released, constants = _released_csv_loop()
    assert UPSTREAM_SHORT_REPORT in constants
    module = __import__(type(chair).__module__, fromlist=["clean_prediction"])
    rng = random.Random(0)
    texts = ["Assistant: Small left pleural effusion", "Assistant:", "Assistants:", "Assistant", "", "Effusion.",
             "Effusions.", "sAssistantEffusion.", "  no  ", "Normal chest\n", *CLEANED_PREDICTIONS,
             *("".join(rng.choice("Asitan: Ex.\n") for _ in range(rng.randrange(0, 16))) for _ in range(400))]
    expected = released(texts)
    assert [module.clean_prediction(text) for text in texts] == expected
    assert [clean_generated_text(text, upstream_compat=True, report_csv=True) for text in texts] == expected
    # labelled as the released loop writes them
    references = _fixture_references([0, 1, 5])
    ours = chair.compute(predictions=CLEANED_PREDICTIONS, references=references, variant="medheval_code",
                         upstream_compat=True)
    theirs = chair.compute(predictions=released(CLEANED_PREDICTIONS), references=references, variant="medheval_code")
    assert (ours["chair"], ours["recall"]) == (theirs["chair"], theirs["recall"])
