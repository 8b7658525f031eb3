"""The offline ``rule`` classifier of MediHall levels (no model, no network).

* VQA (:func:`classify_vqa_rule`): correct when the answer agrees with the reference
  (:func:`answer_correct`), otherwise a level from the aspect the question probes
  (:func:`question_aspect`), with answer-side overrides for Med-HallMark's catastrophic cases.
* IRG (:func:`classify_irg_rule`): findings of a small chest X-ray vocabulary, their polarity
  and attributes, sentence by sentence against the reference report.

The rules were written from Med-HallMark's level definitions and tuned by hand on the 364 records
of ``Conventional..json`` that carry a ground truth. Their agreement with the human levels (per
split, overall, cross-validated) is measured by ``benchmarks/bench_medihall_agreement.py`` and
reported in ``metrics/medihall_score/README.md``. A reference given as the answer is always
``correct`` (VQA and IRG): Med-HallMark scores an answer that matches the facts 1.0 (Sec. 6.2).
"""

from __future__ import annotations

import re
from bisect import bisect_left
from dataclasses import dataclass
from typing import Sequence

from medheval.scoring import parsing
from medheval.scoring import text_cues
from medheval.families.med_hallmark.levels import Classified, split_sentences

__all__ = [
    "ASPECT_LEVEL", "QUESTION_TYPE_ASPECT", "FINDINGS", "strip_confidence_prefix", "question_aspect", "answer_correct",
    "classify_vqa_rule", "classify_vqa_aspect", "classify_irg_rule", "unreadable_vqa_answer",
]


# ---------------------------------------------------------------------------
# The offline ``rule`` classifier, VQA
# ---------------------------------------------------------------------------
#
# level = correct                      when the answer agrees with the reference, else by the
#                                      question's *aspect*:
#   premise    (a counterfactual question's false premise)             -> prompt_induced
#   technique  (modality, plane, sequence, how the image was taken)    -> minor
#   attribute  (size, shape, location, side, number)                   -> attribute
#   cause      (pathology category, diagnosis, cause, organ function)  -> critical
#   presence   (is a finding / organ present or normal, which organ)   -> catastrophic
# with two answer-side overrides (Med-HallMark's catastrophic definition): an answer that calls
# the image normal when the reference names a finding, or that describes (locates, sizes) a
# structure the reference says is absent, is catastrophic whatever the question's aspect.

ASPECT_LEVEL: dict[str, str] = {
    "premise": "prompt_induced", "technique": "minor", "attribute": "attribute",
    "cause": "critical", "presence": "catastrophic",
}

# Question-type labels of the usual sources -> aspect (keys lower case). Hallucination-level
# labels are deliberately *not* accepted: they are what the classifier is asked to predict.
QUESTION_TYPE_ASPECT: dict[str, str | None] = {
    # Med-HallMark splits
    # (confidence-weakening questions are conventional ones behind a prefix: decided by the text)
    "counterfactual": "premise", "confidence_weakening": None, "confidence-weakening": None,
    "conventional": None,
    # MedHEval visual categories (medheval.data.schema) and their upstream codes
    "radiology": "technique", "type_4": "technique", "technique": "technique",
    "measurement": "attribute", "type_2": "attribute",
    "anatomy": "presence", "type_1": "presence",
    "symptom": None, "type_3": None,  # yes/no presence or an open "which disease": decided by the text
    # VQA-RAD answer types
    "modality": "technique", "plane": "technique", "organ": "presence", "abn": "presence", "pres": "presence",
    "pos": "attribute", "size": "attribute", "count": "attribute", "attrib": "attribute", "color": "attribute",
    "other": None,
    # SLAKE content types
    "position": "attribute", "quantity": "attribute", "shape": "attribute", "abnormality": None, "kg": "cause",
}

