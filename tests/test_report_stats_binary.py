"""0/1 figures near 0 or 1 (binomial interval over the effective sample size, exact bound of no success), paired
0/1 differences (exact McNemar at any n, Tango's score interval), and alpha = 0.05 exactly — on known answers
computed independently (scipy) and on exact coverage."""

import math

import numpy as np
import pytest
from conftest import load_benchmark

from medheval.report import stats
from medheval.report.paper import Cell, Column, Table, adjust_family
from medheval.report.stats import (ALPHA, FEW_UNITS_NOTE, LEVEL, bootstrap_ci, clopper_pearson, compare_accuracy,
                                   compare_scores, design_effect, effective_trials, expanded_level, few_units_note,
                                   figure_interval, mcnemar_exact, mcnemar_p, sign_flip, tango_interval, zero_bound)

ss = pytest.importorskip("scipy.stats")
so = pytest.importorskip("scipy.optimize")


def _cp(x: int, n: int) -> tuple[float, float]:
    interval = ss.binomtest(x, n).proportion_ci(confidence_level=LEVEL, method="exact")
    return interval.low, interval.high


# --- 0/1 figures ------------------------------------------------------------------------------------------


def test_clopper_pearson_and_beta_match_scipy():
    for x, n in ((0, 10), (1, 200), (5, 30), (99, 100), (100, 100), (37, 1000)):
        assert clopper_pearson(x, n) == pytest.approx(_cp(x, n), abs=1e-10)
    # fractional counts (Korn & Graubard's effective ones): the Beta quantiles themselves
    low, high = clopper_pearson(3.7, 41.2)
    assert low == pytest.approx(ss.beta.ppf(0.025, 3.7, 41.2 - 3.7 + 1), abs=1e-10)
    assert high == pytest.approx(ss.beta.ppf(0.975, 4.7, 41.2 - 3.7), abs=1e-10)


def test_99_of_100_right_is_as_wide_as_clopper_pearson():
    """The audit's case: the bootstrap gave [0.970, 1]; Clopper–Pearson of 99/100 is [0.94554, 0.99975]. The
    interval spans both: [0.94554, 1]. 1 of 100: [0, 0.05446] (Clopper–Pearson's upper bound)."""
    low, high = figure_interval([1.0] * 99 + [0.0], binary=True)[0]
    assert low == pytest.approx(0.945541, abs=1e-6) and high == 1.0
    assert bootstrap_ci([1.0] * 99 + [0.0], level=expanded_level(LEVEL, 100))[0] > 0.96  # the old, too narrow
    low, high = figure_interval([1.0] + [0.0] * 99, binary=True)[0]
    assert low == 0.0 and high == pytest.approx(_cp(1, 100)[1], abs=1e-9)


@pytest.mark.parametrize("n", [30, 100])
def test_exact_binomial_coverage_of_iid_answers_is_at_least_95_percent(n):
    """Coverage by enumeration, Σ_x P(X = x)·[p in the interval of x of n], X ~ Bin(n, p), at the audit's rates and
    at rates just off the bootstrap's lattice k/n (0.0302 at n = 100 was 85% before)."""
    intervals = [figure_interval([1.0] * x + [0.0] * (n - x), binary=True)[0] for x in range(n + 1)]
    for p in (0.01, 0.03, 0.0302, 0.12, 0.31, 0.5, 0.97):
        pmf = ss.binom.pmf(np.arange(n + 1), n, p)
        covered = sum(w for w, (low, high) in zip(pmf, intervals) if low <= p <= high)
        assert covered >= 0.95, (n, p, covered)
    assert all(intervals[x][0] <= intervals[x + 1][0] and intervals[x][1] <= intervals[x + 1][1] for x in range(n))


def test_one_success_never_has_a_lower_upper_bound_than_none():
    """Monotone in the count: 200 answers; CHAIR with 2 objects in each of 100 reports; 200 answers on 40 images
    of 5. Before: 1 hallucinated of 200 objects gave [0, 0.015], below 0 of 200's [0, 0.036]."""
    designs = {
        "items": (lambda x: ([1.0] * x + [0.0] * (200 - x), None, None)),
        "reports": (lambda x: ([1.0] * x + [0.0] * (100 - x), [2.0] * 100, None)),
        "images": (lambda x: ([1.0] * x + [0.0] * (200 - x), None, [f"image:{i // 5}" for i in range(200)])),
    }
    for name, make in designs.items():
        shown = [figure_interval(*make(x)[:2], clusters=make(x)[2], binary=True)[0] for x in range(4)]
        assert all(shown[x][1] <= shown[x + 1][1] for x in range(3)), (name, shown)
    chair_zero = figure_interval([0.0] * 100, [2.0] * 100, binary=True)[0]
    assert chair_zero == (0.0, pytest.approx(1 - 0.025 ** (1 / 100), abs=1e-12))
    assert figure_interval([1.0] + [0.0] * 99, [2.0] * 100, binary=True)[0][1] >= chair_zero[1]


