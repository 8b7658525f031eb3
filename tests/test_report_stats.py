"""Bootstrap intervals, sign-flip paired comparisons, McNemar and p-value adjustment on known answers."""

import math
import statistics

import numpy as np
import pytest
from conftest import load_benchmark

from medheval.report.stats import (FEW_CLUSTERS, LEVEL, MIN_CLUSTERS, NO_SPREAD, NO_VARIATION, adjust_p,
                                   bca_acceleration, bca_ci, bca_levels, bootstrap_ci, bootstrap_distribution,
                                   compare_accuracy, compare_scores, expanded_level, figure_interval, mcnemar_exact,
                                   sign_flip, t_quantile, t_two_sided, zero_bound)


def test_interval_of_a_constant_is_a_point():
    assert bootstrap_ci([0.7] * 50) == pytest.approx((0.7, 0.7))
    assert bootstrap_ci([2.0] * 10, denominators=[4.0] * 10) == pytest.approx((0.5, 0.5))  # a constant ratio


def test_binomial_80_of_100_matches_the_normal_interval():
    values = [1.0] * 80 + [0.0] * 20
    low, high = bootstrap_ci(values)
    half = 1.96 * math.sqrt(0.8 * 0.2 / 100)  # normal approximation: 0.8 ± 0.0784
    assert low == pytest.approx(0.8 - half, abs=0.015) and high == pytest.approx(0.8 + half, abs=0.015)
    assert 0.70 < low < 0.75 and 0.85 < high < 0.90  # Wilson: [0.711, 0.867]


def test_seeded_and_empty():
    values = [0.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0]
    assert bootstrap_ci(values, seed=3) == bootstrap_ci(values, seed=3)
    assert bootstrap_ci([]) is None
    with pytest.raises(ValueError, match="3 numerators but 2 denominators"):
        bootstrap_ci([1, 2, 3], denominators=[1, 1])


def test_ratio_interval_recomputes_sums_not_means():
    # per-item ratios 1/1 and 0/9: micro rate 1/10, mean of ratios 0.5 — the interval must hold 0.1
    low, high = bootstrap_ci([1] * 20 + [0] * 20, denominators=[1] * 20 + [9] * 20)
    assert low <= 0.1 <= high and high < 0.3


# --- clustered designs (issue 25, part 1) -----------------------------------------------------------------


def test_two_clusters_of_fifty_identical_answers_are_far_wider_than_iid():
    """Image A: 50 questions all right; image B: 50 all wrong. Items as i.i.d.: mean 0.5, normal half-width
    1.96·sqrt(0.25/100) ≈ 0.098, so about [0.40, 0.60]. Resampling the G = 2 images: a replicate draws A twice
    (mean 1), B twice (0) or one of each (0.5) with probabilities ¼, ¼, ½, so the 2.5% and 97.5% percentiles
    are 0 and 1: the interval is [0, 1], the whole range (the data hold two independent observations)."""
    values = [1.0] * 50 + [0.0] * 50
    clusters = ["A"] * 50 + ["B"] * 50
    iid = bootstrap_ci(values)
    clustered = bootstrap_ci(values, clusters=clusters)
    assert iid[0] == pytest.approx(0.40, abs=0.02) and iid[1] == pytest.approx(0.60, abs=0.02)
    assert clustered == (0.0, 1.0)
    assert clustered[1] - clustered[0] > 4 * (iid[1] - iid[0])
    replicates = bootstrap_distribution(values, clusters=clusters, n_boot=4000)
    assert set(np.unique(replicates)) == {0.0, 0.5, 1.0}
    assert np.mean(replicates == 0.5) == pytest.approx(0.5, abs=0.03)


def test_one_item_per_cluster_is_exactly_the_item_bootstrap():
    """With every label distinct (numbered by first appearance), the cluster bootstrap draws the item bootstrap's
    indices, so means and ratios give bit-identical intervals, and a comparison is the unclustered one."""
    rng = np.random.default_rng(7)
    values = rng.integers(0, 2, 120).astype(float).tolist()
    other = rng.integers(0, 2, 120).astype(float).tolist()
    denominators = rng.integers(1, 6, 120).astype(float).tolist()
    labels = [f"image:{code}" for code in rng.permutation(10_000)[:120]]  # distinct, in no particular order
    assert bootstrap_ci(values, clusters=labels) == bootstrap_ci(values)
    assert bootstrap_ci(values, denominators, clusters=labels) == bootstrap_ci(values, denominators)
    assert figure_interval(values, clusters=labels) == figure_interval(values)
    flags = [bool(v) for v in values], [bool(v) for v in other]
    assert compare_accuracy(*flags, clusters=labels) == compare_accuracy(*flags)
    assert compare_accuracy(*flags).test == "exact sign-flip over items"
    assert compare_accuracy(*flags).p_value == pytest.approx(mcnemar_exact(*flags)[2])


def _clustered_sample() -> tuple[np.ndarray, np.ndarray, list[int]]:
    """60 images with 1–12 questions each; each image has its own accuracy (so answers correlate within it)."""
    rng = np.random.default_rng(2026)
    y, d, labels = [], [], []
    for image in range(60):
        size, p = int(rng.integers(1, 13)), float(rng.uniform(0.05, 0.95))
        y += (rng.uniform(size=size) < p).astype(float).tolist()
        d += rng.integers(1, 4, size).astype(float).tolist()
        labels += [image] * size
    return np.array(y), np.array(d), labels


