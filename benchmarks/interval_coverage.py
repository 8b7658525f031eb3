"""How often a report's 95% interval holds the true value: at few clusters, for binary rates near 0 or 1, and for
paired 0/1 differences (``medheval.report.stats``).

1. Clustered figures, simulated benchmarks of G clusters (images) × ``--per-cluster`` items, with a cluster effect,
   so answers about one image are correlated:

   * ``accuracy``: 0/1 answers, each cluster's rate p_g ~ Beta(2, 2); truth E[p] = 0.5.
   * ``micro rate``: a CHAIR-like ratio Σy/Σd; per item d ~ 1 + Poisson(2) objects, y ~ Binomial(d, p_g)
     hallucinated, p_g ~ Beta(1, 4); d and p independent, so the truth is E[p] = 0.2.
   * ``skewed score``: y = exp(μ_g + ε), μ_g ~ N(0, 0.5²), ε ~ N(0, 1) per item; truth exp((0.25 + 1) / 2).

   "plain": the item and cluster percentile intervals at 95%, joined (the report before the expansion);
   "expanded": both levels' percentile intervals expanded for their unit counts (:func:`expanded_level`) and
   joined (the report before the BCa interval); "BCa": :func:`medheval.report.stats.figure_interval` without
   ``binary``, which also spans the BCa interval over the clusters at the expanded level (:func:`bca_ci`);
   "shown": :func:`figure_interval` as the report calls it (accuracy and the micro rate marked 0/1 trials, so
   the binomial interval in place of the BCa one; for the skewed score the same as "BCa"). Coverage is a
   proportion over ``--sets`` seeded data sets; its standard error is about sqrt(0.95·0.05/sets) (0.5 points at
   2,000 sets; the columns share their data sets, so their differences are much more precise). The median width
   of the expanded, BCa and shown interval is printed too: what the added coverage costs.

2. Binary rates over n independent items (accuracy, or a rate of one trial per item), X ~ Bin(n, p): coverage
   computed exactly, Σ_x P(X = x)·[p in the interval of x of n], no simulation. "before": the expanded
   percentile bootstrap with Clopper–Pearson only at x = 0 or n (the report before the binomial hull); "after":
   :func:`figure_interval` with ``binary=True``.

3. Paired 0/1 differences (other − baseline) over n independent items, each −1, 0 or +1 with probabilities
   p_b, 1 − p_b − p_c, p_c: coverage of Δ = p_c − p_b computed exactly over the trinomial (b, c) (cells of
   probability below 1e-12 left out; their total is printed). "before": the sign-flip test inverted
   (:func:`medheval.report.stats.sign_flip`); "after": :func:`compare_scores` (joined with Tango's score
   interval).

    PYTHONPATH=. python benchmarks/interval_coverage.py [--sets 1000] [--clusters 6 8 12 30] [--per-cluster 5]

Nothing here is timed.
"""

from __future__ import annotations

import argparse
import math
from typing import Callable

import numpy as np

from medheval.report.stats import (LEVEL, bootstrap_ci, clopper_pearson, compare_scores, expanded_level,
                                   figure_interval, is_clustered, sign_flip)

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


def _expanded(values: list[float], denominators: list[float] | None, labels: list[str]) -> tuple[float, float] | None:
    """The report's interval before the BCa interval: item and cluster percentile intervals, each expanded for its
    unit count, joined; none without spread (the simulated figures have no 0-of-0 items and at least 6 units)."""
    items = bootstrap_ci(values, denominators, level=expanded_level(LEVEL, len(values)))
    if is_clustered(labels):
        clusters = bootstrap_ci(values, denominators, clusters=labels, level=expanded_level(LEVEL, len(set(labels))))
        items = min(items[0], clusters[0]), max(items[1], clusters[1])
    return None if items[0] == items[1] else items


def coverage(make: Callable[[np.random.Generator, int, int], Figure], truth: float, groups: int, per: int,
             sets: int, seed: int, binary: bool = False) -> tuple[list[float], list[float]]:
    """([plain, expanded, BCa, shown], [median width expanded, BCa, shown]): the share of ``sets`` simulated data
    sets whose interval holds ``truth`` (no interval: not held), and the widths (no interval: infinite)."""
    rng = np.random.default_rng(seed)
    labels = [f"image:{g}" for g in range(groups) for _ in range(per)]
    held = [0, 0, 0, 0]
    widths: list[list[float]] = [[], [], []]
    for _ in range(sets):
        values, denominators = make(rng, groups, per)
        intervals = [_plain(values, denominators, labels), _expanded(values, denominators, labels),
                     figure_interval(values, denominators, clusters=labels)[0],
                     figure_interval(values, denominators, clusters=labels, binary=binary)[0]]
        for at, interval in enumerate(intervals):
            held[at] += interval is not None and interval[0] <= truth <= interval[1]
        for at, interval in enumerate(intervals[1:]):
            widths[at].append(math.inf if interval is None else interval[1] - interval[0])
    return [count / sets for count in held], [float(np.median(w)) for w in widths]