def test_design_effect_and_effective_trials_by_hand():
    """Successes 2, 0, 1, 1 of 2 trials each: p̂ = ½, n = 8, G = 4, Σ(s − p̂t)² = 1 + 1 = 2, v = 4/3 · 2/64 = 1/24,
    binomial 0.25/8 = 1/32: deff = 4/3. One trial per unit: 1. n* = (n/deff)(t_{n−1}/t_{G−1})²."""
    assert design_effect(np.array([2.0, 0, 1, 1]), np.array([2.0, 2, 2, 2])) == pytest.approx(4 / 3)
    assert design_effect(np.array([1.0, 0, 1, 0, 0]), np.ones(5)) == 1.0
    expected = 100 / 2 * (ss.t.ppf(0.975, 99) / ss.t.ppf(0.975, 19)) ** 2
    assert effective_trials(100.0, 20, 2.0) == pytest.approx(expected, rel=1e-6)
    assert effective_trials(100.0, 100, 1.0) == 100.0


def test_clustered_rate_spans_korn_graubard_known_answer():
    """7 hallucinated answers on 10 images of 10 questions (1, 0, 2, 0, 0, 1, 0, 0, 3, 0): the Korn & Graubard
    interval, computed here from numpy and scipy (deff over the clusters, n* = (100/deff)(t₉₉/t₉)², Clopper–Pearson
    at p̂n* of n*), joined with both bootstraps and the floor 1 − 0.025^(1/10)."""
    per_image = [1, 0, 2, 0, 0, 1, 0, 0, 3, 0]
    values = [float(i < k) for k in per_image for i in range(10)]
    labels = [f"image:{g}" for g in range(10) for _ in range(10)]
    s, t = np.array(per_image, float), np.full(10, 10.0)
    rate = 0.07
    deff = 10 / 9 * np.sum((s - rate * t) ** 2) / 100 ** 2 / (rate * (1 - rate) / 100)
    trials = 100 / max(1.0, deff) * (ss.t.ppf(0.975, 99) / ss.t.ppf(0.975, 9)) ** 2
    kg = (ss.beta.ppf(0.025, rate * trials, trials - rate * trials + 1),
          ss.beta.ppf(0.975, rate * trials + 1, trials - rate * trials))
    items = bootstrap_ci(values, level=expanded_level(LEVEL, 100))
    clusters = bootstrap_ci(values, clusters=labels, level=expanded_level(LEVEL, 10))
    floor = 1 - 0.025 ** 0.1
    low, high = figure_interval(values, clusters=labels, binary=True)[0]
    assert low == pytest.approx(max(0.0, min(items[0], clusters[0], kg[0])), abs=1e-9)
    assert high == pytest.approx(max(items[1], clusters[1], kg[1], floor), abs=1e-9)
    assert deff > 1.5 and high > clusters[1]


def test_zero_bound_equal_units_is_clopper_pearson_and_unequal_is_the_exact_maximum():
    """Equal units: 1 − 0.025^(1/G). Unequal (7 images of 100 questions, 8 of 1): the largest Σw_g p_g with
    Π(1 − p_g) ≥ 0.025, found here by scipy's SLSQP, ≈ 0.405 — where the old bound over G = 15 was 0.218."""
    for units in (6, 15, 100):
        assert zero_bound([3.0] * units) == pytest.approx(1 - 0.025 ** (1 / units), abs=1e-12)
    sizes = [100.0] * 7 + [1.0] * 8
    w = np.array(sizes) / sum(sizes)
    found = so.minimize(lambda p: -w @ p, np.full(15, 0.01), method="SLSQP", bounds=[(0, 0.999)] * 15,
                        constraints=[{"type": "ineq", "fun": lambda p: np.sum(np.log1p(-p)) - math.log(0.025)}],
                        options={"ftol": 1e-12, "maxiter": 500})
    assert zero_bound(sizes) == pytest.approx(-found.fun, abs=1e-6)
    assert zero_bound(sizes) > 0.4 > 1 - 0.025 ** (1 / 15)
    kish = sum(sizes) ** 2 / sum(x * x for x in sizes)  # Kish's effective number of units
    assert zero_bound(sizes) == pytest.approx(1 - 0.025 ** (1 / kish), abs=0.01)