def test_cluster_bootstrap_matches_the_cluster_robust_standard_error():
    """Independent check (Liang & Zeger 1986; Cameron, Gelbach & Miller 2008): for a mean ȳ over n items in G
    clusters the cluster-robust (CR0 sandwich) variance is Σ_g (Σ_{i∈g} (y_i − ȳ))² / n²; for a ratio
    R = Σy/Σd, linearised, Σ_g (Σ_{i∈g} (y_i − R·d_i))² / (Σd)². The cluster bootstrap's standard deviation
    estimates the same quantity; with B = 4000 its Monte Carlo error is about 1/sqrt(2B) ≈ 1.1%, so 5% is a
    tolerance the i.i.d. bootstrap (here about half as large) cannot meet."""
    y, d, labels = _clustered_sample()
    groups = np.array(labels)
    residual = y - y.mean()
    robust = math.sqrt(sum(residual[groups == g].sum() ** 2 for g in set(labels))) / y.size
    clustered = bootstrap_distribution(y, clusters=labels, n_boot=4000).std()
    iid = bootstrap_distribution(y, n_boot=4000).std()
    assert clustered == pytest.approx(robust, rel=0.05)
    assert iid < 0.6 * robust  # ignoring the clusters understates the uncertainty
    ratio = y.sum() / d.sum()
    linearised = y - ratio * d
    robust_ratio = math.sqrt(sum(linearised[groups == g].sum() ** 2 for g in set(labels))) / d.sum()
    assert bootstrap_distribution(y, d, clusters=labels, n_boot=4000).std() == pytest.approx(robust_ratio, rel=0.05)
    # the 95% percentile interval is close to ȳ ± 1.96·SE
    low, high = bootstrap_ci(y, clusters=labels, n_boot=4000)
    assert low == pytest.approx(y.mean() - 1.96 * robust, abs=0.2 * robust)
    assert high == pytest.approx(y.mean() + 1.96 * robust, abs=0.2 * robust)


def test_cluster_labels_must_match_the_items():
    with pytest.raises(ValueError, match="3 items but 2 cluster labels"):
        bootstrap_ci([1.0, 0.0, 1.0], clusters=["a", "b"])
    assert bootstrap_ci([], clusters=[]) is None
    assert bootstrap_ci([2.0] * 6, denominators=[4.0] * 6, clusters=list("aabbcc")) == pytest.approx((0.5, 0.5))


# --- paired comparisons: sign-flip test and its inversion (issue 30, points 1 and 3) -------------------------


def test_mcnemar_worked_by_hand():
    # b = 1 (baseline right, other wrong), c = 5: p = 2 * P[Bin(6, 1/2) <= 1] = 2 * 7/64 = 0.21875; 15 items,
    # so the sign-flip test enumerates all 2^15 sign vectors and gives McNemar's p exactly
    baseline = [True] * 1 + [False] * 5 + [True] * 6 + [False] * 3
    other = [False] * 1 + [True] * 5 + [True] * 6 + [False] * 3
    assert mcnemar_exact(baseline, other) == (1, 5, pytest.approx(0.21875))
    assert mcnemar_exact([True, False], [True, False]) == (0, 0, 1.0)
    result = compare_accuracy(baseline, other)
    assert result.diff == pytest.approx(4 / 15) and result.p_value == pytest.approx(0.21875)
    assert result.low <= 0 <= result.high and result.test == "exact sign-flip over items"
    assert (result.n, result.n_clusters, result.note) == (15, 15, None)


