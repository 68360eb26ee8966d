"""Is an accuracy above chance? The Wilson interval of an accuracy and the majority-class rate.

Shared by the ablation's degenerate-classifier check and the fine-tuning lab's end-of-run warning.
Chance is the majority-class rate of the labels: the accuracy of always predicting the most frequent
class (at least ``1/k``; ``0.5`` on a balanced two-class sample).
"""
from __future__ import annotations

import numpy as np
from scipy.stats import binomtest


def accuracy_interval(correct: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """The Wilson score interval of an accuracy of ``correct`` out of ``n`` (scipy's ``binomtest``).

    Wilson rather than the module's paired bootstrap: it needs only ``(correct, n)``, which the table
    keeps, so the summary and the report recompute the same interval from the run folder; and unlike a
    percentile bootstrap it does not collapse to a point at accuracy 0 or 1 and keeps its coverage at
    the small ``n`` of a quick run.
    """
    if n < 1:
        raise ValueError(f"n must be at least 1, not {n}")
    ci = binomtest(int(correct), int(n)).proportion_ci(confidence_level=level, method="wilson")
    return float(ci.low), float(ci.high)


def chance_rate(labels: np.ndarray) -> float:
    """The majority-class rate of ``labels``: the accuracy of always predicting the most frequent class."""
    labels = np.asarray(labels)
    if labels.size == 0:
        raise ValueError("chance_rate needs at least one label")
    return float(np.unique(labels, return_counts=True)[1].max() / labels.size)


def above_chance(correct: int, n: int, labels: np.ndarray) -> tuple[bool, tuple[float, float], float]:
    """Whether the Wilson 95% interval of ``correct / n`` lies above the majority rate of ``labels``.

    Returns ``(above, (low, high), chance)``.
    """
    lo, hi = accuracy_interval(correct, n)
    chance = chance_rate(labels)
    return lo > chance, (lo, hi), chance
