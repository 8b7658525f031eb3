"""Uncertainty for report figures: seeded percentile (and, for figures that are not 0/1, BCa) bootstrap intervals
of figures, and paired comparisons by an exact (or Monte Carlo) sign-flip test whose inversion gives the
interval, corrected for many comparisons.

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
  :func:`figure_interval` is what the report shows: the cluster interval joined with the item interval (never
  narrower than the item-level one), and below :data:`MIN_CLUSTERS` units none but the exact bound of a 0/1
  figure with no success or no failure.
* :func:`sign_flip` — paired comparison (other − baseline on the same items) by a sign-flip randomization test
  over cluster totals (Fisher 1935; Good 2005, §3; for clustered data Cameron, Gelbach & Miller 2008, and
  Canay, Romano & Shaikh 2017). With d_i the per-item difference, D_g = Σ_{i∈g} d_i and n_g the items of
  cluster g, the estimate is Δ̂ = Σ_g D_g / n. Under H0: Δ = δ (the two conditions exchangeable within a
  cluster after a shift δ) each cluster total D_g − δ·n_g is as likely negated, so the two-sided p-value is
  p(δ) = #{s : |Σ_g s_g (D_g − δ n_g)| ≥ |Σ_g (D_g − δ n_g)|} / 2^G over all sign vectors s ∈ {±1}^G
  (exact: the whole distribution is built by grouping clusters alike in (D_g, n_g), :func:`_exact_flips`,
  while building it handles at most :data:`EXACT_STATES` sums, e.g. 0/1 answers over a few hundred items), else
  (1 + #{…}) / (B + 1) over B = :data:`N_FLIP` seeded random sign vectors (a valid Monte Carlo p-value). The reported p is p(0); the 95% interval is its inversion,
  {δ : p(δ) ≥ 0.05}: each sign vector's condition holds on an interval of δ that contains Δ̂ (the roots of a
  concave quadratic), so the set is one interval, found exactly, and "p < 0.05" ⇔ "0 outside the interval",
  always. For 0/1 correctness with one item per cluster, p(0) is the exact McNemar test (the zero differences
  do not move the statistic and the discordant ones are ±1, so |Σ s_i d_i| ~ |2·Bin(b + c, ½) − (b + c)|).
  Significance is p < :data:`ALPHA` = 0.05 exactly (``1 − 0.95`` is 0.050000000000000044 in floating point,
  which made p = 0.05 significant).
* **Paired 0/1 outcomes** (every item's difference −1, 0 or +1: accuracy): over items, p is the exact McNemar
  p from the discordant counts b and c at any n (:func:`mcnemar_p`, the binomial tail; no sign vectors are
  drawn however many items). The inversion at δ ≠ 0 assumes the shifted differences d_i − δ symmetric, which
  0/1 differences are not, and covered Δ in as few as 92% of data sets at 95% (few discordant pairs); the
  interval over items is therefore joined with Tango's (1998) score interval for a difference of paired
  proportions (:func:`tango_interval`): 96–98% (exact, ``benchmarks/interval_coverage.py``). The union keeps
  "p < 0.05 ⇔ 0 outside": Tango's interval leaves 0 out whenever the exact McNemar test rejects (checked for
  every b + c ≤ 3000), and where the inversion is Monte Carlo (above :data:`EXACT_STATES`) and disagrees with
  the exact p near 0.05, the bound crossing 0 moves back to 0 (:func:`_agree`).
* **Few clusters**: with G clusters the smallest p a two-sided sign-flip test can give is 2 / 2^G (the
  identity and the all-flipped vector always tie), 0.0625 at G = 5 and 0.031 at G = 6, so below
  :data:`MIN_CLUSTERS` = 6 no 5% test can reject and no interval is bounded: the report shows the estimate
  with its p but no interval and no star, and says so. The same minimum holds for the interval of a figure
  whose items fall in fewer than 6 clusters (one cluster: every bootstrap resample is the same, a zero-width
  interval; a few: too few distinct resamples to cover), except a 0/1 figure with no success or no failure,
  whose exact bound (below) holds at any number of units: 0 of 2 right, [0, 1 − 0.025^{1/2}] = [0, 0.842].
* **Small samples** (:func:`expanded_level`): a percentile interval is about θ̂ ± z·σ̂ with the plug-in σ̂
  (divisor G), where the t interval is θ̂ ± t_{G−1}·s, so over few units it is too narrow: the report's 95%
  interval over 6 clusters held the truth in 91% of simulated accuracies and 85% of micro rates
  (``benchmarks/interval_coverage.py``; 96% and 92% expanded, more with the binomial interval below). Every figure's
  interval is therefore Hesterberg's (2015) expanded percentile interval: the bootstrap quantiles at α′/2 and
  1 − α′/2, α′/2 = Φ(−√(G/(G−1))·t_{0.975, G−1}), G the units resampled (clusters, or items): tails of 0.24%
  at G = 6, 1.9% at G = 30, 2.5% in the limit. The same minimum of :data:`MIN_CLUSTERS` units holds for items
  as for clusters (at G = 2 the expanded interval is the whole range of the resamples). For a ratio, G counts
  only the units that hold any of it: an item with 0 of 0 (an empty report's CHAIR, a Break rate's
  originally wrong answer) adds nothing to Σnum/Σden, so 100 items of which 2 hold trials are 2 units.
* **Skewed figures** (:func:`bca_ci`): the expanded percentile interval of a skewed score (log-normal, 5 per
  cluster) held the truth in 88.8% at 6 clusters, 89.8% at 12 and 91.6% at 30, nearly every miss with the truth
  above the upper bound. A figure that is not 0/1 therefore also spans the BCa interval (bias-corrected and
  accelerated: Efron 1987; DiCiccio & Efron 1996) over the units resampled (clusters, or items), at the same
  expanded level: the same replicates θ*_b taken at the levels Φ(z₀ + (z₀ + z)/(1 − a(z₀ + z))), z at the
  expanded tails, z₀ = Φ⁻¹(#{θ*_b < θ̂}/B, ties half) and a = Σ u_g³ / (6 (Σ u_g²)^{3/2}) from the jackknife over
  the units (u_g = θ̄₍·₎ − θ₍g₎, θ₍g₎ = (S − S_g)/(D − D_g); 0 for 0/0). Joined, it only widens: 89.6%, 92.0%
  and 93.3%, the median width 7–12% wider. At 6 clusters no interval built from the replicates gets much
  further: the truth lay above all 2,000 of them in 9.4% of data sets. A cluster bootstrap-t covered 92.4%
  at 6 clusters but its width ran past 3.5 times the expanded interval's in 1 data set in 20 (16 times at
  worst), so it is not used. A 0/1 figure keeps its binomial interval instead (below).
* **0/1 figures** (``binary``: accuracy, recall, or a rate of 0/1 trials such as CHAIR's hallucinated objects
  among those mentioned; x successes in n trials over G units): near 0 or 1 the bootstrap is too narrow (99 of
  100 right gave [0.970, 1], Clopper–Pearson [0.9455, 0.9997]; exact coverage 85% at n = 100, p just above 0.03), so the
  interval also spans Korn & Graubard's (1998) Clopper–Pearson interval over the effective sample size
  n* = (n / deff)·(t_{n−1}/t_{G−1})², deff ≥ 1 the design effect (:func:`design_effect`: the cluster-robust
  variance over the binomial one, over the items and over the clusters, the larger; 1 when each unit is one
  trial, so i.i.d. answers get Clopper–Pearson exactly and cover at least 95%). With no success (x = 0) there is
  no spread to estimate deff from, and the bound is exact for any dependence within a unit
  (:func:`zero_bound`): [0, U₀], U₀ the largest rate Σ_g t_g p_g / Σ t_g with Π_g (1 − p_g) ≥ α/2 (a unit of
  t_g trials shows none with probability at most 1 − p_g, its mean trial's). For equal units that is Clopper &
  Pearson's (1934) 1 − (α/2)^{1/G} (0 of 6 right: [0, 0.459]); for unequal ones it is wider, where the old
  bound over G units was invalid (clusters of 1 and of 100 items: P(all 0) 7.5% at θ = 0.297, above its bound
  0.218). No failure: [1 − U₀, 1]. U₀ is also a floor for every count (upper bound ≥ U₀, lower ≤ 1 − U₀): one
  success says nothing about how correlated a unit's trials are, and a data set with one success never gets a
  lower upper bound than one with none (1 hallucinated of 200 objects in 100 reports: [0, 0.036], as for 0).
* **No spread in a figure** that is not 0/1: when every item has the same value (or ratio), every resample
  gives the figure itself and the percentile interval is the zero-width [θ̂, θ̂]: no interval, :data:`NO_SPREAD`.
* **No variation**: when every paired difference is the same, c, the inversion rejects every δ ≠ c (each at
  p = 2/2^G) and would give the zero-width [c, c]; the comparison keeps its p but shows no interval (so no
  star), :data:`NO_VARIATION`.
* **Bad inputs** raise ``ValueError`` naming the position: a NaN, infinite or ``None`` score
  (:func:`compare_scores`; NaN made every test condition false, so p was 0), a ``None`` or NaN answer
  (:func:`compare_accuracy`: unscored is not wrong), a p-value outside [0, 1] or NaN (:func:`adjust_p`), and
  cluster labels or denominators whose number is not the number of items (:func:`figure_interval` checks before
  anything else).
* **Never more confident than items**: a clustered comparison is tested both over clusters and over items;
  its p is the larger and its interval the union (both contain Δ̂). The maximum of two p-values is valid
  when either is.
* :func:`adjust_p` — the family of comparisons in one report table: Holm (1979) step-down,
  p̃_(i) = max_{j ≤ i} min(1, (m − j + 1) p_(j)), controlling the family-wise error rate (default); or
  Benjamini & Hochberg (1995) step-up, p̃_(i) = min_{j ≥ i} min(1, m p_(j) / j), controlling the false
  discovery rate; ``none`` leaves p as it is. Stars mark adjusted p < 0.05; intervals stay per comparison.
* :func:`mcnemar_exact` — exact McNemar test for paired correctness: with b = #(baseline right,
  other wrong) and c = #(baseline wrong, other right), p = min(1, 2·P[X ≤ min(b, c)]), X ~ Bin(b + c, ½),
  in exact integers; kept as the hand check of :func:`sign_flip` and :func:`mcnemar_p` on unclustered 0/1 data.
* **Few units** (:func:`few_units_note`): over fewer than :data:`FEW_UNITS` = 30 clusters (or items) the
  interval of a score that is not 0/1, with BCa's, still falls short of 95% (a skewed score: 89.6% at 6
  clusters, 92.0% at 12, 93.3% at 30, ``benchmarks/interval_coverage.py``; 0/1 figures, with the binomial
  interval, cover 96% or more), so the report's footer says so, :data:`FEW_UNITS_NOTE`.
"""