@pytest.mark.parametrize("seed", range(12))
def test_sign_flip_over_items_is_exact_mcnemar_on_correctness(seed):
    """Unclustered 0/1 answers: equal items do not move Σ s_i d_i and the discordant ones are ±1, so the
    sign-flip p at 0 is McNemar's exact p, whatever b and c."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(6, 16))
    baseline, other = rng.integers(0, 2, n).astype(bool).tolist(), rng.integers(0, 2, n).astype(bool).tolist()
    assert compare_accuracy(baseline, other).p_value == pytest.approx(mcnemar_exact(baseline, other)[2])


def test_one_cluster_is_never_more_certain_than_its_items():
    """The issue's case: 4 answers about one image, the baseline right on one. One cluster: the two sign
    vectors give |T| = 1 both, p = 1; over items McNemar (b = 1, c = 0) also gives 1 (the old bootstrap
    said 0.0005). One cluster is below the minimum: the estimate, no interval, and the reason."""
    result = compare_accuracy([1, 0, 0, 0], [0] * 4, clusters=["i"] * 4)
    assert result.diff == -0.25 and result.p_value == 1.0
    assert (result.low, result.high, result.n_clusters, result.note) == (None, None, 1, FEW_CLUSTERS)
    assert compare_accuracy([1, 0, 0, 0], [0] * 4).p_value == 1.0


def test_two_clusters_fifty_items_each():
    """A mitigation fixes all 50 questions about image A and none of B's (B all right already). Over items
    McNemar b = 0, c = 50: p = 2^-49. Over the 2 images: totals (50, 0), all 4 sign vectors give |T| = 50,
    p = 1. The comparison takes the larger, 1, and has no interval (2 < 6 clusters)."""
    baseline = [False] * 50 + [True] * 50
    other = [True] * 100
    clusters = ["A"] * 50 + ["B"] * 50
    assert compare_accuracy(baseline, other).p_value == pytest.approx(2 * 0.5 ** 50)  # exact over the 100 items
    clustered = compare_accuracy(baseline, other, clusters=clusters)
    assert clustered.diff == pytest.approx(0.5) and clustered.p_value == 1.0
    assert clustered.low is None and clustered.note == FEW_CLUSTERS
    assert clustered.test == "sign-flip over clusters (exact) and items (exact)"


def test_monte_carlo_when_the_exact_distribution_is_too_large():
    """3,000 items with scores all distinct: no two items alike, 2^3000 sign vectors; 9999 seeded random ones
    give a valid p ≥ 1/10000, and the star still agrees with the interval."""
    rng = np.random.default_rng(5)
    base = rng.normal(0, 1, 3000)
    result = compare_scores(base, base + rng.normal(0.05, 1, 3000))
    assert result.test == "sign-flip over items (9999 draws)" and result.p_value >= 1 / 10000
    assert (result.p_value < 0.05) == (not result.low <= 0 <= result.high)


def test_three_clusters_by_hand():
    """Three images of 5 questions; the mitigation fixes 5 on A, 3 on B, none on C. Totals (5, 3, 0): of the
    8 sign vectors, |±5 ±3| = 8 for the 4 with A and B alike, so p = 4/8 = 0.5 (over items McNemar gives
    2·2^-8 = 0.0078): p = 0.5, no interval below 6 clusters."""
    baseline = [False] * 5 + [False] * 3 + [True] * 2 + [True] * 5
    other = [True] * 5 + [True] * 3 + [True] * 2 + [True] * 5
    clusters = ["A"] * 5 + ["B"] * 5 + ["C"] * 5
    item = compare_accuracy(baseline, other)
    assert item.p_value == pytest.approx(2 / 256) and item.low is not None and item.low > 0
    result = compare_accuracy(baseline, other, clusters=clusters)
    assert result.diff == pytest.approx(8 / 15) and result.p_value == 0.5 and result.low is None


def test_six_clusters_all_improving_reach_significance():
    """Six images of 2 questions, one fixed on each: cluster totals all 1; only the identity and the all-flipped
    vector reach |T| = 6, p = 2/64 = 0.03125 (McNemar over items, b = 0, c = 6: the same). Six is the smallest
    G whose 2/2^G is below 0.05, so the interval exists and excludes 0."""
    baseline = [False, True] * 6
    other = [True, True] * 6
    clusters = [g for g in "ABCDEF" for _ in range(2)]
    assert MIN_CLUSTERS == 6
    result = compare_accuracy(baseline, other, clusters=clusters)
    assert result.p_value == pytest.approx(0.03125) and result.n_clusters == 6
    assert 0 < result.low <= result.diff == 0.5 <= result.high <= 1


def test_five_fixed_of_two_hundred_star_and_interval_agree():
    """The issue's case: 5 items fixed out of 200 and nothing broken. McNemar p = 2·2^-5 = 0.0625, no star; the
    old bootstrap interval [+0.5, +5.0] excluded 0. Now the interval is the test inverted, so it holds 0."""
    baseline = [False] * 5 + [True] * 100 + [False] * 95
    other = [True] * 5 + [True] * 100 + [False] * 95
    result = compare_accuracy(baseline, other)
    assert result.p_value == pytest.approx(0.0625) and result.test == "exact sign-flip over items"
    assert result.p_value >= 0.05 and result.low <= 0 <= result.high and result.high > 0.02


def test_all_equal_and_empty_inputs():
    scores = [0.1, 0.5, 0.9, 0.3, 0.7, 0.2]
    same = compare_scores(scores, scores)  # every difference 0: p = 1, and no zero-width [0, 0] interval
    assert (same.diff, same.low, same.high, same.p_value, same.note) == (0.0, None, None, 1.0, NO_VARIATION)
    assert compare_accuracy([True] * 8, [True] * 8).p_value == 1.0
    with pytest.raises(ValueError, match="same non-zero number of paired items, got 0 and 0"):
        compare_scores([], [])
    with pytest.raises(ValueError, match="got 1 and 2"):
        compare_scores([1.0], [1.0, 2.0])
    assert figure_interval([]) == (None, "no items")
    assert figure_interval([1.0, 0.0, 1.0, 1.0], clusters="aabb") == (None, FEW_CLUSTERS)  # 2 clusters
    assert figure_interval([1.0] * 8, clusters="a" * 8) == (None, FEW_CLUSTERS)  # one: was [100, 100]
    assert figure_interval([1.0, 0.0, 1.0]) == (None, FEW_CLUSTERS)  # 3 items: as few as 3 clusters
    six = [1.0, 0.0, 1.0, 1.0, 0.0, 1.0]  # 6 items: the item bootstrap, its level expanded for n = 6, joined
    percentile, bca = bootstrap_ci(six, level=expanded_level(LEVEL, 6)), bca_ci(six, level=expanded_level(LEVEL, 6))
    assert figure_interval(six) == ((min(percentile[0], bca[0]), max(percentile[1], bca[1])), None)  # with BCa's
    assert adjust_p([]) == []


def test_a_clear_shift_is_detected():
    base = [i / 100 for i in range(100)]
    result = compare_scores(base, [x + 0.2 for x in base])
    assert result.diff == pytest.approx(0.2) and result.p_value == pytest.approx(1 / 10000)
    # a constant shift (equal up to rounding): the inversion would be the zero-width [0.2, 0.2]; none shown
    assert (result.low, result.high, result.note) == (None, None, NO_VARIATION)
    varied = compare_scores(base, [x + 0.2 + (0.01 if i % 2 else -0.01) for i, x in enumerate(base)])
    assert varied.low < 0.2 < varied.high and varied.note is None and varied.p_value == pytest.approx(1 / 10000)


@pytest.mark.parametrize("seed", range(8))
def test_interval_is_the_test_inverted(seed):
    """Independent check of the inversion: the test run on the differences shifted by δ accepts δ just inside
    the interval (p ≥ 0.05) and rejects it just outside; and "p < 0.05" ⇔ "0 outside the interval"; the
    clustered p is never below the items' p."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(8, 40))
    d = np.round(rng.normal(0.2, 1.0, n), 3)
    clusters = rng.integers(0, max(6, n // 3), n).tolist() if seed % 2 else None
    result = compare_scores(np.zeros(n), d, clusters=clusters)
    if result.low is None:
        return
    def p_at(delta: float) -> float:  # the comparison's p for H0: Δ = δ (clustered: the larger of the two)
        shifted = d - delta
        return max(sign_flip(shifted)[0], sign_flip(shifted, clusters)[0] if clusters is not None else 0.0)

    for bound, inward in ((result.low, 1), (result.high, -1)):
        assert p_at(bound + inward * 1e-6) >= 0.05 and p_at(bound - inward * 1e-6) < 0.05
    assert (result.p_value < 0.05) == (not result.low <= 0 <= result.high)
    if clusters is not None:
        assert result.p_value >= compare_scores(np.zeros(n), d).p_value


@pytest.mark.parametrize("seed", range(30))
def test_star_and_interval_always_agree(seed):
    rng = np.random.default_rng(100 + seed)
    n = int(rng.integers(6, 60))
    baseline = rng.random(n) < 0.5
    other = rng.random(n) < rng.uniform(0.3, 0.95)
    clusters = rng.integers(0, int(rng.integers(1, n + 1)), n).tolist() if seed % 3 else None
    result = compare_accuracy(baseline.tolist(), other.tolist(), clusters=clusters)
    if result.low is not None:
        assert (result.p_value < 0.05) == (not result.low <= 0 <= result.high)
    else:
        assert result.p_value >= 0.05 or result.n_clusters >= MIN_CLUSTERS


# --- many comparisons (issue 30, point 2) ---------------------------------------------------------------------


def test_holm_and_bh_by_hand():
    """p = (0.01, 0.04, 0.03, 0.005), m = 4. Holm, sorted: 4·0.005 = 0.02, 3·0.01 = 0.03, 2·0.03 = 0.06,
    1·0.04 = 0.04 → running max 0.02, 0.03, 0.06, 0.06. BH: 4p/j = 0.02, 0.02, 0.04, 0.04, running min from
    the top: the same."""
    p = [0.01, 0.04, 0.03, 0.005]
    assert adjust_p(p, "holm") == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert adjust_p(p, "bh") == pytest.approx([0.02, 0.04, 0.04, 0.02])
    assert adjust_p(p, "none") == p
    assert adjust_p([0.5, 0.9], "holm") == [1.0, 1.0]  # capped at 1
    with pytest.raises(ValueError, match="p-value adjustment 'bonferroni': choose one of holm, bh, none"):
        adjust_p(p, "bonferroni")


def test_holm_removes_stars_from_a_63_comparison_family():
    """7 mitigations × 9 split·metric cells = 63 comparisons, all raw p < 0.05: three at 0.0001 and sixty
    between 0.01 and 0.049. Holm multiplies the smallest by 63, 62, 61 (0.0063, 0.0062, 0.0061: kept) and the
    fourth, 0.01, by 60 = 0.6: 60 stars go. BH's largest, 0.049 at rank 63, stays 0.049, so BH keeps all 63."""
    p = [0.0001] * 3 + [0.01 + 0.039 * k / 59 for k in range(60)]
    assert len(p) == 63 and max(p) < 0.05
    holm = adjust_p(p, "holm")
    assert sum(value < 0.05 for value in holm) == 3
    assert holm[:3] == pytest.approx([0.0063] * 3) and holm[3] == pytest.approx(0.6)
    assert sum(value < 0.05 for value in adjust_p(p, "bh")) == 63


def test_comparison_labels_must_match_the_items_and_results_are_reused():
    with pytest.raises(ValueError, match="3 items but 2 cluster labels"):
        compare_scores([0.0, 1.0, 1.0], [1.0, 1.0, 0.0], clusters=["a", "b"])
    first = compare_scores([0.1] * 8, [0.3] * 8, clusters="aabbccdd")
    assert compare_scores([0.1] * 8, [0.3] * 8, clusters=list("aabbccdd")) is first  # computed once


# --- small samples: Student's t and the expanded percentile interval -----------------------------------------


def test_t_distribution_known_answers():
    """Closed forms: df = 1 is Cauchy, P(|T| ≤ 1) = ½; df = 2: P(|T| ≤ t) = t / sqrt(2 + t²). Printed
    t_{0.975} table values (df 1, 2, 5, 10, 30) to their 3 decimals, and the normal 1.960 in the limit."""
    assert t_two_sided(1.0, 1) == pytest.approx(0.5, abs=1e-15)
    assert t_two_sided(3.0, 2) == pytest.approx(3 / math.sqrt(11), abs=1e-15)
    assert t_two_sided(0.0, 7) == 0.0 and t_two_sided(-2.0, 5) == t_two_sided(2.0, 5)
    printed = {1: 12.706, 2: 4.303, 5: 2.571, 10: 2.228, 30: 2.042, 120: 1.980, 10 ** 6: 1.960}
    for df, value in printed.items():
        assert round(t_quantile(0.95, df), 3) == value, df
    for df in (3, 50, 100):  # the bisection lands on the level it was asked for
        assert t_two_sided(t_quantile(0.95, df), df) == pytest.approx(0.95, abs=1e-11)
    assert t_quantile(0.95, 100) > t_quantile(0.95, 101) > t_quantile(0.95, 10 ** 4)  # the two methods meet
    with pytest.raises(ValueError, match="at least 1 degree of freedom"):
        t_two_sided(1.0, 0)


def test_t_quantile_matches_scipy():
    stats = pytest.importorskip("scipy.stats")
    for df in (1, 2, 3, 4, 6, 9, 17, 29, 64, 100, 101, 250, 5000):
        for level in (0.9, 0.95, 0.99):
            assert t_quantile(level, df) == pytest.approx(stats.t.ppf((1 + level) / 2, df), rel=1e-7), (df, level)


def test_expanded_level_by_hand():
    """G = 6: √(6/5)·t_{0.975,5} = 1.09545 × 2.57058 = 2.81594, Φ(−2.81594) = 0.002432, so the percentiles move
    from 2.5/97.5% to 0.243/99.757%; G = 30: √(30/29)·2.04523 = 2.08019, Φ(−2.08019) = 0.018754; large G: back to 95%."""
    assert expanded_level(LEVEL, 6) == pytest.approx(1 - 2 * 0.0024318, abs=2e-7)
    assert expanded_level(LEVEL, 30) == pytest.approx(1 - 2 * 0.018754, abs=2e-6)
    assert expanded_level(LEVEL, 100_000) == pytest.approx(LEVEL, abs=1e-5)
    levels = [expanded_level(LEVEL, g) for g in (2, 3, 6, 12, 30, 100, 1000)]
    assert levels == sorted(levels, reverse=True) and all(level > LEVEL for level in levels)
    with pytest.raises(ValueError, match="at least 2 units"):
        expanded_level(LEVEL, 1)


def test_few_cluster_intervals_cover_near_their_level():
    """The defect it mends: the plain 95% percentile interval over G = 8 clusters covers the true accuracy in about
    89% of these data sets (355 of 400). 400 seeded data sets of 8 clusters × 5 correlated 0/1 answers (cluster rate ~ Beta(2, 2), true
    mean ½): the interval shown (:func:`figure_interval`, clusters and items joined, levels expanded) covers ½ in
    at least 92%, where the plain cluster percentile interval misses more than twice as often."""
    rng = np.random.default_rng(2026)
    labels = [f"c{g}" for g in range(8) for _ in range(5)]
    shown = plain = 0
    for _ in range(400):
        rates = rng.beta(2, 2, 8)
        values = (rng.random((8, 5)) < rates[:, None]).astype(float).ravel().tolist()
        low, high = figure_interval(values, clusters=labels)[0]
        shown += low <= 0.5 <= high
        low, high = bootstrap_ci(values, clusters=labels, n_boot=500)
        plain += low <= 0.5 <= high
    assert shown / 400 >= 0.92 and (400 - plain) > 2 * (400 - shown), (shown, plain)


def test_a_figure_without_spread_gets_no_zero_width_interval():
    """Every item alike: every resample gives the figure, [θ̂, θ̂]. A 0/1 mean gets the exact bound of no success
    (or failure) over its units instead, Clopper–Pearson's for equal units (stats.zero_bound): 0 of 8 right, [0, 1 − 0.025^(1/8)] = [0, 1 − 0.63059] = [0, 0.36941]; 8 of 8,
    [0.63059, 1]; 0 of 12 answers on 6 images (2 each), over G = 6: [0, 1 − 0.025^(1/6)] = [0, 0.45926]. A
    constant score or ratio (whose range the statistics cannot know) gets none, and says why."""
    assert figure_interval([0.0] * 8, binary=True) == ((0.0, pytest.approx(0.36941, abs=1e-5)), None)
    assert figure_interval([1.0] * 8, binary=True) == ((pytest.approx(0.63059, abs=1e-5), 1.0), None)
    assert figure_interval([0.0] * 12, clusters=[f"image:{i // 2}" for i in range(12)], binary=True) == (
        (0.0, pytest.approx(0.45926, abs=1e-5)), None)
    assert figure_interval([0.7] * 8) == (None, NO_SPREAD) and figure_interval([1.0] * 8) == (None, NO_SPREAD)
    assert figure_interval([1.0, 2.0] * 4, denominators=[2.0, 4.0] * 4) == (None, NO_SPREAD)  # every ratio ½
    assert figure_interval([0.0] * 8, denominators=[3.0] * 8) == (None, NO_SPREAD)  # a ratio of unknown kind
    varied = [1.0, 0.0] * 4  # with spread: the bootstrap, which here already spans Clopper–Pearson's [0.157, 0.843]
    assert figure_interval(varied, binary=True) == figure_interval(varied) == (
        bootstrap_ci(varied, level=expanded_level(LEVEL, 8)), None)
    assert figure_interval(varied)[0][0] < 0.157 and figure_interval(varied)[0][1] > 0.843


# --- BCa: bias-corrected and accelerated interval (Efron 1987) for figures that are not 0/1 -------------------


def test_alike_items_in_units_of_unequal_size_get_no_interval_from_rounding():
    """Reproduction: every item 0.7 over image clusters of 1 to 3 items gave the interval (0.6999999999999997,
    0.7000000000000001) (a resample's Σ/D rounds in its last bits), shown as [70.0, 70.0], not "no interval";
    so did a ratio whose every item is 0.1 of its denominator (0.1/1, 0.2/2, 0.3/3)."""
    labels = ["a", "a", "a", "b", "c", "c", "d", "e", "e", "e", "f", "g"]
    assert figure_interval([0.7] * 12, clusters=labels) == (None, NO_SPREAD)
    assert figure_interval([0.1, 0.2, 0.3] * 4, denominators=[1.0, 2.0, 3.0] * 4) == (None, NO_SPREAD)
    near = [0.7] * 11 + [0.7 + 1e-6]  # a real (if tiny) spread keeps its interval
    assert figure_interval(near, clusters=labels)[0] is not None


def test_bca_acceleration_of_a_hand_worked_jackknife():
    """Items 1, 2, 3, 10: leave-one-out means 5, 14/3, 13/3, 2, their mean 4, u = 4 − θ₍i₎ = −1, −2/3, −1/3, 2;
    Σu² = 50/9, Σu³ = 20/3, a = (20/3) / (6 (50/9)^{3/2}) = 3/(25√2) = 0.0848528 (the long right tail: a > 0).
    Clusters of sums 1, 4, 6 over sizes 2, 2, 4 (the ratio 11/8): leave-one-out 10/6, 7/6, 5/4, mean 49/36,
    u = −11/36, 7/36, 4/36, a = −924 / (6·186^{3/2}) = −154/186^{3/2} = −0.0607088. Through bca_ci the same
    clusters are given item by item."""
    assert bca_acceleration([1, 2, 3, 10], [1, 1, 1, 1]) == pytest.approx(3 / (25 * math.sqrt(2)), rel=1e-12)
    assert bca_acceleration([1, 4, 6], [2, 2, 4]) == pytest.approx(-154 / 186 ** 1.5, rel=1e-12)
    assert bca_acceleration([10, 20, 30, 100], [10, 10, 10, 10]) == pytest.approx(3 / (25 * math.sqrt(2)))  # scale-free
    assert bca_acceleration([-1, -2, -3, -10], [1, 1, 1, 1]) == pytest.approx(-3 / (25 * math.sqrt(2)))  # mirrored
    assert bca_acceleration([1, 2, 3, 4, 5], [1] * 5) == 0.0  # symmetric: Σu³ = 0


def test_bca_acceleration_edges():
    """All units alike (every u_g = 0: 0/0), one unit (no jackknife), or all but one leaving no denominator: 0."""
    assert bca_acceleration([0.7] * 6, [1] * 6) == 0.0
    assert bca_acceleration([2.0, 4.0, 6.0], [1.0, 2.0, 3.0]) == 0.0  # every ratio 2
    assert bca_acceleration([0.1 + 0.2] * 3 + [0.3] * 3, [1] * 6) == 0.0  # alike up to rounding
    assert bca_acceleration([5.0], [1.0]) == 0.0
    assert bca_acceleration([1.0, 0.0], [3.0, 0.0]) == 0.0  # without unit 0 there is no ratio


def test_bca_levels_known_answers():
    """α[z] = Φ(z₀ + (z₀ + z)/(1 − a(z₀ + z))), z = ∓1.959964: z₀ = a = 0, the percentile's 2.5/97.5%;
    z₀ = 0.1: Φ(0.2 ∓ 1.959964) = 0.039207, 0.984612; a = 0.1: Φ(−1.959964/1.195996) = Φ(−1.638771) = 0.050631,
    Φ(1.959964/0.804004) = Φ(2.437755) = 0.992611; a = 0.6: the upper end past the pole (1 − 0.6·1.96 < 0), 1,
    the lower Φ(−1.959964/2.175978) = Φ(−0.900728) = 0.183867; a = −0.6 mirrors it."""
    assert bca_levels(0.0, 0.0) == pytest.approx((0.025, 0.975), abs=1e-15)
    assert bca_levels(0.1, 0.0) == pytest.approx((0.039207, 0.984612), abs=1e-6)
    assert bca_levels(0.0, 0.1) == pytest.approx((0.050631, 0.992611), abs=1e-6)
    assert bca_levels(0.0, 0.6) == (pytest.approx(0.183867, abs=1e-6), 1.0)
    assert bca_levels(0.0, -0.6) == (0.0, pytest.approx(1 - 0.183867, abs=1e-6))
    assert bca_levels(0.0, 0.0, 0.9) == pytest.approx((0.05, 0.95), abs=1e-15)


def test_bca_on_symmetric_data_is_the_percentile_interval():
    """1..21: the jackknife is symmetric (a = 0 exactly) and the replicates lie about evenly around the mean
    (z₀ ≈ 0), so BCa's levels are the percentile's and so, to within a replicate's spacing, are its bounds."""
    values = [float(i) for i in range(1, 22)]
    assert bca_acceleration(values, [1.0] * 21) == 0.0
    assert bca_ci(values, n_boot=20000) == pytest.approx(bootstrap_ci(values, n_boot=20000), abs=0.05)


def test_bca_takes_the_bootstrap_quantiles_at_its_levels():
    """The wiring, clustered: the same replicates as bootstrap_ci (bootstrap_distribution, same seed), taken at
    bca_levels(z₀, a) with z₀ = Φ⁻¹(share below θ̂, ties half) and a the clusters' jackknife acceleration (the
    hand-worked −154/186^{3/2} above: clusters [1, 0], [2, 2], [1, 2, 1, 2], θ̂ = 11/8)."""
    values = [1.0, 0.0, 2.0, 2.0, 1.0, 2.0, 1.0, 2.0]
    labels = list("aabbcccc")
    flat = bootstrap_distribution(values, clusters=labels, n_boot=4000, seed=7)
    estimate = 11 / 8
    share = (np.sum(flat < estimate - 1e-12) + 0.5 * np.sum(np.abs(flat - estimate) <= 1e-12)) / flat.size
    assert 0 < np.sum(np.abs(flat - estimate) <= 1e-12) < flat.size  # ties: a, b and c drawn once each, in any order
    bias = statistics.NormalDist().inv_cdf(share)
    levels = bca_levels(bias, -154 / 186 ** 1.5, 0.9)
    expected = tuple(float(q) for q in np.quantile(flat, levels))
    assert bca_ci(values, clusters=labels, n_boot=4000, seed=7, level=0.9) == pytest.approx(expected, abs=1e-12)
    assert bca_ci(values, clusters=labels, seed=3) == bca_ci(values, clusters=labels, seed=3)  # seeded


def test_bca_reaches_into_the_long_tail_of_a_skewed_score():
    """A right-skewed score (log-normal): BCa's upper bound lies above the percentile interval's (a > 0, the
    long tail), and the interval a report shows spans both (figure_interval: percentile ∪ BCa, each at the
    level expanded for 12 items)."""
    values = np.exp(np.random.default_rng(11).normal(0, 1, 12)).tolist()
    level = expanded_level(LEVEL, 12)
    percentile, bca = bootstrap_ci(values, level=level), bca_ci(values, level=level)
    assert bca_acceleration(values, [1.0] * 12) > 0 and bca[1] > percentile[1]
    assert figure_interval(values) == ((min(percentile[0], bca[0]), max(percentile[1], bca[1])), None)


def test_bca_edges():
    """No items: None. One item, one cluster, every value alike: every replicate is θ̂ (z₀ = Φ⁻¹(½) = 0, a = 0),
    the zero-width [θ̂, θ̂] (which figure_interval shows as no spread, or no interval below 6 units). A NaN value or
    a zero total denominator: None, and figure_interval stays as it was (NaN bounds for a NaN value)."""
    assert bca_ci([]) is None
    assert bca_ci([5.0]) == (5.0, 5.0)
    assert bca_ci([1.0, 2.0, 3.0, 6.0], clusters="aaaa") == (3.0, 3.0)
    assert bca_ci([0.7] * 8) == pytest.approx((0.7, 0.7)) and figure_interval([0.7] * 8) == (None, NO_SPREAD)
    assert figure_interval([1.0, 2.0, 3.0, 6.0] * 2, clusters="a" * 8) == (None, FEW_CLUSTERS)
    assert figure_interval([1.0, 2.0, 3.0, 6.0, 5.0]) == (None, FEW_CLUSTERS)  # 5 items
    assert bca_ci([1.0, float("nan"), 3.0, 4.0, 5.0, 6.0]) is None
    low, high = figure_interval([1.0, float("nan"), 3.0, 4.0, 5.0, 6.0, 7.0])[0]
    assert math.isnan(low) and math.isnan(high)
    assert bca_ci([0.0, 0.0], denominators=[0.0, 0.0]) is None


def test_bca_raises_coverage_of_a_skewed_score_over_few_clusters():
    """The defect it mends (benchmarks/interval_coverage.py, docs/reports.md): 300 seeded data sets of 12 clusters
    × 5 log-normal scores (cluster effect N(0, 0.5²), item noise N(0, 1), true mean exp(0.625)). Joining the BCa
    interval only widens, so it never loses a data set the expanded percentile interval held, and here it holds
    more of them (276 of 300, where the expanded percentile interval alone held 274)."""
    rng = np.random.default_rng(2027)
    labels = [f"c{g}" for g in range(12) for _ in range(5)]
    truth = math.exp(0.625)
    before = after = 0
    for _ in range(300):
        values = np.exp(rng.normal(0, 0.5, 12)[:, None] + rng.normal(0, 1, (12, 5))).ravel().tolist()
        items = bootstrap_ci(values, level=expanded_level(LEVEL, 60))
        clusters = bootstrap_ci(values, clusters=labels, level=expanded_level(LEVEL, 12))
        held = min(items[0], clusters[0]) <= truth <= max(items[1], clusters[1])
        low, high = figure_interval(values, clusters=labels)[0]
        assert low <= min(items[0], clusters[0]) and high >= max(items[1], clusters[1])
        before += held
        after += low <= truth <= high
    assert after > before, (before, after)


def test_the_coverage_benchmark_runs_and_measures_proportions():
    """benchmarks/interval_coverage.py (the numbers in docs/reports.md), on 20 data sets of each figure: it runs
    and gives three shares in [0, 1] and widths, the shown interval never narrower than the expanded bootstrap
    it spans; with the truth far outside any data (accuracy 2.0) nothing covers it."""
    bench = load_benchmark("interval_coverage")
    for name, (make, truth) in bench.FIGURES.items():
        shares, (expanded_width, bca_width, shown_width) = bench.coverage(make, truth, 6, 5, sets=20, seed=1,
                                                                          binary=name != "skewed score")
        assert all(0.0 <= share <= 1.0 for share in shares) and len(shares) == 4, name
        assert 0.0 < expanded_width <= bca_width and expanded_width <= shown_width, name  # both span the expanded
        assert shares[1] <= shares[2], name  # BCa joined: never covers less than the expanded interval alone
    assert bench.coverage(bench.FIGURES["accuracy"][0], 2.0, 6, 5, sets=20, seed=1, binary=True)[0] == [0, 0, 0, 0]


def test_a_rate_of_trials_without_spread_gets_the_exact_bound_over_the_units_holding_trials():
    """A rate of 0/1 trials (CHAIR: hallucinated among mentioned objects; Break: broken among right answers)
    that is 0: Clopper–Pearson over the units holding trials. 0 hallucinated of 3 mentioned in each of 8
    reports: [0, 1 − 0.025^(1/8)] = [0, 0.36941]; all 3 of 3: [0.63059, 1]. Four more empty reports (0 of 0)
    add nothing to the rate, so nothing to the bound."""
    zero = ((0.0, pytest.approx(0.36941, abs=1e-5)), None)
    assert figure_interval([0.0] * 8, denominators=[3.0] * 8, binary=True) == zero
    assert figure_interval([0.0] * 12, denominators=[3.0] * 8 + [0.0] * 4, binary=True) == zero
    assert figure_interval([3.0] * 8, denominators=[3.0] * 8, binary=True) == (
        (pytest.approx(0.63059, abs=1e-5), 1.0), None)
    images = [f"image:{i // 2}" for i in range(16)]  # 8 images; the last 2 hold only 0-of-0 items
    assert figure_interval([0.0] * 16, denominators=[1.0] * 12 + [0.0] * 4, clusters=images, binary=True) == (
        (0.0, pytest.approx(0.45926, abs=1e-5)), None)  # G = 6 images hold trials


def test_below_the_minimum_only_a_rate_without_success_or_failure_gets_its_exact_bound():
    """Below 6 units no bootstrap interval is bounded, but the bound of no success (or failure) is exact at any
    number of units (stats.zero_bound): 0 of 2 right, [0, 1 − 0.025^(1/2)] = [0, 0.84189]; 1 of 1, [0.025, 1];
    0 of 5 trials on 2 images (4 + 1): Π(1 − p_g) ≥ 0.025 over the two units, wider than for 2 equal ones. A
    mixed 0/1 figure, a constant score and a one-cluster figure with a success keep no interval."""
    assert figure_interval([0.0, 0.0], binary=True) == ((0.0, pytest.approx(0.84189, abs=1e-5)), None)
    assert figure_interval([1.0], binary=True) == ((pytest.approx(0.025), 1.0), None)
    assert figure_interval([0.0, 0.0], denominators=[4.0, 1.0], binary=True) == (
        (0.0, pytest.approx(zero_bound([4.0, 1.0]))), None)
    clustered = figure_interval([0.0] * 5, clusters=["a"] * 4 + ["b"], binary=True)
    assert clustered == ((0.0, pytest.approx(zero_bound([4.0, 1.0]))), None)
    assert zero_bound([4.0, 1.0]) > zero_bound([1.0, 1.0]) == pytest.approx(0.84189, abs=1e-5)
    assert figure_interval([1.0, 0.0, 1.0], binary=True) == (None, FEW_CLUSTERS)
    assert figure_interval([0.0] * 3) == (None, FEW_CLUSTERS)  # not marked 0/1: its range is unknown
    assert figure_interval([1.0, 0.0] * 3, clusters=["a"] * 6, binary=True) == (None, FEW_CLUSTERS)
    assert figure_interval([2.0, 2.0], denominators=[1.0, 1.0], binary=True) == (None, FEW_CLUSTERS)  # not of trials


def test_a_rates_minimum_and_expansion_count_only_the_units_holding_trials():
    """A Break rate over 40 answers of which only 5 were right to begin with (the rest are 0 of 0) rests on 5
    units, below the minimum of 6: no interval, however many items. With 8 such units, the interval is the
    one of those 8 items alone, expanded for G = 8 (not for 40)."""
    held = [1.0, 0.0, 1.0, 0.0, 0.0]
    values, denominators = held + [0.0] * 35, [1.0] * 5 + [0.0] * 35
    assert figure_interval(values, denominators) == (None, FEW_CLUSTERS)
    held = [1.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0, 0.0]
    values, denominators = held + [0.0] * 32, [1.0] * 8 + [0.0] * 32
    level = expanded_level(LEVEL, 8)
    percentile, bca = bootstrap_ci(held, [1.0] * 8, level=level), bca_ci(held, [1.0] * 8, level=level)
    alone = (min(percentile[0], bca[0]), max(percentile[1], bca[1]))  # a figure not marked 0/1 also spans BCa's
    assert figure_interval(values, denominators) == (alone, None)
    assert percentile != bootstrap_ci(values, denominators, level=expanded_level(LEVEL, 40))
    clusters = [f"c{i}" for i in range(8)] + [f"c{i % 8}" for i in range(32)]  # every cluster holds one trial
    assert figure_interval(values, denominators, clusters=clusters) == (alone, None)
