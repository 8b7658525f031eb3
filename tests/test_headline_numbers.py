"""Issue 32, point 3: one definition of a split's headline numbers (medheval.scoring.headline) feeds the
published ``.eval_results``, ``eval.yaml``, lmms-eval's metric list and inspect's split metric; a metric's
setting (``text_generation``'s ``bertscore_num_layers``) or count is never published as a score."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from medheval.cli import main
from medheval.data.benchmarks import prepare_benchmark
from medheval.data.registry import list_units
from medheval.integrations.lmms_eval import TASKS_DIR
from medheval.publish import hub
from medheval.publish.eval_yaml import eval_yaml
from medheval.scoring.headline import (HEADLINE_NUMBERS, UNITS, headline_numbers, headline_unit, headline_values,
                                       unit_label)

from test_integrations_lmms_eval import _load


def test_every_metric_unit_declares_its_headline_numbers():
    assert set(HEADLINE_NUMBERS) == set(list_units("metrics"))
    for metric, numbers in HEADLINE_NUMBERS.items():
        keys = [key for key, *_ in numbers]
        assert keys and len(set(keys)) == len(keys), metric
        assert not any(key == "n" or key.startswith(("n_", "bertscore_")) or key.endswith("_std") for key in keys)
        assert all(unit in UNITS for *_, unit in numbers), metric  # every published number names its scale


def test_text_metrics_are_percent_and_shares_are_fractions():
    assert headline_unit("text_generation", "rougeL") == "percent" and unit_label("percent") == "percent (0-100)"
    assert headline_unit("close_ended_accuracy", "accuracy") == "fraction" and unit_label("fraction") == "fraction (0-1)"
    assert headline_unit("radcliq", "radcliq") == "unbounded" == unit_label("unbounded")
    assert headline_unit("text_generation", "bleu_per_item") is None


def test_hallucination_scores_are_lower_is_better():
    """A number that counts hallucination (CHAIR, ClinHallu's H rates, S_h: a 0-5 rating where 5 is entirely
    hallucinated, MedHEval section 4.2; RadCliQ: an error count) is published as lower-is-better."""
    lower = {(metric, key) for metric, numbers in HEADLINE_NUMBERS.items() for key, better, _ in numbers if not better}
    assert lower == {("chair", "chair"), ("chair", "chair_s"), ("sh_judge", "sh"), ("clinhallu", "h_v"),
                     ("clinhallu", "h_k"), ("clinhallu", "h_r"), ("radcliq", "radcliq")}


def test_settings_counts_and_none_are_never_headline_numbers():
    values = {"bleu": 0.25, "rougeL": 0.5, "meteor": None, "bertscore_num_layers": 17, "n": 4, "n_empty": 0,
              "bertscore_rescaled": False, "bleu_per_item": [25.0]}
    assert headline_numbers("text_generation", values) == {"bleu": 0.25, "rougeL": 0.5}
    assert headline_values({"text_generation": values}) == {"text_generation/bleu": 0.25, "text_generation/rougeL": 0.5}
    assert headline_numbers("unknown_metric", {"x": 1.0}) == {}


@pytest.mark.parametrize("benchmark, config", [("vishal_report", "default"), ("cxr_vishal", "mimic_cxr")])
def test_one_definition_feeds_all_four_consumers(benchmark, config, fixture_benchmark, tmp_path):
    """`medheval run --predictions` on the fixture split, then: the published task ids, eval.yaml's task ids,
    lmms-eval's metric names and inspect's split-metric names are the same numbers, and the published values
    are the run's."""
    records = prepare_benchmark(benchmark, config, data_dir=fixture_benchmark["data_dir"]).dataset.to_list()
    path = tmp_path / "answers.jsonl"
    path.write_text("".join(json.dumps({"id": r["id"], "prediction": str(r["answer"]) if i % 2 else "No finding."})
                            + "\n" for i, r in enumerate(records)))
    assert main(["run", "--benchmark", f"{benchmark}:{config}", "--predictions", str(path), "--output",
                 str(tmp_path / "run"), "--data-dir", fixture_benchmark["data_dir"]]) == 0
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    metrics = results["benchmarks"][f"{benchmark}:{config}"]["metrics"]
    published = {entry["dataset"]["task_id"]: entry["value"]
                 for entries in hub.eval_results_entries(results, allow=["fixture"]).values() for entry in entries}
    in_eval_yaml = {task["id"] for task in eval_yaml(benchmark, [config])["tasks"]}
    in_lmms_eval = {f"{config}/" + m["metric"].replace(".", "/")
                    for m in _load(TASKS_DIR / f"medheval_{benchmark}_{config}.yaml")["metric_list"]}
    in_inspect = {f"{config}/{name}" for name in headline_values(metrics)}
    assert published.keys() == in_eval_yaml == in_lmms_eval == in_inspect
    keys = [task_id.rsplit("/", 1)[1] for task_id in published]
    assert not any(key == "n" or key.startswith(("n_", "bertscore")) for key in keys)
    for task_id, value in published.items():
        _, metric, key = task_id.split("/")
        assert value == metrics[metric][key]
    if benchmark == "vishal_report":  # the case: 16 entries, 10 on no leaderboard, a setting among them
        assert "bertscore_num_layers" in metrics["text_generation"]
        assert len(published) == len(in_eval_yaml) == 6
