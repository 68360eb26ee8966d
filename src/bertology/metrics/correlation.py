"""Pearson and Spearman correlations under example weights, and the Fisher interval of a Pearson r.

Weights are what makes a paired bootstrap cheap (DESIGN §6): a resample of ``n`` examples is a row of
multinomial counts, so every resample of every ablation is one weighted statistic of the same arrays,
with no copy of the data. scipy computes one correlation of one sample at a time; a resample of
``n`` examples is ``np.repeat(x, w)``, and these functions give exactly
``scipy.stats.pearsonr`` / ``spearmanr`` of that repeated sample (tested), for ``R`` resamples of
``U`` prediction vectors at once.
"""
from __future__ import annotations

import numpy as np
from scipy.stats import norm


def weighted_pearson(weights: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Pearson r of each row of ``x`` ``[U, n]`` with ``y`` ``[n]`` under each row of ``weights`` ``[R, n]``: ``[R, U]``.

    NaN where either side is constant under the weights (as scipy, which warns and returns NaN).
    """
    w = np.asarray(weights, dtype=np.float64)
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    # Pearson is shift-invariant; centring first keeps the moment formulas free of cancellation
    x = x - x.mean(axis=1, keepdims=True)
    y = y - y.mean()
    tot = w.sum(axis=1, keepdims=True)
    mx = w @ x.T / tot
    my = (w @ y)[:, None] / tot
    sxy = w @ (x * y).T / tot - mx * my
    sxx = w @ (x * x).T / tot - mx * mx
    syy = (w @ (y * y))[:, None] / tot - my * my
    with np.errstate(invalid="ignore", divide="ignore"):
        r = sxy / np.sqrt(sxx * syy)
    ok = _not_constant(sxx, w @ (x * x).T / tot) & _not_constant(syy, (w @ (y * y))[:, None] / tot)
    return np.where(ok, np.clip(r, -1.0, 1.0), np.nan)


def _not_constant(variance: np.ndarray, second_moment: np.ndarray) -> np.ndarray:
    """Whether a weighted variance is more than rounding: a constant sample's variance is 0 up to a
    few ulps of its second moment (the mean of identical floats need not equal them exactly)."""
    return variance > 1e-12 * second_moment


def weighted_ranks(weights: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Average ranks ``[R, n]`` of ``x`` ``[n]`` in each weighted sample (ties share their mean rank).

    An example of weight ``w`` stands for ``w`` copies: its rank is the weight of the smaller values
    plus the mean position of its tie group, ``less + (equal + 1) / 2`` (what
    ``scipy.stats.rankdata`` gives every copy of it in the repeated sample).
    """
    w = np.asarray(weights, dtype=np.float64)
    values, inverse = np.unique(np.asarray(x), return_inverse=True)
    order = np.argsort(inverse, kind="stable")
    starts = np.searchsorted(inverse[order], np.arange(values.size))
    group = np.add.reduceat(w[:, order], starts, axis=1)  # [R, groups]: weight of each distinct value
    less = np.cumsum(group, axis=1) - group
    return (less + (group + 1.0) / 2.0)[:, inverse]


def _rowwise_pearson(w: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Pearson r of ``a[r]`` with ``b[r]`` under ``w[r]``, for every row: ``[R]``."""
    tot = w.sum(axis=1)
    ma = (w * a).sum(axis=1) / tot
    mb = (w * b).sum(axis=1) / tot
    da, db = a - ma[:, None], b - mb[:, None]
    sab = (w * da * db).sum(axis=1)
    saa = (w * da * da).sum(axis=1)
    sbb = (w * db * db).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        r = sab / np.sqrt(saa * sbb)
    ok = _not_constant(saa, (w * a * a).sum(axis=1)) & _not_constant(sbb, (w * b * b).sum(axis=1))
    return np.where(ok, np.clip(r, -1.0, 1.0), np.nan)


def weighted_spearman(weights: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Spearman rho of each row of ``x`` ``[U, n]`` with ``y`` ``[n]`` under each row of ``weights``: ``[R, U]``.

    The Pearson r of the weighted average ranks (:func:`weighted_ranks`), as ``scipy.stats.spearmanr``.
    """
    w = np.asarray(weights, dtype=np.float64)
    x = np.asarray(x)
    ry = weighted_ranks(w, y)
    out = np.empty((w.shape[0], x.shape[0]), dtype=np.float64)
    for u in range(x.shape[0]):
        out[:, u] = _rowwise_pearson(w, weighted_ranks(w, x[u]), ry)
    return out


def pearson_interval(r: float, n: int, level: float = 0.95) -> tuple[float, float]:
    """The Fisher-z interval of a Pearson ``r`` over ``n`` pairs (``scipy.stats.pearsonr``'s default).

    Needs only ``(r, n)``, which the ``ablation`` table keeps, so the summary and the report recompute
    the interval from the run folder. NaN for a NaN ``r`` or ``n <= 3``.
    """
    if not np.isfinite(r) or n <= 3:
        return float("nan"), float("nan")
    z = np.arctanh(np.clip(r, -1 + 1e-15, 1 - 1e-15))
    half = norm.ppf(0.5 + level / 2) / np.sqrt(n - 3)
    return float(np.tanh(z - half)), float(np.tanh(z + half))
