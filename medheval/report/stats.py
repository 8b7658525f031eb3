"""Uncertainty for report figures: seeded percentile bootstrap over items or clusters, paired comparisons.

* :func:`bootstrap_ci` — 95% percentile bootstrap interval of a mean (accuracy = mean of 0/1) or,
  with ``denominators``, of a ratio of sums Σnum/Σden (a micro rate such as CHAIR), resampling items
  with replacement B times (Efron & Tibshirani 1993, §13).
* **Clustered designs** (``clusters=``: one label per item, e.g. its image, study or report): answers about
  one image are correlated, so resampling items treats n correlated answers as n independent ones and gives
  intervals that are too narrow. The cluster bootstrap draws G clusters with replacement (G = number of
  distinct labels) and keeps all items of a drawn cluster: with per-cluster sums S_g = Σ_{i∈g} y_i and
  D_g = Σ_{i∈g} d_i (d_i = 1 for a mean), a replicate is Σ_{g*} S_g / Σ_{g*} D_g (Davison & Hinkley 1997,
  §3.8; Cameron, Gelbach & Miller 2008). Clusters are numbered by first appearance, so one item per cluster
  draws exactly the item bootstrap's indices and gives exactly its interval. For a mean, the cluster bootstrap's
  standard error approaches the cluster-robust (sandwich, CR0) standard error
  SE = sqrt(Σ_g (Σ_{i∈g} (y_i − ȳ))²) / n (Liang & Zeger 1986), and for a ratio R = Σy/Σd the linearised
  SE = sqrt(Σ_g (Σ_{i∈g} (y_i − R·d_i))²) / Σd; the tests check the bootstrap against both.
* :func:`paired_bootstrap` — mitigation minus baseline on the same items (paired by id): the
  difference of means, its percentile interval, and a two-sided p-value from the null-shifted
  bootstrap distribution, p = (1 + #{|d* − d| ≥ |d|}) / (B + 1); with ``clusters``, the per-item
  differences d_i are resampled by cluster as above (the clustered paired bootstrap).
* :func:`mcnemar_exact` — exact McNemar test for paired correctness: with b = #(baseline right,
  other wrong) and c = #(baseline wrong, other right), p = min(1, 2·P[X ≤ min(b, c)]), X ~ Bin(b + c, ½).
  It assumes independent pairs, so :func:`compare_accuracy` uses it only where no cluster holds two items.
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
CLUSTER_NOTE = (f"Intervals: {int(LEVEL * 100)}% percentile bootstrap, {N_BOOT} resamples of clusters (seed {SEED}): "
                f"every item of a drawn cluster comes along, the unit per split is named below, and a unit of one "
                f"item is the plain item bootstrap; ratios (micro rates) recomputed from the drawn clusters' "
                f"numerator and denominator sums. Mitigation − none: paired by item id, differences resampled by "
                f"the same clusters; p-values from the clustered paired bootstrap (null-shifted, two-sided), the "
                f"exact McNemar test only where every cluster is one item. `medheval report --cluster none` "
                f"resamples items.")


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


def cluster_index(clusters: Sequence[object], n: int) -> tuple[np.ndarray, int]:
    """(cluster number of each item, G): numbers 0..G−1 in order of first appearance."""
    if len(clusters) != n:
        raise ValueError(f"{n} items but {len(clusters)} cluster labels; give one label per item")
    numbers: dict[object, int] = {}
    index = np.fromiter((numbers.setdefault(label, len(numbers)) for label in clusters), dtype=np.int64, count=n)
    return index, len(numbers)


def is_clustered(clusters: Sequence[object] | None) -> bool:
    """True when some cluster holds more than one item (else the cluster bootstrap is the item bootstrap)."""
    return clusters is not None and len(set(clusters)) < len(clusters)


def bootstrap_distribution(values: Sequence[float], denominators: Sequence[float] | None = None,
                           clusters: Sequence[object] | None = None, n_boot: int = N_BOOT,
                           seed: int = SEED) -> np.ndarray:
    """The bootstrap replicates of mean(values) or Σvalues/Σdenominators (items, or ``clusters`` resampled).

    A resample whose denominator sums to 0 has no ratio and is left out."""
    x = np.asarray(values, dtype=float)
    den = None if denominators is None else np.asarray(denominators, dtype=float)
    if den is not None and den.shape != x.shape:
        raise ValueError(f"bootstrap_ci: {x.size} numerators but {den.size} denominators")
    stats = []
    if clusters is None:
        for idx in _replicates(x.size, n_boot, seed):
            if den is None:
                stats.append(x[idx].mean(axis=1))
            else:
                d = den[idx].sum(axis=1)
                keep = d > 0
                stats.append(x[idx].sum(axis=1)[keep] / d[keep])
    else:
        index, groups = cluster_index(clusters, x.size)
        sums = np.bincount(index, weights=x, minlength=groups)
        counts = np.bincount(index, minlength=groups).astype(float) if den is None else \
            np.bincount(index, weights=den, minlength=groups)
        for idx in _replicates(groups, n_boot, seed):
            d = counts[idx].sum(axis=1)
            keep = d > 0
            stats.append(sums[idx].sum(axis=1)[keep] / d[keep])
    return np.concatenate(stats) if stats else np.empty(0)


def bootstrap_ci(values: Sequence[float], denominators: Sequence[float] | None = None, n_boot: int = N_BOOT,
                 seed: int = SEED, level: float = LEVEL,
                 clusters: Sequence[object] | None = None) -> tuple[float, float] | None:
    """Percentile interval of mean(values), or of Σvalues/Σdenominators; ``None`` with no items.

    ``clusters`` (one label per item) resamples whole clusters instead of items (module docstring)."""
    if len(values) == 0:
        return None
    flat = bootstrap_distribution(values, denominators, clusters, n_boot, seed)
    if flat.size == 0:
        return None
    alpha = (1 - level) / 2
    low, high = np.quantile(flat, [alpha, 1 - alpha])
    return float(low), float(high)


def paired_bootstrap(baseline: Sequence[float], other: Sequence[float], n_boot: int = N_BOOT, seed: int = SEED,
                     level: float = LEVEL, clusters: Sequence[object] | None = None) -> Comparison:
    """``mean(other) − mean(baseline)`` over paired items, its percentile interval and p-value; with
    ``clusters``, the differences are resampled by cluster (the clustered paired bootstrap)."""
    a = np.asarray(baseline, dtype=float)
    b = np.asarray(other, dtype=float)
    if a.shape != b.shape or a.size == 0:
        raise ValueError(f"paired_bootstrap needs the same non-zero number of paired items, got {a.size} and {b.size}")
    d = b - a
    observed = float(d.mean())
    boot = bootstrap_distribution(d, clusters=clusters, n_boot=n_boot, seed=seed)
    alpha = (1 - level) / 2
    low, high = np.quantile(boot, [alpha, 1 - alpha])
    extreme = int(np.sum(np.abs(boot - observed) >= abs(observed) - 1e-12))
    p = min(1.0, (1 + extreme) / (n_boot + 1))
    test = "clustered paired bootstrap" if is_clustered(clusters) else "paired bootstrap"
    return Comparison(observed, float(low), float(high), p, int(d.size), test)


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
                     seed: int = SEED, clusters: Sequence[object] | None = None) -> Comparison:
    """Accuracy difference (other − baseline), its paired bootstrap interval and the exact McNemar p; where
    ``clusters`` put several items in one cluster, the clustered paired bootstrap's interval and p instead
    (McNemar assumes independent pairs)."""
    boot = paired_bootstrap([float(x) for x in baseline], [float(y) for y in other], n_boot=n_boot, seed=seed,
                            clusters=clusters)
    if is_clustered(clusters):
        return boot
    _, _, p = mcnemar_exact(baseline, other)
    return Comparison(boot.diff, boot.low, boot.high, p, boot.n, "exact McNemar")
