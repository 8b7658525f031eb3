"""PNG figures for the report (matplotlib, Agg backend, Okabe–Ito colour-blind-safe palette).

Every figure has a fixed pixel size (``SIZE`` at ``DPI``): per-type accuracy bars (MedHEval Figures 2/3
style), mitigation − none deltas with intervals, MediHall level distributions, ClinHallu stage rates and
Fix/Break, and judge-versus-human agreement (confusion matrix, or a scatter for numeric ratings).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from medheval.report.collect import Run  # noqa: E402
from medheval.report.paper import Cell, comparisons, figure  # noqa: E402
from medheval.report.tables import CATEGORY_COLUMNS, CLINHALLU_REPLACEMENTS, clinhallu_rows  # noqa: E402
from medheval.data.schema import VISUAL_CATEGORIES  # noqa: E402

# Okabe & Ito (2008), "Color Universal Design": distinguishable under the common colour-vision deficiencies.
OKABE_ITO = ("#E69F00", "#56B4E9", "#009E73", "#F0E442", "#0072B2", "#D55E00", "#CC79A7", "#000000")
DPI = 100
SIZE = (8.0, 4.5)  # inches: 800 × 450 pixels


def _new(nrows: int = 1, ncols: int = 1):
    fig, axes = plt.subplots(nrows, ncols, figsize=SIZE, dpi=DPI, squeeze=False)
    return fig, axes.ravel()


def _save(fig: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=DPI, format="png")  # no bbox_inches: the pixel size stays SIZE × DPI
    plt.close(fig)
    return path


def _colour(index: int) -> str:
    return OKABE_ITO[index % len(OKABE_ITO)]


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
    fig, axes = _new(1, len(splits))
    width = 0.8 / max(len(runs), 1)
    for ax, split in zip(axes, splits):
        for index, run in enumerate(runs):
            cells = [figure(run, split, "close_ended_accuracy", "accuracy", category=c) for c in VISUAL_CATEGORIES]
            if all(c.value is None for c in cells):
                continue
            shown = [c if c.value is not None else Cell(value=0.0) for c in cells]
            ax.bar([i + index * width for i in range(4)], [c.value for c in shown], width, yerr=_errors(shown),
                   capsize=2, color=_colour(index), label=run.label)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(4)], [CATEGORY_COLUMNS[c] for c in VISUAL_CATEGORIES])
        ax.set_ylim(0, 100)
        ax.set_title(split, fontsize=9)
        ax.set_ylabel("accuracy (%)")
    axes[0].legend(fontsize=7)
    return _save(fig, path)


def mitigation_deltas(records: list[dict[str, Any]], path: Path) -> Path | None:
    """Mitigation − none with its 95% interval (points), one row per mitigation × split × metric."""
    if not records:
        return None
    fig, (ax,) = _new()
    labels = [f"{r['mitigation']} · {r['split']} · {r['metric']}" for r in records]
    for y, record in enumerate(records):
        ax.errorbar(record["diff"], y, xerr=[[record["diff"] - record["low"]], [record["high"] - record["diff"]]],
                    fmt="o", color=_colour(4 if record["p_value"] >= 0.05 else 5), capsize=3)
    ax.axvline(0, color="#000000", linewidth=0.8)
    ax.set_yticks(range(len(records)), labels, fontsize=7)
    ax.set_xlabel("difference to none (points; orange-red: p < 0.05)")
    return _save(fig, path)


def medihall_levels(runs: list[Run], path: Path) -> Path | None:
    """Stacked bars: share of each MediHall level per model · mitigation · split."""
    rows = [(f"{run.label} · {split}", (entry.get("metrics", {}).get("medihall_score") or {}).get("level_distribution"))
            for run in runs for split, entry in run.results["benchmarks"].items()]
    rows = [(label, counts) for label, counts in rows if counts]
    if not rows:
        return None
    levels = list(dict.fromkeys(level for _, counts in rows for level in counts))
    fig, (ax,) = _new()
    left = [0.0] * len(rows)
    for index, level in enumerate(levels):
        shares = [100 * counts.get(level, 0) / (sum(counts.values()) or 1) for _, counts in rows]
        ax.barh(range(len(rows)), shares, left=left, color=_colour(index), label=level)
        left = [a + b for a, b in zip(left, shares)]
    ax.set_yticks(range(len(rows)), [label for label, _ in rows], fontsize=7)
    ax.set_xlabel("share of answers / sentences (%)")
    ax.legend(fontsize=7, ncol=3)
    return _save(fig, path)


def clinhallu_rates(runs: list[Run], path: Path) -> Path | None:
    """Left: Acc, H^V, H^K, H^R (%) per model · split; right: Fix and Break (%) per replacement setting."""
    rows = [(f"{model} · {split}", metric) for model, split, source, metric in clinhallu_rows([r.results for r in runs])
            if source == "all"]
    if not rows:
        return None
    fig, (left, right) = _new(1, 2)
    width = 0.8 / len(rows)
    for index, (label, metric) in enumerate(rows):
        keys = ("acc", "h_v", "h_k", "h_r")
        left.bar([i + index * width for i in range(4)], [100 * (metric.get(k) or 0) for k in keys], width,
                 color=_colour(index), label=label)
        fix = [100 * ((metric.get("fix_rate") or {}).get(k) or 0) for k, _ in CLINHALLU_REPLACEMENTS]
        brk = [100 * ((metric.get("break_rate") or {}).get(k) or 0) for k, _ in CLINHALLU_REPLACEMENTS]
        right.bar([i + index * width for i in range(3)], fix, width, color=_colour(index))
        right.bar([i + index * width for i in range(3)], [-b for b in brk], width, color=_colour(index), hatch="//")
    left.set_xticks([i + 0.4 - width / 2 for i in range(4)], ["Acc", "H^V", "H^K", "H^R"])
    left.set_ylabel("%")
    left.legend(fontsize=7)
    right.set_xticks([i + 0.4 - width / 2 for i in range(3)], [label for _, label in CLINHALLU_REPLACEMENTS])
    right.axhline(0, color="#000000", linewidth=0.8)
    right.set_ylabel("Fix (up) / Break (down, hatched), %")
    return _save(fig, path)


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


def write_plots(runs: list[Run], folder: Path) -> dict[str, Path]:
    """Every figure the runs have data for, as ``{name: path}``. The folder's earlier figures are removed
    first (a reused ``--output`` shows no stale plot), and labels are plain text (a ``$`` in a model name
    is not mathtext)."""
    if folder.is_dir():
        for stale in folder.glob("*.png"):
            stale.unlink()
    with plt.rc_context({"text.parse_math": False}):
        return _write_plots(runs, folder)


def _write_plots(runs: list[Run], folder: Path) -> dict[str, Path]:
    _, records = comparisons(runs)
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
    return {name: path for name, path in made.items() if path is not None}
