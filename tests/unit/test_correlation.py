"""Weighted Pearson / Spearman equal scipy's on the repeated sample a bootstrap row stands for."""
import numpy as np
import pytest
import scipy.stats as st

from bertology.metrics.correlation import pearson_interval, weighted_pearson, weighted_ranks, weighted_spearman


def _data(n=40, seed=0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 6, n) / 1.0  # many ties, as STS-B's scores
    x = np.stack([y + rng.normal(0, 1, n), np.round(rng.normal(0, 1, n), 1), -y])
    w = np.vstack([np.ones(n), rng.multinomial(n, np.ones(n) / n, size=30)]).astype(np.float32)
    return x, y, w


def test_weighted_correlations_equal_scipy_on_the_repeated_sample():
    x, y, w = _data()
    p, s = weighted_pearson(w, x, y), weighted_spearman(w, x, y)
    assert p.shape == s.shape == (w.shape[0], x.shape[0])
    for r in range(w.shape[0]):
        rep = np.repeat(np.arange(len(y)), w[r].astype(int))
        for u in range(x.shape[0]):
            # float64 sums of a few hundred terms: agreement to ~1e-15 relative; 1e-10 leaves room for any order
            assert p[r, u] == pytest.approx(st.pearsonr(x[u][rep], y[rep]).statistic, abs=1e-10)
            assert s[r, u] == pytest.approx(st.spearmanr(x[u][rep], y[rep]).statistic, abs=1e-10)
    assert np.allclose(p[:, 2], -1.0) and np.allclose(s[:, 2], -1.0)


def test_weighted_ranks_are_scipy_average_ranks_of_the_copies():
    x, _, w = _data(n=25, seed=3)
    ranks = weighted_ranks(w, x[1])
    for r in range(w.shape[0]):
        rep = np.repeat(np.arange(25), w[r].astype(int))
        ref = st.rankdata(x[1][rep])
        got = ranks[r][rep]
        assert np.array_equal(got, ref)


def test_a_constant_side_gives_nan_not_a_number():
    x, y, w = _data()
    const = np.full((1, len(y)), 0.1)  # the mean of identical floats need not equal them to the last bit
    assert np.isnan(weighted_pearson(w, const, y)).all()
    assert np.isnan(weighted_spearman(w, const, y)).all()


def test_pearson_interval_is_scipys_fisher_interval():
    x, y, _ = _data(n=60)
    res = st.pearsonr(x[0], y)
    ci = res.confidence_interval(0.95)
    assert pearson_interval(res.statistic, 60) == pytest.approx((ci.low, ci.high), abs=1e-12)
    assert all(np.isnan(pearson_interval(float("nan"), 60))) and all(np.isnan(pearson_interval(0.5, 3)))
