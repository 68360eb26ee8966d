"""The gain a transplanted unit recovers, with paired bootstrap intervals: the ``transplant`` table.

gain recovered = (metric with the unit - metric with the head alone) / (tuned metric - metric with the head alone)

The three terms are scored on the same bootstrap resamples of the examples (:func:`bertology.metrics.bootstrap.
bootstrap_counts`), so the ratio's interval is the 2.5/97.5 percentiles of the per-resample ratios. The ratio is
only defined when the tuned model beats the head alone: when the denominator's 95% interval includes 0 (or the
tuned model is worse), ``gain_recovered`` and its interval are NaN and ``reason`` says why. Without resamples
(``n_bootstrap=0``) the point ratio is given when the tuned model is better at all, with no interval.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from bertology.metrics.bootstrap import bootstrap_counts
from bertology.tasks.base import Task

TABLE = "transplant"
TABLE_COLUMNS = [
    "unit_kind", "layer", "head", "direction", "k", "with_embeddings", "label", "mode", "metric", "value",
    "value_head_alone", "value_tuned", "gain_recovered", "ci_low", "ci_high", "reason", "n_examples", "task",
    "main_metric",  # the metric the findings use (bertology.tasks.main_metric)
]
#: Store keys of the two reference models.
TUNED_KEY, HEAD_ALONE_KEY = "intact", "transplant-none"


@dataclass(frozen=True)
class Gain:
    """One row's gain recovered, its 95% interval and why it is undefined (empty when it is defined)."""

    value: float
    ci_low: float
    ci_high: float
    reason: str


def gain_recovered(unit: np.ndarray, head: np.ndarray, tuned: np.ndarray) -> np.ndarray:
    """(unit - head) / (tuned - head), elementwise; NaN where the denominator is 0 (no gain to recover)."""
    unit, head, tuned = (np.asarray(x, dtype=np.float64) for x in (unit, head, tuned))
    den = tuned - head
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(den != 0, (unit - head) / np.where(den != 0, den, 1.0), np.nan)


def denominator_reason(point: float, lo: float, hi: float, higher_is_better: bool) -> str:
    """Why the gain is undefined given tuned - head alone (point and 95% interval; NaN bounds: no bootstrap), or ''."""
    sign = 1.0 if higher_is_better else -1.0
    if np.isnan(lo):
        return "" if sign * point > 0 else (
            f"the tuned model is not better than the head alone (tuned - head alone = {point:+.4g}): no gain to recover")
    if sign * lo > 0 and sign * hi > 0:
        return ""
    return (f"the tuned model is not better than the head alone beyond the 95% interval (tuned - head alone "
            f"{point:+.4g} [{lo:+.4g}, {hi:+.4g}]): no gain to recover, the ratio is undefined")


def gain_of(point: np.ndarray, boot: np.ndarray | None, j: int, i_head: int, i_tuned: int,
            higher_is_better: bool) -> Gain:
    """The gain of unit ``j`` from point scores ``point[unit]`` and bootstrap scores ``boot[resample, unit]`` (None: none)."""
    den = float(point[i_tuned] - point[i_head])
    lo = hi = float("nan")
    if boot is not None:
        d = boot[:, i_tuned] - boot[:, i_head]
        lo, hi = float(np.percentile(d, 2.5)), float(np.percentile(d, 97.5))
    reason = denominator_reason(den, lo, hi, higher_is_better)
    if reason:
        return Gain(float("nan"), float("nan"), float("nan"), reason)
    value = float(gain_recovered(point[j], point[i_head], point[i_tuned]))
    if boot is None:
        return Gain(value, float("nan"), float("nan"), "")
    ratios = gain_recovered(boot[:, j], boot[:, i_head], boot[:, i_tuned])
    return Gain(value, float(np.nanpercentile(ratios, 2.5)), float(np.nanpercentile(ratios, 97.5)), "")


def scores(keys: Sequence[str], per_example: dict, y: np.ndarray, task: Task, n_bootstrap: int, seed: int,
           chunk: int = 100) -> tuple[dict, dict | None]:
    """Point scores ``{metric: [unit]}`` and bootstrap scores ``{metric: [resample, unit]}`` (None without resamples)
    of the records under ``keys``, all on the same resamples."""
    records = {name: np.stack([per_example[k][name] for k in keys]) for name in per_example[keys[0]]}
    n = len(y)
    point = {m: v[0] for m, v in task.scores(np.ones((1, n), dtype=np.float32), records, y).items()}
    if n_bootstrap <= 0:
        return point, None
    counts = bootstrap_counts(n, n_bootstrap, seed)
    parts = [task.scores(counts[s: s + chunk], records, y) for s in range(0, n_bootstrap, chunk)]
    return point, {m: np.concatenate([p[m] for p in parts]) for m in task.metrics}
