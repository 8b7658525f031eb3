"""Uncertainty for report figures: seeded percentile bootstrap intervals of figures, and paired comparisons by
an exact (or Monte Carlo) sign-flip test whose inversion gives the interval, corrected for many comparisons.

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
  narrower than the item-level one), and none at all below :data:`MIN_CLUSTERS` units.
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
* **Few clusters**: with G clusters the smallest p a two-sided sign-flip test can give is 2 / 2^G (the
  identity and the all-flipped vector always tie), 0.0625 at G = 5 and 0.031 at G = 6, so below
  :data:`MIN_CLUSTERS` = 6 no 5% test can reject and no interval is bounded: the report shows the estimate
  with its p but no interval and no star, and says so. The same minimum holds for the interval of a figure
  whose items fall in fewer than 6 clusters (one cluster: every bootstrap resample is the same, a zero-width
  interval; a few: too few distinct resamples to cover).
* **Small samples** (:func:`expanded_level`): a percentile interval is about θ̂ ± z·σ̂ with the plug-in σ̂
  (divisor G), where the t interval is θ̂ ± t_{G−1}·s, so over few units it is too narrow: the report's 95%
  interval over 6 clusters held the truth in 91% of simulated accuracies and 85% of micro rates
  (``benchmarks/interval_coverage.py``; 96% and 92% expanded). Every figure's
  interval is therefore Hesterberg's (2015) expanded percentile interval: the bootstrap quantiles at α′/2 and
  1 − α′/2, α′/2 = Φ(−√(G/(G−1))·t_{0.975, G−1}), G the units resampled (clusters, or items): tails of 0.24%
  at G = 6, 1.9% at G = 30, 2.5% in the limit. The same minimum of :data:`MIN_CLUSTERS` units holds for items
  as for clusters (at G = 2 the expanded interval is the whole range of the resamples). For a ratio, G counts
  only the units that hold any of it: an item with 0 of 0 (an empty report's CHAIR, a Break rate's
  originally wrong answer) adds nothing to Σnum/Σden, so 100 items of which 2 hold trials are 2 units.
* **No spread in a figure**: when every item has the same value (or ratio), every resample gives the figure
  itself and the percentile interval is the zero-width [θ̂, θ̂]. A 0/1 figure (``binary``: accuracy, recall,
  or a rate of 0/1 trials such as CHAIR's hallucinated objects among those mentioned) that is all 0 or all 1 gets the exact Clopper & Pearson (1934) bound instead, over the G units resampled:
  [0, 1 − (α/2)^{1/G}] or [(α/2)^{1/G}, 1] (0 of 6 right: [0, 0.459]). Over clusters this stays valid: a cluster
  is all 0 with probability at most 1 − p (its first item's), so P(all G clusters all 0) ≤ (1 − p)^G. Any other
  figure without spread shows no interval, :data:`NO_SPREAD`.
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
  other wrong) and c = #(baseline wrong, other right), p = min(1, 2·P[X ≤ min(b, c)]), X ~ Bin(b + c, ½);
  kept as the hand check of :func:`sign_flip` on unclustered 0/1 data.
"""

from __future__ import annotations

import functools
import math
import statistics
from dataclasses import dataclass
from typing import Sequence

import numpy as np

N_BOOT = 2000
SEED = 0
LEVEL = 0.95
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
                   f"test over cluster totals (exact where its distribution is small enough to build, else {N_FLIP} seeded random "
                   f"sign vectors; over items it is exact McNemar for accuracy), its 95% interval the test inverted, "
                   f"so an interval excluding 0 ⇔ raw p < 0.05; clustered: tested over clusters and over items, the "
                   f"larger p and the wider interval. Fewer than {MIN_CLUSTERS} clusters, or every paired difference "
                   f"the same: no interval, no star.")
