"""PNG figures for the report (matplotlib, Agg backend, Okabe–Ito colour-blind-safe palette).

Per-type accuracy bars (MedHEval Figures 2/3 style), a heatmap of mitigation − none with intervals and
significance, MediHall level distributions, ClinHallu stage rates and Fix/Break, Med-StepBench recall and
F1 per step, and judge-versus-human agreement (confusion matrix, or a scatter for numeric ratings).

A bar is drawn only for a figure the tables show: a cell without a figure gets no bar (never a 0; "–" at its
place), a cell without an interval no error bar but an "n/i" label, and the panel's x-axis note counts both
(:class:`Bars`).

A figure's size follows its content: at least ``SIZE`` (inches at ``DPI``), taller with more rows or legend
entries, so labels never overlap; it is saved with its tight bounding box, so no label is cut off.
"""

from __future__ import annotations

from dataclasses import dataclass, field
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

from medheval.report.collect import Run, mitigation_labels, run_labels, seed_label  # noqa: E402
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


NO_INTERVAL = "n/i"  # the label over a bar whose cell has no interval (the table marks it †)


@dataclass
class Bars:
    """One series of bars as drawn: a bar per cell with a figure (``x``, ``heights``), its error bar
    (``below``/``above``: value − low, high − value; ``None`` without an interval, then no error bar and an
    :data:`NO_INTERVAL` label); ``missing``: positions of cells without a figure, which get no bar."""

    x: list[float] = field(default_factory=list)
    heights: list[float] = field(default_factory=list)
    below: list[float | None] = field(default_factory=list)
    above: list[float | None] = field(default_factory=list)
    missing: list[float] = field(default_factory=list)

    @property
    def no_interval(self) -> list[float]:
        """Positions of the bars drawn without an interval."""
        return [x for x, below in zip(self.x, self.below) if below is None]


def bars(cells: Sequence[Cell], positions: Sequence[float]) -> Bars:
    """The :class:`Bars` of ``cells`` at ``positions``: no bar for a cell without a figure, no error bar for one
    without an interval."""
    out = Bars()
    for x, cell in zip(positions, cells):
        if cell.value is None:
            out.missing.append(x)
            continue
        out.x.append(x)
        out.heights.append(cell.value)
        interval = cell.low is not None and cell.high is not None
        out.below.append(cell.value - cell.low if interval else None)
        out.above.append(cell.high - cell.value if interval else None)
    return out


MISSING = "–"  # at the foot of the place of a bar whose cell has no figure (as the tables show it)


def _draw_bars(ax: Any, series: Bars, width: float, top: float = 100.0, **style: Any) -> None:
    """Bars of ``series`` on ``ax`` (``style``: colour, hatch, label), error bars where there is an interval, an
    :data:`NO_INTERVAL` label (upright, inside a bar that reaches the top) where there is none, and
    :data:`MISSING` where a cell has no figure (no bar)."""
    ax.bar(series.x, series.heights, width, **style)
    shown = [(x, h, b, a) for x, h, b, a in zip(series.x, series.heights, series.below, series.above) if b is not None]
    if shown:
        x, heights, below, above = zip(*shown)
        ax.errorbar(x, heights, yerr=[below, above], fmt="none", ecolor="#000000", elinewidth=1, capsize=2)
    for x, height, below in zip(series.x, series.heights, series.below):
        if below is None:
            inside = height > 0.8 * top
            ax.text(x, height - 0.02 * top if inside else height + 0.01 * top, NO_INTERVAL, rotation=90,
                    ha="center", va="top" if inside else "bottom", fontsize=7)
    for x in series.missing:
        ax.text(x, 0.01 * top, MISSING, ha="center", va="bottom", fontsize=7)


def bar_note(series: Sequence[Bars]) -> str:
    """The panel's note on what its bars leave out: bars without an interval and cells without a bar, counted
    ("" when neither)."""
    no_interval = sum(len(s.no_interval) for s in series)
    missing = sum(len(s.missing) for s in series)
    parts = [f"{NO_INTERVAL}: no interval ({no_interval} bar(s); the table's † says why)" if no_interval else "",
             f"no figure, no bar: {missing}" if missing else ""]
    return "; ".join(part for part in parts if part)


