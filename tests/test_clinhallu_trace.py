"""The ClinHallu trace parser on hand-written traces, and agreement with upstream's parser."""

from __future__ import annotations

import ast
import re
import typing
from pathlib import Path

import pytest

from clinhallu_fixture import shared_upstream
from medheval.families.clinhallu.trace import STAGES, parse_trace, render_stages

UPSTREAM_COMMON = shared_upstream() / "clinhallu" / "src" / "common.py"

VR = "An axial CT slice of the chest shows a rounded opacity in the right lower lobe."
KR = "Solitary pulmonary nodules larger than eight millimetres warrant further workup."
RE = "The opacity is large and spiculated, so malignancy is the most likely explanation."


def _trace(vr: str | None = VR, kr: str | None = KR, re_: str | None = RE, answer: str | None = "B. Lung cancer",
           sep: str = "\n") -> str:
    parts = []
    if vr is not None:
        parts.append(f"[Visual Recognition]{sep}{vr}")
    if kr is not None:
        parts.append(f"[Knowledge Recall]{sep}{kr}")
    if re_ is not None:
        body = f"[Reasoning]{sep}{re_}"
        if answer is not None:
            body += f"\n[Answer] {answer}"
        parts.append(body)
    return "\n\n".join(parts)


# (name, text, valid, reason prefix, expected answer)
CASES: list[tuple[str, str, bool, str, str]] = [
    ("valid_mc", _trace(), True, "ok", "B. Lung cancer"),
    ("valid_yes", _trace(answer="yes"), True, "ok", "yes"),
    ("valid_no", _trace(answer="no"), True, "ok", "no"),
    ("valid_open", _trace(answer="right lower lobe"), True, "ok", "right lower lobe"),
    ("valid_same_line_markers", _trace(sep=" "), True, "ok", "B. Lung cancer"),
    ("valid_preamble", "Sure, here is my analysis.\n" + _trace(), True, "ok", "B. Lung cancer"),
    ("valid_trailing_text", _trace() + "\nI hope this helps.", True, "ok", "B. Lung cancer"),
    ("valid_answer_next_line", _trace(answer=None) + "\n[Answer]\n\nC", True, "ok", "C"),
    ("valid_answer_padded", _trace(answer="   A   "), True, "ok", "A"),
    ("valid_exactly_three_words", _trace(vr="three words here", kr="also three words", re_="so answer follows"),
     True, "ok", "B. Lung cancer"),
    ("valid_stages_reordered",
     f"[Knowledge Recall]\n{KR}\n[Visual Recognition]\n{VR}\n[Reasoning]\n{RE}\n[Answer] B", True, "ok", "B"),
    ("valid_duplicate_stage_last_wins",
     f"[Visual Recognition]\nfirst draft of it\n" + _trace(), True, "ok", "B. Lung cancer"),
    ("valid_empty_repeat_kept_first", _trace() .replace("[Reasoning]", "[Knowledge Recall]\n[Reasoning]"),
     True, "ok", "B. Lung cancer"),
    ("valid_two_answers_first_wins", _trace(answer="A") + "\n[Answer] C", True, "ok", "A"),
    ("valid_answer_mid_reasoning",
     f"[Visual Recognition]\n{VR}\n[Knowledge Recall]\n{KR}\n[Reasoning]\n[Answer] D\n{RE}", True, "ok", "D"),
    ("valid_unicode", _trace(vr="Opacité diffuse bilatérale très étendue", answer="oui"), True, "ok", "oui"),
    ("valid_markdown_around", _trace().replace("[Reasoning]", "**[Reasoning]**"), True, "ok", "B. Lung cancer"),
    ("valid_tabs", _trace(vr="a\tb\tc", kr="d\te\tf", re_="g\th\ti"), True, "ok", "B. Lung cancer"),
    ("valid_long_answer", _trace(answer="F. Resolving parenchymal hematoma with post-traumatic changes"), True, "ok",
     "F. Resolving parenchymal hematoma with post-traumatic changes"),
    ("valid_crlf", _trace().replace("\n", "\r\n"), True, "ok", "B. Lung cancer"),
    # missing stages
    ("missing_vr", _trace(vr=None), False, "missing stage [Visual Recognition]", "B. Lung cancer"),
    ("missing_kr", _trace(kr=None), False, "missing stage [Knowledge Recall]", "B. Lung cancer"),
    ("missing_reasoning", _trace(re_=None), False, "missing stage [Reasoning]", ""),
    ("missing_all", "The answer is B.", False, "missing stage [Visual Recognition]", ""),
    ("empty_text", "", False, "missing stage [Visual Recognition]", ""),
    ("only_answer", "[Answer] B", False, "missing stage [Visual Recognition]", ""),
    ("empty_vr_body", _trace(vr=""), False, "missing stage [Visual Recognition]", "B. Lung cancer"),
    ("whitespace_kr_body", _trace(kr="   \n  "), False, "missing stage [Knowledge Recall]", "B. Lung cancer"),
    ("vr_and_kr_missing", _trace(vr=None, kr=None), False, "missing stage [Visual Recognition]", "B. Lung cancer"),
    # short stages
    ("two_word_vr", _trace(vr="opacity present"), False, "stage [Visual Recognition] has fewer", "B. Lung cancer"),
    ("two_word_kr", _trace(kr="nodules matter"), False, "stage [Knowledge Recall] has fewer", "B. Lung cancer"),
    ("two_word_reasoning", _trace(re_="hence cancer"), False, "stage [Reasoning] has fewer", "B. Lung cancer"),
    ("one_word_vr", _trace(vr="opacity"), False, "stage [Visual Recognition] has fewer", "B. Lung cancer"),
    ("reasoning_only_answer", _trace(re_=""), False, "stage [Reasoning] has fewer", "B. Lung cancer"),
    ("short_vr_and_missing_kr", _trace(vr="ok", kr=None), False, "stage [Visual Recognition] has fewer",
     "B. Lung cancer"),
    ("answer_in_vr_counts_as_vr_words", _trace(vr="tiny\n[Answer] B", re_="x y"), False,
     "stage [Reasoning] has fewer", "B. Lung cancer"),
    # answer problems
    ("answer_missing", _trace(answer=None), False, "no [Answer]", ""),
    ("answer_empty", _trace(answer=""), False, "no [Answer]", ""),
    ("answer_blank_spaces_at_end", _trace(answer=None) + "\n[Answer]   \n", False, "no [Answer]", ""),
    ("answer_only_in_vr", _trace(vr=VR + "\n[Answer] B", answer=None), False, "no [Answer]", ""),
    ("answer_marker_lowercase", _trace(answer=None) + "\n[answer] B", False, "no [Answer]", ""),
    ("answer_without_brackets", _trace(answer=None) + "\nAnswer: B", False, "no [Answer]", ""),
    # markers in other case / spacing (strict: not markers)
    ("lowercase_markers", _trace().lower(), False, "missing stage [Visual Recognition]", ""),
    ("uppercase_vr_marker", _trace().replace("[Visual Recognition]", "[VISUAL RECOGNITION]"), False,
     "missing stage [Visual Recognition]", "B. Lung cancer"),
    ("spaced_kr_marker", _trace().replace("[Knowledge Recall]", "[ Knowledge Recall ]"), False,
     "missing stage [Knowledge Recall]", "B. Lung cancer"),
    ("double_space_reasoning", _trace().replace("[Reasoning]", "[Reasoning ]"), False,
     "missing stage [Reasoning]", ""),
    ("no_brackets", _trace().replace("[", "").replace("]", ":"), False, "missing stage [Visual Recognition]", ""),
    ("parenthesised_markers", _trace().replace("[", "(").replace("]", ")"), False,
     "missing stage [Visual Recognition]", ""),
    ("markdown_headings", _trace().replace("[Visual Recognition]", "## Visual Recognition"), False,
     "missing stage [Visual Recognition]", "B. Lung cancer"),
]


