"""Paper-shaped tables over many runs, with intervals and best/worst marks (``medheval report``).

Shapes (columns reuse :mod:`medheval.report.tables`' definitions): MedHEval Tables 3–4 (visual
close-ended Acc-A/M/S/R/Acc, here also the knowledge/context close-ended splits), Tables 5–6 (report
metrics, with the CHAIR/Recall labeler per split in the footer), Tables 7–11 (generation metrics, S_h as
mean ± std), Med-HallMark Table 1 (a pooled Med-VQA row and an IRG row per model, then per question type)
with its level distribution, Med-StepBench Table 3, ClinHallu Tables 2–3 with Fix/Break and Table 4 (Δ
averaged over models, Eq. 14), every mitigation against ``none`` on the same items, and every run against
its image-blind control (Δ image, :func:`image_deltas`). A figure is the value in ``results.json``; its
interval is recomputed from
``scored.jsonl`` (ClinHallu: from the protocol logs, :func:`medheval.report.collect.protocol_columns`)
with :mod:`medheval.report.stats`, and only when the per-item values reproduce that figure — otherwise the
cell says why there is none. Intervals resample the split's clusters (the unit its benchmark declares:
image, study, report or item; :func:`clusters`), or items with ``--cluster none``; paired comparisons are
sign-flip tests over the same clusters with the test's own interval, their p-values adjusted per table
(:func:`adjust_family`); each table's footer names the unit and the number of clusters per split. Mitigations are shown by a short
label (method and preset) with their full settings in a legend (:func:`shorten`); the report shows the
tables by benchmark family, a footer line that several of a family's tables share once (:func:`sections`).
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Callable

from medheval.report.collect import Run, mitigation_labels, seed_label
from medheval.report.stats import (CLUSTER_NOTE, LEVEL, METHOD_NOTE, P_ADJUST_NAMES, Comparison, adjust_p,
                                   compare_accuracy, compare_scores, few_units_note, figure_interval)
from medheval.report.tables import (CATEGORY_COLUMNS, CLINHALLU_REPLACEMENTS, OPEN_ENDED_COLUMNS, STD_OF,
                                    STEPBENCH_LANGUAGES, STEPBENCH_STEPS, CLINHALLU_DELTAS,
                                    STEPBENCH_STEP1_NOTE, LABELER_NOTE, clinhallu_model_average, clinhallu_stage_denominator,
                                    clinhallu_stage_notes, csv_cell, md_cell, md_text, stepbench_rows,
                                    stepbench_shows)
from medheval.data.schema import VISUAL_CATEGORIES

# (metric, summary key) -> the per-item key in scored.jsonl whose mean is that figure.
PER_ITEM: dict[tuple[str, str], str] = {
    ("close_ended_accuracy", "accuracy"): "correct",
    ("stepbench", "accuracy"): "correct",
    ("chexbert_similarity", "chexbert_similarity"): "similarities",
    ("radgraph_f1", "radgraph_f1"): "radgraph_f1_per_item",
    ("ratescore", "ratescore"): "ratescore_per_item",
    ("sh_judge", "sh"): "scores",
    ("medihall_score", "medihall_score"): "item_scores",
    ("medihall_score", "accuracy"): "correct",
    ("radcliq", "radcliq"): "radcliq_per_item",
    ("green", "green"): "green_per_item",
    **{("text_generation", key): f"{key}_per_item" for key in ("bleu", "meteor", "rouge1", "rouge2", "rougeL",
                                                               "bertscore")},
}
# Micro rates: (metric, key) -> per-item (numerator, denominator) keys, used when scored.jsonl has them. Each
# counts 0/1 trials (a mentioned object hallucinated or not; a reference finding matched or not), so a rate of
# 0 or 1 gets the exact bound (``binary`` in medheval.report.stats.figure_interval).
RATIO_PARTS: dict[tuple[str, str], tuple[str, str]] = {
    ("chair", "chair"): ("n_hallucinated_per_item", "n_generated_per_item"),
    ("chair", "recall"): ("n_matched_per_item", "n_reference_per_item"),
}
NO_PARTS = "a ratio over all items' counts, and scored.jsonl holds no per-item counts to resample"
MARK_NOTE = "▲ best, ▼ worst per column (within a split where rows span several; ↓: lower is better)."


@dataclass
class Cell:
    """A figure (in display units), its interval (or why none), its std and n."""

    value: float | None = None
    low: float | None = None
    high: float | None = None
    std: float | None = None
    n: int | None = None
    note: str | None = None  # why there is no interval
    text: str | None = None  # shown instead of a number (e.g. a count)
    mark: str = ""  # "best" / "worst"
    signed: bool = False
    unit: str | None = None  # what the interval resampled, e.g. "mm_vishal:all by image" (None: --cluster none)
    n_clusters: int | None = None
    digits: int | None = None  # decimals shown (None: one, or two beside a std)
    star: bool = False  # a comparison whose adjusted p < 0.05 (its family: :func:`adjust_family`)
    binary: bool = False  # its interval is of 0/1 answers or success counts (the binomial hull widens it)


@dataclass
class Column:
    label: str
    lower_is_better: bool = False
    ranked: bool = True


@dataclass
class Table:
    """Rows of labels + cells; ``group`` (a label index, or several) scopes the best/worst marks (e.g. per
    split, or per split and source)."""

    key: str
    title: str
    row_header: list[str]
    columns: list[Column]
    rows: list[tuple[list[str], list[Cell]]] = field(default_factory=list)
    footer: list[str] = field(default_factory=list)
    group: int | tuple[int, ...] | None = None
    # row label as data (a full mitigation spec) -> as shown; the legend under the table (:func:`shorten`)
    labels: dict[str, str] = field(default_factory=dict)

    def shown(self, label: str) -> str:
        return self.labels.get(label, label)


def _num(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _item_value(item: dict[str, Any], metric: str, key: str) -> Any:
    return item.get(f"{metric}.{key}", item.get(key))


def clusters(run: Run, split: str, items: list[dict[str, Any]]) -> tuple[list[str] | None, str | None]:
    """The cluster label of each item (``None``: resample items) and what the footer says was resampled
    (``None`` with ``--cluster none``). The unit is the split's ``cluster_unit`` (results.json) with each
    scored row's ``cluster``; a run written before them is resampled by item, and the footer says so."""
    if run.cluster == "none":
        return None, None
    unit = run.results["benchmarks"].get(split, {}).get("cluster_unit")
    if unit == "item":
        return None, f"{split} by item"
    if isinstance(unit, str) and items and all(isinstance(item.get("cluster"), str) for item in items):
        return [item["cluster"] for item in items], f"{split} by {unit}"
    declared = declared_cluster_unit(split)
    if declared == "item":
        return None, f"{split} by item"
    return None, (f"{split} by item, not by {declared}: this run's scored.jsonl has no cluster ids (written "
                  f"before clustered intervals; re-score it for them), so its intervals may be too narrow")


def protocol_clusters(run: Run, split: str, columns: dict[str, list], rows: list[int]
                      ) -> tuple[list[str] | None, str | None]:
    """:func:`clusters` for a split whose items come from protocol logs (ClinHallu): the labels of items
    ``rows`` from the columns' ``clusters`` (written by the run beside its logs); a run without them is
    resampled by item, and the footer says so."""
    if run.cluster == "none":
        return None, None
    unit = run.results["benchmarks"].get(split, {}).get("cluster_unit") or declared_cluster_unit(split)
    if unit == "item":
        return None, f"{split} by item"
    labels = [(columns.get("clusters") or [None] * (max(rows, default=-1) + 1))[i] for i in rows]
    if all(isinstance(label, str) for label in labels):
        return labels, f"{split} by {unit}"
    return None, (f"{split} by item, not by {unit}: this run's protocol logs have no cluster ids (written before "
                  f"{_name(split)} clustered by {unit}; re-run it for them), so its intervals may be too narrow")


def declared_cluster_unit(split: str) -> str:
    """The unit split's benchmark declares (``CLUSTER`` in its dataset unit); ``item`` when it cannot be read."""
    from medheval.run.protocol import benchmark_cluster_unit

    try:
        return benchmark_cluster_unit(_name(split))
    except Exception:  # noqa: BLE001 - an unknown or broken unit: the report resamples items and says "by item"
        return "item"