def category_series(runs: list[Run]) -> list[tuple[str, list[tuple[str, Bars]]]]:
    """Per split (four at most) with per-type accuracy, the bars of each model · mitigation that has any:
    (label, :class:`Bars` at x = type index + series index × :func:`_bar_width`). A run without any per-type
    figure on the split has no series there."""
    splits = [s for s in dict.fromkeys(s for run in runs for s, e in run.results["benchmarks"].items()
                                       if (e.get("metrics", {}).get("close_ended_accuracy") or {})
                                       .get("accuracy_by_category"))]
    splits = [s for s in splits if any(c in (run.results["benchmarks"].get(s, {}).get("metrics", {})
                                            .get("close_ended_accuracy", {}).get("accuracy_by_category") or {})
                                       for run in runs for c in VISUAL_CATEGORIES)][:4]
    width = _bar_width(len(runs))
    labels = _run_labels(runs)
    out = []
    for split in splits:
        series = []
        for index, run in enumerate(runs):
            cells = [figure(run, split, "close_ended_accuracy", "accuracy", category=c) for c in VISUAL_CATEGORIES]
            if any(c.value is not None for c in cells):
                series.append((labels[id(run)], bars(cells, [i + index * width for i in range(4)])))
        out.append((split, series))
    return out


def _bar_width(series: int) -> float:
    return 0.8 / max(series, 1)


def category_figure(runs: list[Run]) -> Figure | None:
    """Grouped bars: accuracy (%) per hallucination type, one bar per model · mitigation, one panel per split
    (:func:`category_series`); colours follow the runs' order."""
    panels = category_series(runs)
    if not panels:
        return None
    fig, axes = _new(1, len(panels), height=SIZE[1] + _legend_height(len(runs)))
    width = _bar_width(len(runs))
    labels = _run_labels(runs)
    index_of = {labels[id(run)]: index for index, run in enumerate(runs)}
    for ax, (split, series) in zip(axes, panels):
        for label, drawn in series:
            index = index_of[label]
            _draw_bars(ax, drawn, width, color=_colour(index), hatch=_hatch(index), label=label)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(4)], [CATEGORY_COLUMNS[c] for c in VISUAL_CATEGORIES])
        ax.set_ylim(0, 100)
        ax.set_title(split, fontsize=9)
        ax.set_ylabel("accuracy (%)")
        note = bar_note([drawn for _, drawn in series])
        if note:
            ax.set_xlabel(textwrap.fill(note, 40), fontsize=7)
    _legend_below(fig, axes[0])
    return fig


