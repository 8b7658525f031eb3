"""Hand-labelled sentences and short reports for the CheXpert-14 rule labeler.

Every case lists the non-blank conditions; all others must be blank (None). The texts are
written for this test (not taken from any dataset)."""

from __future__ import annotations

import random

import pytest

from medheval.labelers import CONDITIONS
from medheval.labelers.chexpert_rules import RuleLabeler, as_dict, label_report, split_sentences

ECM, CM, LO, LL, ED = "Enlarged Cardiomediastinum", "Cardiomegaly", "Lung Opacity", "Lung Lesion", "Edema"
CO, PNA, AT, PTX, EFF = "Consolidation", "Pneumonia", "Atelectasis", "Pneumothorax", "Pleural Effusion"
PO, FX, SD, NF = "Pleural Other", "Fracture", "Support Devices", "No Finding"

CASES: list[tuple[str, dict]] = [
    # --- normal reports / No Finding -----------------------------------------------------
    ("Heart size normal and lungs are clear. No edema or pneumonia. No effusion",
     {CM: 0, ED: 0, PNA: 0, EFF: 0, NF: 1}),
    ("No acute cardiopulmonary process.", {NF: 1}),
    ("The lungs are clear. The cardiomediastinal silhouette is unremarkable.", {ECM: 0, NF: 1}),
    ("The heart is normal in size. The mediastinum is unremarkable.", {ECM: 0, CM: 0, NF: 1}),
    ("Heart size, mediastinal contours, and hila are normal.", {ECM: 0, CM: 0, NF: 1}),
    ("Cardiac silhouette within normal limits. No focal airspace consolidation.", {CM: 0, CO: 0, NF: 1}),
    ("Normal heart size. Clear lungs without pleural effusion or pneumothorax.", {CM: 0, PTX: 0, EFF: 0, NF: 1}),
    ("The heart size is at the upper limits of normal.", {CM: 0, NF: 1}),
    ("Top-normal heart size without vascular congestion.", {CM: 0, ED: 0, NF: 1}),
    ("No pneumothorax.", {PTX: 0, NF: 1}),
    # --- simple positives ----------------------------------------------------------------
    ("Mild cardiomegaly.", {CM: 1}),
    ("The heart is enlarged.", {CM: 1}),
    ("There is moderate enlargement of the cardiac silhouette.", {CM: 1}),
    ("Heart size is mildly increased.", {CM: 1}),
    ("The superior mediastinum is widened.", {ECM: 1}),
    ("Small right pleural effusion.", {EFF: 1}),
    ("Layering pleural fluid on the left.", {EFF: 1}),
    ("Large left pneumothorax with mediastinal shift.", {PTX: 1}),
    ("Small apical PTX.", {PTX: 1}),
    ("Right lower lobe consolidation.", {CO: 1}),
    ("Patchy airspace disease in the left base.", {LO: 1}),
    ("Bibasilar opacities.", {LO: 1}),
    ("Hazy opacification of the right hemithorax.", {LO: 1}),
    ("Diffuse interstitial markings are increased.", {LO: 1}),
    ("A 2 cm nodule in the right upper lobe.", {LL: 1}),
    ("Spiculated mass in the left apex.", {LL: 1}),
    ("Nodular opacity in the right mid lung.", {LL: 1, LO: 1}),
    ("Moderate pulmonary edema.", {ED: 1}),
    ("Subsegmental atelectasis at the left base.", {AT: 1}),
    ("Right middle lobe pneumonia.", {PNA: 1}),
    ("Right pleural thickening.", {PO: 1}),
    ("Healed left rib fractures.", {FX: 1}),
    ("Acute fracture of the right clavicle.", {FX: 1}),
    # --- devices ---------------------------------------------------------------------------
    ("ET tube terminates 4 cm above the carina.", {SD: 1, NF: 1}),
    ("The ETT is in standard position. NG tube tip in the stomach.", {SD: 1, NF: 1}),
    ("Right PICC line terminates in the SVC.", {SD: 1, NF: 1}),
    ("Left-sided dual-chamber pacemaker with leads in the right atrium and ventricle.", {SD: 1, NF: 1}),
    ("Right internal jugular central venous catheter tip in the mid SVC.", {SD: 1, NF: 1}),
    ("Lines and tubes are unchanged.", {SD: 1, NF: 1}),
    ("Dual-lead pacemaker/ICD in place.", {SD: 1, NF: 1}),  # "X or Y" of one finding is no hedge
    ("The endotracheal tube has been removed.", {SD: 0, NF: 1}),
    ("Pacer leads over the heart.", {SD: 1, NF: 1}),  # a bare "heart" is not a cardiomegaly mention
    ("Left chest tube in place with a tiny residual pneumothorax.", {SD: 1, PTX: 1}),
    ("Platelike atelectasis at the right base.", {AT: 1}),  # "plate" here is no device
    # --- negation --------------------------------------------------------------------------
    ("There is no evidence of pneumothorax or pleural effusion.", {PTX: 0, EFF: 0, NF: 1}),
    ("No focal consolidation, pleural effusion, or pneumothorax.", {CO: 0, EFF: 0, PTX: 0, NF: 1}),
    ("Lungs are clear without consolidation or edema.", {CO: 0, ED: 0, NF: 1}),
    ("The lungs are free of focal airspace disease.", {LO: 0, NF: 1}),
    ("Pneumothorax is not seen.", {PTX: 0, NF: 1}),
    ("The previously seen right pneumothorax has resolved.", {PTX: 0, NF: 1}),
    ("Interval resolution of the left lower lobe pneumonia.", {PNA: 0, NF: 1}),
    ("The heart is not enlarged.", {CM: 0, NF: 1}),
    ("Negative for acute fracture.", {FX: 0, NF: 1}),
    ("Pleural effusions are absent.", {EFF: 0, NF: 1}),
    ("No findings to suggest pneumonia.", {PNA: 0, NF: 1}),
    ("Pneumothorax is no longer visible.", {PTX: 0, NF: 1}),
    ("Atelectasis rather than pneumonia.", {AT: 1, PNA: 0}),
    ("No suspicious pulmonary nodules.", {LL: 0, NF: 1}),  # a hedge inside the negated phrase
    ("The heart is of normal size and the mediastinum is normal.", {CM: 0, ECM: 0, NF: 1}),
    # --- uncertainty -----------------------------------------------------------------------
    ("Possible small left pleural effusion.", {EFF: -1}),
    ("Pleural effusion cannot be excluded.", {EFF: -1}),
    ("Cannot exclude early pneumonia.", {PNA: -1}),
    ("A small pneumothorax is not excluded.", {PTX: -1}),
    ("Cannot rule out a small right apical pneumothorax.", {PTX: -1}),
    ("Left basilar opacity likely represents atelectasis.", {LO: 1, AT: -1}),
    ("Findings are suggestive of pulmonary edema.", {ED: -1}),
    ("Right lower lobe opacity concerning for pneumonia.", {LO: 1, PNA: -1}),
    ("The opacity may represent aspiration or pneumonia.", {LO: 1, PNA: -1}),
    ("Questionable tiny nodule in the left apex.", {LL: -1}),
    ("Suspected left lower lobe collapse.", {AT: -1}),
    ("Atelectasis is likely.", {AT: -1}),
    ("Borderline heart size.", {CM: -1}),
    ("The heart size is borderline enlarged.", {CM: -1}),
    ("Minimal, if any, pleural effusion.", {EFF: -1}),
    ("Retrocardiac opacity, atelectasis versus pneumonia.", {LO: 1, AT: -1, PNA: -1}),
    ("Bibasilar atelectasis or consolidation.", {AT: -1, CO: -1}),
    ("Left lower lobe collapse and/or consolidation.", {AT: -1, CO: -1}),
    ("Minimal patchy airspace disease within the lingula, may reflect atelectasis or consolidation.",
     {LO: 1, AT: -1, CO: -1}),
    ("Mild pulmonary vascular congestion.", {ED: -1}),  # congestion terms are always uncertain
    ("No pulmonary vascular congestion.", {ED: 0, NF: 1}),  # ... unless negated
    ("Possible left effusion, no pneumothorax.", {EFF: -1, PTX: 0}),
    ("No evidence of pneumonia, possible atelectasis.", {PNA: 0, AT: -1}),
    # --- "no new" (CheXpert: uncertain) ----------------------------------------------------
    ("No new consolidation.", {CO: -1}),
    ("No new focal opacity to suggest pneumonia.", {LO: -1, PNA: 0}),
    ("No new areas of consolidation or effusion.", {CO: -1, EFF: -1}),
    ("No new fractures are identified.", {FX: -1}),
    # --- stable / unchanged descriptors (CheXpert: uncertain) -------------------------------
    ("The cardiomediastinal silhouette is stable.", {ECM: -1}),
    ("Stable appearance of the cardiac silhouette.", {CM: -1}),
    ("The heart size and mediastinum appear unchanged.", {CM: -1, ECM: -1}),
    ("Unchanged mild cardiomegaly.", {CM: 1}),  # an explicit finding stays positive
    ("The heart is mildly enlarged but stable.", {CM: 1}),  # (CheXpert: -1) enlargement beats "stable"
    ("Heart size is normal and unchanged.", {CM: 0, NF: 1}),
    ("No significant change in the left pleural effusion.", {EFF: 1}),  # "no change" is no negation
    # --- CHF → Cardiomegaly uncertain --------------------------------------------------------
    ("Mild CHF.", {ED: 1, CM: -1}),
    ("Findings consistent with congestive heart failure.", {ED: 1, CM: -1}),
    ("Possible heart failure.", {ED: -1, CM: -1}),
    ("No evidence of CHF.", {ED: 0, NF: 1}),
    ("Mild congestive heart failure with cardiomegaly.", {ED: 1, CM: 1}),  # positive beats uncertain
    # --- scope / several findings ---------------------------------------------------------------
    ("No pneumothorax, mild cardiomegaly.", {PTX: 0, CM: 1}),
    ("There is no evidence of pneumothorax and the heart size is enlarged.", {PTX: 0, CM: 1}),
    ("Mild edema, heart size is normal.", {ED: 1, CM: 0}),
    ("No pleural effusion but there is a small pneumothorax.", {EFF: 0, PTX: 1}),
    ("Pleural effusion is small and the pneumothorax has resolved.", {EFF: 1, PTX: 0}),
    ("Moderate cardiomegaly with small bilateral effusions and bibasilar atelectasis.", {CM: 1, EFF: 1, AT: 1}),
    ("The heart size is normal, but the superior mediastinum is widened.", {CM: 0, ECM: 1}),
    ("Moderate pulmonary edema, and the mediastinal contours are unremarkable.", {ED: 1, ECM: 0}),
    ("Small left effusion, right pneumothorax has resolved.", {EFF: 1, PTX: 0}),
    ("Left effusion has decreased. Right effusion has resolved.", {EFF: 1}),  # positive beats negative
    ("No new effusion. Small stable left effusion.", {EFF: 1}),  # positive beats uncertain
    ("Possible pneumonia. No pneumonia on the right.", {PNA: -1}),  # uncertain beats negative
    ("Findings: No acute process, mild atelectasis.", {AT: 0, NF: 1}),  # CheXpert's "findings: no" rule
    ("1. Small left effusion. 2. Mild cardiomegaly.", {EFF: 1, CM: 1}),
    # --- exclusions ("unmentions") and other abnormalities -------------------------------------
    ("Small pericardial effusion.", {}),  # not a pleural effusion; blocks No Finding
    ("Calcified granuloma in the left upper lobe.", {}),  # not a lung lesion; blocks No Finding
    ("Low lung volumes.", {NF: 1}),  # not an opacity
    ("Pleural effusion without pleural thickening.", {EFF: 1, PO: 0}),  # "pleural effusion" is no Pleural Other
    ("Hyperinflated lungs consistent with emphysema.", {}),
    ("No emphysema.", {NF: 1}),
    ("Compression deformity of a thoracic vertebral body.", {}),
    ("Fractured sternotomy wire.", {NF: 1}),  # a broken wire is no bone fracture
    ("Hiatal hernia. ET tube in place.", {SD: 1}),
    ("", {}),  # an empty report is all blank
]