def _before_binomial(successes: int, n: int) -> tuple[float, float]:
    """The report's interval of x of n before the binomial hull: the expanded percentile bootstrap, and
    Clopper–Pearson's bound only at x = 0 or n."""
    if successes in (0, n):
        return clopper_pearson(successes, n)
    return bootstrap_ci([1.0] * successes + [0.0] * (n - successes), level=expanded_level(LEVEL, n))


def binomial_coverage(n: int, rates: list[float]) -> list[tuple[float, float]]:
    """(before, after) exact coverage of each rate p in ``rates`` by the interval of X of n, X ~ Bin(n, p)."""
    before = [_before_binomial(x, n) for x in range(n + 1)]
    after = [figure_interval([1.0] * x + [0.0] * (n - x), binary=True)[0] for x in range(n + 1)]
    out = []
    for p in rates:
        pmf = [math.comb(n, x) * p ** x * (1 - p) ** (n - x) for x in range(n + 1)]
        out.append(tuple(sum(w for w, (low, high) in zip(pmf, intervals) if low <= p <= high)
                         for intervals in (before, after)))
    return out


def paired_coverage(n: int, worse: float, better: float, floor: float = 1e-12) -> tuple[float, float, float]:
    """(before, after, mass left out): exact coverage of Δ = better − worse by the interval of the paired
    differences, summed over the trinomial's (b, c) cells of probability at least ``floor``; a cell without an
    interval (fewer than 6 items, or every difference the same) counts as not covering."""
    truth = better - worse
    before = after = kept = 0.0
    for b in range(n + 1):
        for c in range(n - b + 1):
            weight = math.exp(math.lgamma(n + 1) - math.lgamma(b + 1) - math.lgamma(c + 1) - math.lgamma(n - b - c + 1)
                              + (b * math.log(worse) if b else 0.0) + (c * math.log(better) if c else 0.0)
                              + (n - b - c) * math.log1p(-worse - better))
            if weight < floor:
                continue
            kept += weight
            d = [-1.0] * b + [1.0] * c + [0.0] * (n - b - c)
            if 0 < b + c and not (b + c == n and min(b, c) == 0):
                _, low, high, _ = sign_flip(d)
                before += weight * (low <= truth <= high)
            shown = compare_scores([0.0] * n, d)
            after += weight * (shown.low is not None and shown.low <= truth <= shown.high)
    return before, after, 1.0 - kept


BINOMIAL_SIZES = (30, 100, 200)
BINOMIAL_RATES = [0.01, 0.03, 0.12, 0.5]
GRID = [0.005 + 0.495 * k / 99 for k in range(100)]  # 0.005 … 0.5 (by symmetry, 0.5 … 0.995 alike)
PAIRED = ((30, 0.05, 0.2), (100, 0.05, 0.1), (200, 0.005, 0.03), (400, 0.0025, 0.015), (1000, 0.001, 0.006))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", type=int, default=1000)
    parser.add_argument("--clusters", type=int, nargs="+", default=[6, 8, 12, 30])
    parser.add_argument("--per-cluster", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(f"1. coverage of the 95% interval, {args.sets} data sets per cell, {args.per_cluster} items per cluster: "
          f"plain → expanded → BCa → shown; then the median width, expanded → BCa → shown")
    print(f"{'figure':<14}" + "".join(f"{f'G = {g}':>32}" for g in args.clusters))
    for name, (make, truth) in FIGURES.items():
        cells = [coverage(make, truth, g, args.per_cluster, args.sets, args.seed + g, binary=name != "skewed score")
                 for g in args.clusters]
        print(f"{name:<14}" + "".join(f"{' → '.join(f'{100 * c:.1f}' for c in held) + '%':>32}" for held, _ in cells))
        print(f"{'  width':<14}" + "".join(f"{' → '.join(f'{w:.3f}' for w in widths):>32}" for _, widths in cells))
    print("\n2. exact coverage of the 95% interval of a binary rate, X ~ Bin(n, p), before → after; the last "
          "column: the lowest over 100 rates p from 0.005 to 0.5")
    print(f"{'':<8}" + "".join(f"{f'p = {p}':>18}" for p in BINOMIAL_RATES) + f"{'lowest':>18}")
    for n in BINOMIAL_SIZES:
        cells = binomial_coverage(n, BINOMIAL_RATES + GRID)
        lowest = (min(b for b, _ in cells[len(BINOMIAL_RATES):]), min(a for _, a in cells[len(BINOMIAL_RATES):]))
        print(f"{f'n = {n}':<8}" + "".join(f"{f'{100 * b:.1f} → {100 * a:.1f}%':>18}"
                                          for b, a in cells[:len(BINOMIAL_RATES)] + [lowest]))
    print("\n3. exact coverage of the 95% interval of a paired 0/1 difference, before → after")
    for n, worse, better in PAIRED:
        before, after, left = paired_coverage(n, worse, better)
        print(f"n = {n:<5} p_b = {worse:<7} p_c = {better:<6} Δ = {better - worse:<7.4g} "
              f"{100 * before:.1f} → {100 * after:.1f}%  (mass left out {left:.1e})")


if __name__ == "__main__":
    main()