from __future__ import annotations

import functools
import math
import statistics
from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

N_BOOT = 2000
SEED = 0
LEVEL = 0.95


def alpha_of(level: float) -> float:
    """The test level of a ``level`` interval, 1 − level rounded to 12 places: 0.05 exactly at 0.95 (1 − 0.95 is
    0.050000000000000044), so a p of exactly 0.05 is not below it."""
    return round(1 - level, 12)


ALPHA = alpha_of(LEVEL)
_CHUNK = 250  # bootstrap replicates drawn per block (bounds memory: _CHUNK × n indices)

MIN_CLUSTERS = 6  # fewer units: 2 / 2^G ≥ 0.0625, no two-sided 5% sign-flip test can reject (module docstring)
EXACT_STATES = 2 ** 18  # the exact sign distribution is built when its steps handle at most this many sums
N_FLIP = 9999
P_ADJUST = ("holm", "bh", "none")
P_ADJUST_NAMES = {"holm": "Holm", "bh": "Benjamini–Hochberg", "none": "unadjusted"}
FEW_CLUSTERS = (f"fewer than {MIN_CLUSTERS} clusters (or items): too few to estimate a 95% interval (a two-sided "
                f"sign-flip test over G clusters cannot give p below 2/2^G ≥ 0.0625), so no interval and no star")
NO_VARIATION = ("no variation in the paired differences (every item's difference is the same): a zero-width "
                "interval would claim a certainty the data cannot give, so no interval and no star; p is shown")
NO_DENOMINATOR = "every item's denominator is 0: the ratio is undefined, so no interval"
NO_SPREAD = ("every item gives the same figure, so every resample does too: a zero-width interval would claim a "
             "certainty the data cannot give, so no interval")
COMPARISON_NOTE = (f"Mitigation − none (and with image − blind): paired by item id; p from a two-sided sign-flip "
                   f"test over cluster totals (exact where its distribution is small enough to build, else {N_FLIP} "
                   f"seeded random sign vectors; over items, for 0/1 outcomes such as accuracy, the exact McNemar "
                   f"test at any number of items), its 95% interval the test inverted (for 0/1 outcomes joined with "
                   f"Tango's score interval), so an interval excluding 0 ⇔ raw p < 0.05; clustered: tested over "
                   f"clusters and over items, the larger p and the wider interval. Fewer than {MIN_CLUSTERS} "
                   f"clusters, or every paired difference the same: no interval, no star.")
SMALL_SAMPLE_NOTE = (f"percentiles expanded for the number of units G (Hesterberg 2015: tails at "
                     f"Φ(−√(G/(G−1))·t₀.₉₇₅,G−1), 0.24% at G = 6, 1.9% at G = 30), none below {MIN_CLUSTERS} units "
                     f"but the exact bound below (for a rate, units holding any of it: an item with 0 of 0 is "
                     f"none); a figure that is not 0/1 also spans the bias-corrected and accelerated (BCa) interval "
                     f"over the same units at the same expanded level (Efron 1987; acceleration from their "
                     f"jackknife), for skew; a 0/1 figure or rate of "
                     f"0/1 trials also spans Clopper–Pearson's interval over the effective sample size (Korn & "
                     f"Graubard 1998: n over the design effect, for the degrees of freedom of G units), and never "
                     f"lies inside the exact bound for no success (or no failure) over its units, which is its "
                     f"interval when all are 0 (or 1), at any number of units")
