"""Med-HallMark Table 1 in the paper's shape (issue 22, point 4) and the CHAIR/Recall labeler in the report's
table footers (point 9), on hand-made run folders and the real metric."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, load_metric_offline

from medheval.families import med_hallmark as mh
from medheval.report.collect import find_runs
from medheval.report.stats import FEW_CLUSTERS
from medheval.report.paper import (HALLMARK_VQA_POOL, build_tables, format_cell, med_hallmark, report_metrics,
                                   to_markdown)

TEXT_KEYS = ("bertscore", "meteor", "rouge1", "rouge2", "rougeL", "bleu")


def _split(items: list[dict[str, Any]], levels: list[str | list[str]], bertscore: list[float], task: str) -> dict:
    """results.json entry + scored rows of one Med-HallMark split: every text metric per item = ``bertscore``
    (so each column's pooled mean is worked out once), MediHall item scores from ``levels``."""
    scores = [mh.WEIGHTS[lv] if task == "vqa" else mh.report_score(lv) for lv in levels]
    for item, level, value, score in zip(items, levels, bertscore, scores):
        item.update({f"{key}_per_item": value for key in TEXT_KEYS}, levels=level, item_scores=score)
        if task == "vqa":
            item["correct"] = level == "correct"
    medihall = {"medihall_score": sum(scores) / len(scores), "n": len(scores), "task": task,
                "accuracy": mh.vqa_accuracy(levels) if task == "vqa" else None,
                "level_distribution": mh.level_distribution(
                    levels if task == "vqa" else [s for lv in levels for s in lv],
                    mh.VQA_LEVELS if task == "vqa" else mh.IRG_LEVELS)}
    text = {key: sum(bertscore) / len(bertscore) for key in TEXT_KEYS} | {"n": len(bertscore)}
    return {"n_records": len(items), "n_scored": len(items), "cluster_unit": "image",
            "skipped_missing_images": {"count": 0, "examples": []}, "data_quality": {},
            "metrics": {"medihall_score": medihall, "text_generation": text}}


def write_hallmark_run(folder: Path, model: str = "m", mitigation: str = "none") -> Path:
    """Four splits. conventional: images a, b; levels correct, attribute; BS 60, 40.
    confidence_weakening: images a (the same VQA-RAD image as conventional's first), c; correct, minor; BS 70, 50.
    counterfactual: image d; prompt_induced; BS 10. irg: one report, sentences correct, critical; BS 55."""
    plan = {"conventional": (["a", "b"], ["correct", "attribute"], [60.0, 40.0], "vqa"),
            "confidence_weakening": (["a", "c"], ["correct", "minor"], [70.0, 50.0], "vqa"),
            "counterfactual": (["d"], ["prompt_induced"], [10.0], "vqa"),
            "irg": (["r"], [["correct", "critical"]], [55.0], "irg")}
    folder.mkdir(parents=True)
    benchmarks, rows = {}, []
    for config, (images, levels, bs, task) in plan.items():
        split = f"med_hallmark:{config}"
        items = [{"id": f"med_hallmark/{config}/{i}", "split": split, "prediction": "p", "reference": "r",
                  "images": [image], "cluster": f"image:{image}", "category": config, "source": "vqa_rad",
                  "answer_type": "report" if task == "irg" else "open", "model": model, "mitigation": mitigation}
                 for i, image in enumerate(images)]
        benchmarks[split] = _split(items, levels, bs, task)
        rows += items
    results = {"settings": {"model": model, "mitigation": mitigation}, "labels": {}, "warnings": [],
               "benchmarks": benchmarks}
    (folder / "results.json").write_text(json.dumps(results))
    (folder / "scored.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    (folder / "predictions.jsonl").write_text("".join(json.dumps(
        {"id": row["id"], "prediction": "p", "model": model, "mitigation": mitigation}) + "\n" for row in rows))
    return folder


def test_vqa_accuracy_is_the_share_of_correct_levels_as_in_table3():
    """Med-HallMark Table 3 (items 1-4 of its Figure 2(b)): MediHall Scores 1.0, 1.0, 0.6 (prompt-induced),
    0.4 (attribute) with Accuracy 1, 1, 0, 0. So ACC = 2/4 = 0.5 while the MediHall Score is
    (1 + 1 + 0.6 + 0.4)/4 = 0.75; an unclassified answer (None) is left out of both."""
    levels = ["correct", "correct", "prompt_induced", "attribute", None]
    assert mh.vqa_correct(levels) == [True, True, False, False, None]
    assert mh.vqa_accuracy(levels) == 0.5
    assert mh.medihall_score([None if lv is None else mh.WEIGHTS[lv] for lv in levels]) == pytest.approx(0.75)
    assert mh.vqa_accuracy([None]) is None


