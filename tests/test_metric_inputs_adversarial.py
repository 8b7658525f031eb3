"""Adversarial inputs to every metric's ``compute``: each refusal names the input, the item's index and what to
pass; nothing is converted behind the caller's back (``evaluate`` checks the first row only and stores a later
number or list as its ``str()``), and text with a surrogate code point is refused the same way everywhere.

The input checks run before ``evaluate`` stores the inputs, so the model-backed metrics (chexbert_similarity,
radgraph_f1, ratescore, green, sh_judge) are checked here without their models or a judge.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
from conftest import REPO, load_metric_offline

from judge_servers import judge_server_factory  # noqa: F401 - fixture

# metric -> the extra declared inputs it needs (evaluate refuses a call without them before any check)
STRING_METRICS = {
    "chair": {}, "chexbert_similarity": {}, "close_ended_accuracy": {"answer_types": ["yes_no", "yes_no"]},
    "green": {}, "medihall_detection": {}, "medihall_score": {}, "radcliq": {}, "radgraph_f1": {},
    "ratescore": {}, "sh_judge": {}, "stepbench": {}, "text_generation": {},
}
_LOADED: dict = {}


def metric(name: str):
    if name not in _LOADED:
        _LOADED[name] = load_metric_offline(REPO / "metrics" / name)
    return _LOADED[name]


def compute(name: str, predictions, references, **kwargs):
    return metric(name).compute(predictions=predictions, references=references,
                                **{**STRING_METRICS[name], **kwargs})


# -- declared string inputs: every row is checked, not only the first ------------------------------------------


@pytest.mark.parametrize("name", sorted(STRING_METRICS))
def test_a_number_at_a_later_index_is_refused_not_stored_as_its_str(name):
    """Reproduction: evaluate stored predictions[1] = 5 as "5" and scored it (close_ended_accuracy counted it
    unparsed, text_generation scored "5" against the reference); predictions[0] = 5 failed without an index."""
    for predictions, index in ((["no effusion", 5], 1), ([5, "no effusion"], 0)):
        expected = rf"^predictions\[{index}\] is int 5, not a string(?: or a list of strings)?; pass the model's answer"
        with pytest.raises(ValueError, match=expected):
            compute(name, predictions, ["effusion", "effusion"])


@pytest.mark.parametrize("name", sorted(STRING_METRICS))
def test_several_references_per_item_are_refused_naming_the_item(name):
    """Reproduction: a list of references at index 1 was scored as the text "['a', 'b']" (close_ended_accuracy
    found "B" in it and called the item correct)."""
    with pytest.raises(ValueError, match=r"^references\[1\] is list \['B', 'C'\], not a string; pass one reference "
                                         r"string per item \(several references per item are not supported"):
        compute(name, ["yes", "B"], ["yes", ["B", "C"]])


@pytest.mark.parametrize("name", sorted(STRING_METRICS))
def test_a_surrogate_code_point_is_a_clear_error_everywhere(name):
    """Reproduction: a lone surrogate (e.g. half of a JSON "\\ud83d\\ude37" pair) failed in pyarrow with
    "'utf-8' codec can't encode character '\\ud800' in position 30", naming neither input nor item."""
    with pytest.raises(ValueError, match=r"^references\[1\] holds a surrogate code point U\+D800 at character 2 "
                                         r".*text\.encode\('utf-16', 'surrogatepass'\)\.decode\('utf-16', 'replace'\)"):
        compute(name, ["yes", "no"], ["yes", "no\ud800"])


@pytest.mark.parametrize("name", sorted(STRING_METRICS))
def test_a_single_string_is_not_read_as_one_item_per_character(name):
    """Reproduction: predictions="Yes", references="Yes" scored three items "Y", "e", "s" (medihall_score with a
    judge reported n 3); other lengths failed with a mismatch of character counts."""
    with pytest.raises(ValueError, match=r"^predictions is a single str \('Yes'\), not a list: pass a list with one "
                                         r"entry per item"):
        compute(name, "Yes", "Yes", **({"answer_types": ["yes_no"] * 3} if name == "close_ended_accuracy" else {}))


def test_pandas_missing_values_are_missing_values():
    """Reproduction: pandas.NA (a "string" column's missing value) was stored as the text "<NA>": a prediction
    scored as the answer "<NA>", a reference as the reference "<NA>"."""
    with pytest.raises(ValueError, match=r"^predictions\[1\] is <NA>; pass the model's answer as a string"):
        compute("close_ended_accuracy", pd.Series(["yes", None], dtype="string"), ["yes", "no"])
    out = compute("text_generation", ["small effusion", "no pneumothorax"],
                  pd.Series(["small effusion", pd.NA], dtype="string"), bertscore_model="/nonexistent",
                  bertscore_num_layers=1)
    assert out["n"] == 1 and out["n_empty_references"] == 1 and out["bleu_per_item"][1] is None


def test_numpy_series_tuples_and_generators_score_as_lists():
    args = (["Yes, there is.", "No"], ["yes", "no"])
    expected = compute("close_ended_accuracy", *args)
    for convert in (np.array, lambda v: np.array(v, dtype=object), lambda v: pd.Series(v, index=[7, 9]), tuple,
                    lambda v: (x for x in v)):
        assert compute("close_ended_accuracy", convert(args[0]), convert(args[1])) == expected


# -- per-item keyword inputs --------------------------------------------------------------------------------


def test_close_ended_accuracy_names_bad_per_item_inputs():
    """Reproductions: choices[0] = 5 failed with "'int' object is not iterable"; a dict of options was read as its
    keys (scored correct); a list category failed with "unhashable type: 'list'"; an int question with
    "'int' object has no attribute 'isascii'"; threshold='x' with "could not convert string to float"; a NaN
    threshold was accepted."""
    one = dict(predictions=["A"], references=["A"], answer_types=["multiple_choice"])
    acc = metric("close_ended_accuracy")
    with pytest.raises(ValueError, match=r"^choices\[0\] is int 5; pass the options as a list of strings"):
        acc.compute(**one, choices=[5])
    with pytest.raises(ValueError, match=r"^choices\[0\] is dict \{'A': 'x'\}; pass the options as a list"):
        acc.compute(**one, choices=[{"A": "x"}])
    two = dict(predictions=["yes", "no"], references=["yes", "no"], answer_types=["yes_no"] * 2)
    with pytest.raises(ValueError, match=r"^categories\[0\] is list \['a'\]; pass a string or a whole number \(or None\)"):
        acc.compute(**two, categories=[["a"], "a"])
    with pytest.raises(ValueError, match=r"^questions\[0\] is int 1; pass a string \(or None\)"):
        acc.compute(**two, questions=[1, None])
    for threshold in ("x", float("nan"), 1.5):
        with pytest.raises(ValueError, match=r"^threshold=.*: expected a number from 0 to 1"):
            acc.compute(**one, choices=[["x", "y"]], threshold=threshold)
    # no items: no accuracy, in upstream mode too (it gave 0.0)
    for upstream in (False, True):
        assert acc.compute(predictions=[], references=[], answer_types=[], upstream_compat=upstream)["accuracy"] is None
    # a NaN category (pandas' missing value) is no category, as None is
    out = acc.compute(**two, categories=[float("nan"), "a"])
    assert out["accuracy_by_category"] == {"a": 1.0}


def test_choices_as_numpy_arrays_score_as_lists():
    """Reproduction: a list column of ``Dataset.to_pandas()`` (or a parquet file read by pandas) holds a numpy
    array per cell; choices=df["choices"] failed with "The truth value of an array with more than one element is
    ambiguous" (close_ended_accuracy, in default and upstream mode, and medihall_score)."""
    import datasets

    frame = datasets.Dataset.from_dict({
        "answer": ["Pneumonia", "yes", "Left"], "answer_type": ["multiple_choice", "yes_no", "multiple_choice"],
        "choices": [["Pleural effusion", "Pneumonia"], [], ["Left", "Right", "Both"]]}).to_pandas()
    assert isinstance(frame["choices"][0], np.ndarray)
    args = dict(predictions=["B", "yes", "A. Left"], references=frame["answer"], answer_types=frame["answer_type"])
    acc = metric("close_ended_accuracy")
    for upstream in (False, True):
        expected = acc.compute(**args, choices=[list(c) for c in frame["choices"]], upstream_compat=upstream)
        assert acc.compute(**args, choices=frame["choices"], upstream_compat=upstream) == expected
    assert expected["accuracy"] == 1.0
    score, args = metric("medihall_score"), {**args, "answer_types": list(frame["answer_type"])}
    expected = score.compute(**args, choices=[list(c) for c in frame["choices"]])
    assert score.compute(**args, choices=frame["choices"]) == expected


OPTION_METRICS = ("close_ended_accuracy", "medihall_score")  # the metrics that read per-item option lists


@pytest.mark.parametrize("name", OPTION_METRICS)
@pytest.mark.parametrize("choices, message", [
    ([5], r"^choices\[0\] is int 5; pass the options as a list of strings \(or one 'A\. x, B\. y' string\)$"),
    ([{"A": "x"}], r"^choices\[0\] is dict \{'A': 'x'\}; pass the options as a list of strings"),
    ([b"A. x, B. y"], r"^choices\[0\] is bytes b'A\. x, B\. y'; pass the options as a list of strings"),
    ([["x", None]], r"^choices\[0\]\[1\] is None; pass every option as a string$"),
    ([("x", 3)], r"^choices\[0\]\[1\] is int 3; pass every option as a string$"),
    ([np.array([1, 2])], r"^choices\[0\]\[0\] is int 1; pass every option as a string$"),
    ([["x", "y\ud800"]], r"^choices\[0\]\[1\] holds a surrogate code point U\+D800"),
])
def test_every_metric_reading_options_checks_them_alike(name, choices, message):
    """One check (metric_inputs.options_column) for every metric that reads per-item options, naming the input,
    the item (and option) and what to pass. Reproductions on medihall_score, which read its options without it:
    choices=[5] failed with "'int' object is not iterable", a dict was read as its keys (["A"], scored correct), a
    None option failed inside the parser."""
    with pytest.raises(ValueError, match=message):
        compute(name, ["A"], ["A"], answer_types=["multiple_choice"], choices=choices)


@pytest.mark.parametrize("name", OPTION_METRICS)
@pytest.mark.parametrize("options", [{"Effusion", "Pneumonia"}, frozenset({"Effusion", "Pneumonia"})])
def test_options_in_no_order_are_refused(name, options):
    """Reproduction: a set of options was read in its iteration order, which for strings changes with
    PYTHONHASHSEED: "B" was Pneumonia in one process and Effusion in the next, the score with it."""
    with pytest.raises(ValueError, match=r"^choices\[0\] is \w+ .*; pass the options as a list of strings, in "
                                         r"their order \(a set has no order"):
        compute(name, ["B"], ["Pneumonia"], answer_types=["multiple_choice"], choices=[options])


@pytest.mark.parametrize("name", OPTION_METRICS)
def test_options_as_tuples_strings_or_missing_read_alike(name):
    """A tuple of options reads as the list; a missing item (None, NaN, pandas.NA) as no options (for a
    multiple-choice item close_ended_accuracy names it as needing choices)."""
    args = dict(answer_types=["multiple_choice", "yes_no"])
    expected = compute(name, ["B", "yes"], ["Pneumonia", "yes"], **args, choices=[["Effusion", "Pneumonia"], []])
    for choices in ([("Effusion", "Pneumonia"), []], ["A. Effusion, B. Pneumonia", None],
                    pd.Series([np.array(["Effusion", "Pneumonia"]), float("nan")]),
                    pd.Series([["Effusion", "Pneumonia"], pd.NA], dtype=object)):
        assert compute(name, ["B", "yes"], ["Pneumonia", "yes"], **args, choices=choices) == expected
    if name == "close_ended_accuracy":
        with pytest.raises(ValueError, match=r"^item 0: answer_type 'multiple_choice' needs choices, got none"):
            compute(name, ["B"], ["Pneumonia"], answer_types=["multiple_choice"], choices=[float("nan")])


def test_medihall_score_names_bad_per_item_inputs():
    """Reproduction: answer_types=["open", 5] failed with "'int' object has no attribute 'strip'"."""
    with pytest.raises(ValueError, match=r"^answer_types\[1\] is int 5; pass a string \(or None\)"):
        compute("medihall_score", ["yes", "no"], ["yes", "no"], answer_types=["open", 5])


def test_stepbench_empty_inputs_have_no_rates_and_bad_labels_are_named():
    """Reproductions: empty inputs gave accuracy, precision, recall, f1 and macro_f1 0.0 (a score for nothing);
    languages=[["en"], "en"] failed with "unhashable type: 'list'"; steps=[True] was read as step 1."""
    out = compute("stepbench", [], [], steps=[])
    assert out["n"] == 0
    assert [out[k] for k in ("accuracy", "precision", "recall", "f1", "macro_f1")] == [None] * 5
    json.dumps(out)
    with pytest.raises(ValueError, match=r"^languages\[0\] is list \['en'\]; pass a string or a whole number \(or None\)"):
        compute("stepbench", ["a", "b"], ["hallucination"] * 2, steps=[1, 2], languages=[["en"], "en"])
    with pytest.raises(ValueError, match=r"^item 0: step True is not one of 1, 2, 3, 4"):
        compute("stepbench", ["a"], ["hallucination"], steps=[True])


def test_whole_number_labels_of_any_type_are_one_group():
    """A category column of ints with a missing value comes out of pandas as floats (1.0, NaN): it was refused
    ("categories[0] is float 1.0; pass a string") while the ints were accepted. A whole number of any type is the
    group its digits name: 1, 1.0, np.int64(1), np.float32(1) and "1" are one group "1" (1 and "1" were two groups
    under one key "1", the later one's accuracy kept)."""
    frame = pd.DataFrame({"category": [1, None, 2, 1]})
    assert frame["category"].dtype == np.float64
    two = dict(predictions=["yes", "no", "yes", "no"], references=["yes", "yes", "yes", "no"], answer_types=["yes_no"] * 4)
    acc = metric("close_ended_accuracy")
    out = acc.compute(**two, categories=frame["category"])
    assert out["accuracy_by_category"] == {"1": 1.0, "2": 1.0}
    for categories in ([1, None, 2, 1], ["1", None, "2", "1"], [np.int64(1), None, np.float32(2.0), 1.0]):
        assert acc.compute(**two, categories=categories) == out
    assert acc.compute(**two, categories=[1, "1", 1.0, np.int8(1)])["accuracy_by_category"] == {"1": 0.75}
    for bad, shown in ((1.5, "float 1.5"), (float("inf"), "float inf"), (np.float64(-0.25), r"float64 np.float64\(-0.25\)")):
        with pytest.raises(ValueError, match=rf"^categories\[1\] is {shown}, not a whole number; pass a string or a "
                                             r"whole number \(or None\)$"):
            acc.compute(**two, categories=[1, bad, 2, 1])
    with pytest.raises(ValueError, match=r"^categories\[0\] is bool True; pass a string or a whole number \(or None\)$"):
        acc.compute(**two, categories=[True, None, 2, 1])
    # every metric with a per-item label: stepbench's languages (1 and "1" failed to sort), clinhallu's sources
    steps = dict(steps=[1, 2, 1, 2])
    out = compute("stepbench", ["no", "yes", "no", "yes"], ["hallucination"] * 4, **steps, languages=[1, "1", 1.0, None])
    assert list(out["by_language"]) == ["1"] and out["by_language"]["1"]["n"] == 3
    base = dict(correct=[1, 0], correct_rep_v=[1, 1], correct_rep_k=[0, 1], correct_rep_vk=[1, 0], h_v=[0, 1],
                h_k=[0, 0], h_r=[1, 0])
    assert list(metric("clinhallu").compute(**base, sources=pd.Series([3.0, 3]))["per_source"]) == ["3"]


def test_clinhallu_leaves_a_missing_source_out_of_per_source():
    """Reproduction: per_source grouped str(source), so a missing source (None, NaN) was a source named "None", one
    group with an item whose source is the text "None"; close_ended_accuracy and stepbench leave a missing label out
    of their groups."""
    base = dict(correct=[1, 0, 1], correct_rep_v=[1, 1, 0], correct_rep_k=[0, 1, 1], correct_rep_vk=[1, 0, 0],
                h_v=[0, 1, 0], h_k=[0, 0, 1], h_r=[1, 0, 0])
    out = metric("clinhallu").compute(**base, sources=["a", None, float("nan")])
    assert list(out["per_source"]) == ["a"] and out["per_source"]["a"]["counts"]["n"] == 1
    named = metric("clinhallu").compute(**base, sources=["a", "None", None])["per_source"]
    assert sorted(named) == ["None", "a"] and named["None"]["counts"]["n"] == 1


def test_radcliq_components_numpy_numbers_count_and_percentages_are_refused():
    """Reproductions: numpy float32 components were all "skipped" as missing (n 0, radcliq None); a BERTScore
    given in percent (text_generation's bertscore_per_item, 0-100) gave RadCliQ -105.7 without a word; a string
    or a list component was skipped as if missing."""
    base = dict(radgraph_combined=[0.5, 0.4], bertscore=[0.6, 0.7], semb_score=[0.3, 0.2], bleu_score=[0.2, 0.1])
    expected = compute("radcliq", ["a", "b"], ["a", "b"], **base)
    as_numpy = {key: np.array(values, dtype=np.float32) for key, values in base.items()}
    out = compute("radcliq", ["a", "b"], ["a", "b"], **as_numpy)
    assert out["n"] == 2 and out["n_skipped"] == 0
    assert out["radcliq"] == pytest.approx(expected["radcliq"], abs=1e-6)
    with pytest.raises(ValueError, match=r"^bertscore\[0\] is 60\.0, above 1; give it as a fraction: "
                                         r"text_generation's bertscore_per_item is on a 0-100 scale, divide it by 100"):
        compute("radcliq", ["a", "b"], ["a", "b"], **{**base, "bertscore": [60.0, 70.0]})
    with pytest.raises(ValueError, match=r"^radgraph_combined\[1\] is 1\.5, outside \[0, 1\]"):
        compute("radcliq", ["a", "b"], ["a", "b"], **{**base, "radgraph_combined": [0.5, 1.5]})
    for bad, shown in (("0.5", "str '0.5'"), ([0.5], r"list \[0\.5\]"), (True, "bool True")):
        with pytest.raises(ValueError, match=rf"^semb_score\[1\] is {shown}; pass a number \(None where it is"):
            compute("radcliq", ["a", "b"], ["a", "b"], **{**base, "semb_score": [0.3, bad]})
    # missing values are still skipped and counted, never scored
    out = compute("radcliq", ["a", "b"], ["a", "b"], **{**base, "semb_score": [0.3, float("inf")]})
    assert out["n"] == 1 and out["skipped"] == {"1": ["semb_score"]}


def test_radcliq_components_at_float32_rounding_of_their_bound_are_accepted():
    """Reproduction: the float32 scores of an identical pair, bert_score's baseline-rescaled F1 1.0000006 and a
    float32 cosine 1.0000001, were refused as "bertscore[0] is 1.0000005960464478, above 1; ... divide it by
    100" (a slack of 1e-9, below float32's step of 1.2e-7 at 1); they scored before the range check."""
    base = dict(radgraph_combined=[1.0, 0.4], bertscore=[1.0000005960464478, 0.7],
                semb_score=[float(np.float32(1.0000001)), 0.2], bleu_score=[1.0, 0.1])
    out = compute("radcliq", ["a", "b"], ["a", "c"], **base)
    assert out["n"] == 2 and out["n_skipped"] == 0
    assert compute("radcliq", ["a", "b"], ["a", "c"], **{**base, "semb_score": np.array([1.0000001, 0.2],
                                                                                         dtype=np.float32)})["n"] == 2
    with pytest.raises(ValueError, match=r"^bertscore\[0\] is 1\.001, above 1"):  # past rounding: refused
        compute("radcliq", ["a", "b"], ["a", "c"], **{**base, "bertscore": [1.001, 0.7]})
    with pytest.raises(ValueError, match=r"^semb_score\[1\] is -1\.001, outside \[-1, 1\]"):
        compute("radcliq", ["a", "b"], ["a", "c"], **{**base, "semb_score": [0.3, -1.001]})


def test_radgraph_f1_names_a_malformed_given_graph():
    """Reproduction: a graph that is not a dict failed with "a RadGraph graph must be a dict ...", no index."""
    graph = {"text": "x", "entities": {}}
    with pytest.raises(ValueError, match=r"^reference_graphs\[1\] is str 'x', not a RadGraph graph"):
        compute("radgraph_f1", ["a", "b"], ["a", "b"], prediction_graphs=[graph, graph], reference_graphs=[graph, "x"])


def test_clinhallu_judgements_are_whole_numbers_not_coerced():
    """Reproductions: correct=[1, 0.5] was stored as int8 0 (scored wrong), "1" as 1, "yes" failed with
    "invalid literal for int()", 300 with an unnamed format error; correct="10" was read as [1, 0]; a list
    source was grouped as the text "['a']"."""
    base = dict(correct=[1, 0], correct_rep_v=[1, 1], correct_rep_k=[0, 1], correct_rep_vk=[1, 0], h_v=[0, 1],
                h_k=[0, 0], h_r=[1, 0])
    clinhallu = metric("clinhallu")
    for bad, message in ((0.5, r"is 0\.5, not a whole number"), ("1", "is str '1', not a number"),
                         (300, r"is 300, out of the range of int8")):
        with pytest.raises(ValueError, match=rf"^correct\[1\] {message}"):
            clinhallu.compute(**{**base, "correct": [1, bad]})
    with pytest.raises(ValueError, match=r"^correct is a single str \('10'\), not a list"):
        clinhallu.compute(**{**base, "correct": "10"})
    with pytest.raises(ValueError, match=r"^sources\[0\] is list \['a'\]; pass a string or a whole number \(or None\)"):
        clinhallu.compute(**base, sources=[["a"], "b"])
    # pandas' float columns (1.0 / 0.0 / NaN) still read as judgements
    expected = clinhallu.compute(**base)
    assert clinhallu.compute(**{**base, "correct": pd.Series([1.0, 0.0])}) == expected


def test_clinhallu_numpy_bool_judgements_score_as_python_bools():
    """Reproduction: correct=np.array([True, False]) (a bool column's .to_numpy()) was refused with "correct[0] is
    bool np.True_, not a number" while [True, False] scored; it scored before the per-index checks too. A pandas
    "boolean" column (True / False / <NA>) reads the same."""
    base = dict(correct=[1, 0], correct_rep_v=[1, 1], correct_rep_k=[0, 1], correct_rep_vk=[1, 0], h_v=[0, 1],
                h_k=[0, 0], h_r=[1, 0])
    clinhallu = metric("clinhallu")
    expected = clinhallu.compute(**{**base, "correct": [True, False]})
    assert clinhallu.compute(**{**base, "correct": np.array([True, False])}) == expected
    assert clinhallu.compute(**{**base, "h_v": np.array([False, True])}) == expected
    assert (clinhallu.compute(**{**base, "correct": pd.array([True, None], dtype="boolean")})
            == clinhallu.compute(**{**base, "correct": [1, None]}))


# -- the judge metrics ------------------------------------------------------------------------------------------


def test_sh_judge_empty_and_generator_inputs(judge_server_factory, tmp_path):
    """Reproductions: empty inputs failed with IndexError inside evaluate (its choice between the string and the
    list-of-strings format reads row 0); a generator of predictions was consumed by the multi-mode test in
    compute, leaving none to score (IndexError)."""
    sh = metric("sh_judge")
    out = sh.compute(predictions=[], references=[], judge="openai:m@http://127.0.0.1:9/v1", credentialed=False,
                     cache_dir=str(tmp_path))
    assert out["n"] == 0 and out["sh"] is None and out["failed"] == []
    server = judge_server_factory("openai", lambda request: '{"score": 2, "rationale": "r"}')
    out = sh.compute(predictions=(p for p in ["a", "b"]), references=["r", "s"], credentialed=False,
                     judge=f"openai:m@{server.base_url}", cache_dir=str(tmp_path))
    assert out["scores"] == [2, 2] and out["n"] == 2
    with pytest.raises(ValueError, match=r"^predictions\[1\] is str 'c', not a list of strings"):
        sh.compute(predictions=[["a", "b"], "c"], references=["r", "s"], mode="multi", credentialed=False,
                   judge=f"openai:m@{server.base_url}", cache_dir=str(tmp_path))
    with pytest.raises(ValueError, match=r"^predictions\[1\] is str 'b': with answers given as dicts"):
        sh.compute(predictions=[{"m1": "a"}, "b"], references=["r", "s"], credentialed=False,
                   judge=f"openai:m@{server.base_url}", cache_dir=str(tmp_path))


# -- the re-scoring path (run_eval.py --predictions FILE) --------------------------------------------------------


def test_a_predictions_file_with_a_surrogate_names_the_line(tmp_path):
    """Reproduction: a JSON "\\ud800" escape passed the file check and the run stopped later with
    "error: 'utf-8' codec can't encode character '\\ud800' in position 120", naming no line or record."""
    from medheval.backends.base import BackendError
    from medheval.backends.predictions import PredictionsFileBackend

    path = tmp_path / "p.jsonl"
    path.write_text('{"id": "a/1", "prediction": "No."}\n{"id": "a/2", "prediction": "No\\ud800."}\n')
    with pytest.raises(BackendError, match=r"line 2 \(id 'a/2'\): the prediction holds a surrogate code point U\+D800 "
                                           r"at character 2"):
        PredictionsFileBackend(path)
    path.write_text('{"id": "a/1", "prediction": "No \\ud83d\\ude37."}\n')  # a whole pair is fine
    assert PredictionsFileBackend(path).generate([{"id": "a/1"}]) == ["No \U0001f637."]


def test_shared_checks_directly():
    from medheval.scoring.metric_inputs import number_column, per_item_column, surrogate_problem

    assert surrogate_problem("fine 😷") is None and "U+DFFF at character 1" in surrogate_problem("a\udfff")
    assert per_item_column("sources", pd.Series(["a", np.nan, None]), 3, kind="label") == ["a", None, None]
    with pytest.raises(ValueError, match=r"^sources is a single str"):
        per_item_column("sources", "abc", 3)
    with pytest.raises(ValueError, match=r"^sources is a DataFrame: pass one of its columns"):
        per_item_column("sources", pd.DataFrame({"a": [1, 2, 3]}), 3)  # iterating it gives the column names
    assert number_column("x", [np.float32(0.5), None, math.nan, math.inf], 4, 0, 1) == [0.5, None, None, None]


def test_medihall_score_takes_its_answer_types_as_a_pandas_series():
    """``answer_types=df["type"]`` failed with "The truth value of a Series is ambiguous" where the task is
    chosen (irg when every type is "report"); a Series now scores as its list does."""
    args = dict(predictions=["Yes", "No"], references=["yes", "yes"])
    types = ["yes_no", "yes_no"]
    expected = metric("medihall_score").compute(**args, answer_types=types)
    for convert in (lambda v: pd.Series(v, index=[3, 5]), np.array):
        assert metric("medihall_score").compute(**args, answer_types=convert(types)) == expected
