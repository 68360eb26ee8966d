"""The relation heads' Numba kernel against word_attention + np.argmax, with ties everywhere."""
import numpy as np
import pytest

from bertology.data.align import word_attention
from bertology.metrics.word_argmax import WordPairs, word_argmax_hits


def _reference(att, word_ids, n_words, allowed, pair_start, dep, gov, to_method, from_method, transpose):
    """Pool each example with word_attention (float64), mask non-candidates and self, take np.argmax."""
    B, H = att.shape[:2]
    out = np.zeros((2, H, len(dep)), dtype=bool)
    for b in range(B):
        W = n_words[b]
        wid = word_ids[b]
        real = wid >= 0
        A = word_attention(att[b][:, real][:, :, real].astype(np.float64), wid[real], to_method, from_method, n_words=W)
        for p in range(pair_start[b], pair_start[b + 1]):
            d, g = dep[p], gov[p]
            for h in range(H):
                row = np.where(allowed[b, :W], A[h, d], -np.inf)
                row[d] = -np.inf
                out[0, h, p] = row.argmax() == g
                if transpose:
                    col = np.where(allowed[b, :W], A[h, :, d], -np.inf)
                    col[d] = -np.inf
                    out[1, h, p] = col.argmax() == g
                else:
                    row = np.where(allowed[b, :W], A[h, g], -np.inf)
                    row[g] = -np.inf
                    out[1, h, p] = row.argmax() == d
    return out


def _batch(seed):
    """Maps with values from a tiny set (exact ties everywhere), multi-piece words, padding, a skipped example."""
    rng = np.random.default_rng(seed)
    B, H, T = 4, 3, 11
    att = rng.integers(0, 3, size=(B, H, T, T)).astype(np.float32) / 4
    word_ids = np.full((B, T), -1)
    n_words = np.zeros(B, dtype=int)
    allowed = np.zeros((B, 8), dtype=bool)
    dep, gov, counts = [], [], []
    for b in range(B):
        length = int(rng.integers(6, T + 1))
        pieces = np.sort(rng.integers(0, 5 + b % 2, size=length - 2))  # tokens 1..length-2; 0 and last special
        _, pieces = np.unique(pieces, return_inverse=True)
        word_ids[b, 1 : length - 1] = pieces
        W = int(pieces.max()) + 1
        n_words[b] = W
        allowed[b, :W] = True
        if b == 1:
            allowed[b, W - 1] = False  # e.g. a truncated last word: not a candidate
        cand = np.flatnonzero(allowed[b, :W])
        n = 0 if b == 2 else int(rng.integers(1, 6))  # example 2 has no pairs
        for _ in range(n):
            d, g = rng.choice(cand, 2, replace=False)
            dep.append(d), gov.append(g)
        counts.append(n)
    return att, word_ids, n_words, allowed, np.r_[0, np.cumsum(counts)], np.array(dep), np.array(gov)


@pytest.mark.parametrize("to_method,from_method", [("sum", "mean"), ("mean", "sum"), ("first", "first"), ("max", "max"), ("sum", "max")])
@pytest.mark.parametrize("transpose", [True, False])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_kernel_equals_word_attention_and_first_argmax(to_method, from_method, transpose, seed):
    args = _batch(seed)
    got = word_argmax_hits(args[0], args[1:4], args[4:], to_method=to_method, from_method=from_method, transpose=transpose)
    expected = _reference(*args, to_method, from_method, transpose)
    assert expected.any() and (~expected).any()
    np.testing.assert_array_equal(got, expected)


def test_ties_go_to_the_first_candidate():
    # one example, one head, words 0..3 (one token each after [CLS]); row of word 1 ties between 0 and 2
    att = np.zeros((1, 1, 6, 6), dtype=np.float32)
    att[0, 0, 2, [1, 3]] = 0.5
    word_ids = np.array([[-1, 0, 1, 2, 3, -1]])
    args = (word_ids, np.array([4]), np.ones((1, 4), bool))
    pairs = WordPairs(np.array([0, 2]), np.array([1, 1]), np.array([0, 2]))
    hits = word_argmax_hits(att, args, pairs)
    assert hits[0, 0].tolist() == [True, False]  # word 1 -> word 0 is the first maximum, word 2 is not
    with pytest.raises(ValueError, match="pooling"):
        word_argmax_hits(att, args, pairs, to_method="median")


def test_warmup_compiles_the_signatures_the_analyses_use():
    import numba

    from bertology.metrics.attention import _layer_statistics_kernel
    from bertology.metrics.word_argmax import _kernel
    from bertology.warmup import compile_kernels

    assert compile_kernels() >= 0
    for kernel in (_kernel, _layer_statistics_kernel):
        first = [sig[0] for sig in kernel.signatures]
        assert any(t.dtype == numba.float32 and t.ndim == 4 and t.layout == "C" for t in first), first