def test_medihall_metric_fills_acc_for_vqa_and_leaves_it_empty_for_irg():
    """The rule classifier on two yes/no answers to "Is there a fracture?" (reference "No"): "No" is correct
    (1.0), "Yes" fabricates a finding, a presence question: catastrophic (0.0). ACC = 1/2, MediHall = 0.5.
    A report (task irg) has no ACC in Table 1: ``accuracy`` is None and no per-item ``correct``."""
    metric = load_metric_offline(REPO / "metrics" / "medihall_score")
    out = metric.compute(predictions=["No", "Yes"], references=["No", "No"],
                         questions=["Is there a fracture?"] * 2, answer_types=["yes_no"] * 2, task="vqa")
    assert out["levels"] == ["correct", "catastrophic"]
    assert out["accuracy"] == 0.5 and out["correct"] == [True, False] and out["medihall_score"] == 0.5
    irg = metric.compute(predictions=["The heart is normal."], references=["The heart is normal."], task="irg")
    assert irg["accuracy"] is None and "correct" not in irg


def test_table1_pools_conventional_and_confidence_weakening(tmp_path):
    """Med-HallMark Table 1 shape. Med-VQA pools the conventional and confidence-weakening items (the paper
    reports counterfactual apart, supplementary Table 6), so from :func:`write_hallmark_run`:
    BS = (60 + 40 + 70 + 50)/4 = 55.0 (each split's own mean, 50 and 60, weighted by n = 2);
    MediHall = (1.0 + 0.4 + 1.0 + 0.8)/4 = 0.80; ACC = 2 correct / 4 = 0.50. The counterfactual item
    (BS 10, MediHall 0.6) is not in it. Clusters: images a, b, c (a is shared by the two splits) = 3, fewer than
    the 6 an interval needs, so the cells say why they have none.
    IRG: BS 55.0, MediHall = (1.0 + 0.2)/2 = 0.60, ACC "–"."""
    runs = find_runs([write_hallmark_run(tmp_path / "run")])
    table1, detail, levels = med_hallmark(runs)
    assert HALLMARK_VQA_POOL == ("conventional", "confidence_weakening")
    assert [c.label for c in table1.columns] == ["BS", "MR", "R-1", "R-2", "R-L", "BLEU", "MediHall Score", "ACC"]
    assert [labels for labels, _ in table1.rows] == [["m", "none", "Med-VQA", "conventional + confidence_weakening"],
                                                    ["m", "none", "IRG", "irg"]]
    vqa = dict(zip([c.label for c in table1.columns], table1.rows[0][1]))
    irg = dict(zip([c.label for c in table1.columns], table1.rows[1][1]))
    for label in ("BS", "MR", "R-1", "R-2", "R-L", "BLEU"):
        assert vqa[label].value == pytest.approx(55.0) and irg[label].value == pytest.approx(55.0)
    assert vqa["MediHall Score"].value == pytest.approx(0.80) and vqa["ACC"].value == pytest.approx(0.50)
    assert vqa["ACC"].n == 4 and vqa["ACC"].n_clusters == 3 and vqa["ACC"].low is None
    assert vqa["ACC"].note == FEW_CLUSTERS
    assert format_cell(vqa["ACC"]) == "0.50 †" and format_cell(vqa["MediHall Score"]) == "0.80 †"
    assert irg["MediHall Score"].value == pytest.approx(0.60) and format_cell(irg["ACC"]) == "–"
    # per-type detail rows follow, with and ACC filled (counterfactual: 0 of 1 correct)
    assert [labels[2] for labels, _ in detail.rows] == [f"med_hallmark:{c}" for c in (
        "conventional", "confidence_weakening", "counterfactual", "irg")]
    columns = [c.label for c in detail.columns]
    assert {"R-1", "R-2", "ACC"} <= set(columns)
    assert [row[columns.index("ACC")].value for _, row in detail.rows][:3] == [0.5, 0.5, 0.0]
    assert levels.key == "med_hallmark_levels"


def test_table1_markdown_names_the_pool_and_acc(tmp_path):
    """The rendered table says which question types Med-VQA pools and how ACC is defined."""
    tables = {t.key: t for t in build_tables(find_runs([write_hallmark_run(tmp_path / "run")]))}
    text = to_markdown(tables["med_hallmark_table1"])
    assert "conventional and confidence-weakening" in text and "Table 6" in text and "ACC" in text
    assert "| m | none | Med-VQA | conventional + confidence_weakening | 55.0 †" in text
    assert f"No interval (†): {FEW_CLUSTERS}." in text