def _vector(expected: dict) -> list:
    unknown = set(expected) - set(CONDITIONS)
    assert not unknown, unknown
    return [expected.get(name) for name in CONDITIONS]


@pytest.mark.parametrize("text,expected", CASES, ids=[f"{i:03d}" for i in range(len(CASES))])
def test_hand_labelled(text, expected):
    got = label_report(text)
    assert {k: v for k, v in as_dict(got).items() if v is not None} == expected, text
    assert got == _vector(expected)


def test_enough_cases():
    assert len(CASES) >= 80


def test_batch_api_matches_single():
    labeler = RuleLabeler()
    assert labeler.name == "chexpert_rules"
    texts = [text for text, _ in CASES]
    assert labeler.label(texts) == [label_report(t) for t in texts]
    assert all(len(row) == len(CONDITIONS) for row in labeler.label(texts))
    with pytest.raises(TypeError):
        labeler.label("one string")


def test_values_and_no_finding_domain():
    for row in RuleLabeler().label([t for t, _ in CASES]):
        assert all(v in (1, 0, -1, None) for v in row)
        assert row[CONDITIONS.index("No Finding")] in (1, None)  # never 0 or -1


def test_as_dict_checks_length():
    assert list(as_dict([None] * 14)) == list(CONDITIONS)
    with pytest.raises(ValueError):
        as_dict([1, 0])