FEW_UNITS = 30  # below this many units an interval of a score that is not 0/1 still undercovers (docstring)
FEW_UNITS_NOTE = (f"Some intervals here rest on fewer than {FEW_UNITS} clusters (or items): there the 95% interval "
                  f"of a score that is not 0/1 (an F1, a similarity, an error count) held the truth in only 90–92% "
                  f"of simulated data sets (benchmarks/interval_coverage.py); read it as somewhat too narrow.")
METHOD_NOTE = (f"Intervals: {int(LEVEL * 100)}% percentile bootstrap, {N_BOOT} resamples of items (seed {SEED}), "
               f"{SMALL_SAMPLE_NOTE}; ratios (micro rates) recomputed from per-item numerators/denominators. {COMPARISON_NOTE}")
CLUSTER_NOTE = (f"Intervals: {int(LEVEL * 100)}% percentile bootstrap, {N_BOOT} resamples of clusters (seed {SEED}): "
                f"every item of a drawn cluster comes along, the unit per split is named below, and a unit of one "
                f"item is the plain item bootstrap; ratios (micro rates) recomputed from the drawn clusters' "
                f"numerator and denominator sums; the interval shown also spans the item bootstrap's (never "
                f"narrower than items); {SMALL_SAMPLE_NOTE}. {COMPARISON_NOTE} "
                f"`medheval report --cluster none` resamples items.")


@dataclass(frozen=True)
class Comparison:
    """``other − baseline`` on ``n`` paired items in ``n_clusters`` clusters: the difference, its interval
    (``None`` below :data:`MIN_CLUSTERS`, ``note`` says why) and the two-sided p-value of ``test``."""

    diff: float
    low: float | None
    high: float | None
    p_value: float
    n: int
    test: str
    n_clusters: int = 0
    note: str | None = None


def few_units_note(units: Iterable[int | None]) -> str | None:
    """:data:`FEW_UNITS_NOTE` when any interval of a table rests on :data:`MIN_CLUSTERS` to :data:`FEW_UNITS` − 1
    units (``units``: the clusters, or items, behind each interval shown; ``None`` skipped), else ``None``."""
    return FEW_UNITS_NOTE if any(u is not None and MIN_CLUSTERS <= u < FEW_UNITS for u in units) else None


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
    return _percentile_interval(bootstrap_distribution(values, denominators, clusters, n_boot, seed), level)


def _percentile_interval(flat: np.ndarray, level: float) -> tuple[float, float] | None:
    """The ``level`` percentile interval of the replicates ``flat``; ``None`` with none."""
    if flat.size == 0:
        return None
    alpha = (1 - level) / 2
    low, high = np.quantile(flat, [alpha, 1 - alpha])
    return float(low), float(high)


def bca_acceleration(sums: Sequence[float], sizes: Sequence[float]) -> float:
    """Efron's (1987) acceleration of the ratio θ = Σ_g S_g / Σ_g D_g from its jackknife over the units g (items,
    or clusters with sums S_g and sizes D_g; D_g = items for a mean): with θ₍g₎ = (S − S_g) / (D − D_g),
    θ̄ the mean of the θ₍g₎ and u_g = θ̄ − θ₍g₎, a = Σ u_g³ / (6 (Σ u_g²)^{3/2}) (DiCiccio & Efron 1996;
    Efron & Tibshirani 1993, §14.3). Units whose removal leaves no denominator are left out; 0 when all u_g
    are 0 (every unit alike: 0/0) or when fewer than two units remain (one unit)."""
    s = np.asarray(sums, dtype=float)
    d = np.asarray(sizes, dtype=float)
    rest = d.sum() - d
    keep = rest > 0
    if int(keep.sum()) < 2:
        return 0.0
    jackknife = (s.sum() - s[keep]) / rest[keep]
    u = jackknife.mean() - jackknife
    spread = float(np.sum(u * u))
    if spread <= 1e-24 * max(1.0, float(np.max(np.abs(jackknife)))) ** 2:
        return 0.0
    return float(np.sum(u ** 3)) / (6 * spread ** 1.5)


def bca_levels(bias: float, acceleration: float, level: float = LEVEL) -> tuple[float, float]:
    """The levels at which the BCa interval (Efron 1987) takes the bootstrap quantiles for a ``level`` interval:
    α[z] = Φ(z₀ + (z₀ + z) / (1 − a(z₀ + z))) at z = Φ⁻¹((1 ∓ level)/2), z₀ the bias correction (``bias``) and a
    the :func:`bca_acceleration`. z₀ = a = 0 gives the percentile interval's (1 ∓ level)/2. Where
    1 − a(z₀ + z) ≤ 0 the map has run past its pole and the level is its limit there, 0 or 1."""
    normal = statistics.NormalDist()
    out = []
    for tail in ((1 - level) / 2, (1 + level) / 2):
        shifted = bias + normal.inv_cdf(tail)
        scale = 1 - acceleration * shifted
        out.append(normal.cdf(bias + shifted / scale) if scale > 0 else float(shifted > 0))
    return out[0], out[1]


def bca_ci(values: Sequence[float], denominators: Sequence[float] | None = None, n_boot: int = N_BOOT,
           seed: int = SEED, level: float = LEVEL,
           clusters: Sequence[object] | None = None) -> tuple[float, float] | None:
    """Bias-corrected and accelerated (BCa) interval of mean(values), or of Σvalues/Σdenominators, over items or
    ``clusters`` (Efron 1987; DiCiccio & Efron 1996): the replicates of :func:`bootstrap_distribution` (the
    same draws as :func:`bootstrap_ci`) taken at the levels of :func:`bca_levels`, with the bias correction
    z₀ = Φ⁻¹(share of replicates below θ̂, ties (to 1e-12) counted half), kept within [1/(2B), 1 − 1/(2B)], and the
    acceleration of the jackknife over the same units (:func:`bca_acceleration`). ``None`` with no items, no
    replicate, or an estimate or acceleration that is not a number (a NaN input)."""
    if len(values) == 0:
        return None
    return _bca_interval(bootstrap_distribution(values, denominators, clusters, n_boot, seed), values, denominators,
                         clusters, level)