def category_accuracy(runs: list[Run], path: Path) -> Path | None:
    """The :func:`category_figure` as a PNG."""
    fig = category_figure(runs)
    return None if fig is None else _save(fig, path)


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
    mitigation run (:func:`delta_rows`: short label, with the model when several are shown and the seed of a
    pass of ``--seeds``), a column per split · metric (panels: :func:`delta_panels`). A cell shows Δ, ``*`` when its
    adjusted p < 0.05 (the record's ``significant``), and its 95% interval; its colour is Δ over the column's largest |Δ|, sign flipped for ↓ metrics
    (purple always better), pale when not significant, grey "–" when not compared. The figure grows with
    rows and columns (:data:`CELL`)."""
    if not records:
        return None
    rows, row_labels = delta_rows(records)
    by_key = {(r["split"], r["metric"], _row_key(r)): r for r in records}
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


def _row_key(record: dict[str, Any]) -> tuple[str, str, int | None, str | None]:
    """The heatmap row of a comparison record: model, mitigation, seed (a pass of ``--seeds``), run folder."""
    return record["model"], record["mitigation"], record.get("seed"), record.get("run")


def delta_rows(records: list[dict[str, Any]]) -> tuple[list[tuple[str, str, int | None, str | None]], list[str]]:
    """The heatmap's rows (:func:`_row_key`, in record order) and their labels: short mitigation, the model
    when several are shown, `` · seed s`` for a pass of ``--seeds``, and the run's folder name (its path when
    the names are alike too) for rows still alike."""
    rows = list(dict.fromkeys(_row_key(r) for r in records))
    short = mitigation_labels(row[1] for row in rows)
    several = len({row[0] for row in rows}) > 1
    labels = [(f"{model} · " if several else "") + short[mitigation] + (seed_label(seed) if seed is not None else "")
              for model, mitigation, seed, _ in rows]
    shown = []
    for row, label in zip(rows, labels):
        twins = [other for other, text in zip(rows, labels) if text == label]
        if len(twins) > 1 and row[3]:
            names = {Path(other[3]).name for other in twins if other[3]}
            label += f" ({Path(row[3]).name if len(names) == len(twins) else row[3]})"
        shown.append(label)
    return rows, shown


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
    """The :func:`clinhallu_figure` as a PNG."""
    fig = clinhallu_figure(runs)
    return None if fig is None else _save(fig, path)


def clinhallu_figure(runs: list[Run]) -> Figure | None:
    """Left: Acc, H^V, H^K, H^R (%) per model · split; right: Fix and Break (%) per replacement setting. No
    intervals (the tables give them; the x-axis note says so); a figure results.json lacks gets no bar, counted
    in the note."""
    rows = [(f"{model} · {split}", metric) for model, split, source, metric in clinhallu_rows([r.results for r in runs])
            if source == "all"]
    if not rows:
        return None
    fig, (left, right) = _new(1, 2, height=SIZE[1] + _legend_height(len(rows)))
    width = 0.8 / len(rows)
    missing = 0
    for index, (label, metric) in enumerate(rows):
        keys = ("acc", "h_v", "h_k", "h_r")
        stage = _present([i + index * width for i in range(4)], [metric.get(k) for k in keys])
        fix = _present([i + index * width for i in range(3)],
                       [(metric.get("fix_rate") or {}).get(k) for k, _ in CLINHALLU_REPLACEMENTS])
        brk = _present([i + index * width for i in range(3)],
                       [(metric.get("break_rate") or {}).get(k) for k, _ in CLINHALLU_REPLACEMENTS])
        missing += (4 - len(stage)) + (3 - len(fix)) + (3 - len(brk))
        left.bar([x for x, _ in stage], [100 * v for _, v in stage], width, color=_colour(index),
                 hatch=_hatch(index), label=label)
        right.bar([x for x, _ in fix], [100 * v for _, v in fix], width, color=_colour(index), hatch=_hatch(index))
        right.bar([x for x, _ in brk], [-100 * v for _, v in brk], width, color=_colour(index), hatch="//")
    left.set_xticks([i + 0.4 - width / 2 for i in range(4)], ["Acc", "H^V", "H^K", "H^R"])
    left.set_ylabel("%")
    left.set_xlabel("figures of ClinHallu Tables 2–3, without intervals (the tables give them)"
                    + (f"; no figure, no bar: {missing}" if missing else ""), fontsize=7)
    _legend_below(fig, left)
    right.set_xticks([i + 0.4 - width / 2 for i in range(3)], [label for _, label in CLINHALLU_REPLACEMENTS])
    right.axhline(0, color="#000000", linewidth=0.8)
    right.set_ylabel("Fix (up) / Break (down, hatched), %")
    return fig


def _present(positions: Sequence[float], values: Sequence[Any]) -> list[tuple[float, float]]:
    """(position, value) of the values that are numbers (a missing figure gets no bar, not a 0)."""
    return [(x, float(v)) for x, v in zip(positions, values)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)]


def stepbench_steps(runs: list[Run], path: Path) -> Path | None:
    """The :func:`stepbench_figure` as a PNG."""
    fig = stepbench_figure(runs)
    return None if fig is None else _save(fig, path)


def stepbench_figure(runs: list[Run]) -> Figure | None:
    """Med-StepBench recall and F1 (%) per step (its Table 3 as bars with 95% intervals): a panel per
    measure × language (EN, VI), a bar per model · mitigation · knowledge setting (hatched: with knowledge);
    Step 1 has no bar in a row with knowledge (its prompts take none); a bar without an interval is labelled
    "n/i" (:func:`_draw_bars`)."""
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
            drawn = []
            for index, (label, cells) in enumerate(series):
                picked = [cells[labels.index(f"{language.upper()} S{step} {what}")] for step in STEPBENCH_STEPS]
                drawn.append(bars(picked, [i + index * width for i in range(len(STEPBENCH_STEPS))]))
                _draw_bars(ax, drawn[-1], width, color=_colour(index), label=label,  # no bar where the table has "–"
                           hatch=_hatch(index) if label.endswith("knowledge none") else "//")
            ax.set_xticks([i + 0.4 - width / 2 for i in range(len(STEPBENCH_STEPS))],
                          [f"Step {step}" for step in STEPBENCH_STEPS])
            ax.set_ylim(0, 100)
            ax.set_title(f"{language.upper()}: {name} (%)", fontsize=9)
            note = bar_note(drawn)
            if note:
                ax.set_xlabel(textwrap.fill(note, 50), fontsize=7)
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
