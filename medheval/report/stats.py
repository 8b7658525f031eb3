"""Uncertainty for report figures: seeded percentile bootstrap over items, paired comparisons.

* :func:`bootstrap_ci` — 95% percentile bootstrap interval of a mean (accuracy = mean of 0/1) or,
  with ``denominators``, of a ratio of sums Σnum/Σden (a micro rate such as CHAIR), resampling items
  with replacement B times (Efron & Tibshirani 1993, §13).
* :func:`paired_bootstrap` — mitigation minus baseline on the same items (paired by id): the
  difference of means, its percentile interval, and a two-sided p-value from the null-shifted
  bootstrap distribution, p = (1 + #{|d* − d| ≥ |d|}) / (B + 1).
* :func:`mcnemar_exact` — exact McNemar test for paired correctness: with b = #(baseline right,
  other wrong) and c = #(baseline wrong, other right), p = min(1, 2·P[X ≤ min(b, c)]), X ~ Bin(b + c, ½).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

N_BOOT = 2000
SEED = 0
LEVEL = 0.95
_CHUNK = 250  # bootstrap replicates drawn per block (bounds memory: _CHUNK × n indices)

METHOD_NOTE = (f"Intervals: {int(LEVEL * 100)}% percentile bootstrap, {N_BOOT} resamples of items (seed {SEED}); "
               f"ratios (micro rates) recomputed from per-item numerators/denominators. Mitigation − none: paired "
               f"by item id; accuracy p-values from the exact McNemar test, scores from a paired bootstrap "
               f"(null-shifted, two-sided).")


@dataclass(frozen=True)
class Comparison:
    """``other − baseline`` on ``n`` paired items: the difference, its interval and a p-value."""

    diff: float
    low: float
    high: float
    p_value: float
    n: int
    test: str


def _replicates(n: int, n_boot: int, seed: int):
    """Blocks of resampled index rows (each row: n indices drawn with replacement)."""
    rng = np.random.default_rng(seed)
    for start in range(0, n_boot, _CHUNK):
        yield rng.integers(0, n, size=(min(_CHUNK, n_boot - start), n))


def bootstrap_ci(values: Sequence[float], denominators: Sequence[float] | None = None, n_boot: int = N_BOOT,
                 seed: int = SEED, level: float = LEVEL) -> tuple[float, float] | None:
    """Percentile interval of mean(values), or of Σvalues/Σdenominators; ``None`` with no items.

    A resample whose denominator sums to 0 has no ratio and is left out of the percentiles."""
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        return None
    den = None if denominators is None else np.asarray(denominators, dtype=float)
    if den is not None and den.shape != x.shape:
        raise ValueError(f"bootstrap_ci: {x.size} numerators but {den.size} denominators")
    stats = []
    for idx in _replicates(x.size, n_boot, seed):
        if den is None:
            stats.append(x[idx].mean(axis=1))
        else:
            d = den[idx].sum(axis=1)
            keep = d > 0
            stats.append(x[idx].sum(axis=1)[keep] / d[keep])
    flat = np.concatenate(stats)
    if flat.size == 0:
        return None
    alpha = (1 - level) / 2
    low, high = np.quantile(flat, [alpha, 1 - alpha])
    return float(low), float(high)


def paired_bootstrap(baseline: Sequence[float], other: Sequence[float], n_boot: int = N_BOOT, seed: int = SEED,
                     level: float = LEVEL) -> Comparison:
    """``mean(other) − mean(baseline)`` over paired items, its percentile interval and p-value."""
    a = np.asarray(baseline, dtype=float)
    b = np.asarray(other, dtype=float)
    if a.shape != b.shape or a.size == 0:
        raise ValueError(f"paired_bootstrap needs the same non-zero number of paired items, got {a.size} and {b.size}")
    d = b - a
    observed = float(d.mean())
    boot = np.concatenate([d[idx].mean(axis=1) for idx in _replicates(d.size, n_boot, seed)])
    alpha = (1 - level) / 2
    low, high = np.quantile(boot, [alpha, 1 - alpha])
    extreme = int(np.sum(np.abs(boot - observed) >= abs(observed) - 1e-12))
    p = min(1.0, (1 + extreme) / (n_boot + 1))
    return Comparison(observed, float(low), float(high), p, int(d.size), "paired bootstrap")


def mcnemar_exact(baseline: Sequence[bool], other: Sequence[bool]) -> tuple[int, int, float]:
    """(b, c, two-sided exact p) for paired correctness; b: baseline right & other wrong, c: the reverse."""
    if len(baseline) != len(other):
        raise ValueError(f"mcnemar_exact needs paired items, got {len(baseline)} and {len(other)}")
    b = sum(1 for x, y in zip(baseline, other) if x and not y)
    c = sum(1 for x, y in zip(baseline, other) if y and not x)
    n = b + c
    if n == 0:
        return b, c, 1.0
    tail = sum(math.comb(n, k) for k in range(min(b, c) + 1)) / 2 ** n
    return b, c, min(1.0, 2 * tail)


def compare_accuracy(baseline: Sequence[bool], other: Sequence[bool], n_boot: int = N_BOOT,
                     seed: int = SEED) -> Comparison:
    """Accuracy difference (other − baseline), its paired bootstrap interval and the exact McNemar p."""
    boot = paired_bootstrap([float(x) for x in baseline], [float(y) for y in other], n_boot=n_boot, seed=seed)
    _, _, p = mcnemar_exact(baseline, other)
    return Comparison(boot.diff, boot.low, boot.high, p, boot.n, "exact McNemar")
