import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bertology.metrics.attention import js_divergence, js_divergence_np, map_cosine


def _dist(rng, k):
    p = rng.random(k) ** 3
    p[rng.random(k) < 0.3] = 0.0  # zeros exercise 0 log 0
    p[0] += 1e-3
    return p / p.sum()


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), k=st.integers(2, 30))
def test_js_matches_scipy_and_is_bounded(seed, k):
    rng = np.random.default_rng(seed)
    p, q = _dist(rng, k), _dist(rng, k)
    ours = float(js_divergence(torch.tensor(p), torch.tensor(q)))
    assert ours == pytest.approx(js_divergence_np(p, q), abs=1e-10)
    assert 0.0 <= ours <= 1.0 + 1e-12
    assert float(js_divergence(torch.tensor(p), torch.tensor(p))) == pytest.approx(0.0, abs=1e-12)


def test_js_of_disjoint_distributions_is_one_bit():
    assert float(js_divergence(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0]))) == pytest.approx(1.0)


def test_map_cosine_against_numpy_loop():
    rng = np.random.default_rng(0)
    a, b = rng.random((3, 4, 5, 5)), rng.random((3, 4, 5, 5))
    ours = map_cosine(torch.tensor(a), torch.tensor(b)).numpy()
    for i in range(3):
        for h in range(4):
            u, v = a[i, h].ravel(), b[i, h].ravel()
            assert ours[i, h] == pytest.approx(u @ v / np.linalg.norm(u) / np.linalg.norm(v))
