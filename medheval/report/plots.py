"""PNG figures for the report (matplotlib, Agg backend, Okabe–Ito colour-blind-safe palette).

Per-type accuracy bars (MedHEval Figures 2/3 style), a heatmap of mitigation − none with intervals and
significance, MediHall level distributions, ClinHallu stage rates and Fix/Break, Med-StepBench recall and
F1 per step, and judge-versus-human agreement (confusion matrix, or a scatter for numeric ratings).

A figure's size follows its content: at least ``SIZE`` (inches at ``DPI``), taller with more rows or legend
entries, so labels never overlap; it is saved with its tight bounding box, so no label is cut off.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import math
import textwrap

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.text import Text  # noqa: E402
from matplotlib.transforms import Bbox  # noqa: E402

from medheval.report.collect import Run, mitigation_labels, run_labels  # noqa: E402
from medheval.report.paper import Cell, comparisons, figure, stepbench  # noqa: E402
from medheval.report.stats import P_ADJUST_NAMES  # noqa: E402
from medheval.report.tables import (CATEGORY_COLUMNS, CLINHALLU_REPLACEMENTS, STEPBENCH_LANGUAGES,  # noqa: E402
                                    STEPBENCH_STEPS, clinhallu_rows)
from medheval.data.schema import VISUAL_CATEGORIES  # noqa: E402

# Okabe & Ito (2008), "Color Universal Design": distinguishable under the common colour-vision deficiencies.
OKABE_ITO = ("#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7", "#000000")
DPI = 100
SIZE = (8.0, 4.5)  # inches: the smallest figure, 800 × 450 pixels
ROW_INCHES = 0.3  # per labelled bar row (8-point labels need 0.11 inch)
LEGEND_INCHES = 0.25  # per legend row below a figure
LEGEND_COLUMNS = 3


def _new(nrows: int = 1, ncols: int = 1, height: float = SIZE[1], width: float = SIZE[0]):
    """A figure at least ``SIZE``, laid out by matplotlib's constrained layout (which also makes room for a
    legend placed "outside")."""
    fig, axes = plt.subplots(nrows, ncols, figsize=(max(width, SIZE[0]), max(height, SIZE[1])), dpi=DPI,
                             squeeze=False, layout="constrained")
    return fig, axes.ravel()


def _legend_height(entries: int) -> float:
    return LEGEND_INCHES * math.ceil(entries / LEGEND_COLUMNS)


def _legend_below(fig: Figure, ax: Any) -> None:
    """The figure's legend under its panels, :data:`LEGEND_COLUMNS` entries a row."""
    handles, labels = ax.get_legend_handles_labels()
    if handles:
        fig.legend(handles, labels, loc="outside lower center", ncols=min(LEGEND_COLUMNS, len(handles)), fontsize=8)


def _save(fig: Figure, path: Path) -> Path:
    """PNG of the figure's tight bounding box (every label inside the image)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=DPI, format="png", bbox_inches="tight", pad_inches=0.1)
    plt.close(fig)
    return path


def text_boxes(fig: Figure) -> list[tuple[str, Bbox]]:
    """Every visible, non-empty text of a drawn figure (tick labels, titles, cell values, legend) with its box
    in display pixels: the figure's own layout data, for checking that no two labels overlap."""
    renderer = fig.canvas.get_renderer()
    fig.draw(renderer)
    return [(text.get_text(), text.get_window_extent(renderer)) for text in fig.findobj(Text)
            if text.get_visible() and text.get_text().strip() and text.figure is not None]


def overlapping(boxes: Sequence[tuple[str, Bbox]]) -> list[tuple[str, str]]:
    """Pairs of texts whose boxes overlap (by more than a pixel each way)."""
    found = []
    for i, (a, box_a) in enumerate(boxes):
        for b, box_b in boxes[i + 1:]:
            dx = min(box_a.x1, box_b.x1) - max(box_a.x0, box_b.x0)
            dy = min(box_a.y1, box_b.y1) - max(box_a.y0, box_b.y0)
            if dx > 1 and dy > 1:
                found.append((a, b))
    return found


def _colour(index: int) -> str:
    return OKABE_ITO[index % len(OKABE_ITO)]


