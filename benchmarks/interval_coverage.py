"""How often a report's 95% interval holds the true value, at few clusters: the plain percentile bootstrap the
report used before, and the expanded percentile interval it shows now (``medheval.report.stats``).

Simulated benchmarks of G clusters (images) × ``--per-cluster`` items, with a cluster effect, so answers about one
image are correlated:

* ``accuracy``: 0/1 answers, each cluster's rate p_g ~ Beta(2, 2); truth E[p] = 0.5.
* ``micro rate``: a CHAIR-like ratio Σy/Σd; per item d ~ 1 + Poisson(2) objects, y ~ Binomial(d, p_g) hallucinated,
  p_g ~ Beta(1, 4); d and p independent, so the truth is E[p] = 0.2.
* ``skewed score``: y = exp(μ_g + ε), μ_g ~ N(0, 0.5²), ε ~ N(0, 1) per item; truth exp((0.25 + 1) / 2).

"before": the item and cluster percentile intervals at 95%, joined (the report until this change);
"after": :func:`medheval.report.stats.figure_interval` (both levels expanded for their unit counts; the accuracy's
values marked 0/1, as the report marks them, so an all-equal data set gets Clopper–Pearson's bound).

    PYTHONPATH=. python benchmarks/interval_coverage.py [--sets 1000] [--clusters 6 8 12 30] [--per-cluster 5]

Coverage is a proportion over ``--sets`` seeded data sets; its standard error is about sqrt(0.95·0.05/sets)
(0.7 points at 1,000 sets). Nothing here is timed.
"""

from __future__ import annotations

import argparse
import math
from typing import Callable

import numpy as np

from medheval.report.stats import LEVEL, bootstrap_ci, figure_interval

Figure = tuple[list[float], list[float] | None]


def _accuracy(rng: np.random.Generator, groups: int, per: int) -> Figure:
    rates = rng.beta(2, 2, groups)
    return (rng.random((groups, per)) < rates[:, None]).astype(float).ravel().tolist(), None


def _micro_rate(rng: np.random.Generator, groups: int, per: int) -> Figure:
    rates = rng.beta(1, 4, groups)
    objects = 1 + rng.poisson(2, (groups, per))
    return rng.binomial(objects, rates[:, None]).astype(float).ravel().tolist(), objects.astype(float).ravel().tolist()


def _skewed(rng: np.random.Generator, groups: int, per: int) -> Figure:
    effects = rng.normal(0, 0.5, groups)
    return np.exp(effects[:, None] + rng.normal(0, 1, (groups, per))).ravel().tolist(), None


FIGURES: dict[str, tuple[Callable[[np.random.Generator, int, int], Figure], float]] = {
    "accuracy": (_accuracy, 0.5),
    "micro rate": (_micro_rate, 0.2),
    "skewed score": (_skewed, math.exp(0.625)),
}


def _plain(values: list[float], denominators: list[float] | None, labels: list[str]) -> tuple[float, float]:
    """The report's interval before the expansion: item and cluster percentile intervals at 95%, joined."""
    items = bootstrap_ci(values, denominators, level=LEVEL)
    clusters = bootstrap_ci(values, denominators, clusters=labels, level=LEVEL)
    return min(items[0], clusters[0]), max(items[1], clusters[1])


def coverage(make: Callable[[np.random.Generator, int, int], Figure], truth: float, groups: int, per: int,
             sets: int, seed: int, binary: bool = False) -> tuple[float, float]:
    """(before, after): the share of ``sets`` simulated data sets whose interval holds ``truth``."""
    rng = np.random.default_rng(seed)
    labels = [f"image:{g}" for g in range(groups) for _ in range(per)]
    before = after = 0
    for _ in range(sets):
        values, denominators = make(rng, groups, per)
        low, high = _plain(values, denominators, labels)
        before += low <= truth <= high
        interval, _ = figure_interval(values, denominators, clusters=labels, binary=binary)
        after += interval is not None and interval[0] <= truth <= interval[1]
    return before / sets, after / sets


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", type=int, default=1000)
    parser.add_argument("--clusters", type=int, nargs="+", default=[6, 8, 12, 30])
    parser.add_argument("--per-cluster", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(f"coverage of the 95% interval, {args.sets} data sets per cell, {args.per_cluster} items per cluster")
    print(f"{'figure':<14}" + "".join(f"{f'G = {g}':>18}" for g in args.clusters))
    print(f"{'':<14}" + "".join(f"{'before → after':>18}" for _ in args.clusters))
    for name, (make, truth) in FIGURES.items():
        cells = [coverage(make, truth, g, args.per_cluster, args.sets, args.seed + g, binary=name == "accuracy")
                 for g in args.clusters]
        print(f"{name:<14}" + "".join(f"{f'{100 * b:.1f} → {100 * a:.1f}%':>18}" for b, a in cells))


if __name__ == "__main__":
    main()
