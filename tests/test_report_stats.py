"""Bootstrap intervals, paired comparisons and McNemar on known answers."""

import math

import numpy as np
import pytest

from medheval.report.stats import (bootstrap_ci, bootstrap_distribution, compare_accuracy, mcnemar_exact,
                                   paired_bootstrap)


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


def test_mcnemar_worked_by_hand():
    # b = 1 (baseline right, other wrong), c = 5: p = 2 * P[Bin(6, 1/2) <= 1] = 2 * 7/64 = 0.21875
    baseline = [True] * 1 + [False] * 5 + [True] * 10 + [False] * 4
    other = [False] * 1 + [True] * 5 + [True] * 10 + [False] * 4
    assert mcnemar_exact(baseline, other) == (1, 5, pytest.approx(0.21875))
    assert mcnemar_exact([True, False], [True, False]) == (0, 0, 1.0)
    result = compare_accuracy(baseline, other)
    assert result.diff == pytest.approx(4 / 20) and result.p_value == pytest.approx(0.21875)
    assert result.low <= 0.2 <= result.high and result.test == "exact McNemar"


def test_paired_bootstrap_of_identical_runs():
    scores = [0.1, 0.5, 0.9, 0.3, 0.7]
    result = paired_bootstrap(scores, scores)
    assert (result.diff, result.low, result.high, result.p_value) == (0.0, 0.0, 0.0, 1.0)


def test_paired_bootstrap_detects_a_clear_shift():
    base = [i / 100 for i in range(100)]
    result = paired_bootstrap(base, [x + 0.2 for x in base])
    assert result.diff == pytest.approx(0.2) and result.p_value < 0.01
    with pytest.raises(ValueError, match="paired items"):
        paired_bootstrap([1.0], [1.0, 2.0])


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
    indices, so means, ratios and paired differences give bit-identical intervals and p-values."""
    rng = np.random.default_rng(7)
    values = rng.integers(0, 2, 120).astype(float).tolist()
    other = rng.integers(0, 2, 120).astype(float).tolist()
    denominators = rng.integers(1, 6, 120).astype(float).tolist()
    labels = [f"image:{code}" for code in rng.permutation(10_000)[:120]]  # distinct, in no particular order
    assert bootstrap_ci(values, clusters=labels) == bootstrap_ci(values)
    assert bootstrap_ci(values, denominators, clusters=labels) == bootstrap_ci(values, denominators)
    assert paired_bootstrap(values, other, clusters=labels) == paired_bootstrap(values, other)
    # no cluster holds two items: an unclustered design, so accuracy keeps the exact McNemar test
    flags = [bool(v) for v in values], [bool(v) for v in other]
    assert compare_accuracy(*flags, clusters=labels) == compare_accuracy(*flags)
    assert compare_accuracy(*flags, clusters=labels).test == "exact McNemar"


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


def test_clustered_paired_comparison_replaces_mcnemar():
    """A mitigation fixes all 50 questions about image A and changes nothing on image B: mean difference 0.5.
    Item-paired, b = 0 and c = 50, McNemar p = 2·2^-50. Resampling the 2 images, a replicate difference is 0, 0.5
    or 1 (¼, ½, ¼): the interval is [0, 1] and |d* − 0.5| ≥ 0.5 for half the replicates, so p ≈ 0.5."""
    baseline = [False] * 50 + [True] * 50
    other = [True] * 50 + [True] * 50
    clusters = ["A"] * 50 + ["B"] * 50
    item = compare_accuracy(baseline, other)
    assert item.test == "exact McNemar" and item.p_value == pytest.approx(2 * 0.5 ** 50)
    clustered = compare_accuracy(baseline, other, clusters=clusters)
    assert clustered.test == "clustered paired bootstrap" and clustered.diff == pytest.approx(0.5)
    assert (clustered.low, clustered.high) == (0.0, 1.0)
    assert clustered.p_value == pytest.approx(0.5, abs=0.05)
    assert paired_bootstrap(baseline, other, clusters=clusters) == clustered


def test_cluster_labels_must_match_the_items():
    with pytest.raises(ValueError, match="3 items but 2 cluster labels"):
        bootstrap_ci([1.0, 0.0, 1.0], clusters=["a", "b"])
    assert bootstrap_ci([], clusters=[]) is None
    assert bootstrap_ci([2.0] * 6, denominators=[4.0] * 6, clusters=list("aabbcc")) == pytest.approx((0.5, 0.5))