def figure(run: Run, split: str, metric: str, key: str, scale: float = 100.0, category: str | None = None) -> Cell:
    """``results.json``'s figure × ``scale`` and its bootstrap interval over the split's items."""
    out = run.results["benchmarks"].get(split, {}).get("metrics", {}).get(metric) or {}
    value = (out.get("accuracy_by_category") or {}).get(category) if category else out.get(key)
    if not _num(value):
        run.not_a_number(f"benchmarks[{split!r}].metrics.{metric}." + (f"accuracy_by_category.{category}"
                                                                         if category else key), value)
        return Cell()
    std_key = STD_OF.get((metric, key))
    cell = Cell(value=scale * value, std=scale * out[std_key] if std_key and _num(out.get(std_key)) else None)
    items = run.items_of(split)
    if not items:
        cell.note = "no scored.jsonl items for this run"
        return cell
    if category is not None:
        if all(item.get("category") is None for item in items):
            cell.note = "scored.jsonl predates per-item categories (re-score the run to get them)"
            return cell
        items = [item for item in items if item.get("category") == category]
    if (metric, key) in RATIO_PARTS:
        num, den = RATIO_PARTS[(metric, key)]
        pairs = [(item[num], item[den]) for item in items if _num(item.get(num)) and _num(item.get(den))]
        if not pairs or len(pairs) != len(items):
            cell.note = NO_PARTS
            return cell
        numerators, denominators = zip(*pairs)
        return _with_interval(cell, list(numerators), scale, value, list(denominators),
                              clustered=clusters(run, split, items), binary=True)
    per_item = PER_ITEM.get((metric, key))
    if per_item is None:
        cell.note = "no per-item values for this figure"
        return cell
    items = [item for item in items if isinstance(_item_value(item, metric, per_item), bool)
             or _num(_item_value(item, metric, per_item))]
    values = [float(_item_value(item, metric, per_item)) for item in items]
    if not values:
        cell.note = f"scored.jsonl has no per-item '{per_item}'"
        return cell
    binary = all(isinstance(_item_value(item, metric, per_item), bool) for item in items)
    return _with_interval(cell, values, scale, value, clustered=clusters(run, split, items), binary=binary)


def _with_interval(cell: Cell, values: list[float], scale: float, value: float,
                   denominators: list[float] | None = None, digits: int | None = None,
                   clustered: tuple[list[str] | None, str | None] = (None, None), binary: bool = False) -> Cell:
    """Attach the interval when the items reproduce the reported figure (same units up to ×100; rounded
    to ``digits`` places first when the metric rounds it); ``clustered``: :func:`clusters` of the items;
    ``binary``: the values are 0/1 answers, or the numerators count successes among the denominators' trials
    (:func:`medheval.report.stats.figure_interval`)."""
    recomputed = sum(values) / (sum(denominators) if denominators else len(values)) if (
        sum(denominators) if denominators else values) else None
    if digits is not None and recomputed is not None:
        recomputed = round(recomputed, digits)
    factor = next((f for f in (1.0, 0.01, 100.0) if recomputed is not None
                   and math.isclose(recomputed * f, value, rel_tol=1e-6, abs_tol=1e-9)), None)
    if factor is None:
        cell.note = f"the per-item values give {recomputed!r}, not the reported {value!r}"
        return cell
    labels, cell.unit = clustered
    interval, why = figure_interval(values, denominators, clusters=labels, binary=binary)
    cell.n, cell.binary = len(values), binary
    if cell.unit is not None:
        cell.n_clusters = len(set(labels)) if labels is not None else len(values)
    if interval is None:
        cell.note = why
    else:
        cell.low, cell.high = (scale * factor * bound for bound in interval)
    return cell


def _run_labels(runs: list[Run]) -> dict[int, tuple[str, str]]:
    """(model, mitigation) per run (a blind run's control appended: ``none · no_image``); runs sharing both and
    a split get their folder name appended."""
    labels = {}
    for run in runs:
        twins = [other for other in runs if other is not run and (other.model, other.variant)
                 == (run.model, run.variant) and set(other.results["benchmarks"]) & set(run.results["benchmarks"])]
        suffix = f" ({run.path.name})" if twins else ""
        labels[id(run)] = (run.model, run.variant + suffix)
    return labels


def _splits(runs: list[Run], keep: Callable[[str, dict], bool]) -> list[str]:
    found: list[str] = []
    for run in runs:
        for split, entry in run.results["benchmarks"].items():
            if split not in found and keep(split, entry.get("metrics", {})):
                found.append(split)
    return found


def _name(split: str) -> str:
    return split.partition(":")[0]


def close_ended(runs: list[Run]) -> Table | None:
    """MedHEval Tables 3–4: Acc-A/M/S/R and Acc (%) per split, one row per model × mitigation × split."""
    splits = _splits(runs, lambda s, m: "close_ended_accuracy" in m and _name(s) != "med_hallmark")
    if not splits:
        return None
    categories = [c for c in VISUAL_CATEGORIES if any(
        c in (run.results["benchmarks"].get(s, {}).get("metrics", {}).get("close_ended_accuracy", {})
              .get("accuracy_by_category") or {}) for run in runs for s in splits)]
    table = Table("medheval_close_ended", "MedHEval Tables 3–4: close-ended accuracy (%)",
                  ["Model", "Mitigation", "Split"], [Column(CATEGORY_COLUMNS[c]) for c in categories]
                  + [Column("Acc"), Column("n", ranked=False)], group=2)
    labels = _run_labels(runs)
    for split in splits:
        for run in runs:
            out = run.results["benchmarks"].get(split, {}).get("metrics", {}).get("close_ended_accuracy")
            if not out:
                continue
            cells = [figure(run, split, "close_ended_accuracy", "accuracy", category=c) for c in categories]
            cells += [figure(run, split, "close_ended_accuracy", "accuracy"), Cell(text=str(out.get("n", "–")))]
            table.rows.append(([*labels[id(run)], split], cells))
    if categories:
        table.footer.append("Accuracy by hallucination category: " + ", ".join(
            f"{CATEGORY_COLUMNS[c]} {c}" for c in categories) + "; Acc: all items of the split.")
    return table


def _metric_table(runs: list[Run], key: str, title: str, metrics: set[str],
                  keep: Callable[[str], bool]) -> Table | None:
    columns = [c for c in OPEN_ENDED_COLUMNS if c[0] in metrics]
    splits = _splits(runs, lambda s, m: keep(s) and any(_num((m.get(c[0]) or {}).get(c[1])) for c in columns))
    present = [c for c in columns if any(_num((run.results["benchmarks"].get(s, {}).get("metrics", {}).get(c[0]) or {})
                                              .get(c[1])) for run in runs for s in splits)]
    if not present:
        return None
    table = Table(key, title, ["Model", "Mitigation", "Split"],
                  [Column(label, lower_is_better="↓" in label) for _, _, label, _ in present], group=2)
    labels = _run_labels(runs)
    for split in splits:
        for run in runs:
            if split not in run.results["benchmarks"]:
                continue
            cells = [figure(run, split, metric, out_key, scale) for metric, out_key, _, scale in present]
            if any(cell.value is not None for cell in cells):
                table.rows.append(([*labels[id(run)], split], cells))
    return table


REPORT_METRICS = {"chexbert_similarity", "radgraph_f1", "ratescore", "chair", "radcliq", "green"}
GENERATION_METRICS = {"text_generation", "sh_judge"}
RADCLIQ_NOTE = ("RadCliQ-v1 ↓ (Yu et al., 2023) estimates a count of errors per report: lower is better, shown as "
                "is (not a percentage).")


def report_metrics(runs: list[Run]) -> Table | None:
    """MedHEval Tables 5–6: CheXbert, RadGraph, RaTEScore, Recall, CHAIR ↓ (%) per report split, and, when
    computed, RadCliQ-v1 ↓ and GREEN (the ReXrank metrics)."""
    table = _metric_table(runs, "medheval_report", "MedHEval Tables 5–6: report metrics (%)", REPORT_METRICS,
                          lambda s: _name(s) != "med_hallmark")
    if table is not None:
        table.footer += report_metric_notes(runs)
    return table


def report_metric_notes(runs: list[Run]) -> list[str]:
    """Footer lines for RadCliQ-v1 and GREEN: what RadCliQ-v1 is, components that differ from RadCliQ-v1's
    (``component_notes``), pairs left out, and GREEN judge replies that could not be read."""
    lines: list[str] = []
    for run in runs:
        for split, entry in run.results["benchmarks"].items():
            metrics = entry.get("metrics") or {}
            where = f"{run.model} · {run.mitigation} · {split}"
            radcliq = metrics.get("radcliq") or {}
            if _num(radcliq.get("radcliq")):
                if RADCLIQ_NOTE not in lines:
                    lines.insert(0, RADCLIQ_NOTE)
                for note in radcliq.get("component_notes") or []:
                    lines.append(f"RadCliQ-v1, {where}: not comparable with published RadCliQ-v1: {note}.")
                if radcliq.get("n_skipped"):
                    lines.append(f"RadCliQ-v1, {where}: {radcliq['n_skipped']} report(s) left out for a missing "
                                 "component.")
            green = metrics.get("green") or {}
            if green.get("n_failed"):
                lines.append(f"GREEN, {where}: {green['n_failed']} report(s) not scored "
                             f"({green.get('n_unparseable', 0)} unparseable judge replies); n = {green.get('n')}.")
    return lines


