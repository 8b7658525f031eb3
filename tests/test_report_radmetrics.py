"""The report-metrics table (MedHEval Tables 5–6) with the ReXrank metrics RadCliQ-v1 (↓) and GREEN."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from medheval.report.collect import find_runs
from medheval.report.paper import RADCLIQ_NOTE, build_tables, to_markdown
from medheval.report.stats import FEW_CLUSTERS


def _run(folder: Path, model: str, radcliq: list[float | None], green: list[float | None], notes: list[str]) -> None:
    """A report split whose radcliq / green summaries are the means of the per-item values given."""
    folder.mkdir(parents=True)
    items = [{"id": f"vishal_report/{i}", "prediction": "p", "reference": "r", "split": "vishal_report:all",
              "model": model, "mitigation": "none", "radcliq_per_item": rc, "green_per_item": gr,
              "similarities": 0.5} for i, (rc, gr) in enumerate(zip(radcliq, green))]
    scored_rc, scored_gr = [v for v in radcliq if v is not None], [v for v in green if v is not None]
    metrics = {
        "chexbert_similarity": {"chexbert_similarity": 0.5, "n": len(items)},
        "radcliq": {"radcliq": sum(scored_rc) / len(scored_rc), "radcliq_std": 0.1, "n": len(scored_rc),
                    "n_skipped": len(radcliq) - len(scored_rc), "component_notes": notes, "comparable": not notes},
        "green": {"green": sum(scored_gr) / len(scored_gr), "n": len(scored_gr),
                  "n_failed": len(green) - len(scored_gr), "n_unparseable": len(green) - len(scored_gr),
                  "prompt_version": "green-upstream@d72c1951"},
    }
    results = {"settings": {"model": model, "mitigation": "none"}, "labels": {}, "warnings": [],
               "benchmarks": {"vishal_report:all": {"n_records": len(items), "n_scored": len(items),
                                                    "skipped_missing_images": {"count": 0, "examples": []},
                                                    "data_quality": {}, "metrics": metrics}}}
    (folder / "results.json").write_text(json.dumps(results))
    (folder / "scored.jsonl").write_text("".join(json.dumps(item) + "\n" for item in items))
    (folder / "predictions.jsonl").write_text("".join(json.dumps({"id": item["id"], "prediction": "p"}) + "\n"
                                                      for item in items))


def test_report_table_has_radcliq_lower_is_better_and_green(tmp_path):
    """Model a: RadCliQ per item (0.2, -0.4) × 3 -> -0.1, GREEN (0.6, 1.0) × 3 -> 80 %. Model b: RadCliQ (1.0, 0.6, None)
    -> 0.8 with one pair left out, GREEN (0.5, None, 0.5) -> 50 % with one unparseable reply. RadCliQ is ranked
    lower-is-better: a (-0.1) is best; GREEN higher-is-better: a (80) is best. a's 6 items give intervals; b's 2
    scored items are too few for one, and the cell says so."""
    _run(tmp_path / "a", "a", [0.2, -0.4] * 3, [0.6, 1.0] * 3, [])
    _run(tmp_path / "b", "b", [1.0, 0.6, None], [0.5, None, 0.5], ["bertscore: text_generation ran with roberta-large"])
    table = next(t for t in build_tables(find_runs([tmp_path])) if t.key == "medheval_report")
    labels = [c.label for c in table.columns]
    assert labels == ["CheXbert", "RadCliQ-v1 ↓", "GREEN"]
    assert table.columns[1].lower_is_better and not table.columns[2].lower_is_better
    cells = {labels_[0]: row for labels_, row in table.rows}
    assert cells["a"][1].value == pytest.approx(-0.1) and cells["b"][1].value == pytest.approx(0.8)
    assert cells["a"][2].value == pytest.approx(80.0) and cells["b"][2].value == pytest.approx(50.0)
    assert cells["a"][1].mark == "best" and cells["b"][1].mark == "worst" and cells["a"][2].mark == "best"
    assert cells["b"][1].n == 2 and cells["b"][2].n == 2  # intervals over the scored items only
    assert cells["a"][1].low is not None and cells["a"][1].low <= -0.1 <= cells["a"][1].high
    assert (cells["b"][1].low, cells["b"][1].note) == (None, FEW_CLUSTERS)
    footer = "\n".join(table.footer)
    assert RADCLIQ_NOTE in table.footer
    assert "RadCliQ-v1, b · none · vishal_report:all: not comparable with published RadCliQ-v1: bertscore" in footer
    assert "1 report(s) left out for a missing component" in footer
    assert "GREEN, b · none · vishal_report:all: 1 report(s) not scored (1 unparseable judge replies)" in footer
    markdown = to_markdown(table)
    assert "RadCliQ-v1 ↓" in markdown and "-0.10 ± 0.10" in markdown
