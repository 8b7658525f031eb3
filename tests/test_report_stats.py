"""Bootstrap intervals, paired comparisons and McNemar on known answers."""

import math

import pytest

from medheval.report.stats import bootstrap_ci, compare_accuracy, mcnemar_exact, paired_bootstrap


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