def generation_metrics(runs: list[Run]) -> Table | None:
    """MedHEval Tables 7–11: BERTScore, BLEU, METEOR, ROUGE (0–100) and S_h ↓ (0–5, mean ± std). The title
    names S_h only when a run computed it; a column a run could not compute (BERTScore without its weights,
    METEOR without WordNet) is named in the footer with the reason."""
    keep = lambda s: _name(s) != "med_hallmark"  # noqa: E731 - the splits of this table
    table = _metric_table(runs, "medheval_generation", "MedHEval Tables 7–11: generation metrics (0–100)",
                          GENERATION_METRICS, keep)
    if table is None:
        return None
    if any(column.label.startswith("S_h") for column in table.columns):
        table.title += " and S_h ↓ (0–5, mean ± std)"
    else:
        table.footer.append("S_h (the LLM-judged hallucination score) is not shown: no run was scored with "
                            "--judge.")
    table.footer += unavailable_column_notes(runs, keep)
    return table


def unavailable_column_notes(runs: list[Run], keep: Callable[[str], bool]) -> list[str]:
    """One line per text-generation column a split could not compute, with the metric's own reason
    (``<column>_unavailable_reason``), so a missing BERTScore is never silent."""
    reasons: dict[tuple[str, str], list[str]] = {}
    for run in runs:
        for split, entry in run.results.get("benchmarks", {}).items():
            out = (entry.get("metrics") or {}).get("text_generation") or {}
            if not keep(split) or not isinstance(out, dict):
                continue
            for column in ("bertscore", "meteor"):
                reason = out.get(f"{column}_unavailable_reason")
                if reason:
                    reasons.setdefault((column, str(reason)), []).append(split)
    names = {"bertscore": "BERTScore", "meteor": "METEOR"}
    return [f"{names[column]} not computed on {', '.join(sorted(set(splits)))}: {reason}"
            for (column, reason), splits in reasons.items()]


# Med-HallMark Table 1's columns, in its order: (metric, key, label, scale, digits). Text metrics 0–100,
# MediHall Score and ACC 0–1 with two decimals, as the paper prints them.
HALLMARK_COLUMNS: tuple[tuple[str, str, str, float, int | None], ...] = (
    ("text_generation", "bertscore", "BS", 1.0, None), ("text_generation", "meteor", "MR", 1.0, None),
    ("text_generation", "rouge1", "R-1", 1.0, None), ("text_generation", "rouge2", "R-2", 1.0, None),
    ("text_generation", "rougeL", "R-L", 1.0, None), ("text_generation", "bleu", "BLEU", 1.0, None),
    ("medihall_score", "medihall_score", "MediHall Score", 1.0, 2), ("medihall_score", "accuracy", "ACC", 1.0, 2))
# Extra per-type columns a run may carry (not in Table 1).
HALLMARK_EXTRA_COLUMNS: tuple[tuple[str, str, str, float, int | None], ...] = (
    ("chair", "chair", "CHAIR ↓", 100.0, None),)
# Table 1's Med-VQA row pools these question types; IRG is the image-depiction (report) type. The paper's
# supplement (A.5) gives counterfactual questions their own table (Table 6) as results "not detailed in
# the main text", and its main-text VQA comparison (Table 2) is conventional vs confidence-weakening: so
# Table 1's Med-VQA figures are over conventional and confidence-weakening questions.
HALLMARK_VQA_POOL = ("conventional", "confidence_weakening")
HALLMARK_TASKS = (("Med-VQA", HALLMARK_VQA_POOL), ("IRG", ("irg",)))
HALLMARK_NOTE = ("Med-VQA pools the conventional and confidence-weakening questions, the types behind the "
                 "paper's Table 1 (its supplement reports counterfactual questions apart, Table 6: see the "
                 "per-type rows); each pooled figure is the mean over the pooled items. IRG: image depiction "
                 "(reports). ACC (Med-VQA only): the share of answers whose MediHall level is Correct "
                 "(weight 1.0), as the paper's Table 3 scores Accuracy.")


def _hallmark_config(split: str) -> str:
    return split.partition(":")[2]


def pooled_figure(run: Run, splits: list[str], metric: str, key: str, scale: float = 1.0) -> Cell:
    """One figure over several splits' items: the n-weighted mean of ``results.json``'s per-split figures
    (the mean over all their items), with a bootstrap interval over the pooled per-item values (clusters of
    every split together). One split: :func:`figure`."""
    if len(splits) == 1:
        return figure(run, splits[0], metric, key, scale)
    outs = [run.results["benchmarks"].get(s, {}).get("metrics", {}).get(metric) or {} for s in splits]
    if not all(_num(out.get(key)) and isinstance(out.get("n"), int) and out["n"] > 0 for out in outs):
        return Cell()
    value = sum(out[key] * out["n"] for out in outs) / sum(out["n"] for out in outs)
    cell = Cell(value=scale * value)
    per_item = PER_ITEM.get((metric, key))
    if per_item is None:
        cell.note = "no per-item values for this figure"
        return cell
    values: list[float] = []
    labels: list[str] | None = []
    units: list[str] = []
    binary = True
    for split in splits:
        items = [item for item in run.items_of(split) if isinstance(_item_value(item, metric, per_item), bool)
                 or _num(_item_value(item, metric, per_item))]
        values += [float(_item_value(item, metric, per_item)) for item in items]
        binary = binary and all(isinstance(_item_value(item, metric, per_item), bool) for item in items)
        split_labels, unit = clusters(run, split, items)
        if unit is None:
            labels = None
        elif labels is not None:
            labels += split_labels if split_labels is not None else [f"{split}/{i}" for i in range(len(items))]
        if unit is not None and unit not in units:
            units.append(unit)
    if not values:
        cell.note = f"scored.jsonl has no per-item '{per_item}'"
        return cell
    kinds = {unit.partition(" by ")[2] for unit in units}
    unit = None if not units else f"{' + '.join(splits)} by {kinds.pop()}" if len(kinds) == 1 else "; ".join(units)
    return _with_interval(cell, values, scale, value, clustered=(labels, unit), binary=binary)


def med_hallmark(runs: list[Run]) -> list[Table]:
    """Med-HallMark Table 1 in the paper's shape — per model × mitigation a Med-VQA row (the pooled types of
    :data:`HALLMARK_VQA_POOL`) and an IRG row, columns BS, MR, R-1, R-2, R-L, BLEU, MediHall Score, ACC
    (Med-VQA only) — then one row per question type, and the MediHall level distribution."""
    splits = _splits(runs, lambda s, m: _name(s) == "med_hallmark")
    columns = [c for c in HALLMARK_COLUMNS + HALLMARK_EXTRA_COLUMNS if any(
        _num((run.results["benchmarks"].get(s, {}).get("metrics", {}).get(c[0]) or {}).get(c[1]))
        for run in runs for s in splits)]
    if not columns:
        return []
    labels = _run_labels(runs)
    main_columns = [c for c in columns if c in HALLMARK_COLUMNS]
    table1 = Table("med_hallmark_table1", "Med-HallMark Table 1: Med-VQA (pooled) and IRG (text metrics 0–100, "
                   "MediHall Score and ACC 0–1)", ["Model", "Mitigation", "Task", "Question types"],
                   [Column(label) for _, _, label, _, _ in main_columns], footer=[HALLMARK_NOTE], group=2)
    for run in runs:
        present = [s for s in splits if run.results["benchmarks"].get(s, {}).get("metrics")]
        for task, pool in HALLMARK_TASKS:
            pooled = [s for s in present if _hallmark_config(s) in pool]
            if not pooled:
                continue
            cells = []
            for metric, key, _, scale, digits in main_columns:
                cell = pooled_figure(run, pooled, metric, key, scale)  # IRG's ACC is None: "–"
                cell.digits = digits
                cells.append(cell)
            table1.rows.append(([*labels[id(run)], task, " + ".join(_hallmark_config(s) for s in pooled)], cells))
    table = Table("med_hallmark", "Med-HallMark per question type (detail; counterfactual: the paper's "
                  "Table 6)", ["Model", "Mitigation", "Split"],
                  [Column(label, "↓" in label) for _, _, label, _, _ in columns], group=2)
    levels: list[str] = []
    distributions: list[tuple[list[str], dict[str, int]]] = []
    for split in splits:
        for run in runs:
            metrics = run.results["benchmarks"].get(split, {}).get("metrics", {})
            if not metrics:
                continue
            cells = []
            for metric, key, _, scale, digits in columns:
                cell = figure(run, split, metric, key, scale)
                cell.digits = digits
                cells.append(cell)
            table.rows.append(([*labels[id(run)], split], cells))
            counts = (metrics.get("medihall_score") or {}).get("level_distribution") or {}
            levels += [level for level in counts if level not in levels]
            if counts:
                distributions.append(([*labels[id(run)], split], counts))
    tables = [t for t in (table1, table) if t.rows]
    if distributions:
        dist = Table("med_hallmark_levels", "Med-HallMark: MediHall level distribution (% of answers / sentences)",
                     ["Model", "Mitigation", "Split"], [Column(level, ranked=False) for level in levels]
                     + [Column("n", ranked=False)])
        for row, counts in distributions:
            total = sum(counts.values()) or 1
            dist.rows.append((row, [Cell(value=100 * counts.get(level, 0) / total) for level in levels]
                              + [Cell(text=str(sum(counts.values())))]))
        tables.append(dist)
    return tables