def test_there_are_at_least_forty_cases():
    assert len(CASES) >= 40 and len({name for name, *_ in CASES}) == len(CASES)


@pytest.mark.parametrize("name,text,valid,reason,answer", CASES, ids=[case[0] for case in CASES])
def test_hand_written_traces(name, text, valid, reason, answer):
    trace = parse_trace(text)
    assert trace.valid is valid, trace.reason
    assert trace.reason.startswith(reason), trace.reason
    assert trace.answer == answer


def test_stage_texts_are_split_and_answer_lines_removed():
    trace = parse_trace(_trace(answer="A") + "\n[Answer] C")
    assert trace.as_dict() == {"visual_recognition": VR, "knowledge_recall": KR, "reasoning": RE, "answer": "A"}
    assert trace.present == STAGES
    late = parse_trace(f"[Visual Recognition]\nfirst draft of it\n" + _trace())
    assert late.visual_recognition == VR
    kept = parse_trace(_trace().replace("[Reasoning]", "[Knowledge Recall]\n[Reasoning]"))
    assert kept.knowledge_recall == KR


@pytest.mark.parametrize("variant", [
    lambda t: t.lower(),
    lambda t: t.upper(),
    lambda t: t.replace("[Visual Recognition]", "[ visual   recognition ]"),
    lambda t: t.replace("[Knowledge Recall]", "[KNOWLEDGE\tRECALL]").replace("[Answer]", "[ answer ]"),
])
def test_lenient_markers_accept_other_case_and_spacing(variant):
    text = variant(_trace(answer="B"))
    assert not parse_trace(text).valid
    lenient = parse_trace(text, lenient_markers=True)
    assert lenient.valid, lenient.reason
    assert lenient.answer.lower() == "b"
    assert lenient.visual_recognition.lower() == VR.lower()