def test_case_and_whitespace_insensitive():
    a = label_report("Small LEFT Pleural Effusion.\n\nNo  pneumothorax.")
    b = label_report("small left pleural effusion. no pneumothorax.")
    assert a == b


REPORTS = [
    "The heart is mildly enlarged. There is a small left pleural effusion. No pneumothorax. "
    "The ET tube terminates 5 cm above the carina. Possible left lower lobe pneumonia.",
    "No acute cardiopulmonary process. The cardiomediastinal silhouette is stable. "
    "Cannot exclude a small right effusion. Old healed rib fracture.",
    "Mild pulmonary edema. No focal consolidation. Left PICC line in the SVC. "
    "Bibasilar atelectasis. No new pneumothorax. Heart size is normal.",
    "Hyperinflated lungs. Calcified granuloma at the right apex. No effusion. "
    "Right middle lobe opacity concerning for pneumonia. Mild CHF.",
]


@pytest.mark.parametrize("report", REPORTS)
def test_sentence_order_does_not_matter(report):
    sentences = [s for s in report.split(". ") if s]
    expected = label_report(report)
    rng = random.Random(0)
    for _ in range(10):
        rng.shuffle(sentences)
        shuffled = ". ".join(s.rstrip(".") for s in sentences) + "."
        assert label_report(shuffled) == expected, shuffled


def test_split_sentences():
    assert split_sentences("No effusion. Mild cardiomegaly vs. edema! 3.5 cm nodule?") == [
        "no effusion.", "mild cardiomegaly vs edema!", "3.5 cm nodule?"]
    assert split_sentences("") == []
