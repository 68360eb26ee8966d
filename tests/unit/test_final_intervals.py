"""A fine-tuned model's final metrics and their intervals: ``Task.intervals`` resamples examples exactly as
a bootstrap of the repeated sample would, for every task, with the ablation's resamples."""
from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import pearsonr

from bertology.metrics.bootstrap import bootstrap_counts
from bertology.tasks.catalog import get_task


def _independent(stat, n: int, n_bootstrap: int, seed: int) -> tuple[float, float]:
    """The percentile interval of ``stat`` over explicitly repeated samples (the slow way)."""
    counts = bootstrap_counts(n, n_bootstrap, seed).astype(int)
    values = [stat(np.repeat(np.arange(n), c)) for c in counts]
    return float(np.percentile(values, 2.5)), float(np.percentile(values, 97.5))


def test_classification_interval_equals_the_repeated_sample_bootstrap():
    rng = np.random.default_rng(0)
    n = 60
    y = rng.integers(0, 3, n)
    pred = np.where(rng.random(n) < 0.7, y, (y + 1) % 3)
    records = {"pred": pred, "loss": rng.random(n)}
    out = get_task("classification").intervals(records, y, n_bootstrap=200, seed=3)
    acc, lo, hi = out["accuracy"]
    assert acc == pytest.approx((pred == y).mean(), rel=2**-23)  # the task counts in float32 (one rounding)
    want = _independent(lambda idx: (pred[idx] == y[idx]).mean(), n, 200, 3)
    assert (lo, hi) == pytest.approx(want, rel=2**-22)  # float32 counts and division: two roundings
    assert lo < acc < hi


def test_regression_interval_equals_scipy_on_the_repeated_sample():
    rng = np.random.default_rng(1)
    n = 40
    y = rng.normal(size=n)
    pred = y + rng.normal(scale=0.8, size=n)
    records = {"pred": pred, "loss": (pred - y) ** 2}
    out = get_task("regression").intervals(records, y, n_bootstrap=150, seed=5)
    r, lo, hi = out["pearson"]
    assert r == pytest.approx(pearsonr(pred, y).statistic, abs=1e-12)
    want = _independent(lambda idx: pearsonr(pred[idx], y[idx]).statistic, n, 150, 5)
    # weighted vs repeated-sample Pearson agree to ~1e-10 (tests/unit/test_correlation.py); percentiles interpolate them
    assert (lo, hi) == pytest.approx(want, abs=1e-8)
    mse, mlo, mhi = out["mse"]
    assert mse == pytest.approx(((pred - y) ** 2).mean(), rel=1e-12) and mlo < mse < mhi


def test_too_few_examples_or_no_resamples_give_no_interval():
    task = get_task("classification")
    one = task.intervals({"pred": np.array([1]), "loss": np.array([0.1])}, np.array([1]))
    assert one["accuracy"][0] == 1.0 and np.isnan(one["accuracy"][1]) and np.isnan(one["accuracy"][2])
    none = task.intervals({"pred": np.array([1, 0]), "loss": np.array([0.1, 0.2])}, np.array([1, 1]), n_bootstrap=0)
    assert np.isnan(none["accuracy"][1])