def _bca_interval(flat: np.ndarray, values: Sequence[float], denominators: Sequence[float] | None,
                  clusters: Sequence[object] | None, level: float) -> tuple[float, float] | None:
    """:func:`bca_ci` from the replicates ``flat`` of the same data and units."""
    x = np.asarray(values, dtype=float)
    d = np.ones_like(x) if denominators is None else np.asarray(denominators, dtype=float)
    if clusters is not None:
        index, groups = cluster_index(clusters, x.size)
        x, d = np.bincount(index, weights=x, minlength=groups), np.bincount(index, weights=d, minlength=groups)
    if flat.size == 0 or not float(d.sum()) > 0:
        return None
    estimate = float(x.sum() / d.sum())
    acceleration = bca_acceleration(x, d)
    if not (math.isfinite(estimate) and math.isfinite(acceleration)):
        return None
    tie = 1e-12 * max(1.0, abs(estimate))  # a replicate equal to θ̂ but for rounding is a tie
    below = (np.sum(flat < estimate - tie) + 0.5 * np.sum(np.abs(flat - estimate) <= tie)) / flat.size
    share = min(max(float(below), 0.5 / flat.size), 1 - 0.5 / flat.size)
    low, high = np.quantile(flat, bca_levels(statistics.NormalDist().inv_cdf(share), acceleration, level))
    return float(low), float(high)


