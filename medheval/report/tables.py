"""Markdown tables shaped like MedHEval's Table 3 (close-ended accuracy by hallucination category)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterable

from medheval.schema import VISUAL_CATEGORIES

CATEGORY_COLUMNS = {"anatomy": "Acc-A", "measurement": "Acc-M", "symptom": "Acc-S", "radiology": "Acc-R"}


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.1f}"


def close_ended_table(runs: Iterable[dict[str, Any]]) -> str:
    """One row per run (model + mitigation); per benchmark split: Acc-A/M/S/R (visual splits) and overall."""
    runs = list(runs)
    splits: list[str] = []
    for run in runs:
        for split, entry in run["benchmarks"].items():
            if "close_ended_accuracy" in entry["metrics"] and split not in splits:
                splits.append(split)
    if not splits:
        return ""
    header = ["Model", "Mitigation"]
    for split in splits:
        header += [f"{split} {CATEGORY_COLUMNS[c]}" for c in VISUAL_CATEGORIES if _has_category(runs, split, c)]
        header.append(f"{split} Acc")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for run in runs:
        row = [run["settings"]["model"], run["settings"]["mitigation"]]
        for split in splits:
            metric = run["benchmarks"].get(split, {}).get("metrics", {}).get("close_ended_accuracy")
            by_category = (metric or {}).get("accuracy_by_category", {})
            row += [_pct(by_category.get(c)) for c in VISUAL_CATEGORIES if _has_category(runs, split, c)]
            row.append(_pct(metric["accuracy"]) if metric else "–")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def _has_category(runs: list[dict[str, Any]], split: str, category: str) -> bool:
    return any(
        category in run["benchmarks"].get(split, {}).get("metrics", {}).get("close_ended_accuracy", {}).get(
            "accuracy_by_category", {})
        for run in runs
    )


def counts_table(run: dict[str, Any]) -> str:
    """Per split: records, scored, unparsed predictions, unusable references, skipped images, flagged items."""
    header = ["Split", "Records", "With prediction", "Unparsed", "Bad reference", "Skipped (missing image)", "Flagged upstream"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for split, entry in run["benchmarks"].items():
        metric = entry["metrics"].get("close_ended_accuracy", {})
        lines.append("| " + " | ".join(str(v) for v in [
            split, entry["n_records"], entry["n_scored"], metric.get("n_unparsed", "–"),
            metric.get("n_bad_reference", "–"), entry["skipped_missing_images"]["count"],
            entry["data_quality"].get("n_flagged", 0)]) + " |")
    return "\n".join(lines)


def write_markdown(run: dict[str, Any], path: str | Path) -> None:
    """``results.md``: labels, the Table-3-shaped accuracy table, counts, data-quality flags."""
    parts = ["# MedHEval-HF results", ""]
    for label in run.get("labels", {}).values():
        parts += [f"> **{label}**", ""]
    settings = run["settings"]
    parts += [f"Model: `{settings['model']}` · mitigation: `{settings['mitigation']}`", ""]
    table = close_ended_table([run])
    if table:
        parts += ["## Close-ended accuracy (%)", "", table, ""]
    parts += ["## Counts", "", counts_table(run), ""]
    flags = {split: entry["data_quality"].get("flags", {}) for split, entry in run["benchmarks"].items()}
    if any(flags.values()):
        parts += ["## Upstream data-quality flags (kept as released, not re-labelled)", ""]
        for split, counts in flags.items():
            if counts:
                parts.append(f"- `{split}`: " + ", ".join(f"{name} × {n}" for name, n in sorted(counts.items())))
        parts.append("")
    Path(path).write_text("\n".join(parts))