def _hatch(index: int) -> str | None:
    """Bars past the palette's eight colours repeat a colour, so they are hatched."""
    return None if index < len(OKABE_ITO) else ("//", "..", "xx")[(index // len(OKABE_ITO) - 1) % 3]


def _run_labels(runs: list[Run]) -> dict[int, str]:
    """``model · short mitigation`` per run, a blind run's control appended
    (:func:`medheval.report.collect.run_labels`)."""
    return run_labels(runs)


def _errors(cells: Sequence[Any]) -> list[list[float]]:
    """Asymmetric error bars (value − low, high − value); 0 where a cell has no interval."""
    return [[c.value - c.low if c.low is not None else 0.0 for c in cells],
            [c.high - c.value if c.high is not None else 0.0 for c in cells]]


def category_accuracy(runs: list[Run], path: Path) -> Path | None:
    """Grouped bars: accuracy (%) per hallucination type, one bar per model · mitigation, one panel per split."""
    splits = [s for s in dict.fromkeys(s for run in runs for s, e in run.results["benchmarks"].items()
                                       if (e.get("metrics", {}).get("close_ended_accuracy") or {})
                                       .get("accuracy_by_category"))]
    splits = [s for s in splits if any(c in (run.results["benchmarks"].get(s, {}).get("metrics", {})
                                            .get("close_ended_accuracy", {}).get("accuracy_by_category") or {})
                                       for run in runs for c in VISUAL_CATEGORIES)][:4]
    if not splits:
        return None
    fig, axes = _new(1, len(splits), height=SIZE[1] + _legend_height(len(runs)))
    width = 0.8 / max(len(runs), 1)
    labels = _run_labels(runs)
    for ax, split in zip(axes, splits):
        for index, run in enumerate(runs):
            cells = [figure(run, split, "close_ended_accuracy", "accuracy", category=c) for c in VISUAL_CATEGORIES]
            if all(c.value is None for c in cells):
                continue
            shown = [c if c.value is not None else Cell(value=0.0) for c in cells]
            ax.bar([i + index * width for i in range(4)], [c.value for c in shown], width, yerr=_errors(shown),
                   capsize=2, color=_colour(index), hatch=_hatch(index), label=labels[id(run)])
        ax.set_xticks([i + 0.4 - width / 2 for i in range(4)], [CATEGORY_COLUMNS[c] for c in VISUAL_CATEGORIES])
        ax.set_ylim(0, 100)
        ax.set_title(split, fontsize=9)
        ax.set_ylabel("accuracy (%)")
    _legend_below(fig, axes[0])
    return _save(fig, path)


# The deltas heatmap: a row per mitigation, a column per split · metric, wrapped into panels of at most
# PANEL_COLUMNS columns (small multiples stacked vertically) so that the figure stays readable when it is wide.
CELL = (1.1, 0.42)  # inches per cell (fits "+12.3*" over "[-10.5, +14.2]" in 7-point type)
PANEL_HEADER = 0.6  # inches above each panel for its column labels (split, metric)
PANEL_COLUMNS = 8
LABEL_CHARS = 16  # column labels wrap at this many characters (7-point type in CELL[0])
SIGNIFICANT = 0.05
DELTA_CMAP = "PuOr"  # ColorBrewer purple–orange, diverging and colour-blind safe
DELTA_CAPTION = ("Each cell: mitigation − none on the same items (points) and its 95% interval (none: too few "
                 "clusters); * adjusted p < 0.05 over the family of all cells ({method}; full colour; pale: not "
                 "significant; grey –: not compared). Purple: better than none, orange: worse (↓: lower is better); "
                 "colour scaled per column.")


def delta_panels(records: list[dict[str, Any]]) -> list[list[tuple[str, str]]]:
    """The (split, metric) columns of the heatmap, in record order, as panels of at most
    :data:`PANEL_COLUMNS`; a split starts a new panel rather than being cut, unless it alone is wider."""
    columns: dict[str, list[str]] = {}
    for record in records:
        metrics = columns.setdefault(record["split"], [])
        if record["metric"] not in metrics:
            metrics.append(record["metric"])
    panels: list[list[tuple[str, str]]] = [[]]
    for split, metrics in columns.items():
        if panels[-1] and len(panels[-1]) + len(metrics) > PANEL_COLUMNS:
            panels.append([])
        for metric in metrics:
            if len(panels[-1]) == PANEL_COLUMNS:
                panels.append([])
            panels[-1].append((split, metric))
    return panels


def deltas_figure(records: list[dict[str, Any]]) -> Figure | None:
    """Heatmap of mitigation − none (:func:`medheval.report.paper.comparisons` records): a row per
    mitigation (short label, :func:`medheval.report.collect.mitigation_labels`; with the model when several
    are shown), a column per split · metric (panels: :func:`delta_panels`). A cell shows Δ, ``*`` when its
    adjusted p < 0.05 (the record's ``significant``), and its 95% interval; its colour is Δ over the column's largest |Δ|, sign flipped for ↓ metrics
    (purple always better), pale when not significant, grey "–" when not compared. The figure grows with
    rows and columns (:data:`CELL`)."""
    if not records:
        return None
    rows = list(dict.fromkeys((r["model"], r["mitigation"]) for r in records))
    short = mitigation_labels(mitigation for _, mitigation in rows)
    several = len({model for model, _ in rows}) > 1
    row_labels = [(f"{model} · " if several else "") + short[mitigation] for model, mitigation in rows]
    by_key = {(r["split"], r["metric"], (r["model"], r["mitigation"])): r for r in records}
    panels = delta_panels(records)
    width = max(CELL[0] * max(len(panel) for panel in panels), 4.0)
    method = next((r.get("p_adjust") for r in records if r.get("p_adjust")), "none")
    caption = textwrap.fill(DELTA_CAPTION.format(method=P_ADJUST_NAMES.get(method, method)),
                            width=int(width * 72 / 4.2))
    footer = 0.2 + 0.12 * (caption.count("\n") + 1)
    height = CELL[1] * len(rows)
    total = (height + PANEL_HEADER) * len(panels) + footer
    fig = plt.figure(figsize=(width, total), dpi=DPI)
    cmap = plt.get_cmap(DELTA_CMAP)
    for number, columns in enumerate(panels):
        bottom = total - (number + 1) * (PANEL_HEADER + height)
        ax = fig.add_axes((0.0, bottom / total, CELL[0] * len(columns) / width, height / total))
        scale = {column: max((abs(r["diff"]) for (s, m, _), r in by_key.items() if (s, m) == column),
                             default=0.0) or 1.0 for column in columns}
        colours, texts = [], []
        for row in rows:
            colour_row = []
            for split, metric in columns:
                record = by_key.get((split, metric, row))
                if record is None:
                    colour_row.append((0.87, 0.87, 0.87))
                    texts.append(("–", "#000000"))
                    continue
                better = (-1 if "↓" in metric else 1) * record["diff"] / scale[(split, metric)]
                significant = record.get("significant", record["p_value"] < SIGNIFICANT
                                         and record.get("low") is not None)
                colour = cmap(0.5 + 0.5 * max(-1.0, min(1.0, better)))[:3]
                colour_row.append(colour if significant else tuple(0.35 * c + 0.65 for c in colour))
                interval = ("no interval" if record.get("low") is None
                            else f"[{record['low']:+.1f}, {record['high']:+.1f}]")
                texts.append((f"{record['diff']:+.1f}{'*' if significant else ''}\n{interval}",
                              "#FFFFFF" if significant and abs(better) > 0.6 else "#000000"))
            colours.append(colour_row)
        ax.imshow(colours, aspect="auto", interpolation="nearest")
        for index, (text, colour) in enumerate(texts):
            ax.text(index % len(columns), index // len(columns), text, ha="center", va="center", fontsize=7,
                    color=colour, linespacing=1.1)
        ax.xaxis.tick_top()
        ax.set_xticks(range(len(columns)), [f"{textwrap.fill(split, LABEL_CHARS)}\n{textwrap.fill(metric, LABEL_CHARS)}"
                                            for split, metric in columns], fontsize=7)
        ax.set_yticks(range(len(rows)), row_labels, fontsize=8)
        ax.tick_params(length=0)
    fig.text(0.0, 0.2 / total, caption, fontsize=7, va="bottom", ha="left")
    return fig


def mitigation_deltas(records: list[dict[str, Any]], path: Path) -> Path | None:
    """The :func:`deltas_figure` as a PNG."""
    fig = deltas_figure(records)
    return None if fig is None else _save(fig, path)


def medihall_levels(runs: list[Run], path: Path) -> Path | None:
    """Stacked bars: share of each MediHall level per model · mitigation · split."""
    labels = _run_labels(runs)
    rows = [(f"{labels[id(run)]} · {split}", (entry.get("metrics", {}).get("medihall_score") or {})
             .get("level_distribution")) for run in runs for split, entry in run.results["benchmarks"].items()]
    rows = [(label, counts) for label, counts in rows if counts]
    if not rows:
        return None
    levels = list(dict.fromkeys(level for _, counts in rows for level in counts))
    fig, (ax,) = _new(height=1.5 + ROW_INCHES * len(rows) + _legend_height(len(levels)))
    left = [0.0] * len(rows)
    for index, level in enumerate(levels):
        shares = [100 * counts.get(level, 0) / (sum(counts.values()) or 1) for _, counts in rows]
        ax.barh(range(len(rows)), shares, left=left, color=_colour(index), hatch=_hatch(index), label=level)
        left = [a + b for a, b in zip(left, shares)]
    ax.set_yticks(range(len(rows)), [label for label, _ in rows], fontsize=7)
    ax.set_xlabel("share of answers / sentences (%)")
    ax.invert_yaxis()  # the first run on top, as in the tables
    _legend_below(fig, ax)
    return _save(fig, path)


def clinhallu_rates(runs: list[Run], path: Path) -> Path | None:
    """Left: Acc, H^V, H^K, H^R (%) per model · split; right: Fix and Break (%) per replacement setting."""
    rows = [(f"{model} · {split}", metric) for model, split, source, metric in clinhallu_rows([r.results for r in runs])
            if source == "all"]
    if not rows:
        return None
    fig, (left, right) = _new(1, 2, height=SIZE[1] + _legend_height(len(rows)))
    width = 0.8 / len(rows)
    for index, (label, metric) in enumerate(rows):
        keys = ("acc", "h_v", "h_k", "h_r")
        left.bar([i + index * width for i in range(4)], [100 * (metric.get(k) or 0) for k in keys], width,
                 color=_colour(index), hatch=_hatch(index), label=label)
        fix = [100 * ((metric.get("fix_rate") or {}).get(k) or 0) for k, _ in CLINHALLU_REPLACEMENTS]
        brk = [100 * ((metric.get("break_rate") or {}).get(k) or 0) for k, _ in CLINHALLU_REPLACEMENTS]
        right.bar([i + index * width for i in range(3)], fix, width, color=_colour(index), hatch=_hatch(index))
        right.bar([i + index * width for i in range(3)], [-b for b in brk], width, color=_colour(index), hatch="//")
    left.set_xticks([i + 0.4 - width / 2 for i in range(4)], ["Acc", "H^V", "H^K", "H^R"])
    left.set_ylabel("%")
    _legend_below(fig, left)
    right.set_xticks([i + 0.4 - width / 2 for i in range(3)], [label for _, label in CLINHALLU_REPLACEMENTS])
    right.axhline(0, color="#000000", linewidth=0.8)
    right.set_ylabel("Fix (up) / Break (down, hatched), %")
    return _save(fig, path)


def stepbench_steps(runs: list[Run], path: Path) -> Path | None:
    """The :func:`stepbench_figure` as a PNG."""
    fig = stepbench_figure(runs)
    return None if fig is None else _save(fig, path)


def stepbench_figure(runs: list[Run]) -> Figure | None:
    """Med-StepBench recall and F1 (%) per step (its Table 3 as bars with 95% intervals): a panel per
    measure × language (EN, VI), a bar per model · mitigation · knowledge setting (hatched: with knowledge);
    Step 1 has no bar in a row with knowledge (its prompts take none)."""
    table = stepbench(runs)
    if table is None or not table.rows:
        return None
    labels = [c.label for c in table.columns]
    variants = [row[1].partition(" · ") for row, _ in table.rows]  # (mitigation spec, " · ", a blind run's control)
    short = mitigation_labels(spec for spec, _, _ in variants)
    series = [(" · ".join([row[0], short[spec], *([control] if control else []), f"knowledge {row[2]}"]), cells)
              for (row, cells), (spec, _, control) in zip(table.rows, variants)]
    fig, axes = _new(2, len(STEPBENCH_LANGUAGES), height=SIZE[1] + 1.0 + _legend_height(len(series)))
    width = 0.8 / len(series)
    for panel, (what, name) in enumerate((("R", "recall"), ("F1", "F1"))):
        for column, language in enumerate(STEPBENCH_LANGUAGES):
            ax = axes[panel * len(STEPBENCH_LANGUAGES) + column]
            for index, (label, cells) in enumerate(series):
                picked = [(i, cells[labels.index(f"{language.upper()} S{step} {what}")])
                          for i, step in enumerate(STEPBENCH_STEPS)]
                shown = [(i, c) for i, c in picked if c.value is not None]  # no bar where the table has "–"
                ax.bar([i + index * width for i, _ in shown], [c.value for _, c in shown], width,
                       yerr=_errors([c for _, c in shown]), capsize=2, color=_colour(index), label=label,
                       hatch=_hatch(index) if label.endswith("knowledge none") else "//")
            ax.set_xticks([i + 0.4 - width / 2 for i in range(len(STEPBENCH_STEPS))],
                          [f"Step {step}" for step in STEPBENCH_STEPS])
            ax.set_ylim(0, 100)
            ax.set_title(f"{language.upper()}: {name} (%)", fontsize=9)
    _legend_below(fig, axes[0])
    return fig


def agreement_plot(path: Path, confusion: dict[str, Any] | None = None, judge: Sequence[float] | None = None,
                   human: Sequence[float] | None = None, title: str = "judge vs human") -> Path:
    """A confusion matrix (``{"levels", "rows"}``: rows = human, columns = judge) or a scatter of numeric
    ratings with Pearson r and Cohen's kappa from :func:`medheval.judges.agreement.agreement`."""
    fig, (ax,) = _new()
    if confusion is not None:
        levels, matrix = confusion["levels"], confusion["rows"]
        image = ax.imshow(matrix, cmap="Blues")
        for i, row in enumerate(matrix):
            for j, count in enumerate(row):
                ax.text(j, i, str(count), ha="center", va="center", fontsize=8)
        ax.set_xticks(range(len(levels)), levels, rotation=30, fontsize=7)
        ax.set_yticks(range(len(levels)), levels, fontsize=7)
        ax.set_xlabel("judge / detector")
        ax.set_ylabel("human")
        fig.colorbar(image, ax=ax)
    else:
        from medheval.judges.agreement import agreement

        if judge is None or human is None:
            raise ValueError("agreement_plot needs a confusion matrix, or judge and human ratings")
        stats = agreement(list(human), list(judge))
        ax.scatter(human, judge, color=_colour(4), alpha=0.6)
        ax.set_xlabel("human")
        ax.set_ylabel("judge")
        title += "".join(f", {name} {stats[key]:.2f}" for key, name in (("pearson", "r"), ("cohen_kappa", "κ"))
                         if stats[key] is not None) + f" (n={stats['n']})"
    ax.set_title(title, fontsize=9)
    return _save(fig, path)


def write_plots(runs: list[Run], folder: Path, p_adjust: str = "holm") -> dict[str, Path]:
    """Every figure the runs have data for, as ``{name: path}``. The folder's earlier figures are removed
    first (a reused ``--output`` shows no stale plot), and labels are plain text (a ``$`` in a model name
    is not mathtext)."""
    if folder.is_dir():
        for stale in folder.glob("*.png"):
            stale.unlink()
    with plt.rc_context({"text.parse_math": False}):
        return _write_plots(runs, folder, p_adjust)


def _write_plots(runs: list[Run], folder: Path, p_adjust: str) -> dict[str, Path]:
    _, records = comparisons(runs, p_adjust)
    made = {"category_accuracy": category_accuracy(runs, folder / "category_accuracy.png"),
            "mitigation_deltas": mitigation_deltas(records, folder / "mitigation_deltas.png"),
            "medihall_levels": medihall_levels(runs, folder / "medihall_levels.png"),
            "clinhallu": clinhallu_rates(runs, folder / "clinhallu.png")}
    for run in runs:
        for split, entry in run.results["benchmarks"].items():
            confusion = (entry.get("metrics", {}).get("medihall_detection") or {}).get("confusion")
            if confusion and confusion.get("levels"):
                name = f"agreement_{len(made)}"
                made[name] = agreement_plot(folder / f"{name}.png", confusion=confusion,
                                            title=f"{run.model} · {split}: levels vs human")
    made["stepbench_steps"] = stepbench_steps(runs, folder / "stepbench_steps.png")
    return {name: path for name, path in made.items() if path is not None}
