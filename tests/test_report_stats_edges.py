"""Edges of medheval.report.stats on known answers: bad inputs (NaN, None, p outside [0, 1]) are errors naming
their position, and outputs with no variation or no denominator say so instead of showing a zero-width or
misnamed result."""

import math

import pytest

from medheval.report.stats import (FEW_CLUSTERS, NO_DENOMINATOR, NO_VARIATION, adjust_p, compare_accuracy,
                                   compare_scores, figure_interval)

# --- bad inputs ------------------------------------------------------------------------------------------------


def test_nan_or_none_scores_are_an_error_not_p_zero():
    """The audit's case gave diff nan and p 0.0."""
    with pytest.raises(ValueError, match=r"other score at position 1 is nan, not a finite number"):
        compare_scores([.1, .2, .3, .4, .5, .6, .7], [.2, float("nan"), .5, .6, .7, .8, .9])
    with pytest.raises(ValueError, match=r"baseline score at position 3 is None"):
        compare_scores([.1, .2, .3, None, .5, .6], [.2, .3, .5, .6, .7, .8])
    with pytest.raises(ValueError, match=r"baseline score at position 0 is inf"):
        compare_scores([math.inf, .2, .3, .4, .5, .6], [.2, .3, .5, .6, .7, .8])


def test_an_unscored_answer_is_not_a_wrong_one():
    """bool(None) is False (and bool(nan) True): compare_accuracy used to count None as wrong."""
    with pytest.raises(ValueError, match=r"baseline answer at position 2 is None, neither right nor wrong"):
        compare_accuracy([True, False, None, True, True, False], [True] * 6)
    with pytest.raises(ValueError, match=r"other answer at position 0 is nan"):
        compare_accuracy([True] * 6, [float("nan"), 1, 0, 1, 0, 1])
    assert compare_accuracy([1, 0, 1, 0, 1, 1], [True, True, True, False, True, True]).diff == pytest.approx(1 / 6)


@pytest.mark.parametrize("method", ["holm", "bh", "none"])
def test_adjust_p_rejects_nan_and_out_of_range(method):
    """Holm counted a NaN in m, BH spread it to every p; like scipy's false_discovery_control, refuse."""
    with pytest.raises(ValueError, match=r"p-value at position 1 is nan; every p-value must be a number between 0 "
                                         r"and 1"):
        adjust_p([0.01, float("nan"), 0.03], method)
    with pytest.raises(ValueError, match=r"position 0 is 1.5"):
        adjust_p([1.5, 0.2], method)
    with pytest.raises(ValueError, match=r"position 1 is -0.1"):
        adjust_p([0.2, -0.1], method)
    assert adjust_p([0.0, 1.0], method) == [0.0, 1.0]  # the bounds themselves are fine


# --- edge outputs --------------------------------------------------------------------------------------------


def test_identical_differences_give_p_but_no_zero_width_interval():
    """8 items all improved by 0.1: only the identity and the all-flipped sign vector reach |T| = 0.8, so
    p = 2/2^8 = 0.0078125; the inversion would be [0.1, 0.1], shown as a 95% interval before. Clustered (6
    images of 2, totals all 0.2): p = max(2/2^6, 2/2^12) = 0.03125. Both keep p and have no interval."""
    result = compare_scores([0.3] * 8, [0.4] * 8)
    assert result.diff == pytest.approx(0.1) and result.p_value == pytest.approx(2 / 2 ** 8)
    assert (result.low, result.high, result.note) == (None, None, NO_VARIATION)
    clustered = compare_scores([0.3] * 12, [0.4] * 12, clusters=[g for g in "ABCDEF" for _ in range(2)])
    assert clustered.p_value == pytest.approx(2 / 2 ** 6) and clustered.n_clusters == 6
    assert (clustered.low, clustered.high, clustered.note) == (None, None, NO_VARIATION)
    nothing = compare_accuracy([True, False] * 4, [True, False] * 4)  # all differences 0: [0, 0] before
    assert (nothing.p_value, nothing.low, nothing.note) == (1.0, None, NO_VARIATION)
    assert compare_scores([0.3] * 3, [0.4] * 3).note == FEW_CLUSTERS  # too few comes first


def test_every_denominator_zero_is_not_no_items():
    """Six reports mentioning no object: there are items, but the ratio Σ0/Σ0 is undefined."""
    assert figure_interval([0] * 6, [0] * 6) == (None, NO_DENOMINATOR)
    assert figure_interval([0] * 8, [0] * 8, clusters=list("aabbccdd")) == (None, NO_DENOMINATOR)
    assert figure_interval([]) == (None, "no items")


def test_wrong_number_of_labels_or_denominators_is_an_error_before_the_few_clusters_rule():
    """7 items with 3 labels (2 distinct) returned the few-clusters note; now cluster_index's error."""
    with pytest.raises(ValueError, match="7 items but 3 cluster labels; give one label per item"):
        figure_interval([1, 0, 1, 1, 0, 1, 1], clusters=list("aab"))
    with pytest.raises(ValueError, match="3 numerators but 2 denominators"):
        figure_interval([1, 0, 1], denominators=[1, 1])


# --- p-value adjustment at the 0.05 boundary ---------------------------------------------------------------------


def test_bh_adjusted_p_of_exactly_005_is_not_significant():
    """A Monte Carlo p is (1 + k)/10000, so 0.0375 occurs. BH over m = 4 at rank 3: 4 · 0.0375 / 3 = 0.05
    exactly, not below 0.05 (no star); in floating point it was 0.049999999999999996. Likewise 5 · 0.03 / 3."""
    from medheval.report.stats import ALPHA

    adjusted = adjust_p([0.01, 0.02, 0.0375, 0.9], "bh")
    assert adjusted == [0.04, 0.04, 0.05, 0.9]
    assert not adjusted[2] < ALPHA
    assert adjust_p([0.001, 0.002, 0.03, 0.5, 0.6], "bh")[2] == 0.05


@pytest.mark.parametrize("method", ["holm", "bh"])
def test_adjusted_p_is_never_below_raw_and_keeps_the_order(method):
    """p̃ ≥ p for every p (3 · 0.7 / 3 was 0.6999999999999998 < 0.7), a tie adjusts alike, and p̃ rises with p."""
    families = [[0.7, 0.5, 0.1], [1.0, 1.0, 0.01], [0.03], [0.02, 0.02, 0.02, 0.04], [1e-20, 0.3]]
    for p in families:
        adjusted = adjust_p(p, method)
        assert all(a >= raw for a, raw in zip(adjusted, p)), (p, adjusted)
        for i, pi in enumerate(p):
            for j, pj in enumerate(p):
                if pi < pj:
                    assert adjusted[i] <= adjusted[j]
                if pi == pj:
                    assert adjusted[i] == adjusted[j]
    assert adjust_p([0.03], method) == [0.03]  # one comparison: nothing to adjust