def _stepbench_cell(run: Run, split: str, value: Any, items: list[dict[str, Any]], what: str) -> Cell:
    """Recall (mean correctness over hallucinated statements) or F1 = Σ2tp / Σ(2tp + fp + fn), both
    recomputed per item (an unparsed answer is already ``correct = False``), with their intervals."""
    if not _num(value):
        return Cell()
    cell = Cell(value=100 * value)
    items = [item for item in items if item.get("reference") in ("hallucination", "ground_truth")]
    if not items:
        cell.note = "scored.jsonl does not carry each statement's step and label (re-score the run)"
        return cell
    if what == "recall":
        positives = [item for item in items if item["reference"] == "hallucination"]
        values = [float(bool(item.get("correct"))) for item in positives]
        return _with_interval(cell, values, 100.0, value, clustered=clusters(run, split, positives),
                              binary=True) if values else cell
    rows = [(item["reference"] == "hallucination", bool(item.get("correct"))) for item in items]
    numerators = [2.0 * ok if positive else 0.0 for positive, ok in rows]
    denominators = [1.0 + ok if positive else 1.0 - ok for positive, ok in rows]
    if not sum(denominators):
        return cell
    return _with_interval(cell, numerators, 100.0, value, denominators, clustered=clusters(run, split, items))


def stepbench(runs: list[Run]) -> Table | None:
    """Med-StepBench Table 3: recall and F1 (%) per step and language (hallucination = positive class)."""
    from medheval.data.registry import load_unit_module

    steps = load_unit_module("datasets", "med_stepbench").STEPS  # the family's step -> category
    rows = stepbench_rows([run.results for run in runs])
    if not rows:
        return None
    columns = [Column(f"{lang.upper()} S{step} {what}") for lang in STEPBENCH_LANGUAGES for step in STEPBENCH_STEPS
               for what in ("R", "F1")]
    table = Table("med_stepbench", "Med-StepBench Table 3: recall and F1 (%) per step",
                  ["Model", "Mitigation", "Knowledge"], columns + [Column("Acc"), Column("Unparsed", ranked=False)])
    found: dict[tuple[str, str, str], tuple[Run, str]] = {}
    for run in runs:
        for split, entry in run.results["benchmarks"].items():
            if "stepbench" in entry.get("metrics", {}):
                found[(run.model, run.variant, str(entry.get("run_options", {}).get("knowledge", "none")))] = (run, split)
    for model, mitigation, knowledge, by_language in rows:
        run, split = found[(model, mitigation, knowledge)]
        items = run.items_of(split)
        cells = []
        for lang in STEPBENCH_LANGUAGES:
            for step in STEPBENCH_STEPS:
                scores = by_language.get(lang, {}).get(step) or by_language.get(lang, {}).get(str(step)) or {}
                mine = [item for item in items if item.get("category") == steps[step]
                        and item["id"].split("/")[1:2] == [lang]]
                if not stepbench_shows(knowledge, step):
                    cells += [Cell(), Cell()]
                    continue
                cells += [_stepbench_cell(run, split, scores.get("recall"), mine, "recall"),
                          _stepbench_cell(run, split, scores.get("f1"), mine, "f1")]
        cells += [figure(run, split, "stepbench", "accuracy"), Cell(text=str(by_language.get("n_unparsed", 0)))]
        table.rows.append(([model, mitigation, knowledge], cells))
    if any(knowledge != "none" for _, _, knowledge, _ in rows):
        table.footer.append(STEPBENCH_STEP1_NOTE)
    return table


# metrics/clinhallu's answer column of each setting (as medheval.families.clinhallu.protocol.metric_inputs names them)
CLINHALLU_ANSWERS = {"org": "correct", "rep_v": "correct_rep_v", "rep_k": "correct_rep_k", "rep_vk": "correct_rep_vk"}
CLINHALLU_NOTE = ("ClinHallu per-item values: each item's judged answers and stage judgements from the run's "
                  "protocol logs (clinhallu/<config>/, read with metric_inputs), counted as metrics/clinhallu "
                  "counts them: Acc, H and Fix/Break are ratios of per-item counts, resampled by image (VQA-RAD "
                  "and PathVQA ask several questions about one image; the four settings stay within an item; default "
                  "denominator: an invalid or unjudged answer counts as wrong; with upstream_compat: Acc over valid "
                  "answers, Fix/Break over items valid in both settings); Δ is the mean of the paired per-item "
                  "difference (setting right − ORG right).")
DELTA_VALID_ONLY = ("under upstream_compat Δ is the difference of two rounded accuracies over different valid "
                    "items, not a mean of per-item differences")


def clinhallu_item_values(columns: dict[str, list], key: str, valid_only: bool = False,
                          stage_denominator: str = "all_items"
                          ) -> tuple[list[float], list[float] | None, int | None] | str:
    """Per-item (numerators, denominators or ``None`` for a mean, rounding digits) whose ratio of sums is
    the ``metrics/clinhallu`` figure ``key`` (``acc``, ``h_v``/``h_k``/``h_r``, ``delta_v``/``delta_k``/
    ``delta_vk``, ``fix_rate.rep_*``, ``break_rate.rep_*``) on ``columns`` (its per-item inputs: 1, 0 or
    ``None``), with the metric's denominators (``valid_only``: its ``upstream_compat``; ``stage_denominator``:
    its option of that name); or why none.

    Default: Acc = Σ[c = 1] / n; H = Σ[h ≠ 0] / n (Eq. 13; ``"judged"``: Σ[h = 1] / Σ[h judged]);
    Δ_s = mean([c_s = 1] − [c = 1]); Fix_s = Σ[c ≠ 1 ∧ c_s = 1] / Σ[c ≠ 1]; Break_s = Σ[c = 1 ∧ c_s ≠ 1] /
    Σ[c = 1]. ``valid_only``: Acc = Σ[c = 1] / Σ[c valid] rounded to 4 places; Fix/Break over the items
    valid in ORG and s; Δ has no per-item form (a difference of accuracies over different items)."""
    org = columns["correct"]
    if key == "acc":
        right = [float(v == 1) for v in org]
        return (right, [float(v is not None) for v in org], 4) if valid_only else (right, None, None)
    if key in ("h_v", "h_k", "h_r"):
        judged = columns[key]
        if stage_denominator == "all_items":
            return [float(v != 0) for v in judged], None, None
        return [float(v == 1) for v in judged], [float(v is not None) for v in judged], None
    kind, _, setting = key.partition(".")
    if kind.startswith("delta_"):
        setting, kind = "rep_" + kind[len("delta_"):], "delta"
    if setting not in CLINHALLU_ANSWERS or setting == "org" or kind not in ("delta", "fix_rate", "break_rate"):
        raise ValueError(f"clinhallu_item_values: unknown figure {key!r}")
    pairs = list(zip(org, columns[CLINHALLU_ANSWERS[setting]]))
    if kind == "delta":
        return DELTA_VALID_ONLY if valid_only else ([float(b == 1) - float(a == 1) for a, b in pairs], None, None)
    kept = [not valid_only or (a is not None and b is not None) for a, b in pairs]
    if kind == "fix_rate":
        return ([float(k and a != 1 and b == 1) for k, (a, b) in zip(kept, pairs)],
                [float(k and a != 1) for k, (a, _) in zip(kept, pairs)], None)
    return ([float(k and a == 1 and b != 1) for k, (a, b) in zip(kept, pairs)],
            [float(k and a == 1) for k, (a, _) in zip(kept, pairs)], None)


