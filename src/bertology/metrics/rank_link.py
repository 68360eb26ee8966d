"""Spearman's rho between two per-unit measures, with a seeded bootstrap interval over units.

Used by the changed-vs-needed experiment: one value per head (or layer) of how much fine-tuning changed it
and one of how much the task needs that change. The bootstrap resamples **units** with replacement; units
are not independent (heads of one layer share inputs and are tuned together), so the interval is optimistic
(too narrow), which the docs say. An undefined rho (fewer than 3 units, or one side constant) is ``None``
with the reason, never a NaN.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.stats as st

#: Below this many units a rank correlation says nothing.
MIN_UNITS = 3


@dataclass(frozen=True)
class RankLink:
    """Spearman's rho with its percentile bootstrap interval; ``reason`` says why a number is None."""

    spearman: float | None
    ci_low: float | None
    ci_high: float | None
    n_units: int
    reason: str | None = None


def _undefined(x: np.ndarray, y: np.ndarray, names: tuple[str, str]) -> str | None:
    """Why rho does not exist on these units (None when it does)."""
    if len(x) < MIN_UNITS:
        return f"{len(x)} units with both measures: a rank correlation needs at least {MIN_UNITS}"
    for values, name in zip((x, y), names):
        if np.ptp(values) == 0:
            return f"the {name} is the same for every unit: constant input"
    return None


def bootstrap_spearman(x: np.ndarray, y: np.ndarray, n_bootstrap: int, seed: int) -> np.ndarray:
    """Spearman's rho on ``n_bootstrap`` resamples of the units (NaN where a resample is constant on one side).

    Vectorised: average ranks of each resample (``scipy.stats.rankdata`` along rows, as ``spearmanr`` ranks),
    then Pearson of the ranks, which is what ``spearmanr`` computes.
    """
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(x), size=(n_bootstrap, len(x)))
    rx, ry = st.rankdata(x[idx], axis=1), st.rankdata(y[idx], axis=1)
    rx -= rx.mean(axis=1, keepdims=True)
    ry -= ry.mean(axis=1, keepdims=True)
    denom = np.sqrt((rx**2).sum(axis=1) * (ry**2).sum(axis=1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(denom > 0, (rx * ry).sum(axis=1) / np.where(denom > 0, denom, 1.0), np.nan)


def spearman_interval(x, y, *, n_bootstrap: int = 1000, seed: int = 0, level: float = 0.95,
                      names: tuple[str, str] = ("change", "need")) -> RankLink:
    """Spearman's rho between ``x`` and ``y`` (pairs with a NaN dropped) and its ``level`` percentile interval.

    ``names`` word the reason when one side is constant. Resamples that are constant on one side have no rho
    and are left out of the percentiles; with ``n_bootstrap`` 0 (or every resample constant) the interval
    is None and ``reason`` says so while rho stands.
    """
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    keep = np.isfinite(x) & np.isfinite(y)
    x, y = x[keep], y[keep]
    n = len(x)
    if (why := _undefined(x, y, names)) is not None:
        return RankLink(None, None, None, n, why)
    rho = float(st.spearmanr(x, y).statistic)
    if n_bootstrap <= 0:
        return RankLink(rho, None, None, n, "no bootstrap resamples asked for: no interval")
    rhos = bootstrap_spearman(x, y, n_bootstrap, seed)
    rhos = rhos[np.isfinite(rhos)]
    if not len(rhos):
        return RankLink(rho, None, None, n, "every bootstrap resample was constant on one side: no interval")
    tail = (1.0 - level) / 2.0
    low, high = np.quantile(rhos, [tail, 1.0 - tail])
    return RankLink(rho, float(low), float(high), n)