def test_lenient_markers_still_need_brackets_and_words():
    assert not parse_trace(_trace().replace("[", "").replace("]", ":"), lenient_markers=True).valid
    assert parse_trace(_trace(kr="too short"), lenient_markers=True).reason.startswith("stage [Knowledge Recall]")


def test_render_round_trips_and_rejects_unknown_stage():
    text = render_stages(visual_recognition=VR, knowledge_recall=KR, reasoning=RE, answer="B")
    assert parse_trace(text).as_dict() == {"visual_recognition": VR, "knowledge_recall": KR, "reasoning": RE,
                                           "answer": "B"}
    prefix = render_stages(visual_recognition=VR)
    assert prefix == f"[Visual Recognition]\n{VR}"
    with pytest.raises(KeyError, match="impression"):
        render_stages(impression="x")
    with pytest.raises(KeyError, match="visual"):
        parse_trace(text).stage("vision")
    with pytest.raises(TypeError, match="string"):
        parse_trace(None)  # type: ignore[arg-type]


# ----------------------------------------------------------------------------- upstream agreement

_UPSTREAM_NAMES = {"COT_STEPS", "COT_STEP_KEY_MAP", "COT_PARSE_PATTERN", "ANSWER_PATTERN", "_parse_answer",
                   "_strip_answer_line", "parse_cot", "validate_cot"}


def _upstream_parser():
    """parse_cot/validate_cot out of upstream's common.py: only those definitions are compiled
    (the module imports an API client and yaml), in a namespace with ``re`` and ``typing``."""
    tree = ast.parse(UPSTREAM_COMMON.read_text(encoding="utf-8"))
    kept = []
    for node in tree.body:
        names = set()
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names = {node.name}
        elif isinstance(node, ast.Assign):
            names = {target.id for target in node.targets if isinstance(target, ast.Name)}
        if names & _UPSTREAM_NAMES:
            kept.append(node)
    assert {n.name if hasattr(n, "name") else n.targets[0].id for n in kept} == _UPSTREAM_NAMES
    namespace: dict = {"re": re, **{name: getattr(typing, name) for name in ("Any", "Dict", "Optional", "Tuple")}}
    exec(compile(ast.Module(body=kept, type_ignores=[]), str(UPSTREAM_COMMON), "exec"), namespace)
    return namespace["parse_cot"], namespace["validate_cot"]


@pytest.mark.skipif(not UPSTREAM_COMMON.is_file(), reason="../shared/data/upstream/clinhallu absent")
def test_agrees_with_upstream_parser_on_every_case():
    parse_cot, validate_cot = _upstream_parser()
    disagreements = []
    for name, text, *_ in CASES:
        ours = parse_trace(text)
        parsed = parse_cot(text)
        valid, _ = validate_cot(parsed)
        theirs_answer = (parsed or {}).get("reasoning", {}).get("answer", "")
        theirs_texts = {key: (parsed or {}).get(key, {}).get("text", "") for key in STAGES}
        if valid != ours.valid or theirs_answer != ours.answer or theirs_texts != {k: ours.stage(k) for k in STAGES}:
            disagreements.append(name)
    assert disagreements == []