def _clinhallu_cell(run: Run, split: str, source: str, metric: dict[str, Any], key: str, valid_only: bool,
                    stage_denominator: str = "all_items") -> Cell:
    """A ClinHallu figure (×100) of the whole split (``source == "all"``) or one source, with its interval
    when the per-item values from the protocol logs reproduce it."""
    kind, _, setting = key.partition(".")
    value = (metric.get(kind) or {}).get(setting) if setting else metric.get(key)
    if not _num(value):
        run.not_a_number(f"benchmarks[{split!r}].metrics.clinhallu.{key}", value)
        return Cell()
    cell = Cell(value=100 * value, signed=key.startswith("delta_"))
    columns, why = run.clinhallu_columns(split)
    if columns is None:
        cell.note = why
        return cell
    rows = [i for i, s in enumerate(columns["sources"]) if source == "all" or s == source]
    n = (metric.get("counts") or {}).get("n")
    if n is not None and n != len(rows):
        where = "" if source == "all" else f" of {source}"
        cell.note = (f"the protocol logs hold {len(rows)} items{where} but results.json counts {n} (a run resumed "
                     f"with another --limit?)")
        return cell
    group = {name: [values[i] for i in rows] for name, values in columns.items()
             if name not in ("ids", "sources", "settings")}
    parts = clinhallu_item_values(group, key, valid_only, stage_denominator)
    if isinstance(parts, str):
        cell.note = parts
        return cell
    numerators, denominators, digits = parts
    return _with_interval(cell, numerators, 100.0, value, denominators, digits,  # all but Δ count 0/1 answers
                          clustered=protocol_clusters(run, split, columns, rows), binary=not key.startswith("delta_"))


def clinhallu(runs: list[Run]) -> list[Table]:
    """ClinHallu Table 2 (Acc, H^V, H^K, H^R) and Table 3 (Acc, Δ, Fix/Break per replacement), %, with
    intervals from the per-item values of the protocol logs (:func:`clinhallu_item_values`)."""
    found = [(run, split, entry["metrics"]["clinhallu"]) for run in runs
             for split, entry in run.results["benchmarks"].items() if (entry.get("metrics") or {}).get("clinhallu")]
    if not found:
        return []
    stage = Table("clinhallu_stages", "ClinHallu Table 2: accuracy and stage hallucination rates (%)",
                  ["Model", "Split", "Source", "n"], [Column("Acc"), Column("H^V", True), Column("H^K", True),
                                                      Column("H^R", True)], footer=[CLINHALLU_NOTE], group=(1, 2))
    columns = [Column("Acc")] + [Column(f"Δ^{label[4:]}") for _, label in CLINHALLU_REPLACEMENTS]
    for _, label in CLINHALLU_REPLACEMENTS:
        columns += [Column(f"{label} Fix"), Column(f"{label} Break", True)]
    replacement = Table("clinhallu_replacement", "ClinHallu Table 3: Δ (points) when gold stages replace the "
                        "model's, and Fix/Break (%)", ["Model", "Split", "Source", "n"], columns,
                        footer=[CLINHALLU_NOTE], group=(1, 2))
    stage.footer += clinhallu_stage_notes((f"{run.model} · {split}", whole) for run, split, whole in found)
    for run, split, whole in found:
        valid_only = whole.get("denominator") == "valid_only"
        stage_denominator = clinhallu_stage_denominator(whole)
        for source, metric in [("all", whole), *sorted((whole.get("per_source") or {}).items())]:
            labels = [run.model, split, source, str((metric.get("counts") or {}).get("n", "–"))]
            cell = lambda key: _clinhallu_cell(run, split, source, metric, key, valid_only,  # noqa: E731
                                               stage_denominator)
            stage.rows.append((labels, [cell(k) for k in ("acc", "h_v", "h_k", "h_r")]))
            cells = [cell("acc")] + [cell(f"delta_{key[4:]}") for key, _ in CLINHALLU_REPLACEMENTS]
            for key, _ in CLINHALLU_REPLACEMENTS:
                cells += [cell(f"fix_rate.{key}"), cell(f"break_rate.{key}")]
            replacement.rows.append((labels, cells))
    average = clinhallu_average([run.results for run in runs])
    return [stage, replacement] + ([average] if average else [])


CLINHALLU_AVERAGE_NOTE = ("ClinHallu Table 4: each model's Δ of Table 3 (setting accuracy − ORG accuracy, as "
                          "metrics/clinhallu reports it), averaged over the models that ran the split (Eq. 14); "
                          "models are grouped by mitigation, split and source.")


def clinhallu_average(results: list[dict[str, Any]]) -> Table | None:
    """ClinHallu Table 4 (points): Δ^V, Δ^K, Δ^VK averaged over models (Eq. 14), when two or more models ran
    a split; a Δ some models lack is averaged over the others, and the cell says so."""
    rows = clinhallu_model_average(results)
    if not rows:
        return None
    table = Table("clinhallu_model_average", "ClinHallu Table 4: Δ (points) averaged over models (Eq. 14)",
                  ["Mitigation", "Split", "Source"], [Column("Models", ranked=False)]
                  + [Column(f"Δ^{label[4:]}", ranked=False) for _, label in CLINHALLU_REPLACEMENTS],
                  footer=[CLINHALLU_AVERAGE_NOTE])
    for mitigation, split, source, models, means in rows:
        cells = [Cell(text=f"{len(models)}: {', '.join(models)}")]
        for key in CLINHALLU_DELTAS:
            mean, k = means[key]
            cell = Cell(value=None if mean is None else 100 * mean, n=k, signed=True)
            if mean is not None and k < len(models):
                cell.note = "averaged over the models that ran this setting only"
            cells.append(cell)
        table.rows.append(([mitigation, split, source], cells))
    return table


COMPARED: tuple[tuple[str, str, str, float], ...] = (
    ("close_ended_accuracy", "accuracy", "Acc", 100.0), ("stepbench", "accuracy", "Acc", 100.0),
    *((m, k, label, s) for m, k, label, s in OPEN_ENDED_COLUMNS if (m, k) in PER_ITEM),
)


def _comparison_columns(first: str, second: str, delta: str, p_adjust: str) -> list[Column]:
    adjusted = [] if p_adjust == "none" else [Column(f"p ({P_ADJUST_NAMES[p_adjust]})", ranked=False)]
    return [Column(first, ranked=False), Column(second, ranked=False), Column(delta, ranked=False),
            Column("p", ranked=False), *adjusted, Column("n", ranked=False)]


def comparisons(runs: list[Run], p_adjust: str = "holm") -> tuple[Table | None, list[dict[str, Any]]]:
    """Each mitigation against ``none`` of the same model (a pass of ``--seeds`` against the ``none`` pass of
    its seed, :func:`_baseline`; rows labelled as in the other tables, seed included), on the items both scored
    (paired by id), tested over the split's clusters (:func:`clusters`,
    :func:`medheval.report.stats.compare_scores`); the table's p-values adjusted as one family (``p_adjust``:
    :func:`adjust_family`). Items left out of a pairing are counted in the record (:data:`UNPAIRED_KEYS`) and
    named in a footer line per row (:func:`unpaired_lines`)."""
    table = Table("mitigation_vs_none", "Mitigation − none on the same items (paired)",
                  ["Model", "Mitigation", "Split", "Metric"],
                  _comparison_columns("none", "mitigation", "Δ", p_adjust))
    records: list[dict[str, Any]] = []
    names = _run_labels(runs)
    with_image = [run for run in runs if run.control == "none"]  # blind runs are compared by image_deltas
    baselines = [run for run in with_image if run.mitigation == "none" and run.items]
    skipped: list[tuple[list[str], Unpaired]] = []
    for run in with_image:
        base = _baseline(run, baselines)
        if run.mitigation == "none" or base is None or not run.items:
            continue
        unpaired: list[tuple[str, str, Unpaired]] = []
        for split, label, cells, record in _paired_rows(base, run, unpaired):
            table.rows.append(([run.model, names[id(run)][1], split, label], cells))
            records.append({**_who(run), **record})
        skipped += [([run.model, names[id(run)][1], split, label], left) for split, label, left in unpaired]
    _clinhallu_comparisons(with_image, table, records, names)
    adjust_family(table, records, p_adjust, "every mitigation × split × metric against none of the same model")
    short = mitigation_labels(run.mitigation for run in runs)
    table.footer += unpaired_lines(table, records, "none", "the mitigation run", short)
    table.footer += not_compared_lines(skipped, "none", "the mitigation run", short)
    return (table if table.rows or skipped else None), records


