"""The "over seeds" table: for runs sampled with several seeds (``--seeds``, :mod:`medheval.run.seeds`), every
figure's mean and spread over the seeds beside its interval over items.

Two sources of variation, shown side by side for each figure ``x_s`` of seeds ``s = 1..k`` (the passes of one
model × mitigation × control, told apart by ``settings.seed``, shown as ``· seed s`` in their rows):

* over seeds: mean ``m = Σ x_s / k``, sample standard deviation ``SD = sqrt(Σ (x_s − m)² / (k − 1))`` and
  the range ``min_s x_s – max_s x_s``;
* over items: the half-width of each pass's 95% interval over items (or the split's clusters), ``(high_s −
  low_s) / 2``, averaged over the seeds that have one. It is the interval of the figure's table
  (:mod:`medheval.report.stats`): for a figure the expanded percentile bootstrap (joined with the BCa interval
  for a figure that is not 0/1; a 0/1 figure's also spans the Clopper–Pearson interval over its effective
  sample size and the exact bound of no success or failure),
  for a paired Δ (mitigation − none, with image − blind) the sign-flip test inverted (joined with Tango's
  score interval for 0/1 answers).

An SD as large as the item half-width says the seed matters as much as the item sample does.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from medheval.report.collect import seed_label
from medheval.report.paper import Cell, Column, Table

SEED_LABEL = re.compile(r"^(.*) · seed (\d+)$")
NOTE = ("Mean and SD (sample, n − 1) and min–max over the sampling seeds of each row; item ± : the half-width "
        "of each seed's 95% interval over items (or clusters), averaged over the seeds that have one: the interval "
        "of the row's table — for a figure its bootstrap interval (for a 0/1 figure widened to the binomial "
        "interval over its effective sample size, for any other joined with the BCa interval), for a paired Δ "
        "(mitigation − none, with image − blind) the sign-flip test inverted (for 0/1 answers joined with "
        "Tango's score interval) (medheval/report/seeds.py).")


def _unseeded(labels: list[str]) -> tuple[tuple[str, ...], int | None]:
    """Row labels with the seed taken out, and the seed (``None`` for a row of an unseeded run)."""
    seed = None
    out = []
    for label in labels:
        found = SEED_LABEL.match(label)
        if found and seed is None:
            out.append(found.group(1))
            seed = int(found.group(2))
        else:
            out.append(label)
    return tuple(out), seed


def _stats(values: list[float]) -> tuple[float, float | None]:
    mean = sum(values) / len(values)
    if len(values) < 2:
        return mean, None
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def over_seeds(tables: list[Table]) -> Table | None:
    """One row per table × row (seed taken out) × column whose figure was computed under at least two seeds."""
    out = Table("over_seeds", "Over sampling seeds: mean and spread, beside the interval over items",
                ["Table", "Row", "Column"],
                [Column("Seeds", ranked=False), Column("Mean ± SD over seeds", ranked=False),
                 Column("Min–max over seeds", ranked=False), Column("Item 95% CI ± (mean over seeds)", ranked=False)])
    for table in tables:
        if table.key == out.key:
            continue
        groups: dict[tuple[str, ...], dict[int, list[Cell]]] = {}
        for labels, cells in table.rows:
            key, seed = _unseeded(list(labels))
            if seed is not None:
                groups.setdefault(key, {})[seed] = cells
        for key, by_seed in groups.items():
            if len(by_seed) < 2:
                continue
            seeds = sorted(by_seed)
            for index, column in enumerate(table.columns):
                # the seeds with a figure in this column: the count and the list name only those
                having = [s for s in seeds if index < len(by_seed[s]) and by_seed[s][index].value is not None
                          and by_seed[s][index].text is None]
                numbers = [(by_seed[s][index].value, by_seed[s][index].low, by_seed[s][index].high) for s in having]
                if len(numbers) < 2:
                    continue
                values = [v for v, _, _ in numbers]
                mean, sd = _stats(values)
                halves = [(high - low) / 2 for _, low, high in numbers if low is not None and high is not None]
                half = sum(halves) / len(halves) if halves else None
                shown = " · ".join(table.shown(label) for label in key)
                # the figures' own decimals (one for percentages, two for a raw scale such as RadCliQ's), one more
                # for the mean beside its SD: "1.2–1.3" hid the spread of 1.25 ± 0.02
                digits = max(by_seed[s][index].digits or 1 for s in having)
                out.rows.append(([table.title, shown, column.label], [
                    Cell(text=f"{len(values)} ({', '.join(str(s) for s in having)})", n=len(values)),
                    Cell(value=mean, std=sd, digits=digits + 1),
                    Cell(text=f"{min(values):.{digits}f}–{max(values):.{digits}f}", low=min(values), high=max(values)),
                    Cell(value=half, text=f"± {half:.{digits}f}" if half is not None else "–"),
                ]))
    if not out.rows:
        return None
    out.footer.append(NOTE)
    return out


def over_seeds_of(output: str | Path, cluster: str = "auto") -> Table | None:
    """The over-seeds table of the runs under ``output`` (a ``--seeds`` run's folder), or ``None``."""
    from medheval.report.collect import find_runs
    from medheval.report.paper import build_tables

    return over_seeds(build_tables(find_runs([Path(output)], cluster=cluster)))


__all__ = ["NOTE", "over_seeds", "over_seeds_of", "seed_label"]
