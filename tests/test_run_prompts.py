"""Prompt templates: one per answer type, letters from the parsed choices."""

from __future__ import annotations

import json

import pytest

from medheval.run.prompts import PROMPT_VERSION, TEMPLATES, build_prompt, describe_templates
from medheval.data.schema import ANSWER_TYPES


def _record(answer_type, question="Is there a pleural effusion?", choices=None, rid="bench/cfg/1"):
    return {"id": rid, "question": question, "answer_type": answer_type, "choices": choices or []}


def test_every_answer_type_has_a_template():
    assert set(TEMPLATES) == set(ANSWER_TYPES)


def test_yes_no():
    assert build_prompt(_record("yes_no")) == "Is there a pleural effusion? Please answer Yes or No."


@pytest.mark.parametrize("answer_type", ["open", "report", "statement"])
def test_open_report_statement_are_the_question_as_is(answer_type):
    q = "Describe the findings of this chest X-ray."
    assert build_prompt(_record(answer_type, question=q)) == q


def test_multiple_choice_letters_follow_choices():
    prompt = build_prompt(
        _record("multiple_choice", question="Which organ is enlarged?", choices=["Liver", "Spleen", "Kidney"])
    )
    assert prompt == (
        "Which organ is enlarged? Please choose from the following options: "
        "A. Liver, B. Spleen, C. Kidney. Answer with the option's letter."
    )


def test_multiple_choice_many_options_get_consecutive_letters():
    choices = [f"option {i}" for i in range(6)]
    prompt = build_prompt(_record("multiple_choice", choices=choices))
    for letter, text in zip("ABCDEF", choices):
        assert f"{letter}. {text}" in prompt
    assert "G." not in prompt


def test_multiple_choice_without_choices_names_the_record():
    with pytest.raises(ValueError, match="bench/cfg/mc-7"):
        build_prompt(_record("multiple_choice", choices=[], rid="bench/cfg/mc-7"))


def test_multiple_choice_choices_as_string_is_rejected():
    rec = _record("multiple_choice", rid="bench/cfg/mc-8")
    rec["choices"] = "A. liver B. spleen"
    with pytest.raises(ValueError, match="bench/cfg/mc-8"):
        build_prompt(rec)


def test_unknown_answer_type_names_the_record_id():
    with pytest.raises(ValueError) as err:
        build_prompt(_record("free_text", rid="medhallmark/all/42"))
    assert "medhallmark/all/42" in str(err.value)
    assert "free_text" in str(err.value)


def test_missing_question_names_the_record_id():
    rec = _record("open", rid="x/y/z")
    del rec["question"]
    with pytest.raises(ValueError, match="x/y/z"):
        build_prompt(rec)


def test_question_whitespace_is_stripped_and_braces_are_safe():
    prompt = build_prompt(_record("yes_no", question="  Is {this} a mass?\n"))
    assert prompt == "Is {this} a mass? Please answer Yes or No."


def test_describe_templates_is_json_and_versioned():
    desc = describe_templates()
    assert desc["version"] == PROMPT_VERSION == "medheval-prompts-v1"
    assert desc["templates"] == TEMPLATES
    json.dumps(desc)
    desc["templates"]["yes_no"] = "changed"  # a copy: the module's templates stay as they are
    assert TEMPLATES["yes_no"].endswith("Please answer Yes or No.")