def test_all_zero_over_unequal_clusters_covers_where_the_old_bound_did_not():
    """The audit's population (t7): half the images hold 1 question (rate 0.01), half 100 answered all alike
    (rate 0.3); θ = 0.297, and 15 images are all 0 in 7.5% of data sets, above the old bound's 0.218. Now the
    bound is over the images' sizes, and holds θ whenever all are 0; each is [0, zero_bound(sizes)]."""
    rng = np.random.default_rng(5)
    theta = (0.5 * 0.01 + 0.5 * 100 * 0.3) / 50.5
    zero = covered = 0
    for _ in range(1500):
        big = rng.random(15) < 0.5
        values, labels, sizes = [], [], []
        for g in range(15):
            size = 100 if big[g] else 1
            values += [float(rng.random() < (0.3 if big[g] else 0.01))] * size
            labels += [f"g{g}"] * size
            sizes.append(size)
        if sum(values) == 0:
            interval = figure_interval(values, clusters=labels, binary=True)[0]
            assert interval == (0.0, pytest.approx(zero_bound(sizes), abs=1e-12))
            zero += 1
            covered += interval[1] >= theta
    assert zero > 60 and covered / zero >= 0.95, (zero, covered)
    assert figure_interval([1.0] * 30, clusters=[f"g{i // 5}" for i in range(30)], binary=True)[0] == (
        pytest.approx(0.025 ** (1 / 6), abs=1e-12), 1.0)  # all 1 over 6 equal images: [0.541, 1]


def test_binary_needs_counts_of_trials():
    """``binary`` on values that are not 0/1 (or numerators above their denominators) is treated as any
    figure: the bootstrap alone."""
    values = [0.5, 1.0, 0.0, 1.0, 0.5, 0.0, 1.0, 1.0]
    assert figure_interval(values, binary=True) == figure_interval(values)
    above = ([3.0, 1.0] * 4, [2.0, 2.0] * 4)  # 3 of 2 is no count of trials (as one, 16 of 16 would be [0.63, 1])
    assert figure_interval(*above, binary=True) == figure_interval(*above) == ((0.625, 1.375), None)


# --- paired 0/1 differences -------------------------------------------------------------------------------


def test_mcnemar_p_is_exact_at_any_n():
    for b, c in ((0, 5), (3, 12), (40, 20), (7, 7), (0, 0), (4800, 5200), (1, 2000)):
        reference = ss.binomtest(c, b + c, 0.5).pvalue if b + c else 1.0
        assert mcnemar_p(b, c) == pytest.approx(reference, rel=1e-9, abs=1e-300)
    assert mcnemar_exact([True] * 3 + [False] * 12 + [True] * 4, [False] * 3 + [True] * 12 + [True] * 4) == (
        3, 12, pytest.approx(ss.binomtest(12, 15, 0.5).pvalue, rel=1e-9))  # b, c counted from the pairs


def test_accuracy_over_many_items_is_exact_mcnemar_not_monte_carlo():
    """20 000 answers (b = 600, c = 700): too many for the exact sign distribution, yet p is McNemar's exact p."""
    rng = np.random.default_rng(0)
    n = 20_000
    kind = rng.permutation(np.repeat([0, 1, 2, 3], [600, 700, 9000, 20_000 - 10_300]))
    base, other = np.isin(kind, (0, 2)), np.isin(kind, (1, 2))
    result = compare_accuracy(list(base), list(other))
    assert result.test == "exact sign-flip over items"
    assert result.p_value == pytest.approx(ss.binomtest(700, 1300).pvalue, rel=1e-9)
    assert (result.low > 0) == (result.p_value < ALPHA) and result.low <= 0.005 <= result.high


def _tango_reference(b: int, c: int, n: int) -> tuple[float, float]:
    """Tango's interval from its definition: p_b maximising the likelihood under Δ (scipy, bounded), the score
    statistic, and its roots at ±z (brentq)."""
    z = ss.norm.ppf(0.975)

    def score(delta: float) -> float:
        def minus_loglik(p):
            return -((b * math.log(p) if b else 0) + (c * math.log(p + delta) if c else 0)
                     + ((n - b - c) * math.log(1 - 2 * p - delta) if n - b - c else 0))
        low, high = max(0.0, -delta) + 1e-15, (1 - delta) / 2 - 1e-15
        p = so.minimize_scalar(minus_loglik, bounds=(low, high), method="bounded", options={"xatol": 1e-14}).x
        return (c - b - n * delta) / math.sqrt(n * (2 * p + delta * (1 - delta)))

    estimate = (c - b) / n
    lower = so.brentq(lambda d: score(d) - z, -1 + 1e-9, estimate) if score(-1 + 1e-9) > z else -1.0
    upper = so.brentq(lambda d: score(d) + z, estimate, 1 - 1e-9) if score(1 - 1e-9) < -z else 1.0
    return lower, upper


@pytest.mark.parametrize("b,c,n", [(0, 5, 100), (3, 12, 50), (12, 3, 50), (1, 8, 20), (10, 10, 40), (2, 30, 40)])
def test_tango_interval_matches_its_definition(b, c, n):
    assert tango_interval(b, c, n) == pytest.approx(_tango_reference(b, c, n), abs=1e-7)


