"""metrics/radcliq: RadCliQ-v1 from its component metrics (Yu et al., 2023), lower is better."""

from __future__ import annotations

import math
from types import SimpleNamespace

import datasets
import evaluate
import pytest
from conftest import REPO

METRIC_DIR = REPO / "metrics" / "radcliq"


@pytest.fixture(scope="module")
def metric():
    return evaluate.load(str(METRIC_DIR))


def test_known_answer_from_component_values(metric):
    """Hand-worked RadCliQ-v1 (Yu et al. 2023; normaliser and coefficients of CXR-Report-Metric's radcliq-v1.pkl).

    Pair 1, x = (radgraph 0.5, bertscore 0.5, semb 0.8, bleu 0.3):
      z = ((0.5 - 0.537923) / 0.302826, (0.5 - 0.617573) / 0.224309, (0.8 - 0.764794) / 0.253944,
           (0.3 - 0.447383) / 0.298927) = (-0.125231, -0.524154, 0.138636, -0.493041)
      RadCliQ = -0.377084 * -0.125231 - 0.370300 * -0.524154 - 0.252616 * 0.138636 + 4.3e-12 * -0.493041 + 2.5e-10
              = 0.047222 + 0.194094 - 0.035022 + 0.000000 = 0.206295
    Pair 2, every component at its normaliser mean: z = 0, RadCliQ = intercept = 2.47e-10 (about 0).
    Pair 3, x = (1, 1, 1, 1), a perfect report: z = (1.525883, 1.704911, 0.926212, 1.848667),
      RadCliQ = -0.575384 - 0.631329 - 0.233977 + 0.000000 = -1.440690 (lower than pair 1: better).
    Mean = (0.206295 + 0 - 1.440690) / 3 = -0.411465.
    """
    out = metric.compute(
        predictions=["a", "b", "c"], references=["a", "b", "c"],
        radgraph_combined=[0.5, 0.5379231241355762, 1.0], bertscore=[0.5, 0.6175725628125001, 1.0],
        semb_score=[0.8, 0.7647942121140658, 1.0], bleu_score=[0.3, 0.44738335396242174, 1.0])
    assert out["radcliq_per_item"] == pytest.approx([0.206295, 0.0, -1.440690], abs=1e-6)
    assert out["radcliq"] == pytest.approx(-0.411465, abs=1e-6)
    assert out["n"] == 3 and out["n_skipped"] == 0 and out["lower_is_better"] is True
    assert out["comparable"] is True and out["components"]["bertscore"]["source"] == "given"


def test_better_components_lower_the_score(metric):
    """Invariant: the three weighted components have negative coefficients, so raising any of them lowers
    RadCliQ-v1 (fewer expected errors)."""
    base = dict(radgraph_combined=[0.4], bertscore=[0.4], semb_score=[0.4], bleu_score=[0.4])
    start = metric.compute(predictions=["x"], references=["y"], **base)["radcliq"]
    for name in ("radgraph_combined", "bertscore", "semb_score"):
        raised = metric.compute(predictions=["x"], references=["y"], **{**base, name: [0.9]})["radcliq"]
        assert raised < start, name