# A confidence-weakening prefix (Med-HallMark's Q_Inconfi, Sec. 3.4): a clause addressed to the model
# that doubts its skill, ended by a colon (or by a comma before the question). It is no premise:
# the question behind it is scored by its own aspect (the paper's Table 2 reports MediHall Scores
# of 0.35 on these questions, below the 0.6 of a prompt-induced floor).
_ADDRESSED = re.compile(r"\b(?:you|your|ai)\b")
_DOUBT = re.compile(
    r"\b(?:limited|developing|evolving|ongoing|incomplete|insufficient|lacking|inexperienced|beginner|novice"
    r"|still\s+learning|not\s+(?:yet|fully|comprehensive|an?\s+expert|a\s+doctor|a\s+specialist))\b"
)
_PREFIX_COMMA = re.compile(
    r"^([^,:?]*),\s*(?=(?:is|are|was|were|does|do|did|has|have|can|could|what|which|where|how|why|who|when"
    r"|please|name|identify|describe)\b)"
)
_PREMISE_REF = re.compile(
    r"\bpremise\b|\b(?:not|rather\s+than|instead\s+of)\s+(?:an?\s+)?"
    r"(?:mri|ct|x-?ray|ultrasound|radiograph|pet|computed\s+tomography|magnetic\s+resonance)\b"
    r"|\b(?:assumption|assertion|statement|interpretation|question)\b[^.;]{0,160}?\b(?:incorrect|wrong|false|mistaken"
    r"|misleading|inaccurate|baseless|unfounded|misinterpret\w*)\b|\b(?:false|misleading|incorrect)\s+(?:assumption|premise)\b"
)
_TECHNIQUE_WORDS = (
    r"modalit\w*|planes?|sequences?|weighted|weighting|t1|t2|flair|dwi|diffusion|contrast[\s-]enhanced"
    r"|axial|coronal|sagittal|transverse|cross[\s-]sections?|projections?|pa|ap|posteroanterior|anteroposterior"
    r"|ct|cts|mri|x-?rays?|radiographs?|ultrasound|ultrasonography|computed\s+tomography|magnetic\s+resonance"
)
_TECHNIQUE_Q = re.compile(
    r"\b(?:modalit\w*|plane|planes|sequence|weighted|weighting|t1|t2|flair|dwi|imaging\s+(?:method|technique|type)"
    r"|(?:type|kind)\s+of\s+(?:image|imaging|scan|mri|ct|radiograph|x-?ray|study)"
    r"|(?:ct|mri|x-?ray|ultrasound)\s+(?:scan\s+)?or\s+(?:an?\s+)?(?:ct|mri|x-?ray|ultrasound)"
    r"|taken|acquired|captured|obtained\s+(?:through|by|with|using)|projection|cross[\s-]section|axial|coronal|sagittal"
    r"|transverse|pa\s+or\s+ap|ap\s+or\s+pa|window(?:ing)?\s+(?:setting|level))\b"
)
# The reference alone can name the aspect: "Axial", "MRI", "T2 weighted MRI".
_TECHNIQUE_REF = re.compile(rf"^(?:(?:{_TECHNIQUE_WORDS})\b[\s,/-]*)+(?:scan|image|imaging|plane|view|film)?\W*$")
_WHERE = re.compile(
    r"\b(?:where|locat\w+|location|situated|site|position(?:ed)?|left\s+or\s+right|lateralit\w*"
    r"|(?:which|what)\s+(?:\w+\s+){0,2}(?:side|lobe|area|region|part|quadrant|ventricle|lung|hemisphere|segment))\b"
)
_MEASURE = re.compile(
    r"\b(?:size|sized|how\s+(?:large|big|small|long|wide)|enlarg\w*|width|wide|wider|diameter|dimensions?|measur\w*"
    r"|shape|contour|border\w*|margin\w*|outlines?|edges?|circumscribed|well[\s-]defined|ill[\s-]defined|demarcat\w*"
    r"|homogen\w*|heterogen\w*|uniform\w*|consisten\w*|flat|flattened|deviat\w*|shift\w*|midline"
    r"|how\s+many|number\s+of|count|quantit\w*|more\s+than\s+(?:one|\d+)|>\s*\d+|multiple|several|colou?r)\b"
)
_CAUSE = re.compile(
    r"\b(?:cause[sd]?|causing|why|due\s+to|etiolog\w*|aetiolog\w*|mechanism|function\w*|role"
    r"|(?:type|kind|category|class|classification)\s+of|diagnos\w*|disease|illness|condition|patholog\w*"
    r"|abnormalit\w*|anomal\w*|atypical\w*|deviation|term|sign|findings?|incidental\w*|discovery"
    r"|artery|arteries|vessels?|tributar\w*|isointense|similar\s+(?:intensity|density)|same\s+intensity|tissue)\b"
)
_IDENTITY = re.compile(
    r"\b(?:(?:what|which|identify|name|point\s+out)\s+(?:\w+\s+){0,3}(?:structures?|organs?|anatom\w*|joints?|bones?"
    r"|objects?|features?)|what\s+(?:is|are)\s+(?:the|these|this)|what\s+does\s+.+\s+represent)\b"
)
_YES_NO_Q = re.compile(
    r"^\W*(?:is|are|was|were|does|do|did|has|have|had|can|could|will|would|should|may|might|evidence\s+of)\b"
)
_REQUEST_Q = re.compile(
    r"^\W*(?:can|could|would|will)\s+(?:you|we)\s+(?:please\s+)?(?:\w+\s+)?(?:identify|pinpoint|specify|determine|describe"
    r"|provide|tell|name|point|locate|outline|explain|give|estimate|list|elaborate|articulate|evaluate|assess|interpret"
    r"|characteri[sz]e|classify|clarify|indicate|detail|discuss|comment)\b"
)
_NORMAL_CLAIM = re.compile(
    r"\b(?:(?:appears?|looks?|is|are|be)\s+(?:to\s+be\s+)?(?:completely\s+|entirely\s+)?normal|normal\s+(?:image|study|scan"
    r"|appearance|findings?|chest|brain|abdomen)|no\s+(?:visible\s+|obvious\s+|significant\s+|apparent\s+)?"
    r"(?:abnormalit\w*|patholog\w*|lesions?|signs?\s+of\s+disease|issues?)|without\s+any\s+(?:abnormalit\w*|lesions?)"
    r"|not\s+showing\s+any\s+(?:\w+\s+){0,2}abnormalit\w*|unremarkable)\b"
)
_ABSENT_REF = re.compile(r"^(?:none|not\s+seen(?:\s+here)?|absent|not\s+(?:present|visible|shown)|no(?:thing)?)\W*$")
_YES_NO_REF = re.compile(r"\W*(?:yes|no)\b(?!\s+(?:evidence|sign|abnormal))", re.I)
_LATERAL = re.compile(r"\b(left|right|bilateral|both)\b")
_STOP = frozenset(
    "a an the of in on at to and or with without is are was were be been being this that these those it its there "
    "which what where who image images scan shows show shown seen visible appears appear located location "
    "side area region patient patients from by for as into within than more most very also can may could would "
    "likely possibly some any due".split()
)
_TOKEN = re.compile(r"[a-z0-9]+")
_NUMBER_WORDS = {w: str(i) for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve".split())}
_NUMBER_WORDS.update({"single": "1", "once": "1", "twice": "2", "both": "2", "pair": "2"})


def _tokens(text: str) -> list[str]:
    out = []
    for tok in _TOKEN.findall(text.lower()):
        if tok in _STOP:
            continue
        if len(tok) > 3 and tok.endswith("s") and not tok.endswith("ss"):
            tok = tok[:-1]  # plural -> singular, enough for "ribs"/"rib", "lesions"/"lesion"
        out.append(_NUMBER_WORDS.get(tok, tok))
    return out


def strip_confidence_prefix(question: str) -> str:
    """``question`` without a leading confidence-weakening prefix (Med-HallMark Sec. 3.4, Q_Inconfi):
    the text up to the first colon, or up to a comma before the question word, when it addresses the
    model ("you", "your", "AI") and doubts its skill ("limited", "still developing", "not yet …").
    Anything else comes back unchanged."""
    head, colon, rest = question.partition(":")
    if colon and rest.strip() and _ADDRESSED.search(head.lower()) and _DOUBT.search(head.lower()):
        return rest.strip()
    m = _PREFIX_COMMA.match(question.lower())
    if m and _ADDRESSED.search(m.group(1)) and _DOUBT.search(m.group(1)):
        return question[m.end():].strip()
    return question


def question_aspect(
    question: str | None,
    question_type: str | None = None,
    reference: str | None = None,
    closed: bool | None = None,
) -> str | None:
    """The aspect a question probes (``premise``/``technique``/``attribute``/``cause``/``presence``).

    An explicit ``question_type`` (see :data:`QUESTION_TYPE_ASPECT`) wins; otherwise the question
    text decides by keyword families, after :func:`strip_confidence_prefix` (a doubting prefix is
    not a premise: the question behind it is what the answer gets wrong). A reference that corrects
    a premise ("… was taken using CT, not MRI") marks a counterfactual question, and a reference that
    is a modality or plane ("Axial", "T2 weighted MRI") a technique question. ``closed`` (a yes/no
    question) is read from the reference when there is one ("Yes"/"No"), else from the question's
    form. ``None`` for an open question no rule recognises.
    """
    if question_type:
        key = str(question_type).strip().lower().replace(" ", "_")
        aspect = QUESTION_TYPE_ASPECT.get(key)
        if aspect is not None:
            return aspect
    q = strip_confidence_prefix((question or "").lower().replace("*", "").strip())
    ref = (reference or "").strip().lower()
    if _PREMISE_REF.search(ref):
        return "premise"
    if _TECHNIQUE_Q.search(q) or (ref and _TECHNIQUE_REF.match(ref)):
        return "technique"
    if closed is None:
        closed = bool(_YES_NO_REF.match(ref)) if ref else bool(_YES_NO_Q.match(q) and not _REQUEST_Q.match(q))
    if closed:  # yes/no: is a finding/organ there (or normal), or is one of its attributes as asked?
        return "attribute" if _MEASURE.search(q) else "presence"
    if _WHERE.search(q) and not _IDENTITY.search(q):
        return "attribute"
    if _CAUSE.search(q):
        return "cause"
    if _MEASURE.search(q):
        return "attribute"
    if _IDENTITY.search(q):
        return "presence"
    if _WHERE.search(q):
        return "attribute"
    return None


def _normal_polarity(text: str) -> str | None:
    low = text.lower()
    if _NORMAL_CLAIM.search(low) and not re.search(r"\bnot\s+(?:\w+\s+){0,3}normal\b", low):
        return "normal"
    if re.search(r"\babnormal\b|\bnot\s+(?:\w+\s+){0,3}normal\b|\bnot\s+(?:\w+\s+){0,2}healthy\b|\bunhealthy\b", low):
        return "abnormal"
    if re.search(r"\bnormal\b|\bhealthy\b|\bunremarkable\b", low):
        return "normal"
    return None


def _close_ended_kind(ref: str, answer_type: str | None, choices: Sequence[str] | str | None) -> str | None:
    """``"yes_no"``/``"multiple_choice"`` when the item is close-ended (by type, choices or a yes/no reference)."""
    kind = None
    if answer_type:
        try:
            kind = parsing.canonical_answer_type(answer_type)
        except ValueError:
            kind = None
    if kind is None and choices:
        kind = "multiple_choice"
    if kind is None and _YES_NO_REF.match(ref):
        kind = "yes_no"
    return kind


def unreadable_vqa_answer(
    prediction: str | None,
    reference: str | None,
    answer_type: str | None = None,
    choices: Sequence[str] | str | None = None,
) -> str | None:
    """Why the rules cannot classify ``prediction``, or ``None`` when they can.

    An empty or white-space answer, and a close-ended answer the parser leaves unparsed (a hedge,
    "A or B", another language), state no content to grade: such items are failed, not hallucinations.
    """
    if not (prediction or "").strip():
        return "empty answer: nothing to classify"
    if reference is None or not str(reference).strip():
        return None
    ref = str(reference).strip()
    kind = _close_ended_kind(ref, answer_type, choices)
    if kind is None:
        return None
    score = parsing.score_item(prediction, ref, kind, list(choices) if isinstance(choices, tuple) else choices)
    if score.reference_ok and not score.parsed:
        return f"unparsed {'yes/no' if kind == 'yes_no' else 'multiple-choice'} answer: nothing to classify"
    return None


def answer_correct(
    prediction: str | None,
    reference: str | None,
    answer_type: str | None = None,
    choices: Sequence[str] | str | None = None,
    overlap: float = 1.0,
) -> bool | None:
    """Whether ``prediction`` agrees with ``reference``; ``None`` when there is no usable reference.

    * ``answer_type`` yes/no or multiple choice (or a yes/no reference such as ``"No"``, or
      ``choices`` given): :func:`medheval.scoring.parsing.score_item` (negation-aware yes/no parsing,
      option matching); an unparsed answer is wrong.
    * a ``"normal"``/``"abnormal"`` reference: the answer's normal/abnormal polarity must match.
    * open answers: the reference's content words (stop words dropped, plurals folded) must
      appear in the answer's first *k* sentences, *k* = the reference's sentence count (at least 1),
      — at least the fraction ``overlap`` of them (default all) — and those sentences must not name
      only the opposite side (``"left"`` for a ``"right"`` reference). The reference itself is
      therefore always correct (Med-HallMark Sec. 6.2: an answer that matches the facts scores 1.0).
    """
    if reference is None or not str(reference).strip():
        return None
    prediction = prediction or ""
    ref = str(reference).strip()
    kind = _close_ended_kind(ref, answer_type, choices)
    if kind is not None:
        score = parsing.score_item(prediction, ref, kind, list(choices) if isinstance(choices, tuple) else choices)
        return score.correct if score.reference_ok else None
    polarity = re.sub(r"\W+", "", ref.lower())
    if polarity in ("normal", "abnormal"):
        return _normal_polarity(prediction) == polarity
    ref_tokens = set(_tokens(ref))
    if not ref_tokens:
        return None
    # the answer is as many leading sentences as the reference has (at least one): what follows
    # usually explains it, and a list of guesses there must not make it right
    sentences = split_sentences(prediction)
    answer = " ".join(sentences[:max(1, len(split_sentences(ref)))]) if sentences else prediction
    pred_tokens = set(_tokens(answer))
    if len(ref_tokens & pred_tokens) < overlap * len(ref_tokens):
        return False
    ref_sides = set(_LATERAL.findall(ref.lower()))
    pred_sides = set(_LATERAL.findall(answer.lower()))
    return not (ref_sides and pred_sides and not ref_sides & pred_sides)


def classify_vqa_rule(
    prediction: str | None,
    reference: str | None,
    question: str | None = None,
    question_type: str | None = None,
    answer_type: str | None = None,
    choices: Sequence[str] | str | None = None,
    overlap: float = 1.0,
    default_aspect: str = "presence",
) -> Classified | None:
    """Level of one VQA answer by the offline rules (module comment above); ``None`` without a reference
    or for an answer :func:`unreadable_vqa_answer` rejects (empty, or an unparsed close-ended answer).

    ``default_aspect`` is used for an open question that no keyword family recognises.
    """
    if unreadable_vqa_answer(prediction, reference, answer_type, choices) is not None:
        return None
    correct = answer_correct(prediction, reference, answer_type, choices, overlap)
    if correct is None:
        return None
    if correct:
        return Classified("correct", "agrees with the reference")
    aspect = question_aspect(question, question_type, reference)
    pred = (prediction or "").lower()
    ref = str(reference).strip().lower()
    open_question = not _YES_NO_REF.match(ref)
    if open_question and aspect in ("attribute", "cause", None) and _ABSENT_REF.match(ref) and pred.strip():
        return Classified("catastrophic", "describes a structure or finding the reference says is absent")
    if open_question and aspect in ("cause", None) and _NORMAL_CLAIM.search(pred) and _normal_polarity(ref) != "normal":
        return Classified("catastrophic", "calls the image normal where the reference names a finding")
    aspect = aspect or default_aspect
    return Classified(ASPECT_LEVEL[aspect], f"wrong answer to a {aspect} question")



def classify_vqa_aspect(question: str | None, question_type: str | None = None,
                        default_aspect: str = "presence") -> Classified:
    """Level of an answer *assumed wrong*, from the question's aspect alone (no reference to compare with).

    For answers without a ground truth (Med-HallMark's no-ground-truth prompt variant) the rules cannot
    tell right from wrong; this gives the level a wrong answer to that question would get. Sensible
    only where nearly every answer is a hallucination (496 of Med-HallMark's 499 conventional ones).
    """
    aspect = question_aspect(question, question_type) or default_aspect
    return Classified(ASPECT_LEVEL[aspect], f"no reference: a wrong answer to a {aspect} question assumed")


# ---------------------------------------------------------------------------
# The offline ``rule`` classifier, IRG (chest X-ray reports)
# ---------------------------------------------------------------------------
#
# Each sentence of the generated report is read for findings from a small chest X-ray
# vocabulary (:data:`FINDINGS`), each with a polarity (present / absent / uncertain) taken from
# negation and hedge cues in its clause; the reference report is read the same way, in the same
# pieces (:func:`_findings`). A reference may both assert and deny one finding ("no new opacity …
# increased opacification"); a mention agrees when the reference holds a mention like it. Per
# finding the sentence mentions (the most severe outcome wins):
#
#   asserts a finding the reference lacks or only denies, reference otherwise normal -> catastrophic
#   asserts a finding the reference lacks or only denies, reference abnormal         -> critical
#     (a support device the reference lacks: critical whatever the reference)
#   denies a finding the reference asserts on that side, unless the reference
#     also denies it (on the same side)                                            -> critical
#   a global "normal / no acute process" claim where the reference has findings
#     and makes no such claim itself                                               -> catastrophic
#   same finding, but a side that is neither one reference mention's nor all of
#     theirs together, or a severity (mild/moderate/severe) the reference lacks     -> attribute
#   otherwise (agreeing findings, or nothing the vocabulary recognises)            -> correct
#
# So the reference scored against itself is correct sentence by sentence (MediHall Score 1.0). A
# sentence outside the vocabulary is scored correct (the rule cannot see what it cannot read), which
# makes the rule lenient on unfamiliar findings; it is not a bound on a judge's score.

FINDINGS: dict[str, re.Pattern] = {name: re.compile(rf"\b(?:{pattern})\b") for name, pattern in {
    "cardiomegaly": r"cardiomegaly|enlarged\s+(?:heart|cardiac\s+silhouette)|(?:heart|cardiac\s+silhouette)"
                    r"(?:\s+size)?\s+(?:is\s+|remains\s+|appears\s+)?(?:\w+\s+)?enlarged",
    "pleural_effusion": r"(?:pleural\s+)?effusions?",
    "pneumothorax": r"pneumothora(?:x|ces)",
    "edema": r"(?:pulmonary\s+|interstitial\s+)?edema|(?:vascular|pulmonary)\s+congestion"
             r"|congestive\s+(?:heart\s+)?failure",
    "consolidation": r"consolidat\w*|airspace\s+(?:disease|opacit\w+)",
    "pneumonia": r"pneumonia|infectious\s+process|infection|aspiration",
    "atelectasis": r"atelecta\w*",
    "opacity": r"opacit(?:y|ies)|opacification|infiltrat\w*|interstitial\s+markings",
    "nodule": r"nodul\w*|mass(?:es)?|granulomas?",
    "fracture": r"fractur\w*|rib\s+deformit\w*",
    "emphysema": r"emphysema|hyperinflat\w*",
    "hernia": r"hernia",
    "device": r"(?:chest|endotracheal|et|feeding|nasogastric|ng|dobh?off|tracheostomy)\s+tubes?|catheters?|pacemakers?"
              r"|aicd|icd|(?:sternotomy\s+)?wires?|(?:surgical\s+)?clips?|picc(?:\s+line)?|central\s+(?:venous\s+)?line"
              r"|port-?a-?cath|stents?|(?:valve\s+)?prosthes[ie]s",
}.items()}
_DEVICE = "device"
# negation / hedge / clause cues of report text: one home (medheval.scoring.text_cues)
_NEGATION = text_cues.REPORT_NEGATION
_POST_NEGATION = text_cues.REPORT_POST_NEGATION
# the same, matched where a finding ends (re's "^" matches at the string's start only, not at a match position)
_POST_NEGATION_AT = re.compile(_POST_NEGATION.pattern.removeprefix("^"))
_BLANK_SEPARATED = re.compile(r"\S+")  # str.split()'s words
_UNCERTAIN = text_cues.REPORT_UNCERTAIN
_CLAUSE_BREAK = text_cues.REPORT_CLAUSE_BREAK
_NORMAL_HEART = re.compile(
    r"\b(?:heart|cardiac)(?:\s+size|\s+silhouette)?\b[^.;]{0,40}\b(?:normal|within\s+normal\s+limits|unremarkable|top\s+normal)\b"
    r"|\bnormal\s+(?:heart|cardiac)\b"
)
_CLEAR_LUNGS = re.compile(r"\b(?:lungs?\s+(?:are\s+|is\s+|appear\s+|remain\s+)?(?:\w+\s+)?clear|clear\s+lungs?)\b")
_LUNG_FINDINGS = ("consolidation", "pneumonia", "opacity", "edema", "atelectasis")
_CHRONIC = re.compile(r"\b(?:chronic\w*|stable|unchanged|old|healed|prior|persist\w*|long-standing|known|again)\b")
_GLOBAL_NORMAL = re.compile(
    r"\b(?:no\s+(?:evidence\s+of\s+)?(acute|active)\s+(?:(?:cardio)?pulmonary\s+|cardiopulmonary\s+|intrathoracic\s+"
    r"|thoracic\s+|chest\s+|cardiothoracic\s+)?(?:process|findings?|abnormalit\w*|disease)"
    r"|(?:study|exam|examination|x-?ray|radiograph|image|impression)\s+(?:is|appears)\s+(?:\w+\s+)?normal"
    r"|normal\s+(?:chest\s+)?(?:x-?ray|radiograph|study|exam))\b"
)
_SIDE = re.compile(r"\b(left|right|bilateral\w*|both|bibasilar|bibasal)\b")
_SEVERITY = {"minimal": 1, "trace": 1, "tiny": 1, "small": 1, "mild": 1, "mildly": 1, "moderate": 2,
             "moderately": 2, "large": 3, "severe": 3, "extensive": 3, "massive": 3}
_SEVERITY_RE = re.compile(r"\b(" + "|".join(_SEVERITY) + r")\b")
_SEVERITY_SCOPE = 3  # severity words within this many words before a finding belong to it


@dataclass
class _Mention:
    state: str  # "present" | "absent" | "uncertain"
    sides: frozenset
    severity: frozenset
    chronic: bool  # "chronic", "stable", "unchanged" … in its clause


def _sides(text: str) -> frozenset:
    out = set()
    for side in _SIDE.findall(text):
        out |= {"left", "right"} if side.startswith(("bilateral", "both", "bib")) else {side}
    return frozenset(out)


def _first_cue_end(pattern: re.Pattern[str], clause: str, starts: list[int]) -> int | None:
    """The first of ``starts`` (sorted finding starts) with ``pattern`` in the clause before it, or ``None``.

    Whether ``pattern`` occurs in ``clause[:start]`` only turns from no to yes as the start grows: a finding
    starts after a non-word character, where no cue can end. So a binary search finds the turn in a few
    searches of the clause, where one search per finding was quadratic in a long clause of findings."""
    low, high = 0, len(starts)
    while low < high:
        middle = (low + high) // 2
        if pattern.search(clause, 0, starts[middle]):
            high = middle
        else:
            low = middle + 1
    return starts[low] if low < len(starts) else None


def _last_words(clause: str, words: list[re.Match[str]], word_starts: list[int], end: int, count: int) -> str:
    """``" ".join(clause[:end].split()[-count:])``, from the clause's words (the last one cut at ``end``)."""
    last = bisect_left(word_starts, end)
    kept = [match.group() for match in words[max(0, last - count):last]]
    if kept and words[last - 1].end() > end:
        kept[-1] = clause[words[last - 1].start():end]
    return " ".join(kept)


def _clause_mentions(clause: str) -> list[tuple[str, _Mention]]:
    """The findings of one clause, in vocabulary order: "absent" with a negation cue before it in the clause
    or a post-negation after it, else "uncertain" with a hedge before it, else "present"; the severity words
    among the three words before it; the clause's sides and whether it says chronic/stable."""
    hits = [(name, m) for name, pattern in FINDINGS.items() for m in pattern.finditer(clause)]
    if not hits:
        return []
    starts = sorted({m.start() for _, m in hits})
    negated_from = _first_cue_end(_NEGATION, clause, starts)
    hedged_from = _first_cue_end(_UNCERTAIN, clause, starts)
    words = list(_BLANK_SEPARATED.finditer(clause))
    word_starts = [word.start() for word in words]
    sides, chronic = _sides(clause), bool(_CHRONIC.search(clause))
    out = []
    for name, m in hits:
        if (negated_from is not None and m.start() >= negated_from) or _POST_NEGATION_AT.match(clause, m.end()):
            state = "absent"
        elif hedged_from is not None and m.start() >= hedged_from:
            state = "uncertain"
        else:
            state = "present"
        near = _last_words(clause, words, word_starts, m.start(), _SEVERITY_SCOPE)
        out.append((name, _Mention(state, sides, frozenset(_SEVERITY[w] for w in _SEVERITY_RE.findall(near)),
                                   chronic)))
    return out


def _mentions(sentence: str) -> tuple[dict[str, list[_Mention]], str | None]:
    """Findings of one sentence with their polarity and attributes (:func:`_clause_mentions`), and its
    normality claim if any: ``"acute"`` ("no acute process"), ``"normal"`` ("normal study") or ``None``."""
    low = sentence.lower()
    found: dict[str, list[_Mention]] = {}
    for clause in _CLAUSE_BREAK.split(low):
        for name, mention in _clause_mentions(clause):
            found.setdefault(name, []).append(mention)
        if _NORMAL_HEART.search(clause) and "cardiomegaly" not in found:
            found["cardiomegaly"] = [_Mention("absent", frozenset(), frozenset(), False)]
        if _CLEAR_LUNGS.search(clause):
            for name in _LUNG_FINDINGS:
                found.setdefault(name, [_Mention("absent", _sides(clause), frozenset(), False)])
    m = _GLOBAL_NORMAL.search(low)
    return found, (None if m is None else "acute" if m.group(1) else "normal")


def _findings(text: str) -> tuple[dict[str, list[_Mention]], str | None]:
    """All findings of ``text`` and its normality claim (``"normal"`` over ``"acute"`` over ``None``,
    see :func:`_mentions`). Reports (reference and
    generated alike) are read in the same pieces: sentences, cut again at ", <Capital>" (MIMIC
    summaries join statements with commas), so that a sentence copied from the reference is read
    exactly as the reference reads it."""
    pieces = [p for s in split_sentences(text) for p in re.split(r",\s+(?=[A-Z])", s)] or [text]
    merged: dict[str, list[_Mention]] = {}
    claims: set[str] = set()
    for piece in pieces:
        found, normal = _mentions(piece)
        claims.add(normal)
        for name, mentions in found.items():
            merged.setdefault(name, []).extend(mentions)
    return merged, "normal" if "normal" in claims else "acute" if "acute" in claims else None


def _sides_agree(mention: _Mention, stated: list[_Mention]) -> bool:
    """The mention's sides match one stated mention's sides, or all of them together (left + right)."""
    sided = [m.sides for m in stated if m.sides]
    return not mention.sides or not sided or mention.sides in sided or mention.sides == frozenset().union(*sided)


_SEVERITY_ORDER = {level: i for i, level in enumerate(("catastrophic", "critical", "attribute", "correct"))}


def _worst(a: Classified, b: Classified) -> Classified:
    return a if _SEVERITY_ORDER[a.level] <= _SEVERITY_ORDER[b.level] else b


def classify_irg_rule(prediction: str | None, reference: str | None) -> list[tuple[str, Classified]] | None:
    """``[(sentence, Classified), …]`` for a generated report; ``None`` without a reference.

    A report without sentences gives ``[]``. See the module comment above for the rules.
    """
    if reference is None or not str(reference).strip():
        return None
    ref, ref_normal_claim = _findings(str(reference))
    ref_state = {name: {m.state for m in ms} for name, ms in ref.items()}
    present = [m for name, ms in ref.items() if name != _DEVICE for m in ms if m.state == "present"]
    ref_abnormal = bool(present)
    ref_acute = any(not m.chronic for m in present)
    out = []
    for sentence in split_sentences(prediction):
        found, normal_claim = _findings(sentence)
        verdict = Classified("correct", "agrees with the reference" if found else "no finding the rules read")
        contradicted = ref_abnormal if normal_claim == "normal" else ref_acute if normal_claim else False
        if contradicted and not ref_normal_claim:
            verdict = _worst(verdict, Classified("catastrophic", "calls the study normal; the reference has findings"))
        for name, mentions in found.items():
            states = ref_state.get(name, set())
            stated = [m for m in ref.get(name, []) if m.state != "absent"]
            for mention in mentions:
                if mention.state == "absent":
                    denied_too = any(m.state == "absent" and m.sides == mention.sides for m in ref.get(name, []))
                    asserted = any(m.state == "present"
                                   and (not m.sides or not mention.sides or m.sides & mention.sides)
                                   for m in stated)
                    if asserted and not denied_too:
                        verdict = _worst(verdict, Classified("critical", f"denies {name}, which the reference reports"))
                    continue
                if not stated:
                    if name == _DEVICE or ref_abnormal:
                        level = "critical"
                    else:
                        level = "catastrophic"
                    verdict = _worst(verdict, Classified(level, f"reports {name}, which the reference "
                                                                + ("denies" if states else "does not mention")))
                    continue
                ref_severity = frozenset().union(*(m.severity for m in stated))
                if not _sides_agree(mention, stated):
                    verdict = _worst(verdict, Classified("attribute", f"{name}: side differs from the reference"))
                elif mention.severity and ref_severity and not mention.severity & ref_severity:
                    verdict = _worst(verdict, Classified("attribute", f"{name}: severity differs from the reference"))
        out.append((sentence, verdict))
    return out