def _who(run: Run) -> dict[str, Any]:
    """The first keys of a comparison record: the run's model, mitigation spec, seed (``None`` without
    ``--seeds``) and folder."""
    return {"model": run.model, "mitigation": run.mitigation, "seed": run.seed, "run": str(run.path)}


@dataclass
class Unpaired:
    """The items a paired comparison left out: ids only the baseline run scored, ids only the other run
    scored, and ids both have but without a per-item value (NaN, ``None``, absent) in one or both."""

    only_baseline: int = 0
    only_other: int = 0
    unscored: int = 0


UNPAIRED_KEYS = ("n_only_baseline", "n_only_other", "n_unscored")  # the record keys of :class:`Unpaired`


def unpaired_lines(table: Table, records: list[dict[str, Any]], first: str, second: str,
                   short: dict[str, str]) -> list[str]:
    """A footer line per row of ``table`` (``records`` in the same order) whose pairing left items out: how
    many were only in the ``first`` run, only in the ``second``, or unscored; ``short``: mitigation labels."""
    lines = []
    for (labels, _), record in zip(table.rows, records):
        only_first, only_second, unscored = (record.get(key, 0) for key in UNPAIRED_KEYS)
        if not only_first + only_second + unscored:
            continue
        where = " · ".join(table.labels.get(label, _short_label(label, short)) for label in labels)
        parts = [f"{only_first} only in {first}" if only_first else "",
                 f"{only_second} only in {second}" if only_second else "",
                 f"{unscored} in both but unscored in one or both (no per-item value)" if unscored else ""]
        lines.append(f"Unpaired, {where}: n = {record['n']} paired; left out " + ", ".join(p for p in parts if p)
                     + ".")
    return lines


def not_compared_lines(skipped: list[tuple[list[str], Unpaired]], first: str, second: str,
                       short: dict[str, str]) -> list[str]:
    """A footer line per comparison that paired no item at all (both runs scored the split, but no id is in
    both with a per-item value in each: e.g. runs limited to different items, or one run's values missing), so
    it is said instead of dropped: ``skipped`` holds its row labels and what was left out (:class:`Unpaired`)."""
    lines = []
    for labels, left in skipped:
        where = " · ".join(_short_label(label, short) for label in labels)
        parts = [f"{left.only_baseline} only in {first}", f"{left.only_other} only in {second}",
                 f"{left.unscored} in both but unscored in one or both (no per-item value)"]
        lines.append(f"Not compared, {where}: no item paired (n = 0); " + ", ".join(parts) + ".")
    return lines


def _short_label(label: str, short: dict[str, str]) -> str:
    """``label`` with a leading mitigation spec shown short (:func:`shorten`'s rule)."""
    spec = _spec_of(label, short)
    return label if spec is None else short[spec] + label[len(spec):]


def _spec_of(label: str, short: dict[str, str]) -> str | None:
    """The mitigation spec ``label`` starts with (alone, or followed by `` · `` or `` (``), or ``None``."""
    return next((s for s in sorted(short, key=len, reverse=True)
                 if label == s or label.startswith((s + " (", s + " · "))), None)


def adjust_family(table: Table, records: list[dict[str, Any]], p_adjust: str, family: str) -> None:
    """Adjust the p-values of ``table``'s rows (one family; ``records`` in the same order) by ``p_adjust``
    (:func:`medheval.report.stats.adjust_p`): fill the adjusted-p cells, star Δ where the adjusted p < 0.05
    and the comparison has an interval, and say the family and the method in the footer."""
    if not records:
        return
    raw = [record["p_value"] for record in records]
    adjusted = adjust_p(raw, p_adjust)
    from medheval.report.stats import ALPHA as alpha  # 0.05 exactly: p = 0.05 is not significant
    at = [c.label for c in table.columns].index("p")
    for (_, cells), record, value in zip(table.rows, records, adjusted):
        significant = value < alpha and record.get("low") is not None
        record.update(p_adjusted=value, p_adjust=p_adjust, family_size=len(raw), significant=significant)
        cells[2].star = significant
        if p_adjust == "none":
            del cells[at + 1]
        else:
            cells[at + 1] = Cell(text=f"{value:.3g}")
    source = {"holm": "Holm 1979, family-wise error", "bh": "Benjamini & Hochberg 1995, false discovery rate"}
    how = "unadjusted" if p_adjust == "none" else f"adjusted by {P_ADJUST_NAMES[p_adjust]} ({source[p_adjust]})"
    table.footer.append(f"Family: the {len(raw)} comparisons of this table ({family}); p {how}; "
                        f"* adjusted p < {alpha:g}. Intervals are per comparison ({int(LEVEL * 100)}%, "
                        f"unadjusted): one excludes 0 exactly when its raw p < {alpha:g}. "
                        f"`medheval report --p-adjust holm|bh|none` chooses the adjustment.")


def _paired_rows(base: Run, run: Run, skipped: list[tuple[str, str, Unpaired]] | None = None
                 ) -> list[tuple[str, str, list[Cell], dict[str, Any]]]:
    """(split, metric label, cells, record) of ``run`` − ``base`` per split and :data:`COMPARED` metric, on the
    items both scored (paired by id), tested over the split's clusters and over items
    (:func:`medheval.report.stats.compare_scores`). Cells: base, run, Δ with its interval, p, adjusted p, n.
    A metric both runs have items for but no item pairs is appended to ``skipped`` (split, label, what was
    left out) instead of vanishing."""
    rows = []
    for split in run.results["benchmarks"]:
        ours = {item["id"]: item for item in run.items_of(split)}
        theirs = {item["id"]: item for item in base.items_of(split)}
        for metric, key, label, scale in COMPARED:
            if metric not in run.results["benchmarks"][split].get("metrics", {}):
                continue
            per_item = PER_ITEM[(metric, key)]
            pairs = [(_item_value(theirs[i], metric, per_item), _item_value(ours[i], metric, per_item), ours[i])
                     for i in ours if i in theirs]
            scored = [(a, b, item) for a, b, item in pairs if _scored(a) and _scored(b)]
            unpaired = Unpaired(only_baseline=len(theirs.keys() - ours.keys()),
                                only_other=len(ours.keys() - theirs.keys()), unscored=len(pairs) - len(scored))
            if not scored:
                if skipped is not None and ours and theirs:
                    skipped.append((split, label, unpaired))
                continue
            a, b, paired = zip(*scored)
            labels, unit = clusters(run, split, list(paired))
            result = compare_accuracy(a, b, clusters=labels) if per_item == "correct" else \
                compare_scores(a, b, clusters=labels)
            mean_a, mean_b = scale * sum(map(float, a)) / len(a), scale * sum(map(float, b)) / len(b)
            rows.append((split, label, *_comparison_cells(result, mean_a, mean_b, scale, unit, split, label,
                                                          unpaired)))
    return rows


def _scored(value: Any) -> bool:
    """A per-item value a comparison can use: a bool or a finite number."""
    return isinstance(value, bool) or _num(value)


def _comparison_cells(result: Comparison, mean_a: float, mean_b: float, scale: float, unit: str | None,
                      split: str, label: str, unpaired: Unpaired) -> tuple[list[Cell], dict[str, Any]]:
    """Cells (baseline, other, Δ with its interval or why none, p, adjusted p (filled by :func:`adjust_family`),
    n) and the record of one paired comparison, with the counts of the items it left out (``unpaired``)."""
    n_clusters = None if unit is None else result.n_clusters
    low, high = ((None, None) if result.low is None else (scale * result.low, scale * result.high))
    cells = [Cell(value=mean_a), Cell(value=mean_b),
             Cell(value=scale * result.diff, low=low, high=high, signed=True, unit=unit, n_clusters=n_clusters,
                  note=result.note),
             Cell(text=f"{result.p_value:.3g} ({result.test})"), Cell(text="–"), Cell(text=str(result.n))]
    return cells, {"split": split, "metric": label, "baseline": mean_a, "value": mean_b, "diff": scale * result.diff,
                   "low": low, "high": high, "p_value": result.p_value, "n": result.n, "test": result.test,
                   "resampled": unit, "n_clusters": n_clusters,
                   **dict(zip(UNPAIRED_KEYS, (unpaired.only_baseline, unpaired.only_other, unpaired.unscored))),
                   **({"note": result.note} if result.note else {})}