def test_bleu2_computed_from_the_texts_when_not_given(metric):
    """BLEU-2 on CXR-Report-Metric's words: "no effusion." -> [no, effusion, .]; identical texts give 1,
    disjoint texts 0 (1-gram precision 0). Its coefficient is 4.3e-12, so RadCliQ barely moves."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("radcliq_module", METRIC_DIR / "radcliq.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module._words("No  Effusion.") == ["no", "effusion", "."]
    assert module.bleu2("No effusion.", "no effusion.") == pytest.approx(1.0)
    assert module.bleu2("cardiomegaly", "no effusion") == pytest.approx(0.0, abs=1e-9)
    out = metric.compute(predictions=["No effusion."], references=["no effusion."], radgraph_combined=[0.5],
                         bertscore=[0.5], semb_score=[0.8])
    assert out["components"]["bleu_score"]["source"].startswith("computed here")
    assert out["components"]["bleu_score"]["mean"] == pytest.approx(1.0)
    assert out["radcliq"] == pytest.approx(0.206295, abs=1e-6)


def test_missing_components_are_counted_and_absent_ones_are_an_error(metric):
    out = metric.compute(predictions=["a", "b"], references=["a", "b"], radgraph_combined=[0.5, None],
                         bertscore=[0.5, 0.5], semb_score=[0.8, float("nan")], bleu_score=[0.3, 0.3])
    assert out["n"] == 1 and out["n_skipped"] == 1 and out["skipped"] == {"1": ["radgraph_combined", "semb_score"]}
    assert out["radcliq_per_item"][1] is None and out["radcliq"] == pytest.approx(0.206295, abs=1e-6)
    with pytest.raises(ValueError, match=r"needs per-report \['radgraph_combined', 'semb_score'\].*--metrics"):
        metric.compute(predictions=["a"], references=["a"], bertscore=[0.5])
    in_run = metric.compute(predictions=["a", "b"], references=["a", "b"], run_results={
        "radgraph_f1": {"radgraph_f1_per_item": [0.5, 0.5]},
        "text_generation": {"bertscore_per_item": None, "bertscore_unavailable_reason": "no weights at /x"}})
    assert in_run["n"] == 0 and in_run["n_failed"] == 2 and in_run["radcliq"] is None
    assert "['bertscore', 'semb_score']" in in_run["unavailable_reason"]
    assert in_run["unavailable_reason"].endswith("text_generation ran without BERTScore: no weights at /x")
    from medheval.run.runner import failed_on_every_item

    assert failed_on_every_item(in_run)  # the run warns and exits non-zero, keeping the predictions
    with pytest.raises(ValueError, match="Mismatch in the number of predictions"):
        metric.compute(predictions=["a"], references=["a"], radgraph_combined=[0.5, 0.5], bertscore=[0.5],
                       semb_score=[0.5])


def test_components_from_run_results_and_notes_on_differing_settings(metric):
    """In a run, the components come from the other metrics' outputs; a BERTScore that is not RadCliQ-v1's
    (roberta-large, unrescaled) and RadGraph's native empty-graph rule are named in component_notes."""
    run_results = {
        "radgraph_f1": {"radgraph_f1_per_item": [0.5], "upstream_compat": False},
        "chexbert_similarity": {"similarities": [0.8]},
        "text_generation": {"bertscore_per_item": [50.0], "bertscore_model": "roberta-large",
                            "bertscore_num_layers": 17, "bertscore_rescaled": False, "bertscore_idf": False},
    }
    out = metric.compute(predictions=["x"], references=["x"], bleu_score=[0.3], run_results=run_results)
    assert out["radcliq"] == pytest.approx(0.206295, abs=1e-6)
    assert out["components"]["bertscore"]["source"] == "text_generation.bertscore_per_item / 100"
    assert out["comparable"] is False and len(out["component_notes"]) == 2
    assert "roberta-large" in out["component_notes"][1] and "empty graphs" in out["component_notes"][0]
    run_results["radgraph_f1"]["upstream_compat"] = True
    run_results["text_generation"].update(bertscore_model="/models/distilroberta-base/", bertscore_num_layers=5,
                                          bertscore_rescaled=True)
    out = metric.compute(predictions=["x"], references=["x"], bleu_score=[0.3], run_results=run_results)
    assert out["comparable"] is True and out["component_notes"] == []


def test_runner_computes_radcliq_after_its_components(metric):
    """`score()` runs metrics taking `run_results` last, whatever the order asked, and hands them the outputs
    of the others: radgraph_f1 (graphs given, no model) feeds radgraph_combined."""
    from medheval.run.runner import score

    entity = {"tokens": "effusion", "label": "OBS-DP", "start_ix": 0, "end_ix": 0, "relations": []}
    other = {**entity, "tokens": "pneumothorax"}
    rows = [{"id": f"r{i}", "answer": "effusion", "category": None, "source": "mimic_cxr", "answer_type": "report",
             "images": [], "meta": {}} for i in range(2)]
    loaded = SimpleNamespace(dataset=datasets.Dataset.from_list(rows), name="vishal_report", config="all",
                             resolver=None)
    graphs = {"prediction_graphs": [{"text": "", "entities": {"1": entity}}, {"text": "", "entities": {"1": other}}],
              "reference_graphs": [{"text": "", "entities": {"1": entity}}] * 2}
    results, items = score(loaded, {"r0": "effusion", "r1": "pneumothorax"}, ["radcliq", "radgraph_f1"],
                           {"radgraph_f1": graphs, "radcliq": {"bertscore": [0.5, 0.5], "semb_score": [0.8, 0.8],
                                                               "bleu_score": [0.3, 0.3]}})
    assert list(results) == ["radgraph_f1", "radcliq"]
    # pair 0: entity F1 1, relation F1 1 (both empty: native rule) -> 1; pair 1: 0 and 1 -> 0.5
    assert [item["radgraph_f1_per_item"] for item in items] == [1.0, 0.5]
    assert results["radcliq"]["components"]["radgraph_combined"]["source"] == "radgraph_f1.radgraph_f1_per_item"
    expected_0 = -0.37708368261038905 * (1.0 - 0.5379231241355762) / 0.3028258411486429 + 0.206295 - 0.047222
    assert items[0]["radcliq_per_item"] == pytest.approx(expected_0, abs=1e-5)
    assert items[1]["radcliq_per_item"] == pytest.approx(0.206295, abs=1e-6)
    assert not math.isnan(results["radcliq"]["radcliq"])