def _report_run(folder: Path, mitigation: str, chair: dict[str, Any]) -> Path:
    folder.mkdir(parents=True)
    results = {"settings": {"model": "m", "mitigation": mitigation}, "labels": {}, "warnings": [], "benchmarks": {
        "vishal_report:all": {"n_records": 2, "n_scored": 2, "skipped_missing_images": {"count": 0, "examples": []},
                              "data_quality": {}, "metrics": {"chair": chair}}}}
    (folder / "results.json").write_text(json.dumps(results))
    return folder


def test_report_footer_names_the_chair_labeler_and_the_papers_chexbert(tmp_path):
    """MedHEval Tables 5-6 take CHAIR and Recall from CheXbert's labels. A split scored by the offline rule
    labeler (chair's labeler 'chexpert_rules') says so in the table footer, with the CheXbert note; a run
    scored by CheXbert names it; a results.json without the labeler says it is not recorded."""
    _report_run(tmp_path / "g" / "none", "none", {"chair": 0.25, "recall": 0.5, "labeler": "chexpert_rules"})
    _report_run(tmp_path / "g" / "vcd", "vcd", {"chair": 0.2, "recall": 0.4, "labeler": "chexbert"})
    tables = {t.key: t for t in build_tables(find_runs([tmp_path / "g"]))}
    footer = tables["medheval_report"].footer
    line = [f for f in footer if f.startswith("CHAIR and Recall labeler")]
    assert line == ["CHAIR and Recall labeler — vishal_report:all: chexpert_rules / chexbert (the offline rule "
                    "labeler; the MedHEval paper labelled reports with CheXbert)."]
    assert line[0] in to_markdown(tables["medheval_report"])

    only_chexbert = report_metrics(find_runs([tmp_path / "g" / "vcd"]))
    assert only_chexbert is not None
    from medheval.report.paper import labeler_footer

    assert labeler_footer(find_runs([tmp_path / "g" / "vcd"]), only_chexbert) == [
        "CHAIR and Recall labeler — vishal_report:all: chexbert."]
    _report_run(tmp_path / "old", "none", {"chair": 0.25, "recall": 0.5})
    old = find_runs([tmp_path / "old"])
    assert "not recorded" in labeler_footer(old, report_metrics(old))[0]


def test_results_md_shows_acc_and_rouge_beside_the_medihall_score(tmp_path):
    """The single-run ``results.md`` carries Med-HallMark Table 1's columns for one run: R-1, R-2 and the
    MediHall Score next to ACC. Levels correct, correct, prompt_induced, attribute (the paper's Table 3 items):
    MediHall = (1 + 1 + 0.6 + 0.4)/4 = 0.75, ACC = 2/4 = 0.50. The IRG split has no ACC (Table 1 leaves it
    empty): its cell is "–", not 0."""
    from medheval.report.tables import write_markdown

    levels = ["correct", "correct", "prompt_induced", "attribute"]
    vqa = {"medihall_score": {"medihall_score": mh.medihall_score([mh.WEIGHTS[lv] for lv in levels]),
                              "accuracy": mh.vqa_accuracy(levels), "task": "vqa"},
           "text_generation": {"rouge1": 41.5, "rouge2": 20.25, "rougeL": 30.0}}
    irg = {"medihall_score": {"medihall_score": 0.3, "accuracy": None, "task": "irg"},
           "text_generation": {"rouge1": 12.0, "rouge2": 3.5, "rougeL": 10.0}}
    run = {"settings": {"model": "m", "mitigation": "none"},
           "benchmarks": {split: {"metrics": metrics, "n_records": 4, "n_scored": 4, "data_quality": {},
                                  "skipped_missing_images": {"count": 0}}
                          for split, metrics in (("med_hallmark:conventional", vqa), ("med_hallmark:irg", irg))}}
    write_markdown(run, tmp_path / "results.md")
    text = (tmp_path / "results.md").read_text()
    assert "| Model | Mitigation | Split | ROUGE-1 | ROUGE-2 | ROUGE-L | MediHall | ACC |" in text
    assert "| m | none | med_hallmark:conventional | 41.50 | 20.25 | 30.00 | 0.75 | 0.50 |" in text
    assert "| m | none | med_hallmark:irg | 12.00 | 3.50 | 10.00 | 0.30 | – |" in text
    assert "MediHall and ACC 0–1" in text
