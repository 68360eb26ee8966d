"""Leading principal axes by Lanczos (ARPACK) for large clouds, the dense eigensolver for small ones."""
from __future__ import annotations

import numpy as np
import pytest
from scipy.sparse.linalg import ArpackNoConvergence
from sklearn.decomposition import PCA

import bertology.metrics.principal as principal
from bertology.analyses.pca_views import leading_pca
from bertology.metrics.geometry import max_explainable_variance
from bertology.metrics.principal import DENSE_UP_TO, top_eigenpairs


def _cloud(n: int, dim: int, seed: int) -> np.ndarray:
    """Data with a clear spectral gap (sd 3, 2, then <= 1) and a mean far from 0, as hidden states have."""
    rng = np.random.default_rng(seed)
    scale = np.r_[3.0, 2.0, np.linspace(1.0, 0.1, dim - 2)]
    return rng.standard_normal((n, dim)) * scale + 5 * rng.standard_normal(dim)


@pytest.fixture
def lanczos_calls(monkeypatch):
    """Count the ARPACK solves, so a test knows which route it exercised."""
    calls = []
    real = principal.eigsh
    monkeypatch.setattr(principal, "eigsh", lambda *a, **k: calls.append(a[0].shape) or real(*a, **k))
    return calls


@pytest.mark.parametrize("n, dim", [(300, 200), (200, 300), (64, 48)])
def test_leading_pca_equals_sklearn_on_either_route(n, dim, lanczos_calls):
    """Large clouds go through Lanczos (on the smaller side), small ones through the dense solver; both give
    sklearn's full-SVD PCA to 1e-10 of the data's scale (axes to ~eps sigma_1^2 / gap)."""
    x = _cloud(n, dim, n + dim)
    p = PCA(2, svd_solver="full").fit(x)
    mean, comps, ratio = leading_pca(x)
    assert lanczos_calls == ([(min(n, dim),) * 2] if min(n, dim) > DENSE_UP_TO else [])
    np.testing.assert_allclose(comps, p.components_, rtol=0, atol=1e-10)
    np.testing.assert_allclose(ratio, p.explained_variance_ratio_, rtol=1e-10)
    np.testing.assert_allclose((x - mean) @ comps.T, p.transform(x), rtol=0, atol=1e-10 * np.abs(x).max())


@pytest.mark.parametrize("n, dim", [(300, 200), (200, 300)])
def test_lanczos_equals_the_dense_route(n, dim, monkeypatch):
    """The same eigenpairs (up to sign) as forming the smaller matrix and diagonalising it, to rounding."""
    xc = _cloud(n, dim, 7)
    xc -= xc.mean(0)
    w, vt = top_eigenpairs(xc, 3)
    monkeypatch.setattr(principal, "DENSE_UP_TO", 10**9)
    w_dense, vt_dense = top_eigenpairs(xc, 3)
    np.testing.assert_allclose(w, w_dense, rtol=1e-12)
    np.testing.assert_allclose(np.abs(np.sum(vt * vt_dense, axis=1)), 1.0, rtol=0, atol=1e-12)
    w_only, none = top_eigenpairs(xc, 1, vectors=False)
    assert none is None
    np.testing.assert_allclose(w_only, w[:1], rtol=1e-12)


def test_rank_below_k_gives_a_zero_axis_on_the_lanczos_route(lanczos_calls):
    """A rank-1 cloud of 300 points in 200 dimensions: the second axis is not determined and comes back as
    zeros; the first explains everything."""
    rng = np.random.default_rng(3)
    line = np.outer(rng.standard_normal(300), rng.standard_normal(200)) + 1.0
    mean, comps, ratio = leading_pca(line)
    assert lanczos_calls
    assert ratio[0] == pytest.approx(1.0) and ratio[1] == pytest.approx(0.0, abs=1e-12)
    assert not comps[1].any()
    again = leading_pca(line)
    assert all(np.array_equal(a, b) for a, b in zip((mean, comps, ratio), again))  # deterministic
    np.testing.assert_allclose((line - mean) @ comps.T, PCA(2, svd_solver="full").fit(line).transform(line), atol=1e-9)


def test_no_convergence_falls_back_to_the_dense_route(monkeypatch):
    """When ARPACK gives up, the dense solver answers, with the same axes."""
    xc = _cloud(300, 200, 11)
    xc -= xc.mean(0)
    want = top_eigenpairs(xc, 2)

    def refuse(*args, **kwargs):
        raise ArpackNoConvergence("no", np.zeros(0), np.zeros((200, 0)))

    monkeypatch.setattr(principal, "eigsh", refuse)
    got = top_eigenpairs(xc, 2)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12)
    np.testing.assert_allclose(np.abs(np.sum(got[1] * want[1], axis=1)), 1.0, rtol=0, atol=1e-12)


def test_mev_of_large_stacks_equals_the_dense_route(lanczos_calls):
    """The MEV baseline's large stacks (Lanczos, trace as the total) agree with the batched dense eigensolver
    to rounding, centred or not; an all-identical stack is 1 by convention on both routes; one stack gives a float."""
    import bertology.metrics.geometry as geometry

    rng = np.random.default_rng(5)
    x = np.stack([_cloud(200, 150, s) for s in range(3)])
    x[2] = rng.standard_normal(150)  # every row the same vector: no variance
    for center in (True, False):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(geometry, "DENSE_UP_TO", 10**9)
            want = max_explainable_variance(x, center=center)
        lanczos_calls.clear()
        got = max_explainable_variance(x, center=center)
        assert len(lanczos_calls) == (2 if center else 3)  # the flat stack needs no eigenvalue
        np.testing.assert_allclose(got, want, rtol=1e-12)
        if center:
            assert got[2] == 1.0 and want[2] == 1.0
    assert max_explainable_variance(x[0], center=False) == pytest.approx(float(got[0]), rel=1e-12)  # one stack: a float
