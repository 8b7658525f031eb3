"""medheval.scoring.text_cues: the one sentence splitter (its presets, worked by hand) and the shared cues."""

from __future__ import annotations

import re

import pytest

from medheval.scoring import text_cues as tc
from medheval.labelers import chexpert_rules
from medheval.radiology import ratescore_scoring


def test_answer_preset_splits_on_terminators_outside_numbers():
    text = "no. the effusion is 3.5 cm; it is small!\nyes"
    assert tc.split_sentences(text, tc.ANSWER_SENTENCES) == ["no", " the effusion is 3.5 cm", " it is small", "yes"]
    assert tc.split_sentences("...", tc.ANSWER_SENTENCES) == []


def test_chexpert_preset_keeps_the_terminator():
    text = "no effusion. mild cardiomegaly vs edema! 3.5 cm nodule? . tail"
    assert tc.split_sentences(text, tc.CHEXPERT_SENTENCES) == [
        "no effusion.", "mild cardiomegaly vs edema!", "3.5 cm nodule?", "tail"]
    # where the sentences end: after every terminator followed by white space or the end
    assert tc.sentence_ends("a. b.", tc.CHEXPERT_SENTENCES) == [2, 5]


def test_ratescore_preset():
    line = "Findings: lungs clear.  Impression: 1. No acute process. 2. Stable cardiomegaly."
    assert tc.split_sentences(line, tc.RATESCORE_SENTENCES) == [
        "Findings: lungs clear.", "Impression: 1.", "No acute process.", "2. Stable cardiomegaly."]
    assert tc.split_sentences("OK. ..  \n\n No.", tc.RATESCORE_SENTENCES) == ["OK.", "No."]
    assert tc.keep_sentence("ab") is False and tc.keep_sentence("abc") is True


def test_medihall_preset():
    text = ("### Assistant: The heart is normal. No effusion.\n"
            "Mild atelectasis at 3.5 cm, e.g. at the left base. Is it stable? Yes!\n"
            "- bullet item\n2) numbered item\n\n   ")
    assert tc.split_sentences(text, tc.MEDIHALL_SENTENCES) == [
        "The heart is normal.", "No effusion.", "Mild atelectasis at 3.5 cm, e.g. at the left base.",
        "Is it stable?", "Yes!", "bullet item", "numbered item",
    ]
    assert tc.split_sentences("the worst. Next one", tc.MEDIHALL_SENTENCES) == ["the worst.", "Next one"]
    assert tc.split_sentences("See Fig. 2 here. Done", tc.MEDIHALL_SENTENCES) == ["See Fig. 2 here.", "Done"]
    assert tc.split_sentences(None, tc.MEDIHALL_SENTENCES) == []


def test_options_compose():
    options = tc.SentenceOptions(boundary=re.compile(r"\|"), blocks="lines", strip=True,
                                 abbreviations=frozenset({"dr"}), merge_list_numbers=True)
    # "dr" before a boundary keeps the sentence going; "1." joins the sentence after it
    assert tc.split_sentences("a | dr | b\n1. | c", options) == ["a", "dr | b", "1. c"]
    with pytest.raises(ValueError, match="blocks"):
        tc.split_sentences("x", tc.SentenceOptions(boundary=re.compile(r"\."), blocks="pages"))


def test_users_take_their_splitter_and_cues_from_here():
    assert chexpert_rules._TRIGGERS is tc.CHEXPERT_TRIGGERS
    assert chexpert_rules.split_sentences("No effusion. Mild cardiomegaly vs. edema!") == [
        "no effusion.", "mild cardiomegaly vs edema!"]
    assert ratescore_scoring.split_sentences_rules("A b c. D e f.") == ["A b c.", "D e f."]
    assert ratescore_scoring.keep_sentence is tc.keep_sentence


@pytest.mark.parametrize(
    "text,negation,hedge,assertion",
    [
        ("there is no effusion", True, False, True),
        ("the lungs are clear", False, False, False),  # a copula asserts nothing
        ("it is unlikely", True, False, False),
        ("cannot be determined", True, True, False),
        ("the effusion is seen", False, False, True),
        ("there may be an effusion", False, True, False),  # "there may be" is no "there is"
    ],
)
def test_answer_cues(text, negation, hedge, assertion):
    assert bool(tc.NEGATION.search(text)) is negation
    assert bool(tc.HEDGE.search(text)) is hedge
    assert bool(tc.ASSERTION.search(text)) is assertion


def test_report_clause_cues():
    clause = "no pleural effusion"
    assert tc.REPORT_NEGATION.search(clause)
    assert tc.REPORT_POST_NEGATION.match(" is not seen")
    assert tc.REPORT_UNCERTAIN.search("may represent atelectasis")
    assert tc.REPORT_CLAUSE_BREAK.split("mild edema; no effusion") == ["mild edema", " no effusion"]


def test_trigger_table_is_well_formed():
    kinds = {"pseudo", "trig", "break", "soft", "soft_pre", "term", "term_f"}
    for kind, roles, patterns in tc.CHEXPERT_TRIGGERS:
        assert kind in kinds and patterns
        for role, direction, window in roles:
            assert role in {"pre", "neg", "post", "stable"}
            assert direction in (tc.FORWARD, tc.BACKWARD) and (window is None or window > 0)
        for pattern in patterns:
            assert re.compile(pattern).groups == 0, pattern
    assert tc.expand("a|b", " x", head="y ") == ["y a x", "y b x"]
