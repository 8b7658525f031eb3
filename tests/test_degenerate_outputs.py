"""Degenerate model outputs through the parsers and scorers: linear time, the results of the code they replace.

Models under evaluation write the same phrase until ``max_new_tokens``, long blank runs, thousands of JSON
objects. Each rewritten piece is checked against the expression it replaced on many short random strings
(where that one is fast), and each degenerate input below is sized so that the replaced code takes five to
twenty seconds on it (its growth is quadratic or cubic) where the new code takes milliseconds. The labelers'
scope checks are counted, not timed. The replaced code is kept in one place, ``benchmarks/bench_degenerate.py``,
which times it against the current code; the tests read it from there.
"""

from __future__ import annotations

import random
import re

import pytest
from conftest import load_benchmark

from medheval.families.med_hallmark import prompts, rules
from medheval.judges import structured
from medheval.judges.structured import parse_json_object
from medheval.labelers import chexpert_rules
from medheval.scoring import green, nltk39, parsing, text_cues

CXR = ["Pleural effusion", "Pneumonia", "Cardiomegaly", "Pulmonary edema"]
REPLACED = load_benchmark("bench_degenerate")  # the patterns and the CheXpert context the rewrites replaced


def _strings(tokens: list[str], count: int, longest: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(tokens) for _ in range(rng.randint(0, longest))) for _ in range(count)]


# -- close-ended answers ----------------------------------------------------------------------------------
OLD_WHOLE_LETTER, OLD_EXPLICIT_LETTER = REPLACED.OLD_WHOLE_LETTER, REPLACED.OLD_EXPLICIT_LETTER


def test_letter_patterns_read_as_before():
    for text in _strings(["(", ")", " ", "\n", "\u3000", "A", "b", "x", ".", ":", "1"], 20_000, 8, seed=1):
        old, new = OLD_WHOLE_LETTER.match(text), parsing._WHOLE_LETTER.match(text)
        assert (old and old.group(1)) == (new and new.group(1)), text
    tokens = ["answer", "Option", "choice", " ", "\n", "is", "would", "be", "should", ":", "-", "(", ")", "A", "b",
              "1", "I"]
    for text in _strings(tokens, 20_000, 9, seed=2):
        assert [(m.span(), m.group(1)) for m in OLD_EXPLICIT_LETTER.finditer(text)] == \
            [(m.span(), m.group(1)) for m in parsing._EXPLICIT_LETTER.finditer(text)], text
    for text in _strings([" ", "\n", ".", ")", "a", "A", " b"], 5_000, 6, seed=3):  # read at a position, not a copy
        for pos in range(len(text) + 1):
            for pattern in (parsing._AFTER_LOWER, parsing._AFTER_ARTICLE):
                assert bool(pattern.match(text, pos)) == bool(pattern.match(text[pos:])), (text, pos)


@pytest.mark.parametrize("answer", [
    "A" + " " * 20_000 + "x",  # the old whole-letter pattern: ~6 s
    "I think the answer is" + " " * 12_000 + "1.",  # the old explicit-letter pattern (three blank runs): ~10 s
    "Option" + " \n" * 8_000 + "(1)",  # ~7 s
])
def test_long_blank_runs_in_an_answer_parse_at_once(answer):
    assert parsing.parse_multiple_choice(answer, CXR) is None
    assert parsing.score_item(answer, "B", "multiple_choice", CXR).parsed is False


def test_long_answers_are_not_memoised():
    parsing.clear_caches()
    long_answer = "No, there is no effusion. " * 100
    assert len(long_answer) > parsing.MEMO_MAX_CHARS
    assert parsing.parse_yes_no(long_answer) == "no" and parsing.parse_multiple_choice(long_answer, CXR) is None
    assert parsing.parse_yes_no.cache_info().currsize == 0
    assert parsing._norm.cache_info().currsize == len(CXR)  # the options, not the answer
    assert parsing.parse_yes_no("No.") == "no" and parsing.parse_yes_no.cache_info().currsize == 1


# -- judge replies ----------------------------------------------------------------------------------------
OLD_FENCE = REPLACED.OLD_FENCE


def test_code_fences_are_found_as_before():
    tokens = ["`", "```", " ", "\t", "\r", "\n", "json", "json5", "js", "JavaScript", "py", "python", "x", "{", "}"]
    for text in _strings(tokens, 20_000, 10, seed=4):
        assert structured._fence_blocks(text) == OLD_FENCE.findall(text), text


def test_an_unclosed_fence_before_a_long_blank_run_is_read_at_once():
    # the old fence pattern tried every split of the run between its two blank runs: ~15 s for 2,000 (cubic)
    with pytest.raises(ValueError, match="no JSON object"):
        parse_json_object("```" + " " * 2_000 + "x")
    assert parse_json_object("```json" + " \t" * 2_000 + '\n{"score": 1}```' + " " * 2_000 + "```") == {"score": 1}