SMALL_SAMPLE_NOTE = (f"percentiles expanded for the number of units G (Hesterberg 2015: tails at "
                     f"Φ(−√(G/(G−1))·t₀.₉₇₅,G−1), 0.24% at G = 6, 1.9% at G = 30), none below {MIN_CLUSTERS} units "
                     f"(for a rate, units holding any of it: an item with 0 of 0 is none); a 0/1 figure or rate of "
                     f"0/1 trials that is all 0 or all 1: Clopper–Pearson's exact interval over the G units")
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
    every resample is the same, a zero-width interval; a few: too few distinct resamples to cover). Without
    spread (every item alike): for a ``binary`` figure (a 0/1 mean, or a ratio whose numerator counts the
    successes among its denominator's trials) the Clopper–Pearson bound over the units, else none. A ratio's
    units are those holding any of it (:func:`_with_trials`) (module docstring)."""
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
        return None, FEW_CLUSTERS
    interval = bootstrap_ci(values, denominators, level=expanded_level(LEVEL, len(values)))
    if is_clustered(clusters):
        clustered = bootstrap_ci(values, denominators, clusters=clusters, level=expanded_level(LEVEL, units))
        if interval is None or clustered is None:
            interval = interval or clustered
        else:
            interval = (min(interval[0], clustered[0]), max(interval[1], clustered[1]))
    if interval is not None and interval[0] == interval[1]:
        return _without_spread(interval[0], units, binary)
    return interval, None if interval is not None else NO_DENOMINATOR


def _with_trials(values: Sequence[float], denominators: Sequence[float], clusters: Sequence[object] | None
                 ) -> tuple[list[float], list[float], list[object] | None]:
    """The items of a ratio that hold any of it (denominator > 0, or a numerator ≠ 0): an item with 0 of 0
    adds nothing to Σnum/Σden, so it is not a unit of evidence for the minimum, the expansion or the exact bound."""
    keep = [i for i, (x, d) in enumerate(zip(values, denominators)) if float(d) > 0 or float(x) != 0]
    return ([float(values[i]) for i in keep], [float(denominators[i]) for i in keep],
            None if clusters is None else [clusters[i] for i in keep])


def _without_spread(figure: float, units: int, binary: bool) -> tuple[tuple[float, float] | None, str | None]:
    """Clopper–Pearson's interval of a 0/1 mean (or a rate of 0/1 trials) that is all 0 or all 1 over
    ``units`` units; else none."""
    if not binary or figure not in (0.0, 1.0):
        return None, NO_SPREAD
    edge = ((1 - LEVEL) / 2) ** (1 / units)
    return ((0.0, 1 - edge) if figure == 0.0 else (edge, 1.0)), None


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
    alpha = 1 - level
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
    over ``clusters`` (and over items: the larger p, the union of intervals); no interval below
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


def _shown(given: Sequence[object], at: int) -> str:
    """repr of ``given[at]`` for an error message."""
    try:
        return repr(given[at])
    except (TypeError, IndexError, KeyError):
        return "not a number"


def compare_accuracy(baseline: Sequence[bool], other: Sequence[bool], clusters: Sequence[object] | None = None,
                     level: float = LEVEL, n_flip: int = N_FLIP, seed: int = SEED) -> Comparison:
    """Accuracy difference (other − baseline) of paired 0/1 answers: :func:`compare_scores` (over items it is
    the exact McNemar test at δ = 0). An answer counts by its truth value; ``None`` or NaN (an unscored
    answer, not a wrong one) raises ``ValueError`` naming its position."""
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
    """``p_values`` adjusted for their family (module docstring): ``holm`` (FWER), ``bh`` (FDR) or ``none``."""
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
        adjusted = np.maximum.accumulate(np.minimum(1.0, (m - np.arange(m)) * ranked))
    else:
        adjusted = np.minimum.accumulate(np.minimum(1.0, m * ranked / np.arange(1, m + 1))[::-1])[::-1]
    out = np.empty(m)
    out[order] = adjusted
    return [float(x) for x in out]


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