def test_paired_binary_interval_covers_and_agrees_with_the_star():
    """Exact coverage over the trinomial (benchmarks/interval_coverage.py): p_b = 0.005, p_c = 0.03 over 200 items
    was 92.5% by the sign-flip inversion alone; now at least 95%. Every (b, c) cell: 0 outside ⇔ p < 0.05."""
    bench = load_benchmark("interval_coverage")
    before, after, left = bench.paired_coverage(200, 0.005, 0.03, floor=1e-9)
    assert before < 0.94 and after >= 0.95 and left < 1e-6, (before, after)
    for b in range(0, 12):
        for c in range(0, 12):
            if b + c == 0 or (min(b, c) == 0 and b + c == 60):
                continue
            d = [-1.0] * b + [1.0] * c + [0.0] * (60 - b - c)
            shown = compare_scores([0.0] * 60, d)
            assert shown.p_value == pytest.approx(mcnemar_p(b, c))
            assert (not shown.low <= 0.0 <= shown.high) == (shown.p_value < ALPHA), (b, c, shown)
            assert shown.low <= shown.diff <= shown.high


def test_monte_carlo_inversion_is_made_to_agree_with_the_exact_p(monkeypatch):
    """Above the exact size the inversion is Monte Carlo while p is exact: the interval still excludes 0 exactly
    when p < 0.05, on data sets whose p lies near 0.05."""
    monkeypatch.setattr(stats, "EXACT_STATES", 1)
    stats._compare.cache_clear()
    for b, c in ((10, 22), (10, 23), (11, 23), (20, 36), (20, 37), (30, 50)):
        d = [-1.0] * b + [1.0] * c + [0.0] * 100
        shown = compare_scores([0.0] * len(d), d, n_flip=499)
        assert (not shown.low <= 0.0 <= shown.high) == (shown.p_value < ALPHA), (b, c, shown)
    stats._compare.cache_clear()


# --- alpha ------------------------------------------------------------------------------------------------


def test_p_of_exactly_five_percent_is_not_significant(monkeypatch):
    """ALPHA is 0.05, not 1 − 0.95 = 0.050000000000000044: a Monte Carlo p of (1 + 4)/(99 + 1) = 0.05 accepts 0
    (before: the interval left 0 out at p = 0.05), and a table's p of 0.05 gets no star."""
    assert ALPHA == 0.05 and 1 - LEVEL > 0.05
    monkeypatch.setattr(stats, "EXACT_STATES", 1)
    d = [0.53, 1.86, 1.72, -0.01, 0.2, -0.03, 1.07, 0.44, 1.25, -1.35, 2.07, 0.4]
    p, low, high, exact = sign_flip(d, n_flip=99)
    assert p == 0.05 and not exact and low <= 0.0 <= high
    for p_value, star in ((0.05, False), (0.0499, True)):
        cells = [Cell(), Cell(), Cell(), Cell(), Cell()]
        table = Table("t", "t", ["Metric"], [Column("Base"), Column("Run"), Column("Δ"), Column("p"), Column("adj")],
                      rows=[(["acc"], cells)])
        records = [{"p_value": p_value, "low": 0.01}]
        adjust_family(table, records, "holm", "one comparison")
        assert records[0]["significant"] is star and cells[2].star is star


# --- few units --------------------------------------------------------------------------------------------


def test_few_units_note_decides_by_the_units_behind_intervals():
    assert few_units_note([29, 400]) == FEW_UNITS_NOTE
    assert few_units_note([30, 400, None]) is None
    assert few_units_note([5]) is None  # below 6 units there is no interval to caveat
    assert few_units_note([]) is None


@pytest.mark.parametrize(("n_correct", "n_bleu", "noted"), [
    (20, 12, True),    # BLEU over 12 items (6-29 units): its interval may be too narrow, the footer says so
    (20, 40, False),   # BLEU over 40 items: no note
    (12, None, False),  # accuracy alone over 12 items: 0/1, its binomial hull covers, no note
])
def test_the_few_units_note_is_in_the_footer_of_a_table_whose_score_rests_on_few_units(
        tmp_path, n_correct, n_bleu, noted):
    from report_runs import write_grid

    from medheval.report.build import write_report

    bleu = None if n_bleu is None else [float(10 * (i % 5)) for i in range(n_bleu)]
    grid = write_grid(tmp_path / "grid", {"none": [i % 3 != 0 for i in range(n_correct)]}, bleu=bleu)
    markdown = write_report([grid], tmp_path / "out", plots=False)["markdown"].read_text()
    assert ("fewer than 30 clusters (or items)" in markdown) is noted