def test_thousands_of_different_objects_are_counted_in_linear_time():
    # the old check compared every object with every earlier one: ~10 s for these 20,000
    reply = "".join(f'{{"score": {i}}} ' for i in range(20_000))
    with pytest.raises(ValueError, match="holds 20000 different JSON objects"):
        parse_json_object(reply)


@pytest.mark.parametrize("reply, objects", [
    ('{"a": 1} {"a": 1.0} {"a": true}', 1),  # equal as Python values: one object, as before
    ('{"a": 1, "b": [2, {"c": null}]} {"b": [2.0, {"c": null}], "a": 1}', 1),
    ('{"a": NaN} {"a":  NaN}', 1),  # json reads every NaN as the one same float object
    ('{"a": 1} {"a": 2}', 2),
    ('{"a": [1, 2]} {"a": [2, 1]} {"a": {"1": 2}}', 3),
    ('{"a": "1"} {"a": 1}', 2),
])
def test_objects_count_as_the_same_exactly_when_they_are_equal(reply, objects):
    if objects == 1:
        assert parse_json_object(reply) == parse_json_object(reply[:reply.index("} {") + 1])  # the first one
    else:
        with pytest.raises(ValueError, match=f"holds {objects} different JSON objects"):
            parse_json_object(reply)


def test_a_number_past_pythons_digit_limit_is_an_unreadable_object_not_an_internal_error():
    digits = "1" * 5_000  # json.loads raised int()'s "Exceeds the limit (4300 digits)" past the parser
    with pytest.raises(ValueError, match="could not be parsed"):
        parse_json_object('{"score": ' + digits + "}")
    assert parse_json_object('{"score": ' + digits + '} {"score": 2}') == {"score": 2}
    with pytest.raises(ValueError, match=r"\[Matched Findings\] has a count of 5000 digits"):
        green.parse_reply(f"[Matched Findings]: {digits}\n[Clinically Significant Errors]: No errors.")


@pytest.mark.parametrize("score", [float("inf"), "1e999", "-Infinity", float("nan")])
def test_an_infinite_score_is_an_invalid_reply(score):
    from medheval.families.medheval.sh_prompt import check_score

    with pytest.raises(ValueError, match="score must be an integer from 0 to 5"):  # was OverflowError
        check_score(score)


OLD_GREEN_HEADER, OLD_GREEN_ITEM = REPLACED.OLD_GREEN[green._HEADER], REPLACED.OLD_GREEN[green._ITEM]


def test_green_lines_are_found_as_before():
    tokens = ["\n", " ", "\t", "\r", "[", "]", "x", ":", "(a)", "(", ")", "a", "7", "[Matched Findings]", "\u3000"]
    for text in _strings(tokens, 20_000, 10, seed=5):
        for old, new in ((OLD_GREEN_HEADER, green._HEADER), (OLD_GREEN_ITEM, green._ITEM)):
            assert [(m.start(), m.end(), m.groups()) for m in old.finditer(text)] == \
                [(start, m.end(), m.groups()) for start, m in green._line_matches(new, text)], text


def test_a_green_reply_of_many_blank_lines_parses_at_once():
    # the old patterns retried every line start of a blank run (quadratic): ~20 s for these 100,000 lines
    blank = "\n" * 100_000
    reply = (f"[Matched Findings]:\n2.{blank}[Clinically Significant Errors]:\n(a) False finding: 1.{blank}"
             "(b) Missing finding: 0.\n")
    assert green.parse_reply(reply) == {"matched": 2, "significant": [1, 0, 0, 0, 0, 0], "insignificant": None}


OLD_IRG_BLOCK = REPLACED.OLD_IRG_BLOCK


def test_irg_blocks_are_found_as_before():
    tokens = ["Sentence", "sentence", ":", "：", '"', " ", "\n", "\t", "Hallucination type", "HALLUCINATION type", "x",
              "\u3000"]
    for text in _strings(tokens, 20_000, 10, seed=6):
        assert prompts._irg_blocks(text) == [(m["sentence"], m["level"]) for m in OLD_IRG_BLOCK.finditer(text)], text


@pytest.mark.parametrize("reply", ["Sentence: " * 5_000, "Sentence: x" + " " * 50_000 + "y"])
def test_an_irg_reply_without_type_lines_fails_at_once(reply):
    # old: every "Sentence:" rescanned the rest of the reply, every blank of a run was tried as its end (~5 s)
    with pytest.raises(ValueError, match="no \"Sentence"):
        prompts.parse_irg_upstream(reply)


# -- report text --------------------------------------------------------------------------------------------
OLD_FULL_STOP = REPLACED.OLD_FULL_STOP


def test_the_full_stop_rule_rewrites_as_before():
    tokens = [".", " ", "a", ")", '"', "'", "\n", "\t", "»", "]", "x", "\u3000", ".."]
    for text in _strings(tokens, 20_000, 10, seed=7):
        assert nltk39._PUNCTUATION[0][0].sub(r"\1 \2 \3 ", text) == OLD_FULL_STOP.sub(r"\1 \2 \3 ", text), text


