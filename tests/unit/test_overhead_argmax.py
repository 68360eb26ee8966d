"""relation_heads' argmax scoring (maxima over outer axes plus a tie check) equals a plain first-argmax."""
import numpy as np
import pytest

from bertology.analyses.relation_heads import _ArgmaxHits


@pytest.mark.parametrize("axis", ["row", "col"])
def test_argmax_hits_equal_first_argmax_with_many_ties(axis):
    rng = np.random.default_rng(0)
    B, W, H, P = 5, 7, 4, 60
    # values from a tiny set so that exact ties are everywhere; some candidates excluded (-inf)
    A = rng.integers(0, 3, size=(B, W, H, W)).astype(np.float32)
    A[rng.random(A.shape) < 0.2] = -np.inf
    row, frm, to = rng.integers(0, B, P), rng.integers(0, W, P), rng.integers(0, W, P)
    A[row, frm, :, to] = np.maximum(A[row, frm, :, to], 0)  # the scored pair itself is a candidate
    want = to if axis == "row" else frm
    hits = _ArgmaxHits(W, H, row, frm, to, axis, want)(A, {})
    if axis == "row":
        expected = A[row, frm].argmax(-1) == want[:, None]  # [P, H]
    else:
        expected = A[row, :, :, to].argmax(1) == want[:, None]
    assert expected.any() and (~expected).any()
    np.testing.assert_array_equal(hits, expected)
    # ties really happened where the pair's value equals its maximum but an earlier one does too
    best = A.max(-1 if axis == "row" else 1)
    assert (A[row, frm, :, to] == (best[row, frm] if axis == "row" else best[row, :, to])).sum() > expected.sum()
