"""The shared one-pass layer statistics (Numba) against plain torch, and the stacked pattern sums against pattern_sums."""
import math

import numpy as np
import pytest
import torch

from bertology.metrics.attention import js_divergence, layer_statistics, layer_statistics_torch, map_cosine
from bertology.metrics.patterns import pattern_sums, stacked_pattern_sums


def _maps(seed, B=5, H=3, T=9, dtype=torch.float32):
    """Masked-softmax maps: padding keys get exactly 0, padding query rows still hold attention."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.tensor([T, T - 2, 4, 1, T - 1])[:B]
    mask = torch.arange(T)[None, :] < lengths[:, None]
    def one():
        scores = torch.randn(B, H, T, T, generator=g, dtype=torch.float64)
        return torch.softmax(scores.masked_fill(~mask[:, None, None, :], float("-inf")), -1).to(dtype)
    return one(), one(), mask


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_kernel_equals_torch_reference(dtype):
    a, b, mask = _maps(0, dtype=dtype)
    got, ref = layer_statistics(a, b, mask), layer_statistics_torch(a, b, mask)
    torch.testing.assert_close(got.dots, ref.dots, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got.received, ref.received)
    torch.testing.assert_close(got.diagonals, ref.diagonals, rtol=0, atol=0)
    torch.testing.assert_close(got.entropy, ref.entropy, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got.js, ref.js, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got.entropy_sum, ref.entropy_sum, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(got.diagonal_sums, ref.diagonal_sums, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(got.entropy_sum, got.entropy.double().sum(-1), rtol=1e-6, atol=1e-7)
    assert (got.js[[0, 1, 2, 4]] > 0).all() and (got.js[3] == 0).all() and got.entropy.dtype == dtype  # example 3: one token
    assert got.received.dtype == dtype and got.diagonals.dtype == dtype
    # padding rows are left out: row 3 has one real token, so only its first query row counts
    assert torch.equal(got.diagonals[:, 3, :, 1:], torch.zeros_like(got.diagonals[:, 3, :, 1:]))
    assert torch.allclose(got.received[:, 3, :, 0], torch.ones(2, 3, dtype=dtype))


def test_entropy_and_js_equal_the_per_row_definitions():
    a, b, mask = _maps(3, dtype=torch.float64)
    st = layer_statistics(a, b, mask)
    for i in range(a.shape[0]):
        n = int(mask[i].sum())
        for h in range(a.shape[1]):
            total = 0.0
            for q in range(n):
                u, v = a[i, h, q, :n], b[i, h, q, :n]
                assert float(st.entropy[0, i, h, q]) == pytest.approx(float(-(u * u.log()).sum()), abs=1e-12)
                total += float(js_divergence(u, v, base=math.e))
            assert float(st.js[i, h]) == pytest.approx(total, abs=1e-12)
            assert not st.entropy[:, i, h, n:].any()  # padding rows are 0
    same = layer_statistics(a, a, mask)
    assert float(same.js.abs().max()) < 1e-12


def test_dots_give_the_cropped_cosine_and_diagonals_the_map_values():
    a, b, mask = _maps(1, dtype=torch.float64)
    st = layer_statistics(a, b, mask)
    ab, aa, bb = st.dots.unbind(-1)
    expected = map_cosine(a, b, mask[:, None, :].double())
    torch.testing.assert_close(ab / (aa.sqrt() * bb.sqrt()), expected, rtol=1e-12, atol=1e-12)
    n = int(mask[1].sum())
    for q in range(n):
        for j, o in enumerate((-1, 0, 1)):
            k = q + o
            want = float(a[1, 2, q, k]) if 0 <= k < a.shape[-1] else 0.0
            assert float(st.diagonals[0, 1, 2, q, j]) == want


@pytest.mark.parametrize("band", [0, 1])
def test_stacked_pattern_sums_equal_per_layer_pattern_sums(band):
    a, b, mask = _maps(2)
    vk = torch.zeros_like(mask)
    vk[:, 0] = True
    vk[:, 3] = True
    seg = torch.where(mask, 0, -1)
    st = layer_statistics(a, b, mask)
    ent = torch.stack([-(m.clamp_min(1e-38).log() * m).sum(-1) for m in (a, b)])
    got = stacked_pattern_sums(st.received, st.diagonals, (ent * mask[:, None]).sum(-1), mask, vk, band)
    for m, attn in enumerate((a, b)):
        ref = pattern_sums(attn, mask, vk, seg, ent[m], band=band)
        for key in got:
            torch.testing.assert_close(got[key][m], ref[key], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="band"):
        stacked_pattern_sums(st.received, st.diagonals, ent.sum(-1), mask, vk, 2)


def test_analyses_give_the_same_tables_through_the_torch_fallback(planted_pair, monkeypatch):
    """The path taken off CPU (plain torch statistics) gives the tables of the Numba path."""
    import bertology.activations.batch as batch_module
    from bertology.activations.extract import run_analyses
    from bertology.analyses.attention_change import AttentionChange
    from bertology.analyses.attention_patterns import AttentionPatterns
    from bertology.analyses.attention_targets import AttentionTargets
    from bertology.data.corpus import Corpus
    from bertology.data.encode import encode_corpus
    from bertology.models.pair import ModelPair
    from bertology.testing import SENTENCES

    pair = ModelPair.load(*map(str, planted_pair))
    corpus = Corpus.from_list(SENTENCES)
    enc = encode_corpus(corpus, pair.tokenizer)
    L, H = pair.num_layers, pair.num_heads

    def tables():
        analyses = [AttentionChange(L, H), AttentionPatterns(pair.tokenizer, L, H),
                    AttentionTargets(corpus, pair.tokenizer, L, H, word_level=False)]
        run_analyses(pair, enc, analyses, batch_size=3)
        return [a.compute().table for a in analyses]

    fast = tables()
    monkeypatch.setattr(batch_module, "layer_statistics", lambda a, b, rows, scratch=None: layer_statistics_torch(a, b, rows))
    slow = tables()
    for x, y in zip(fast, slow):
        numeric = x.select_dtypes("number").columns
        np.testing.assert_allclose(x[numeric].to_numpy(float), y[numeric].to_numpy(float), rtol=1e-5, atol=1e-6)
        assert x.drop(columns=numeric).equals(y.drop(columns=numeric))
    assert fast[0]["js_divergence"].max() > 0.01  # the planted head moved
