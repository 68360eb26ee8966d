"""Sub-word -> word alignment: vectorised pooling checked against plain Python loops."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from bertology.data.align import POOLING_METHODS, global_word_ids, pool_words, word_attention
from bertology.data.corpus import Example
from bertology.data.encode import encode_example
from bertology.testing import tiny_tokenizer

# --------------------------------------------------------------------------------------------------
# slow, obviously-correct references


def slow_global_word_ids(word_ids, segment):
    if segment is None:
        return [w if w >= 0 else -1 for w in word_ids]
    n_per_segment: dict[int, int] = {}
    for w, s in zip(word_ids, segment):
        if w >= 0 and s >= 0:
            n_per_segment[s] = max(n_per_segment.get(s, 0), w + 1)
    out = []
    for w, s in zip(word_ids, segment):
        if w < 0 or s < 0:
            out.append(-1)
        else:
            out.append(w + sum(n_per_segment.get(k, 0) for k in range(s)))
    return out


def slow_agg(values: list, method: str):
    """Aggregate a list of equal-shape arrays (or floats) the slow way."""
    if not values:
        return 0.0 if method == "sum" else float("nan")
    if method == "first":
        return values[0]
    if method == "sum":
        total = values[0] * 0.0
        for v in values:
            total = total + v
        return total
    if method == "mean":
        return slow_agg(values, "sum") / len(values)
    best = values[0]
    for v in values[1:]:
        best = np.maximum(best, v)
    return best


def slow_pool(x: np.ndarray, gids: list[int], n_words: int, method: str) -> np.ndarray:
    rows = []
    for i in range(n_words):
        pieces = [x[t] for t in range(len(gids)) if gids[t] == i]
        rows.append(np.broadcast_to(slow_agg(pieces, method), x.shape[1:]))
    return np.array(rows, dtype=float).reshape((n_words,) + x.shape[1:])


def slow_word_attention(a: np.ndarray, gids: list[int], n_words: int, to: str, frm: str) -> np.ndarray:
    out = np.zeros((n_words, n_words))
    for i in range(n_words):
        from_tokens = [t for t in range(len(gids)) if gids[t] == i]
        for j in range(n_words):
            to_tokens = [t for t in range(len(gids)) if gids[t] == j]
            per_row = [slow_agg([a[r, c] for c in to_tokens], to) for r in from_tokens]
            out[i, j] = slow_agg(per_row, frm)
    return out


# --------------------------------------------------------------------------------------------------
# random tokenisations: [CLS] words [SEP] (words [SEP]) [PAD]..., optionally shuffled


@st.composite
def tokenisations(draw, allow_pairs=True, allow_shuffle=True):
    word_ids, segment = [-1], [-1]
    n_segments = draw(st.integers(1, 2)) if allow_pairs else 1
    for s in range(n_segments):
        pieces = draw(st.lists(st.integers(1, 3), min_size=1, max_size=5))
        for w, k in enumerate(pieces):
            word_ids += [w] * k
            segment += [s] * k
        word_ids.append(-1)
        segment.append(-1)
    n_pad = draw(st.integers(0, 2))
    word_ids += [-1] * n_pad
    segment += [-1] * n_pad
    if allow_shuffle and draw(st.booleans()):
        order = draw(st.permutations(range(len(word_ids))))
        word_ids = [word_ids[t] for t in order]
        segment = [segment[t] for t in order]
    seed = draw(st.integers(0, 2**32 - 1))
    return np.array(word_ids), np.array(segment), n_segments == 2, seed


def row_stochastic(rng, *shape):
    logits = rng.normal(size=shape) * 2
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


FAST = settings(max_examples=25, deadline=None)


# --------------------------------------------------------------------------------------------------
# global word ids


def test_global_word_ids_of_a_pair():
    word_ids = np.array([-1, 0, 1, 1, 2, -1, 0, 0, 1, -1, -1])
    segment = np.array([-1, 0, 0, 0, 0, -1, 1, 1, 1, -1, -1])
    assert global_word_ids(word_ids, segment).tolist() == [-1, 0, 1, 1, 2, -1, 3, 3, 4, -1, -1]
    assert global_word_ids(word_ids).tolist() == word_ids.tolist()


@FAST
@given(tokenisations())
def test_global_word_ids_match_loop(case):
    word_ids, segment, _, _ = case
    assert global_word_ids(word_ids, segment).tolist() == slow_global_word_ids(word_ids.tolist(), segment.tolist())
    assert global_word_ids(torch.as_tensor(word_ids), list(segment)).tolist() == slow_global_word_ids(
        word_ids.tolist(), segment.tolist()
    )


# --------------------------------------------------------------------------------------------------
# pool_words


@FAST
@given(tokenisations(), st.sampled_from(POOLING_METHODS), st.integers(1, 4))
def test_pool_words_matches_loop(case, method, dim):
    word_ids, segment, pair, seed = case
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(len(word_ids), dim, 2))
    gids = slow_global_word_ids(word_ids.tolist(), segment.tolist())
    n_words = max(gids) + 1
    expected = slow_pool(x, gids, n_words, method)

    got = pool_words(x, word_ids, method, segment=segment)
    assert isinstance(got, np.ndarray) and got.shape == (n_words, dim, 2)
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)

    got_t = pool_words(torch.as_tensor(x), torch.as_tensor(word_ids), method, segment=segment)
    assert isinstance(got_t, torch.Tensor) and got_t.dtype == torch.float64
    np.testing.assert_allclose(got_t.numpy(), expected, rtol=1e-12, atol=1e-12)

    if not pair:  # one segment: `segment` changes nothing
        np.testing.assert_allclose(pool_words(x, word_ids, method), expected, rtol=1e-12, atol=1e-12)


def test_pool_words_small_example_by_hand():
    x = np.array([[100.0], [1.0], [2.0], [4.0], [8.0], [100.0]])
    word_ids = np.array([-1, 0, 0, 1, 1, -1])
    assert pool_words(x, word_ids, "first")[:, 0].tolist() == [1.0, 4.0]
    assert pool_words(x, word_ids, "mean")[:, 0].tolist() == [1.5, 6.0]
    assert pool_words(x, word_ids, "sum")[:, 0].tolist() == [3.0, 12.0]
    assert pool_words(x, word_ids, "max")[:, 0].tolist() == [2.0, 8.0]


@pytest.mark.parametrize("method", POOLING_METHODS)
def test_words_without_tokens_are_nan_or_zero(method):
    x = np.arange(6.0).reshape(3, 2)
    word_ids = np.array([0, 2, 2])  # word 1 has no tokens; word 3 too with n_words=4
    out = pool_words(x, word_ids, method, n_words=4)
    assert out.shape == (4, 2)
    empty = out[[1, 3]]
    if method == "sum":
        assert (empty == 0).all()
    else:
        assert np.isnan(empty).all()
    out_t = pool_words(torch.as_tensor(x), word_ids, method, n_words=4)
    np.testing.assert_array_equal(out_t.numpy(), out)


def test_pool_words_all_special_gives_zero_words():
    out = pool_words(np.ones((3, 5)), np.array([-1, -1, -1]), "mean")
    assert out.shape == (0, 5)
    out_t = pool_words(torch.ones(3, 5), [-1, -1, -1], "first")
    assert tuple(out_t.shape) == (0, 5)


def test_pool_words_torch_keeps_dtype_and_gradients():
    x = torch.randn(6, 4, dtype=torch.float32, requires_grad=True)
    word_ids = [-1, 0, 0, 1, 2, -1]
    out = pool_words(x, word_ids, "mean")
    assert out.dtype == torch.float32 and out.device == x.device and out.shape == (3, 4)
    out.sum().backward()
    assert torch.allclose(x.grad[:, 0], torch.tensor([0, 0.5, 0.5, 1, 1, 0]))


def test_pool_words_integer_input_gives_float():
    out = pool_words(np.array([[1], [2], [4]]), [0, 0, 1], "mean")
    assert out.dtype == np.float64 and out[:, 0].tolist() == [1.5, 4.0]


def test_pool_words_real_tokenizer_sentence_pair():
    tok = tiny_tokenizer()
    enc = encode_example(tok, Example("the cats liked movies .", "john read books"), 0)
    n_first, n_second = 5, 3
    x = np.random.default_rng(0).normal(size=(len(enc), 3))
    out = pool_words(x, enc.word_ids, "mean", segment=enc.segment)
    assert out.shape == (n_first + n_second, 3)
    gids = global_word_ids(enc.word_ids, enc.segment)
    books = np.flatnonzero((enc.segment == 1) & (enc.word_ids == 2))  # "book ##s"
    assert len(books) == 2 and (gids[books] == n_first + 2).all()
    np.testing.assert_allclose(out[n_first + 2], x[books].mean(axis=0))


def test_pool_words_errors():
    with pytest.raises(ValueError, match="method"):
        pool_words(np.ones((2, 2)), [0, 1], "median")
    with pytest.raises(ValueError, match="tokens"):
        pool_words(np.ones((3, 2)), [0, 1], "mean")
    with pytest.raises(ValueError, match="n_words"):
        pool_words(np.ones((2, 2)), [0, 5], "mean", n_words=3)
    with pytest.raises(ValueError, match="segment"):
        pool_words(np.ones((2, 2)), [0, 1], "mean", segment=[0, 0, 0])


# --------------------------------------------------------------------------------------------------
# word_attention


@settings(max_examples=40, deadline=None)
@given(tokenisations(), st.sampled_from(POOLING_METHODS), st.sampled_from(POOLING_METHODS))
def test_word_attention_matches_loop(case, to, frm):
    word_ids, segment, _, seed = case
    rng = np.random.default_rng(seed)
    a = row_stochastic(rng, len(word_ids), len(word_ids))
    gids = slow_global_word_ids(word_ids.tolist(), segment.tolist())
    expected = slow_word_attention(a, gids, max(gids) + 1, to, frm)
    got = word_attention(a, word_ids, to, frm, segment=segment)
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)
    got_t = word_attention(torch.as_tensor(a), word_ids, to, frm, segment=segment)
    np.testing.assert_allclose(got_t.numpy(), expected, rtol=1e-12, atol=1e-12)


def test_word_attention_defaults_are_clark_et_al():
    # tokens: [CLS] w0 w0 w1 [SEP]
    a = np.array(
        [
            [0.2, 0.2, 0.2, 0.2, 0.2],
            [0.1, 0.3, 0.2, 0.3, 0.1],
            [0.0, 0.5, 0.1, 0.2, 0.2],
            [0.4, 0.0, 0.0, 0.5, 0.1],
            [0.2, 0.2, 0.2, 0.2, 0.2],
        ]
    )
    out = word_attention(a, [-1, 0, 0, 1, -1])
    # to w0 = sum of its two columns; from w0 = mean of its two rows
    np.testing.assert_allclose(out, [[(0.5 + 0.6) / 2, (0.3 + 0.2) / 2], [0.0, 0.5]])


@FAST
@given(tokenisations(allow_shuffle=True))
def test_word_attention_rows_sum_to_at_most_one(case):
    word_ids, segment, _, seed = case
    a = row_stochastic(np.random.default_rng(seed), len(word_ids), len(word_ids))
    out = word_attention(a, word_ids, "sum", "mean", segment=segment)
    assert (out >= 0).all()
    assert (out.sum(axis=1) <= 1 + 1e-12).all()
    # the missing mass is exactly the mean attention the word's pieces pay to special tokens
    gids = global_word_ids(word_ids, segment)
    to_special = a[:, gids < 0].sum(axis=1)
    expected_missing = pool_words(to_special, gids, "mean")
    np.testing.assert_allclose(1 - out.sum(axis=1), expected_missing, atol=1e-12)


@FAST
@given(st.lists(st.integers(1, 3), min_size=1, max_size=6), st.integers(0, 2**32 - 1))
def test_word_attention_rows_sum_to_one_without_special_tokens(pieces, seed):
    word_ids = np.repeat(np.arange(len(pieces)), pieces)
    a = row_stochastic(np.random.default_rng(seed), len(word_ids), len(word_ids))
    out = word_attention(a, word_ids, "sum", "mean")
    np.testing.assert_allclose(out.sum(axis=1), 1.0, atol=1e-12)


@pytest.mark.parametrize("backend", ["numpy", "torch"])
def test_word_attention_keeps_leading_dims(backend):
    rng = np.random.default_rng(3)
    word_ids = np.array([-1, 0, 0, 1, 2, 2, 2, -1, 0, 1, 1, -1])
    segment = np.array([-1, 0, 0, 0, 0, 0, 0, -1, 1, 1, 1, -1])
    a = row_stochastic(rng, 2, 3, len(word_ids), len(word_ids))
    x = torch.as_tensor(a) if backend == "torch" else a
    out = word_attention(x, word_ids, "sum", "max", segment=segment)
    assert tuple(out.shape) == (2, 3, 5, 5)
    for layer, head in itertools.product(range(2), range(3)):
        single = word_attention(a[layer, head], word_ids, "sum", "max", segment=segment)
        np.testing.assert_allclose(np.asarray(out[layer, head]), single, rtol=1e-12)


def test_word_attention_errors():
    with pytest.raises(ValueError, match="square"):
        word_attention(np.ones((3, 4)), [0, 1, 2])
    with pytest.raises(ValueError, match="to_method"):
        word_attention(np.ones((2, 2)), [0, 1], to_method="median")
    with pytest.raises(ValueError, match="from_method"):
        word_attention(np.ones((2, 2)), [0, 1], from_method="median")