def test_a_full_stop_before_a_long_blank_run_tokenizes_at_once():
    # the old rule split the run every way between its closers and its blanks: ~7 s for 30,000 blanks
    assert nltk39.tokenize_sentence("a." + " " * 30_000 + "b") == ["a.", "b"]


def test_the_last_word_is_read_as_split_reads_it():
    for text in _strings(["dr.", " ", "\n", "\u3000", "A", "e.g.", "x"], 5_000, 8, seed=8):
        for start in range(len(text) + 1):
            for end in range(start, len(text) + 1):
                assert text_cues._last_word(text, start, end) == (text[start:end].split() or [""])[-1]


def test_a_line_of_abbreviations_splits_at_once():
    # the old splitter re-split the growing sentence at each of the 20,000 boundaries (~10 s)
    assert text_cues.split_sentences("Dr. A " * 20_000, text_cues.MEDIHALL_SENTENCES) == [("Dr. A " * 20_000).strip()]


class _Counting:
    """A stand-in for a compiled pattern that counts its calls."""

    def __init__(self, pattern: re.Pattern[str]) -> None:
        self.pattern, self.calls = pattern, 0

    def __getattr__(self, name: str):
        method = getattr(self.pattern, name)

        def call(*args, **kwargs):
            self.calls += 1
            return method(*args, **kwargs)
        return call


def test_chexpert_scopes_are_checked_a_bounded_number_of_times_per_mention(monkeypatch):
    checks = 0
    in_scope = chexpert_rules._in_scope

    def counted(*args):
        nonlocal checks
        checks += 1
        return in_scope(*args)

    monkeypatch.setattr(chexpert_rules, "_in_scope", counted)
    labels = chexpert_rules.label_report("no effusion " * 2_000)  # 2,000 mentions and 2,000 triggers in one sentence
    assert labels == chexpert_rules.label_report("no effusion")
    assert checks <= 30 * 2 * 2_000  # old: every trigger for every mention, 4 million checks


_old_context = REPLACED._old_context  # the definition: every trigger overlapping the sentence, every role


def test_chexpert_labels_equal_those_of_checking_every_trigger(monkeypatch):
    words = ("no effusion pneumothorax edema heart size is normal enlarged stable possible likely cannot exclude "
             "without and or with but , . ; consolidation may represent atelectasis not seen resolved findings : "
             "unchanged versus mild pleural new there lungs clear").split()
    rng = random.Random(9)
    reports = [" ".join(rng.choice(words) for _ in range(rng.randint(1, 40))) for _ in range(3_000)]
    monkeypatch.setattr(chexpert_rules, "_FEW_TRIGGERS", 0)  # the index, not the check of every trigger
    new = [chexpert_rules.label_report(report) for report in reports]
    monkeypatch.setattr(chexpert_rules, "_context", _old_context)
    assert new == [chexpert_rules.label_report(report) for report in reports]
    for text in _strings([" ", ",", " and", " or", "with", "\t", "x"], 3_000, 8, seed=10):
        for start in range(len(text) + 1):
            assert chexpert_rules._opens_phrase(text, start) == (
                text[:start].rstrip().endswith(chexpert_rules._OPENERS) or start == 0)


def _old_clause_mentions(clause: str) -> list[tuple]:
    """What the IRG rule read per finding of a clause, from slices of it (the definition)."""
    out = []
    for name, pattern in rules.FINDINGS.items():
        for m in pattern.finditer(clause):
            before, after = clause[:m.start()], clause[m.end():]
            state = ("absent" if rules._NEGATION.search(before) or rules._POST_NEGATION.match(after)
                     else "uncertain" if rules._UNCERTAIN.search(before) else "present")
            near = " ".join(before.split()[-rules._SEVERITY_SCOPE:])
            severity = frozenset(rules._SEVERITY[w] for w in rules._SEVERITY_RE.findall(near))
            chronic = bool(rules._CHRONIC.search(clause))
            out.append((name, rules._Mention(state, rules._sides(clause), severity, chronic)))
    return out


def test_irg_mentions_equal_those_read_from_slices():
    words = ("no not effusion effusions pneumothorax edema is are absent resolved may likely possible small "
             "large moderate mild-effusion left right , and without clear of chronic stable cardiomegaly "
             "(effusion) x-ray").split()
    rng = random.Random(11)
    for _ in range(3_000):
        clause = " ".join(rng.choice(words) for _ in range(rng.randint(1, 30)))
        assert rules._clause_mentions(clause) == _old_clause_mentions(clause), clause


def test_irg_cues_are_searched_a_few_times_per_clause(monkeypatch):
    negation = _Counting(rules._NEGATION)
    monkeypatch.setattr(rules, "_NEGATION", negation)
    found = rules.classify_irg_rule("effusion no effusion " * 1_000, "Small left pleural effusion.")
    assert [verdict for _, verdict in found] == [verdict for _, verdict in rules.classify_irg_rule(
        "effusion no effusion", "Small left pleural effusion.")]
    assert negation.calls <= 20  # old: one search of the clause before each of the 2,000 findings