def t_two_sided(t: float, df: int) -> float:
    """P(|T| ≤ t) for Student's T with integer ``df`` ≥ 1, in closed form (Abramowitz & Stegun 1964, 26.7.3–4):
    with θ = atan(t/√df) and c = cos²θ, df = 1: 2θ/π; odd df: (2/π)(θ + sinθ cosθ Σ_{k=0}^{(df−3)/2} a_k c^k),
    a_0 = 1, a_k = a_{k−1}·2k/(2k+1); even df: sinθ Σ_{k=0}^{(df−2)/2} b_k c^k, b_0 = 1, b_k = b_{k−1}(2k−1)/(2k)."""
    if df < 1:
        raise ValueError(f"Student's t needs at least 1 degree of freedom, not {df}")
    theta = math.atan(abs(t) / math.sqrt(df))
    c = math.cos(theta) ** 2
    total, term = 0.0, 1.0
    if df % 2:
        for k in range((df - 1) // 2):
            total += term
            term *= c * (2 * k + 2) / (2 * k + 3)
        return 2 / math.pi * (theta + math.sin(theta) * math.cos(theta) * total)
    for k in range(df // 2):
        total += term
        term *= c * (2 * k + 1) / (2 * k + 2)
    return math.sin(theta) * total


@functools.lru_cache(maxsize=None)
def t_quantile(level: float, df: int) -> float:
    """t with P(|T| ≤ t) = ``level`` (the two-sided critical value t_{(1+level)/2, df}): by bisection on
    :func:`t_two_sided` to 1e-12, or above 100 degrees of freedom (where that series grows long) by the
    Cornish–Fisher expansion in z = Φ⁻¹((1+level)/2) (Abramowitz & Stegun 1964, 26.7.5; error below 1e-7):
    t ≈ z + (z³+z)/(4ν) + (5z⁵+16z³+3z)/(96ν²) + (3z⁷+19z⁵+17z³−15z)/(384ν³)."""
    if df > 100:
        z = statistics.NormalDist().inv_cdf((1 + level) / 2)
        return (z + (z ** 3 + z) / (4 * df) + (5 * z ** 5 + 16 * z ** 3 + 3 * z) / (96 * df ** 2)
                + (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / (384 * df ** 3))
    low, high = 0.0, 1.0
    while t_two_sided(high, df) < level:
        low, high = high, high * 2
    while high - low > 1e-12 * max(1.0, high):
        middle = (low + high) / 2
        low, high = (middle, high) if t_two_sided(middle, df) < level else (low, middle)
    return (low + high) / 2


def expanded_level(level: float, units: int) -> float:
    """The level whose percentile interval stands in for ``level`` over ``units`` resampled units (items or
    clusters): Hesterberg's (2015) expanded percentile interval. A percentile interval is roughly
    x̄ ± z σ̂ with σ̂ = s·√((G−1)/G) where the t interval is x̄ ± t_{G−1} s, so it is too narrow by
    √(G/(G−1))·t_{G−1}/z (1.44 at G = 6, 1.06 at G = 30); taking the quantiles at α′/2 and 1 − α′/2 with
    α′/2 = Φ(−√(G/(G−1))·t_{(1+level)/2, G−1}) matches the t interval for symmetric data and keeps the
    bootstrap's shape. Needs G ≥ 2."""
    if units < 2:
        raise ValueError(f"an expanded interval needs at least 2 units, not {units}")
    stretched = math.sqrt(units / (units - 1)) * t_quantile(level, units - 1)
    return 1 - math.erfc(stretched / math.sqrt(2))  # 1 − 2Φ(−stretched)


def figure_interval(values: Sequence[float], denominators: Sequence[float] | None = None,
                    clusters: Sequence[object] | None = None,
                    binary: bool = False) -> tuple[tuple[float, float] | None, str | None]:
    """The interval a report shows for a figure, or ``None`` and why: the cluster bootstrap's expanded
    percentile interval (:func:`expanded_level`, G clusters) joined with the item bootstrap's (n items), so
    clustering never narrows it; none for fewer than :data:`MIN_CLUSTERS` items or clusters (one cluster:
    every resample is the same, a zero-width interval; a few: too few distinct resamples to cover), except the
    exact bound of a ``binary`` figure with no success or no failure (:func:`_exact_all_alike`). A
    ``binary`` figure (a 0/1 mean, or a ratio whose numerator counts the successes among its denominator's
    trials, 0 ≤ y ≤ d) also spans the binomial interval over its effective sample size and the exact bound of no
    success or failure (:func:`_binomial_hull`); any other figure also spans the BCa interval over the same G
    units at the same expanded level (:func:`bca_ci`, for skew), and without spread (every item alike) gets none.
    A ratio's units are those holding any of it (:func:`_with_trials`) (module docstring)."""
    if len(values) == 0:
        return None, "no items"
    if denominators is not None and len(denominators) != len(values):
        raise ValueError(f"{len(values)} numerators but {len(denominators)} denominators; give one per item")
    if clusters is not None:
        cluster_index(clusters, len(values))  # one label per item, checked before the few-clusters rule
    if denominators is not None:
        values, denominators, clusters = _with_trials(values, denominators, clusters)
        if not values:
            return None, NO_DENOMINATOR
    units = len(set(clusters)) if is_clustered(clusters) else len(values)
    if units < MIN_CLUSTERS:
        exact = _exact_all_alike(values, denominators, clusters) if binary else None
        return (exact, None) if exact is not None else (None, FEW_CLUSTERS)
    unit_clusters = clusters if is_clustered(clusters) else None
    unit_level = expanded_level(LEVEL, units)
    replicates = bootstrap_distribution(values, denominators, unit_clusters)  # the units': percentiles and BCa
    interval = _percentile_interval(replicates, unit_level)
    if unit_clusters is not None:
        items = bootstrap_ci(values, denominators, level=expanded_level(LEVEL, len(values)))
        if interval is None or items is None:
            interval = items or interval
        else:
            interval = (min(items[0], interval[0]), max(items[1], interval[1]))
    if binary and interval is not None and _of_trials(values, denominators):
        return _binomial_hull(interval, values, denominators, unit_clusters), None
    if interval is not None and math.isfinite(interval[0]) and math.isfinite(interval[1]):
        skewed = _bca_interval(replicates, values, denominators, unit_clusters, unit_level)
        if skewed is not None:
            interval = (min(interval[0], skewed[0]), max(interval[1], skewed[1]))
    # every item alike: all resamples give the figure, up to the last bits of a resample's Σ/D (units of unequal size)
    if interval is not None and math.isclose(interval[0], interval[1], rel_tol=1e-12, abs_tol=1e-15):
        return None, NO_SPREAD
    return interval, None if interval is not None else NO_DENOMINATOR


def _exact_all_alike(values: Sequence[float], denominators: Sequence[float] | None,
                     clusters: Sequence[object] | None) -> tuple[float, float] | None:
    """Below :data:`MIN_CLUSTERS` units, a 0/1 figure with no success or no failure still has an exact interval,
    valid for any dependence within a unit (:func:`zero_bound` over the units' trials): [0, U₀] at x = 0,
    [1 − U₀, 1] at x = n (0 of 2 right: [0, 1 − 0.025^{1/2}] = [0, 0.842]); any other figure has none."""
    if not _of_trials(values, denominators):
        return None
    total = sum(float(x) for x in values)
    trials = [1.0] * len(values) if denominators is None else [float(d) for d in denominators]
    if total not in (0.0, sum(trials)):
        return None
    if is_clustered(clusters):
        index, groups = cluster_index(clusters, len(values))
        trials = np.bincount(index, weights=trials, minlength=groups).tolist()
    bound = zero_bound(trials)
    return (0.0, bound) if total == 0.0 else (1.0 - bound, 1.0)


def _with_trials(values: Sequence[float], denominators: Sequence[float], clusters: Sequence[object] | None
                 ) -> tuple[list[float], list[float], list[object] | None]:
    """The items of a ratio that hold any of it (denominator > 0, or a numerator ≠ 0): an item with 0 of 0
    adds nothing to Σnum/Σden, so it is not a unit of evidence for the minimum, the expansion or the exact bound."""
    keep = [i for i, (x, d) in enumerate(zip(values, denominators)) if float(d) > 0 or float(x) != 0]
    return ([float(values[i]) for i in keep], [float(denominators[i]) for i in keep],
            None if clusters is None else [clusters[i] for i in keep])


def _of_trials(values: Sequence[float], denominators: Sequence[float] | None) -> bool:
    """True when every value is a count of successes among its trials: 0 or 1 for a mean, 0 ≤ y ≤ d for a ratio
    (else a figure marked ``binary`` is treated as any other)."""
    if denominators is None:
        return all(float(x) in (0.0, 1.0) for x in values)
    return all(0.0 <= float(x) <= float(d) for x, d in zip(values, denominators))


def _binomial_hull(interval: tuple[float, float], values: Sequence[float], denominators: Sequence[float] | None,
                   clusters: Sequence[object] | None) -> tuple[float, float]:
    """A 0/1 figure's interval: the bootstrap ``interval`` joined with Korn & Graubard's (1998) Clopper–Pearson
    interval over the effective sample size (:func:`effective_trials`), and never inside the bound of no success
    (or no failure) over the same units (:func:`zero_bound`): x successes among n trials in G units give

    [min(boot_low, CP_low(p̂·n*, n*), 1 − U₀), max(boot_high, CP_high(p̂·n*, n*), U₀)], p̂ = x/n, U₀ = zero_bound;

    [0, U₀] at x = 0 and [1 − U₀, 1] at x = n. The floor at U₀ keeps the family monotone: with a design effect
    there is no telling from one success how correlated a unit's trials are, and one success never shows a
    lower upper bound than none (module docstring)."""
    y = np.asarray(values, dtype=float)
    d = np.ones_like(y) if denominators is None else np.asarray(denominators, dtype=float)
    if clusters is not None:
        index, groups = cluster_index(clusters, y.size)
        sums, sizes = np.bincount(index, weights=y, minlength=groups), np.bincount(index, weights=d, minlength=groups)
    else:
        sums, sizes = y, d
    rate = float(y.sum() / d.sum())
    bound = zero_bound(sizes.tolist())
    if rate == 0.0:
        return 0.0, bound
    if rate == 1.0:
        return 1.0 - bound, 1.0
    deff = max([1.0] + [design_effect(s, t) for s, t in ([(y, d)] if clusters is None else [(y, d), (sums, sizes)])])
    trials = effective_trials(float(d.sum()), sums.size, deff)
    low, high = clopper_pearson(rate * trials, trials)
    return (max(0.0, min(interval[0], low, 1.0 - bound)), min(1.0, max(interval[1], high, bound)))


def design_effect(successes: np.ndarray, trials: np.ndarray) -> float:
    """Kish's design effect of a rate p̂ = Σs/Σt over units with ``successes`` s_g among ``trials`` t_g: the
    cluster-robust (linearised, with-replacement) variance over the binomial one (Kish 1965, §8.2; Korn &
    Graubard 1998), deff = v̂ / (p̂(1 − p̂)/n), v̂ = G/(G − 1) · Σ_g (s_g − p̂ t_g)² / n², n = Σ t_g; 1 when every
    unit is a single trial (the count is then binomial) or p̂ is 0 or 1."""
    n = float(trials.sum())
    rate = float(successes.sum()) / n
    groups = successes.size
    if np.all(trials == 1.0) or rate in (0.0, 1.0) or groups < 2:
        return 1.0
    variance = groups / (groups - 1) * float(np.sum((successes - rate * trials) ** 2)) / n ** 2
    return variance / (rate * (1.0 - rate) / n)


def effective_trials(trials: float, units: int, deff: float, level: float = LEVEL) -> float:
    """Korn & Graubard's (1998) effective sample size with their degrees-of-freedom correction:
    n* = (n / deff) · (t_{n−1} / t_{G−1})², t_ν the two-sided ``level`` critical value with ν degrees of freedom
    (n trials, G units); n* = n when every unit is one trial (G = n, deff = 1)."""
    if trials <= 1 or units >= trials:
        return trials / deff
    return trials / deff * (t_quantile(level, int(round(trials)) - 1) / t_quantile(level, units - 1)) ** 2


def zero_bound(sizes: Sequence[float], level: float = LEVEL) -> float:
    """The exact upper bound U₀ of a rate θ = Σ_g t_g p_g / Σ_g t_g when no unit shows a success, the units'
    trials t_g (``sizes``) fixed and the trials within a unit dependent in any way: a unit shows none with
    probability at most 1 − p_g (its mean trial's), so P(none anywhere) ≤ Π_g (1 − p_g), and U₀ is the largest θ
    with Π_g (1 − p_g) ≥ α/2 for some p. With weights w_g = t_g / Σt sorted w_1 ≥ w_2 ≥ …, maximising Σ w_g p_g
    under Σ log(1 − p_g) ≥ log(α/2) gives 1 − p_g = min(1, μ/w_g) (Lagrange): the k largest units move,
    μ = ((α/2) Π_{g≤k} w_g)^{1/k} with w_{k+1} ≤ μ < w_k, and U₀ = Σ_{g≤k} w_g − kμ. Equal sizes: Clopper &
    Pearson's (1934) 1 − (α/2)^{1/G}; unequal: wider (close to Clopper–Pearson over Kish's effective number of
    units (Σt)²/Σt²), valid where the bound over G units is not. By symmetry 1 − U₀ bounds a rate with no failure."""
    total = float(sum(sizes))
    weights = sorted((float(s) / total for s in sizes if s > 0), reverse=True)
    log_tail = math.log(alpha_of(level) / 2)
    logs = 0.0
    for k, weight in enumerate(weights, 1):
        logs += math.log(weight)
        mu = math.exp((log_tail + logs) / k)
        if k == len(weights) or weights[k] <= mu:
            return sum(weights[:k]) - k * mu
    raise ValueError("zero_bound needs at least one unit with trials")


def clopper_pearson(successes: float, trials: float, level: float = LEVEL) -> tuple[float, float]:
    """Clopper & Pearson's (1934) interval of x successes in n trials: [B(α/2; x, n − x + 1),
    B(1 − α/2; x + 1, n − x)], B(q; a, b) the Beta quantile, 0 at x = 0 and 1 at x = n; x and n may be
    fractional (Korn & Graubard's effective counts)."""
    tail = alpha_of(level) / 2
    low = 0.0 if successes <= 0 else beta_quantile(tail, successes, trials - successes + 1)
    high = 1.0 if successes >= trials else beta_quantile(1 - tail, successes + 1, trials - successes)
    return low, high


def beta_quantile(q: float, a: float, b: float) -> float:
    """x with I_x(a, b) = q, by bisection on :func:`beta_cdf` to 1e-13."""
    low, high = 0.0, 1.0
    while high - low > 1e-13:
        middle = (low + high) / 2
        low, high = (middle, high) if beta_cdf(middle, a, b) < q else (low, middle)
    return (low + high) / 2


def beta_cdf(x: float, a: float, b: float) -> float:
    """The regularised incomplete Beta function I_x(a, b) = x^a (1 − x)^b / (a B(a, b)) · 1/(1+ d₁/(1+ d₂/(1+ …))),
    its continued fraction (d_{2m+1} = −(a+m)(a+b+m)x / ((a+2m)(a+2m+1)), d_{2m} = m(b−m)x / ((a+2m−1)(a+2m)))
    evaluated by the modified Lentz method, through I_x(a, b) = 1 − I_{1−x}(b, a) where x > (a+1)/(a+b+2) (Press
    et al., Numerical Recipes 3rd ed. 2007, §6.4)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1) / (a + b + 2):
        return front * _beta_fraction(x, a, b) / a
    return 1.0 - front * _beta_fraction(1.0 - x, b, a) / b


def _beta_fraction(x: float, a: float, b: float) -> float:
    """The continued fraction of :func:`beta_cdf` (modified Lentz; Numerical Recipes §5.2, §6.4)."""
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    value = d
    for m in range(1, 100_000):
        for term in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                     -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + term * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + term / c
            c = c if abs(c) > tiny else tiny
            value *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return value


def _exact_flips(columns: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """Every distinct (Σ_g s_g D_g, Σ_g s_g n_g) over all 2^G sign vectors and its probability, or ``None``
    when building it would handle more than :data:`EXACT_STATES` sums in all. Clusters alike in (D_g, n_g) are exchangeable, so a
    type of c clusters adds (2j − c)·(D, n) with probability C(c, j) / 2^c (j of them kept positive): the
    distribution is built type by type, merging equal sums (McNemar's b, c and the ties then cost b + c + 1
    states, not 2^n)."""
    types, counts = np.unique(columns, axis=0, return_counts=True)
    order = np.argsort(counts, kind="stable")
    size = work = 1  # an upper bound on the sums handled (before merging): too many, and nothing is built
    for count in counts[order]:
        size *= int(count) + 1
        work += size
        if work > EXACT_STATES:
            return None
    sums, weights = np.zeros((1, columns.shape[1])), np.ones(1)
    for at in order:
        c = int(counts[at])
        j = np.arange(c + 1)
        pmf = np.exp([math.lgamma(c + 1) - math.lgamma(k + 1) - math.lgamma(c - k + 1) - c * math.log(2) for k in j])
        sums = (sums[:, None, :] + ((2 * j - c)[:, None] * types[at])[None, :, :]).reshape(-1, columns.shape[1])
        weights = (weights[:, None] * pmf[None, :]).ravel()
        keys, inverse = np.unique(np.round(sums, 9), axis=0, return_inverse=True)
        weights = np.bincount(inverse.ravel(), weights=weights, minlength=keys.shape[0])
        sums = keys
    return sums, weights


def _random_flips(columns: np.ndarray, n_flip: int, seed: int) -> np.ndarray:
    """Σ_g s_g·columns[g] for ``n_flip`` seeded random sign vectors s. The signs come as bytes, 8 clusters a
    byte, summed through a per-byte table of its 256 sign patterns."""
    groups = columns.shape[0]
    width = (groups + 7) // 8
    padded = np.zeros((width * 8, columns.shape[1]))
    padded[:groups] = columns
    patterns = ((np.arange(256)[:, None] >> np.arange(8)) & 1) * 2 - 1  # (256, 8) signs of a byte's clusters
    # tables[c, 256·j + v]: column c summed over byte j's 8 clusters with the signs of byte value v
    tables = np.einsum("vk,jkc->cjv", patterns.astype(float), padded.reshape(width, 8, -1)).reshape(
        columns.shape[1], -1)
    offsets = np.arange(width) * 256
    rng = np.random.default_rng(seed)
    blocks = []
    for start in range(0, n_flip, _CHUNK):
        where = rng.integers(0, 256, size=(min(_CHUNK, n_flip - start), width), dtype=np.uint8) + offsets
        blocks.append(np.stack([np.take(table, where).sum(axis=1) for table in tables], axis=1))
    return np.concatenate(blocks)


def sign_flip(differences: Sequence[float], clusters: Sequence[object] | None = None, level: float = LEVEL,
              n_flip: int = N_FLIP, seed: int = SEED) -> tuple[float, float, float, bool]:
    """(p(0), low, high, exact) of the two-sided sign-flip test of mean(differences) = δ over cluster totals
    (module docstring): p(0) and the interval {δ : p(δ) ≥ 1 − level}, which is ±inf where no δ is rejected.
    Exact (the whole sign distribution, :func:`_exact_flips`) when it fits, else ``n_flip`` random vectors."""
    d = np.asarray(differences, dtype=float)
    index, groups = cluster_index(clusters, d.size) if clusters is not None else (np.arange(d.size), d.size)
    totals = np.bincount(index, weights=d, minlength=groups)
    sizes = np.bincount(index, minlength=groups).astype(float)
    observed, n = float(totals.sum()), float(d.size)
    estimate = observed / n
    columns = np.stack([totals, sizes], axis=1)
    found = _exact_flips(columns)
    exact = found is not None
    if found is not None:  # p(δ) = Σ weight·[condition]
        flipped, weights, offset = found[0], found[1], 0.0
    else:  # p(δ) = (1 + #[condition]) / (B + 1)
        flipped = _random_flips(columns, n_flip, seed)
        weights, offset = np.full(flipped.shape[0], 1.0 / (n_flip + 1)), 1.0 / (n_flip + 1)
    a, m = flipped[:, 0], flipped[:, 1]
    # each sign vector's condition |A − δM| ≥ |T − δn| holds for u = δ − Δ̂ in [lo, hi] (roots of a concave
    # quadratic; the whole line when M = ±n): with E = A − Δ̂M, Q = n² − M², u = (−EM ± |E|n) / Q
    e = a - estimate * m
    q = n * n - m * m
    tol = 1e-9 * max(1.0, float(np.abs(d).max(initial=0.0)))
    whole = q <= 1e-9 * n * n
    safe = np.where(whole, 1.0, q)
    lo = np.where(whole, -np.inf, (-e * m - np.abs(e) * n) / safe) - tol
    hi = np.where(whole, np.inf, (-e * m + np.abs(e) * n) / safe) + tol
    u0 = -estimate
    p0 = min(1.0, round(offset + float(weights[(lo <= u0) & (u0 <= hi)].sum()), 12))
    alpha = alpha_of(level)  # p(δ) = 0.05 is accepted
    if offset >= alpha - 1e-12:
        return p0, -math.inf, math.inf, exact
    # p(u) for u > 0 is offset + Σ weight over the vectors with hi ≥ u: the bound is the hi at which, taking
    # the largest first, the weights first reach alpha (the same from below with lo)
    bounds = []
    for ends in (-hi, lo):
        order = np.argsort(ends, kind="stable")
        reached = int(np.searchsorted(offset + np.cumsum(weights[order]), alpha - 1e-12))
        bounds.append(float(ends[order][min(reached, order.size - 1)]))
    upper, lower = estimate - bounds[0], estimate + bounds[1]
    if p0 >= alpha:  # 0 is accepted: inside (a bound within the tolerance of 0 is 0)
        lower, upper = min(lower, 0.0), max(upper, 0.0)
        lower, upper = (0.0 if abs(bound) <= 4 * tol else bound for bound in (lower, upper))
    elif lower <= 0.0 <= upper:  # rejected: outside by at least tol in exact arithmetic; rounding cannot undo it
        lower, upper = (math.ulp(0.0), upper) if estimate > 0 else (lower, -math.ulp(0.0))
    return p0, lower, upper, exact


def compare_scores(baseline: Sequence[float], other: Sequence[float], clusters: Sequence[object] | None = None,
                   level: float = LEVEL, n_flip: int = N_FLIP, seed: int = SEED) -> Comparison:
    """``mean(other) − mean(baseline)`` over paired items: the sign-flip test's p and its inverted interval
    over ``clusters`` (and over items: the larger p, the union of intervals; over items, differences of −1, 0 or
    +1 get the exact McNemar p at any n and the interval joined with Tango's, :func:`_agree`); no interval below
    :data:`MIN_CLUSTERS` clusters, nor when every paired difference is the same (:data:`NO_VARIATION`).
    Every score must be a finite number: a NaN, an infinity or ``None`` raises ``ValueError`` naming its
    position (drop unscored items from both sides first; the report does)."""
    a = np.asarray(baseline, dtype=float)
    b = np.asarray(other, dtype=float)
    if a.shape != b.shape or a.size == 0:
        raise ValueError(f"a paired comparison needs the same non-zero number of paired items, got {a.size} and "
                         f"{b.size}")
    for name, given, scores in (("baseline", baseline, a), ("other", other, b)):
        bad = np.flatnonzero(~np.isfinite(scores))
        if bad.size:
            raise ValueError(f"compare_scores: {name} score at position {int(bad[0])} is "
                             f"{_shown(given, int(bad[0]))}, not a finite number ({bad.size} such); "
                             f"drop unscored items from both sides before comparing")
    labels = tuple(clusters) if clusters is not None else None
    if labels is not None and len(labels) != a.size:
        raise ValueError(f"{a.size} items but {len(labels)} cluster labels; give one label per item")
    # a report asks for the same comparison for its tables, its JSON and its heatmap: computed once
    return _compare((b - a).tobytes(), labels, level, n_flip, seed)


@functools.lru_cache(maxsize=512)
def _compare(differences: bytes, clusters: tuple[object, ...] | None, level: float, n_flip: int,
             seed: int) -> Comparison:
    d = np.frombuffer(differences, dtype=float)
    p, low, high, exact = sign_flip(d, level=level, n_flip=n_flip, seed=seed)
    if bool(np.isin(d, (-1.0, 0.0, 1.0)).all()):  # paired 0/1 outcomes: exact McNemar and Tango's score interval
        b, c = int(np.sum(d < 0)), int(np.sum(d > 0))
        p, exact = mcnemar_p(b, c), True
        low, high = _agree(p, float(d.mean()), [(low, high), tango_interval(b, c, d.size, level)],
                           alpha_of(level))
    groups = d.size
    test = "exact sign-flip over items" if exact else f"sign-flip over items ({n_flip} draws)"
    if is_clustered(clusters):
        groups = len(set(clusters))
        p_c, low_c, high_c, exact_c = sign_flip(d, clusters, level, n_flip, seed)
        p, low, high = max(p, p_c), min(low, low_c), max(high, high_c)
        how = {True: "exact", False: f"{n_flip} draws"}
        test = f"sign-flip over clusters ({how[exact_c]}) and items ({how[exact]})"
    estimate = float(d.mean())
    if groups < MIN_CLUSTERS or not (math.isfinite(low) and math.isfinite(high)):
        return Comparison(estimate, None, None, p, int(d.size), test, groups, FEW_CLUSTERS)
    if float(np.ptp(d)) <= 1e-9 * max(1.0, float(np.abs(d).max())):
        # every difference the same (within rounding): the inversion rejects every other δ, a zero-width
        # interval that says nothing about the spread of effects
        return Comparison(estimate, None, None, p, int(d.size), test, groups, NO_VARIATION)
    return Comparison(estimate, low, high, p, int(d.size), test, groups)


def mcnemar_p(b: int, c: int) -> float:
    """The exact McNemar p-value from the discordant counts alone, at any n: p = min(1, 2·P[X ≤ min(b, c)]),
    X ~ Bin(b + c, ½) (McNemar 1947; the exact form: Agresti 2013, §11.1.4), each term
    C(m, k)/2^m = exp(lnΓ(m+1) − lnΓ(k+1) − lnΓ(m−k+1) − m ln 2); 1 when b = c."""
    m = b + c
    if m == 0 or b == c:
        return 1.0
    terms = [math.exp(math.lgamma(m + 1) - math.lgamma(k + 1) - math.lgamma(m - k + 1) - m * math.log(2))
             for k in range(min(b, c) + 1)]
    return min(1.0, round(2 * math.fsum(terms), 12))


def tango_interval(b: int, c: int, n: int, level: float = LEVEL) -> tuple[float, float]:
    """Tango's (1998) score interval for Δ = p_c − p_b, the difference of paired proportions (other − baseline),
    from n pairs of which b went right → wrong and c wrong → right: {Δ : |Z(Δ)| ≤ z_{1−α/2}},

    Z(Δ) = (c − b − nΔ) / sqrt(n (2 p̃ + Δ(1 − Δ))),

    p̃ the maximum-likelihood p_b under Δ, the larger root of 2n p̃² + B p̃ + C = 0 with B = −(b + c) +
    (2n − c + b)Δ and C = −bΔ(1 − Δ). Z falls as Δ grows, so each bound is found by bisection (to 1e-12)
    between Δ̂ = (c − b)/n and ±1."""
    z = statistics.NormalDist().inv_cdf(1 - alpha_of(level) / 2)

    def score(delta: float) -> float:
        linear = -(b + c) + (2 * n - c + b) * delta
        constant = -b * delta * (1 - delta)
        rate = (-linear + math.sqrt(max(0.0, linear * linear - 8 * n * constant))) / (4 * n)
        variance = n * (2 * rate + delta * (1 - delta))
        numerator = c - b - n * delta
        if variance <= 0:
            return math.copysign(math.inf, numerator) if numerator else 0.0
        return numerator / math.sqrt(variance)

    estimate = (c - b) / n
    bounds = []
    for end, target in ((-1.0, z), (1.0, -z)):
        if (score(end) - target) * (1 if target > 0 else -1) <= 0:  # never reaches the critical value
            bounds.append(end)
            continue
        inner, outer = estimate, end
        while abs(outer - inner) > 1e-12:
            middle = (inner + outer) / 2
            reached = score(middle) >= target if target > 0 else score(middle) <= target
            inner, outer = (inner, middle) if reached else (middle, outer)
        bounds.append((inner + outer) / 2)
    return bounds[0], bounds[1]


def _agree(p: float, estimate: float, intervals: list[tuple[float, float]], alpha: float) -> tuple[float, float]:
    """The union of ``intervals`` (each around ``estimate``) made to agree with the exact p: it holds 0 when
    p ≥ alpha and leaves it out when p < alpha. The score interval already does (an exact McNemar rejection
    at 5% is a score-test rejection, checked for every b + c ≤ 3000); only a Monte Carlo inversion (above
    :data:`EXACT_STATES`) can disagree near p = alpha, and then the bound crossing 0 moves to the nearest
    agreeing one (or to 0, open)."""
    low, high = min(i[0] for i in intervals), max(i[1] for i in intervals)
    if p >= alpha:
        return min(low, 0.0), max(high, 0.0)
    if low <= 0.0 <= high:
        if estimate > 0:
            low = min((i[0] for i in intervals if i[0] > 0.0), default=math.ulp(0.0))
        else:
            high = max((i[1] for i in intervals if i[1] < 0.0), default=-math.ulp(0.0))
    return low, high


def _shown(given: Sequence[object], at: int) -> str:
    """repr of ``given[at]`` for an error message."""
    try:
        return repr(given[at])
    except (TypeError, IndexError, KeyError):
        return "not a number"


def compare_accuracy(baseline: Sequence[bool], other: Sequence[bool], clusters: Sequence[object] | None = None,
                     level: float = LEVEL, n_flip: int = N_FLIP, seed: int = SEED) -> Comparison:
    """Accuracy difference (other − baseline) of paired 0/1 answers: :func:`compare_scores` (over items the
    exact McNemar test at any n, the interval joined with Tango's score interval). An answer counts by its
    truth value; ``None`` or NaN (an unscored answer, not a wrong one) raises ``ValueError`` naming its
    position."""
    if len(baseline) != len(other):
        raise ValueError(f"compare_accuracy needs paired items, got {len(baseline)} and {len(other)}")
    for name, answers in (("baseline", baseline), ("other", other)):
        for at, answer in enumerate(answers):
            if answer is None or (isinstance(answer, (float, np.floating)) and math.isnan(answer)):
                raise ValueError(f"compare_accuracy: {name} answer at position {at} is {answer!r}, neither right "
                                 f"nor wrong; drop unscored items from both sides before comparing")
    return compare_scores([float(bool(x)) for x in baseline], [float(bool(y)) for y in other], clusters, level,
                          n_flip, seed)


def adjust_p(p_values: Sequence[float], method: str = "holm") -> list[float]:
    """``p_values`` adjusted for their family (module docstring): ``holm`` (FWER), ``bh`` (FDR) or ``none``.

    Holm: p̃_(i) = max_{j ≤ i} min(1, (m − j + 1) p_(j)); BH: p̃_(i) = min_{j ≥ i} min(1, m p_(j) / j). Each
    product is rounded to 12 places, as the module's p-values are, and p̃ ≥ p is kept: in floating point
    4·0.0375/3 is 0.049999999999999996, which starred an adjusted p of exactly 0.05 (and 3·0.7/3 fell below 0.7)."""
    if method not in P_ADJUST:
        raise ValueError(f"p-value adjustment {method!r}: choose one of {', '.join(P_ADJUST)}")
    p = np.asarray(p_values, dtype=float)
    bad = np.flatnonzero(~((p >= 0) & (p <= 1)))  # NaN fails both
    if bad.size:
        raise ValueError(f"adjust_p: p-value at position {int(bad[0])} is {_shown(p_values, int(bad[0]))}; every "
                         f"p-value must be a number between 0 and 1 (NaN is not)")
    m = p.size
    if m == 0 or method == "none":
        return [float(x) for x in p]
    order = np.argsort(p, kind="stable")
    ranked = p[order]
    if method == "holm":
        scaled = np.round((m - np.arange(m)) * ranked, 12)
        adjusted = np.maximum.accumulate(np.minimum(1.0, scaled))
    else:
        scaled = np.round(m * ranked / np.arange(1, m + 1), 12)
        adjusted = np.minimum.accumulate(np.minimum(1.0, scaled)[::-1])[::-1]
    adjusted = np.maximum(adjusted, ranked)  # an adjusted p is never below its raw p
    out = np.empty(m)
    out[order] = adjusted
    return [float(x) for x in out]


def mcnemar_exact(baseline: Sequence[bool], other: Sequence[bool]) -> tuple[int, int, float]:
    """(b, c, two-sided exact p) for paired correctness; b: baseline right & other wrong, c: the reverse."""
    if len(baseline) != len(other):
        raise ValueError(f"mcnemar_exact needs paired items, got {len(baseline)} and {len(other)}")
    b = sum(1 for x, y in zip(baseline, other) if x and not y)
    c = sum(1 for x, y in zip(baseline, other) if y and not x)
    return b, c, mcnemar_p(b, c)