def image_deltas(runs: list[Run], p_adjust: str = "holm") -> tuple[Table | None, list[dict[str, Any]]]:
    """**Δ image** per split and metric: a with-image run minus its image-blind control (same model and
    mitigation, ``--control no_image|blank|noise``, :mod:`medheval.run.control`), on the items both scored
    (paired by id), with the clustered paired interval of :func:`_paired_rows`; ClinHallu's ORG accuracy from
    its protocol logs (:func:`_clinhallu_org_pair`). Near 0: the answers do not depend on the image; the blind
    run's own figures are its rows in the other tables. Columns: with image, blind, Δ (the paired rows give
    the blind run as the baseline: its cells are swapped into place). One family of p-values (``p_adjust``)."""
    table = Table("image_vs_blind", "Δ image: with image − image-blind control on the same items (paired)",
                  ["Model", "Mitigation", "Control", "Split", "Metric"],
                  _comparison_columns("with image", "blind", "Δ", p_adjust))
    records: list[dict[str, Any]] = []
    names = _run_labels(runs)
    renamed = {"baseline": "blind", "value": "with_image", "n_only_baseline": "n_only_blind",
               "n_only_other": "n_only_with_image"}
    sighted = [run for run in runs if run.control == "none" and (run.items or _clinhallu_splits(run))]
    skipped: list[tuple[list[str], Unpaired]] = []
    for blind in (run for run in runs if run.control != "none" and (run.items or _clinhallu_splits(run))):
        run = _sighted(blind, sighted)
        if run is None:
            continue
        unpaired: list[tuple[str, str, Unpaired]] = []
        rows = _paired_rows(blind, run, unpaired) if run.items and blind.items else []
        rows += [(split, "Acc (ORG)", *paired) for split in _clinhallu_splits(run)  # from ClinHallu's protocol logs
                 if (paired := _clinhallu_org_pair(blind, run, split)) is not None]
        control = blind.control if blind.seed == run.seed else blind.control + (
            seed_label(blind.seed) if blind.seed is not None else " · no seed")  # paired across seeds: said
        skipped += [([run.model, names[id(run)][1], control, split, label], left) for split, label, left in unpaired]
        for split, label, cells, record in rows:
            table.rows.append(([run.model, names[id(run)][1], control, split, label],
                               [cells[1], cells[0], *cells[2:]]))  # with image first, then blind
            records.append({**_who(run), "control": blind.control, "blind_seed": blind.seed,
                            "blind_run": str(blind.path), **{renamed.get(key, key): value
                                                             for key, value in record.items()}})
    adjust_family(table, records, p_adjust, "every run with its image × split × metric against its image-blind "
                  "control")
    short = mitigation_labels(run.mitigation for run in runs)
    table.footer += unpaired_lines(table, [{key: record.get(renamed.get(key, key), 0) for key in (*UNPAIRED_KEYS, "n")}
                                           for record in records], "the blind run", "the run with its image", short)
    table.footer += not_compared_lines(skipped, "the blind run", "the run with its image", short)
    return (table if table.rows or skipped else None), records


def _sighted(blind: Run, sighted: list[Run]) -> Run | None:
    """The with-image run a blind run is compared with: the same model and mitigation, preferably of the same
    seed (a pass of ``--seeds``; all passes share one folder) and then from the same folder."""
    same = [run for run in sighted if (run.model, run.mitigation) == (blind.model, blind.mitigation)]
    same = [run for run in same if run.seed == blind.seed] or same
    return next((run for run in same if run.path.parent == blind.path.parent), same[0] if same else None)


def _baseline(run: Run, baselines: list[Run]) -> Run | None:
    """The same model's ``none`` run, preferably from the same grid (the sibling folder) and, for a pass of
    ``--seeds``, of the same seed."""
    same = [b for b in baselines if b.model == run.model]
    same = [b for b in same if b.seed == run.seed] or same
    return next((b for b in same if b.path.parent == run.path.parent), same[0] if same else None)


def _clinhallu_splits(run: Run) -> dict[str, dict[str, Any]]:
    """The run's splits scored by ``metrics/clinhallu`` and their figures."""
    return {split: entry["metrics"]["clinhallu"] for split, entry in run.results["benchmarks"].items()
            if (entry.get("metrics") or {}).get("clinhallu")}


def _clinhallu_org_pair(base: Run, run: Run, split: str) -> tuple[list[Cell], dict[str, Any]] | None:
    """ORG accuracy (%) of ``run`` − ``base`` on one ClinHallu split, on the items both ran (paired by id,
    tested over the images the run recorded, :func:`protocol_clusters`, and over items), from the protocol
    logs; an answer counts as right
    when judged 1, as the metric counts it (with ``upstream_compat`` in either run: only items whose ORG
    answer is valid in both). Cells: base, run, Δ with its interval, p, n; ``None`` without paired items."""
    ours_metric, theirs_metric = _clinhallu_splits(run).get(split), _clinhallu_splits(base).get(split)
    if ours_metric is None or theirs_metric is None:
        return None
    (ours, _), (theirs, _) = run.clinhallu_columns(split), base.clinhallu_columns(split)
    if ours is None or theirs is None:
        return None
    valid_only = "valid_only" in (ours_metric.get("denominator"), theirs_metric.get("denominator"))
    before = dict(zip(theirs["ids"], theirs["correct"]))
    both = [row for row, i in enumerate(ours["ids"]) if i in before]
    rows = [row for row in both
            if not valid_only or (before[ours["ids"][row]] is not None and ours["correct"][row] is not None)]
    if not rows:
        return None
    unpaired = Unpaired(only_baseline=len(set(theirs["ids"]) - set(ours["ids"])),
                        only_other=len(set(ours["ids"]) - set(theirs["ids"])), unscored=len(both) - len(rows))
    a = [before[ours["ids"][row]] == 1 for row in rows]
    b = [ours["correct"][row] == 1 for row in rows]
    labels, unit = protocol_clusters(run, split, ours, rows)
    result = compare_accuracy(a, b, clusters=labels)
    mean_a, mean_b = 100 * sum(a) / len(a), 100 * sum(b) / len(b)
    return _comparison_cells(result, mean_a, mean_b, 100.0, unit, split, "Acc (ORG)", unpaired)


def _clinhallu_comparisons(runs: list[Run], table: Table, records: list[dict[str, Any]],
                           names: dict[int, tuple[str, str]]) -> None:
    """ClinHallu ORG accuracy of each mitigation against ``none`` (:func:`_clinhallu_org_pair`); ``names``:
    the rows' (model, mitigation) labels (:func:`_run_labels`)."""
    baselines = [run for run in runs if run.mitigation == "none" and _clinhallu_splits(run)]
    for run in runs:
        base = _baseline(run, baselines)
        if run.mitigation == "none" or base is None:
            continue
        for split in _clinhallu_splits(run):
            paired = _clinhallu_org_pair(base, run, split)
            if paired is not None:
                table.rows.append(([run.model, names[id(run)][1], split, "Acc (ORG)"], paired[0]))
                records.append({**_who(run), **paired[1]})


def build_tables(runs: list[Run], p_adjust: str = "holm") -> list[Table]:
    """Every table the runs have data for, marked and footnoted; ``p_adjust``: the comparisons' p-value
    adjustment (:func:`adjust_family`)."""
    tables = [t for t in (close_ended(runs), report_metrics(runs), generation_metrics(runs)) if t]
    tables += med_hallmark(runs)
    tables += [t for t in (stepbench(runs),) if t]
    tables += clinhallu(runs)
    comparison, _ = comparisons(runs, p_adjust)
    if comparison:
        tables.append(comparison)
    short = mitigation_labels(run.mitigation for run in runs)
    blind, _ = image_deltas(runs, p_adjust)
    if blind:
        tables.append(blind)
    for table in tables:
        shorten(table, short)
        mark(table)
        if any(c.ranked for c in table.columns) and table.rows:
            table.footer.append(MARK_NOTE)
        if any(cell.low is not None or cell.note for _, cells in table.rows for cell in cells):
            table.footer += cluster_footer(table)
        few = few_units_note(cell.n_clusters or cell.n for _, cells in table.rows for cell in cells
                             if cell.low is not None and not (cell.signed or cell.binary))  # scores, not 0/1 or Δ
        if few:
            table.footer.append(few)
        notes = sorted({cell.note for _, cells in table.rows for cell in cells if cell.note})
        table.footer += [f"No interval (†): {note}." for note in notes]
        table.footer += labeler_footer(runs, table)
    return tables


def shorten(table: Table, short: dict[str, str]) -> None:
    """Show the table's "Mitigation" labels short (``short``: spec -> label, :func:`mitigation_labels`), a
    blind run's control, a seeded pass's seed (`` · …``) and a twin run's `` (folder)`` kept; the data (CSV,
    JSON) keep the full specs, the legend maps them."""
    if "Mitigation" not in table.row_header:
        return
    index = table.row_header.index("Mitigation")
    for labels, _ in table.rows:
        text = labels[index]
        spec = _spec_of(text, short)
        if spec is not None and short[spec] != spec:
            table.labels[text] = short[spec] + text[len(spec):]


