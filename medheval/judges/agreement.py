"""Agreement between two raters (a judge and humans, two judges): how papers validate LLM judges.

MedHEval reports Pearson r = 0.834, Spearman rho = 0.716 and Kendall tau = 0.658 between
its Claude judge and physicians; Med-HallMark reports agreement on hallucination levels.
:func:`agreement` computes all of these plus Cohen's kappa (unweighted and quadratic-weighted)
and the exact-agreement rate, with ties handled as scipy/sklearn do (Spearman on average
ranks, Kendall's tau-b, kappa over the sorted union of labels), using numpy only.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from numbers import Real
from typing import Any

import numpy as np

_CHUNK = 1024  # rows per block for the O(n^2) Kendall computation


def _is_missing(value: Any) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def _is_number(value: Any) -> bool:
    return isinstance(value, (Real, np.number))  # bool is an int, so True/False count as 1/0


def _pearson(x: np.ndarray, y: np.ndarray) -> float | None:
    if len(x) < 2:
        return None
    dx = x - x.mean()
    dy = y - y.mean()
    denom = math.sqrt(float((dx * dx).sum()) * float((dy * dy).sum()))
    if denom == 0.0:
        return None  # a constant rater: the correlation is undefined
    return max(-1.0, min(1.0, float((dx * dy).sum()) / denom))


def _average_ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks, ties get the mean of the ranks they span (as scipy.stats.rankdata)."""
    order = np.argsort(x, kind="mergesort")
    sorted_x = x[order]
    ranks = np.empty(len(x), dtype=float)
    start = 0
    n = len(x)
    while start < n:
        end = start
        while end + 1 < n and sorted_x[end + 1] == sorted_x[start]:
            end += 1
        ranks[order[start : end + 1]] = (start + end) / 2.0 + 1.0
        start = end + 1
    return ranks


def _kendall_tau_b(x: np.ndarray, y: np.ndarray) -> float | None:
    """tau-b = (n_c - n_d) / sqrt((n_0 - n_x)(n_0 - n_y)), pairs tied in x or y excluded."""
    n = len(x)
    if n < 2:
        return None
    s = 0.0
    untied_x = 0.0
    untied_y = 0.0
    for start in range(0, n, _CHUNK):
        sx = np.sign(x[start : start + _CHUNK, None] - x[None, :])
        sy = np.sign(y[start : start + _CHUNK, None] - y[None, :])
        s += float((sx * sy).sum())
        untied_x += float(np.abs(sx).sum())
        untied_y += float(np.abs(sy).sum())
    if untied_x == 0.0 or untied_y == 0.0:
        return None
    # every unordered pair was counted twice (i,j and j,i); the factor cancels in the ratio
    return max(-1.0, min(1.0, s / math.sqrt(untied_x * untied_y)))


def _kappas(a: list, b: list, numeric: bool) -> tuple[float | None, float | None]:
    """Cohen's kappa and quadratic-weighted kappa over the sorted union of labels."""
    try:
        labels = sorted(set(a) | set(b))
    except TypeError:  # labels of mixed, unorderable types
        labels = list(dict.fromkeys(list(a) + list(b)))
    index = {label: i for i, label in enumerate(labels)}
    k = len(labels)
    n = len(a)
    observed = np.zeros((k, k), dtype=float)
    for left, right in zip(a, b):
        observed[index[left], index[right]] += 1.0
    rows = observed.sum(axis=1)
    cols = observed.sum(axis=0)
    expected = np.outer(rows, cols) / n

    def _ratio(weights: np.ndarray) -> float | None:
        disagreement = float((weights * observed).sum())
        chance = float((weights * expected).sum())
        if chance == 0.0:  # both raters used one and the same label throughout: 0/0 (sklearn: nan)
            return None
        return 1.0 - disagreement / chance

    kappa = _ratio(1.0 - np.eye(k))
    qwk = None
    if numeric:
        if k > 1:
            i, j = np.indices((k, k))
            qwk = _ratio((i - j) ** 2 / float((k - 1) ** 2))
    return kappa, qwk


def agreement(a: Sequence[Any], b: Sequence[Any]) -> dict[str, Any]:
    """Agreement statistics between two paired sequences of ratings.

    Pairs where either rating is ``None`` (or NaN) are dropped (``n`` counts what is left,
    ``n_dropped`` what was dropped). Correlations need numeric ratings; the kappas and
    exact agreement also accept categorical labels (strings). A statistic that is
    undefined (fewer than two pairs, a constant rater; a kappa whose chance agreement is total, where
    sklearn gives nan) is ``None``, never a conventional 1.0.

    Returns:
        ``{"n", "n_dropped", "pearson", "spearman", "kendall_tau" (tau-b), "cohen_kappa",
        "quadratic_weighted_kappa", "exact_agreement"}``. The kappas use the sorted union of
        the labels both raters used (as ``sklearn.metrics.cohen_kappa_score``); the quadratic
        weights are ``(i - j)^2 / (k - 1)^2`` over label *positions*.

    >>> agreement([0, 0, 1, 1], [0, 1, 1, 1])["cohen_kappa"]
    0.5
    """
    if isinstance(a, (str, bytes)) or isinstance(b, (str, bytes)):
        raise ValueError("agreement() takes two sequences of ratings, not strings")
    a = list(a)
    b = list(b)
    if len(a) != len(b):
        raise ValueError(f"agreement() needs paired ratings: got {len(a)} and {len(b)} values")
    pairs = [(x, y) for x, y in zip(a, b) if not _is_missing(x) and not _is_missing(y)]
    out: dict[str, Any] = {
        "n": len(pairs),
        "n_dropped": len(a) - len(pairs),
        "pearson": None,
        "spearman": None,
        "kendall_tau": None,
        "cohen_kappa": None,
        "quadratic_weighted_kappa": None,
        "exact_agreement": None,
    }
    if not pairs:
        return out
    left = [x for x, _ in pairs]
    right = [y for _, y in pairs]
    numeric = all(_is_number(v) for v in left + right)
    out["exact_agreement"] = sum(1 for x, y in pairs if x == y) / len(pairs)
    if numeric:
        x = np.asarray(left, dtype=float)
        y = np.asarray(right, dtype=float)
        out["pearson"] = _pearson(x, y)
        out["spearman"] = _pearson(_average_ranks(x), _average_ranks(y))
        out["kendall_tau"] = _kendall_tau_b(x, y)
        left = [float(v) for v in left]  # 1 and 1.0 and True are one label
        right = [float(v) for v in right]
    out["cohen_kappa"], out["quadratic_weighted_kappa"] = _kappas(left, right, numeric)
    return out


__all__ = ["agreement"]