def legend_lines(table: Table) -> list[str]:
    """The legend under a table with short labels: ``label = full settings``, one per label."""
    return [f"{label} = {spec}" for spec, label in table.labels.items()]


# Tables are shown in sections, one per benchmark family (key prefix -> title); a table whose key matches
# none is a section of its own.
SECTIONS = (("medheval_", "MedHEval"), ("med_hallmark", "Med-HallMark"), ("med_stepbench", "Med-StepBench"),
            ("clinhallu", "ClinHallu"), ("mitigation_vs_none", "Mitigations against none"),
            ("image_vs_blind", "Image-blind controls"))


@dataclass
class Section:
    """Tables of one family, each with the footer lines that are its own, and the lines that two or more of
    them share (the interval method, the marks, ...), said once under the section."""

    title: str
    tables: list[tuple[Table, list[str]]]
    notes: list[str]


def sections(tables: list[Table]) -> list[Section]:
    """``tables`` grouped by :data:`SECTIONS` (in order of first appearance); a footer line found under two or
    more tables of a section moves to its notes, prefixed with those tables' names when not all have it."""
    groups: dict[str, list[Table]] = {}
    for table in tables:
        title = next((name for prefix, name in SECTIONS if table.key.startswith(prefix)), table.title)
        groups.setdefault(title, []).append(table)
    found = []
    for title, members in groups.items():
        having: dict[str, list[Table]] = {}
        for table in members:
            for line in dict.fromkeys(table.footer):
                having.setdefault(line, []).append(table)
        shared = [line for line, owners in having.items() if len(owners) > 1]
        notes = [line if len(having[line]) == len(members) else
                 "; ".join(t.title.partition(":")[0] for t in having[line]) + f": {line}" for line in shared]
        found.append(Section(title, [(t, [line for line in t.footer if line not in shared]) for t in members],
                             notes))
    return found


def sections_markdown(tables: list[Table]) -> str:
    """The tables as Markdown, section by section (:func:`sections`): each table with its own footer, then the
    section's shared notes once."""
    parts = []
    for section in sections(tables):
        parts += [to_markdown(table, footer) for table, footer in section.tables]
        if section.notes:
            parts.append(f"_Notes for the {md_text(section.title)} tables above:_  \n"
                         + "".join(f"_{md_text(line)}_  \n" for line in section.notes))
    return "\n".join(parts)


LABELED_COLUMNS = ("Recall", "CHAIR ↓")  # the columns whose findings come from a report labeler (chair)


def labeler_footer(runs: list[Run], table: Table) -> list[str]:
    """Which labeler gave CHAIR and Recall on each split of ``table`` (chair's ``labeler`` in results.json),
    with the note that the MedHEval paper used CheXbert wherever the offline rule labeler was used."""
    if not any(c.label in LABELED_COLUMNS for c in table.columns) or "Split" not in table.row_header:
        return []
    at = table.row_header.index("Split")
    shown = list(dict.fromkeys(labels[at] for labels, _ in table.rows))
    used: dict[str, list[str]] = {}
    for split in shown:
        for run in runs:
            out = (run.results["benchmarks"].get(split, {}).get("metrics", {}) or {}).get("chair")
            if not isinstance(out, dict):
                continue
            labeler = out.get("labeler")
            name = str(labeler) if labeler else "not recorded (a results.json written before chair named it)"
            if name not in used.setdefault(split, []):
                used[split].append(name)
    if not used:
        return []
    parts = []
    for split, names in used.items():
        notes = [LABELER_NOTE[name] for name in names if name in LABELER_NOTE]
        parts.append(f"{split}: {' / '.join(names)}" + (f" ({'; '.join(notes)})" if notes else ""))
    return ["CHAIR and Recall labeler — " + "; ".join(parts) + "."]


def cluster_footer(table: Table) -> list[str]:
    """The method note and, unless ``--cluster none``, what each split resampled and how many clusters (the
    most any cell of that split drew on; a column over part of a split draws on the clusters it holds)."""
    units: dict[str, int] = {}
    for _, cells in table.rows:
        for cell in cells:
            if cell.unit is not None and (cell.low is not None or cell.n_clusters):  # (too few: no interval)
                units[cell.unit] = max(units.get(cell.unit, 0), cell.n_clusters or 0)
    if not units:
        return [METHOD_NOTE]
    note = CLUSTER_NOTE if any(" by item" not in unit for unit in units) else METHOD_NOTE
    return [note, "Resampled: " + "; ".join(f"{unit} ({count} clusters)" for unit, count in units.items())
            + " — a column over part of a split (a category, step or source) resamples the clusters it holds."]


def mark(table: Table) -> None:
    """Best and worst value per ranked column (within each group), when at least two rows differ."""
    scope = () if table.group is None else (table.group,) if isinstance(table.group, int) else tuple(table.group)
    groups: dict[tuple[str, ...], list[int]] = {}
    for index, (labels, _) in enumerate(table.rows):
        groups.setdefault(tuple(labels[i] for i in scope), []).append(index)
    for col, column in enumerate(table.columns):
        if not column.ranked:
            continue
        for indices in groups.values():
            cells = [table.rows[i][1][col] for i in indices if table.rows[i][1][col].value is not None]
            values = {round(cell.value, 9) for cell in cells}
            if len(values) < 2:
                continue
            best, worst = (min(values), max(values)) if column.lower_is_better else (max(values), min(values))
            for cell in cells:
                cell.mark = "best" if round(cell.value, 9) == best else "worst" if round(cell.value, 9) == worst else ""


def format_cell(cell: Cell, markdown: bool = True) -> str:
    """``71.3 ± 2.0 [65.1, 77.4]`` (std, interval as present); ``†`` after a figure without an interval (the
    footer says why); ``–`` when missing; best/worst marks in Markdown only (HTML marks them by class)."""
    if cell.text is not None:
        return cell.text
    if cell.value is None:
        return "–"
    fmt = "{:+.1f}" if cell.signed else "{:.2f}" if abs(cell.value) < 10 and cell.std is not None else "{:.1f}"
    if cell.digits is not None:
        fmt = "{:%s.%df}" % ("+" if cell.signed else "", cell.digits)
    text = fmt.format(cell.value) + ("*" if cell.star else "")
    if cell.std is not None:
        text += f" ± {cell.std:.2f}"
    if cell.low is not None:
        text += f" [{fmt.format(cell.low)}, {fmt.format(cell.high)}]"
    elif cell.note:
        text += " †"
    if markdown and cell.mark == "best":
        text = f"**{text}** ▲"
    elif markdown and cell.mark == "worst":
        text += " ▼"
    return text


def to_markdown(table: Table, footer: list[str] | None = None) -> str:
    """One table (short labels, then their legend and ``footer``: the table's own when ``None``)."""
    header = [*table.row_header, *(c.label for c in table.columns)]
    lines = [f"## {md_text(table.title)}", "", "| " + " | ".join(md_cell(name) for name in header) + " |",
             "|" + "---|" * len(header)]
    for labels, cells in table.rows:
        lines.append("| " + " | ".join([*(md_cell(table.shown(label)) for label in labels),
                                        *(md_cell(format_cell(c)) for c in cells)]) + " |")
    footer = table.footer if footer is None else footer
    if table.labels:
        lines += ["", "Mitigation settings:", "", *(f"- {md_cell(line)}" for line in legend_lines(table))]
    if footer:
        lines += ["", *(f"_{md_text(line)}_  " for line in footer)]
    return "\n".join(lines) + "\n"


def to_csv(tables: list[Table]) -> str:
    """One tidy row per cell: table, row labels (joined), column, value, std, CI, n, mark, note."""
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(["table", "row", "column", "value", "std", "ci_low", "ci_high", "n", "mark", "text",
                     "no_interval_reason"])
    for table in tables:
        for labels, cells in table.rows:
            for column, cell in zip(table.columns, cells):
                writer.writerow([csv_cell(v) for v in (table.key, " | ".join(labels), column.label, *(
                    "" if v is None else v for v in (cell.value, cell.std, cell.low, cell.high, cell.n, cell.mark,
                                                     cell.text, cell.note)))])
    return buffer.getvalue()


def to_json(table: Table) -> dict[str, Any]:
    return {"key": table.key, "title": table.title, "row_header": table.row_header,
            "columns": [asdict(c) for c in table.columns], "footer": table.footer, "short_labels": table.labels,
            "rows": [{"labels": labels, "cells": [asdict(c) for c in cells]} for labels, cells in table.rows]}
