"""Geometry (Ethayarajh 2019): metrics against slow loops, the analysis against a per-sentence reference,
hashed sampling exact under batching and merge, known cases (isotropic, identical, rank-1), figure."""
import itertools

import numpy as np
import pandas as pd
import pytest
import torch
from matplotlib.figure import Figure
from sklearn.decomposition import PCA

from bertology.activations.batch import PairBatch
from bertology.activations.extract import run_analyses
from bertology.analyses.geometry import _SALT_BASELINE, METRICS, Geometry, WordSample, by_layer, word_key
from bertology.analyses.head_map import example_keys
from bertology.data.corpus import Corpus
from bertology.data.encode import EncodedCorpus, EncodedExample, encode_corpus
from bertology.metrics.geometry import (
    chain_pairs,
    intra_similarity,
    masked_intra_similarity,
    max_explainable_variance,
    mean_offdiagonal_cosine,
    mean_pair_cosine,
    pair_cosines,
)
from bertology.models.hooks import Captured
from bertology.models.pair import ModelPair
from bertology.viz.geometry import geometry_figure


def _cos(a, b):
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


# ----------------------------------------------------------------------------------------- metrics
def test_mean_pair_cosine_matches_a_loop_and_handles_zero_rows():
    rng = np.random.default_rng(0)
    x, y = rng.normal(size=(7, 5)), rng.normal(size=(7, 5))
    assert mean_pair_cosine(x, y) == pytest.approx(np.mean([_cos(x[i], y[i]) for i in range(7)]), abs=1e-14)
    assert mean_pair_cosine(x, x) == pytest.approx(1.0)
    assert mean_pair_cosine(x, -2 * x) == pytest.approx(-1.0)
    x[0] = 0.0
    assert pair_cosines(x, y)[0] == 0.0
    assert np.isnan(mean_pair_cosine(np.zeros((0, 3)), np.zeros((0, 3))))
    with pytest.raises(ValueError):
        mean_pair_cosine(x, y[:3])
    # float32 input is computed in float64
    assert isinstance(mean_pair_cosine(x.astype(np.float32), y.astype(np.float32)), float)


def test_masked_intra_similarity_equals_the_per_sentence_numpy_version():
    """The batched torch form: every row's tokens under the mask, as intra_similarity of that row's
    float32 vectors in float64 (same arithmetic, another summation order: 1e-14); NaN for an empty row;
    a zero vector has cosine 0; leading (layer) dimensions are kept."""
    rng = np.random.default_rng(4)
    h = torch.from_numpy(rng.normal(size=(3, 5, 7, 16)).astype(np.float32) + 0.3)  # [layers, B, T, D]
    h[:, 1, 2] = 0.0
    mask = torch.from_numpy(rng.random((5, 7)) < 0.6)
    mask[3] = False
    mask[1, 2] = True
    mask[4] = False
    mask[4, 6] = True
    got = masked_intra_similarity(h, mask).numpy()
    assert got.shape == (3, 5) and got.dtype == np.float64
    for b in range(5):
        pos = np.nonzero(mask[b].numpy())[0]
        for l in range(3):
            if pos.size == 0:
                assert np.isnan(got[l, b])
            else:
                assert got[l, b] == pytest.approx(intra_similarity(h[l, b, pos].numpy()), abs=1e-14)


@pytest.mark.parametrize("n", [2, 3, 9])
def test_offdiagonal_cosine_and_intra_similarity_match_loops(n):
    rng = np.random.default_rng(n)
    x = rng.normal(size=(n, 6)) + 0.5
    pairs = [_cos(x[i], x[j]) for i, j in itertools.combinations(range(n), 2)]
    assert mean_offdiagonal_cosine(x) == pytest.approx(np.mean(pairs), abs=1e-13)
    mean = x.mean(0)
    assert intra_similarity(x) == pytest.approx(np.mean([_cos(v, mean) for v in x]), abs=1e-13)
    # leading batch dimensions: one value per stack
    stack = np.stack([x, 3 * x[::-1], rng.normal(size=(n, 6))])
    np.testing.assert_allclose(mean_offdiagonal_cosine(stack), [mean_offdiagonal_cosine(s) for s in stack], atol=1e-13)
    np.testing.assert_allclose(intra_similarity(stack), [intra_similarity(s) for s in stack], atol=1e-13)
    assert np.isnan(mean_offdiagonal_cosine(x[:1]))


@pytest.mark.parametrize("n,d", [(5, 8), (30, 4), (12, 12)])
def test_mev_matches_sklearn_pca_centred_and_svd_uncentred(n, d):
    x = np.random.default_rng(n * d).normal(size=(n, d)) * np.linspace(3, 0.5, d) + 1.0
    assert max_explainable_variance(x) == pytest.approx(PCA(1).fit(x).explained_variance_ratio_[0], abs=1e-12)
    s = np.linalg.svd(x, compute_uv=False)
    assert max_explainable_variance(x, center=False) == pytest.approx(s[0] ** 2 / np.sum(s**2), abs=1e-12)
    stack = np.stack([x, x * 2 + 5])
    np.testing.assert_allclose(max_explainable_variance(stack), [max_explainable_variance(s_) for s_ in stack], atol=1e-12)


def test_mev_known_cases():
    # Centred variance 4.5 along x, 0.5 along y: the first component explains 0.9.
    x = np.array([[3.0, 0.0], [-3.0, 0.0], [0.0, 1.0], [0.0, -1.0]])
    assert max_explainable_variance(x) == pytest.approx(0.9)
    assert max_explainable_variance(x, center=False) == pytest.approx(0.9)  # already centred
    # Rank 1 (positive multiples of one vector): MEV 1 both ways; self-similarity 1.
    v = np.random.default_rng(1).normal(size=7)
    r1 = np.array([[1.0], [2.5], [0.3], [4.0]]) * v
    assert max_explainable_variance(r1) == pytest.approx(1.0)
    assert max_explainable_variance(r1, center=False) == pytest.approx(1.0)
    assert mean_offdiagonal_cosine(r1) == pytest.approx(1.0)
    # Identical vectors: self-similarity 1, MEV 1 (no variance: a static vector explains everything).
    same = np.tile(v, (6, 1))
    assert mean_offdiagonal_cosine(same) == pytest.approx(1.0)
    assert max_explainable_variance(same) == 1.0 and max_explainable_variance(same, center=False) == pytest.approx(1.0)
    assert max_explainable_variance(np.full((5, 3), 0.1)) == 1.0


def test_isotropic_gaussian_vectors_have_anisotropy_near_zero():
    rng = np.random.default_rng(7)
    x, y = rng.normal(size=(4000, 128)), rng.normal(size=(4000, 128))
    assert abs(mean_pair_cosine(x, y)) < 0.01  # sd of one cosine ~ 1/sqrt(128); mean of 4000: 0.0014
    assert abs(mean_offdiagonal_cosine(x[:500])) < 0.01
    # A common offset makes the space anisotropic.
    assert mean_pair_cosine(x + 3, y + 3) > 0.9
    # Isotropic: the first PC explains about 1/d of the variance, far from 1.
    assert max_explainable_variance(x) < 3 / 128 + 0.02


def test_chain_pairs():
    a, b = chain_pairs(4)
    assert list(zip(a, b)) == [(0, 1), (1, 2), (2, 3), (3, 0)]
    assert list(zip(*chain_pairs(2))) == [(0, 1)]
    assert len(chain_pairs(1)[0]) == 0


# ------------------------------------------------------------------------- analysis on fake batches
def _fake_batch(indices, sentences, vec, num_layers=2):
    """A PairBatch of sentences of token ids (one word per token, [CLS]=1 and [SEP]=2 around them).

    ``vec(model, layer, example, position, token_id)`` gives each hidden state.
    """
    items, width = [], max(len(s) for s in sentences) + 2
    for i, s in zip(indices, sentences):
        n = len(s)
        items.append(EncodedExample(
            index=i, input_ids=np.array([1, *s, 2]), token_type_ids=np.zeros(n + 2, int),
            special=np.array([True] + [False] * n + [True]),
            word_ids=np.array([-1, *range(n), -1]), segment=np.array([-1] + [0] * n + [-1])))
    b = len(items)
    ids = torch.zeros(b, width, dtype=torch.long)
    mask = torch.zeros(b, width, dtype=torch.bool)
    for r, it in enumerate(items):
        ids[r, : len(it)] = torch.from_numpy(it.input_ids)
        mask[r, : len(it)] = True
    content = mask.clone()
    content[:, 0] = False
    for r, it in enumerate(items):
        content[r, len(it) - 1] = False
    caps = []
    for m in range(2):
        hs = []
        for layer in range(num_layers + 1):
            h = torch.zeros(b, width, 16)
            for r, it in enumerate(items):
                for p, t in enumerate(it.input_ids):
                    h[r, p] = torch.as_tensor(vec(m, layer, it.index, p, int(t)), dtype=torch.float32)
            hs.append(h)
        caps.append(Captured(hidden_states=hs))
    return PairBatch(items, ids, mask, content, torch.tensor([len(it) for it in items]), caps[0], caps[1])


def _sentences(n, seed=0, vocab=range(10, 22), lo=4, hi=9):
    rng = np.random.default_rng(seed)
    return [list(rng.choice(list(vocab), size=int(rng.integers(lo, hi)), replace=False)) for _ in range(n)]


def _metric(table, metric, model="base"):
    return by_layer(table, metric)[model].to_numpy()


def test_static_vectors_give_self_similarity_and_mev_one():
    """A vector that depends on the word only (a static embedding): self-similarity 1, MEV 1, adjusted > 0."""
    emb = {t: np.random.default_rng(t).normal(size=16) for t in range(30)}
    sents = _sentences(40)
    g = Geometry(2, n_pairs=20, word_sample=WordSample(min_contexts=3))
    for s in range(0, 40, 8):
        g.update(_fake_batch(range(s, s + 8), sents[s:s + 8], lambda m, l, e, p, t: emb[t]))
    table = g.compute().table
    for model in ("base", "tuned"):
        np.testing.assert_allclose(_metric(table, "self_similarity", model), 1.0, atol=1e-6)
        np.testing.assert_allclose(_metric(table, "mev", model), 1.0)
    assert (table[table.metric == "self_similarity"].n == 12).all()  # all 12 word types qualify
    assert (_metric(table, "self_similarity_adjusted") > 0.5).all()


def test_rank_one_space_is_fully_anisotropic():
    """Every token a positive multiple of one vector: all cosines 1, MEV 1 (centred or not)."""
    v = np.random.default_rng(3).normal(size=16)
    sents = _sentences(30, seed=1)
    for center in (True, False):
        g = Geometry(2, n_pairs=10, mev_center=center, baseline_pairs="all", word_sample=WordSample(min_contexts=3))
        g.update(_fake_batch(range(30), sents, lambda m, l, e, p, t: (1 + (e * 7 + p * 3 + t) % 5) * v))
        table = g.compute().table
        for metric in ("anisotropy", "self_similarity", "intra_similarity", "mev", "mev_baseline"):
            np.testing.assert_allclose(_metric(table, metric), 1.0, atol=1e-6, err_msg=metric)
        np.testing.assert_allclose(_metric(table, "self_similarity_adjusted"), 0.0, atol=1e-6)


def test_isotropic_gaussian_hidden_states_give_anisotropy_near_zero():
    def vec(m, l, e, p, t):
        return np.random.default_rng([e, p, l, m]).normal(size=16)

    sents = _sentences(400, seed=2, lo=3, hi=5)
    g = Geometry(2, n_pairs=300, word_sample=WordSample(min_contexts=3))
    for s in range(0, 400, 100):
        g.update(_fake_batch(range(s, s + 100), sents[s:s + 100], vec))
    table = g.compute().table
    aniso = table[table.metric == "anisotropy"]
    assert (aniso.n == 300).all()
    assert np.abs(aniso.value).max() < 0.05  # sd of the mean of 300 cosines in 16-D: 0.014
    # Random vectors per occurrence: words are no more self-similar than random pairs.
    assert np.abs(_metric(table, "self_similarity_adjusted")).max() < 0.05


# --------------------------------------------------------------------------- analysis on tiny BERTs
WORDS = ["the", "cat", "dogs", "sat", "on", "mat", "good", "movies", "slowly", "reading", "was", "very", "a", "big", "."]


def _corpus(n=24, seed=0):
    rng = np.random.default_rng(seed)
    return Corpus.from_list([" ".join(rng.choice(WORDS, size=int(rng.integers(4, 9)), replace=False)) for _ in range(n)])


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def planted(planted_pair):
    return ModelPair.load(*map(str, planted_pair))


@pytest.fixture(scope="module")
def encoded(planted):
    return encode_corpus(_corpus(), planted.tokenizer)


def _run(pair, enc, batch_size=5, **kw):
    kw.setdefault("tokenizer", pair.tokenizer)
    g = Geometry(pair.num_layers, **kw)
    run_analyses(pair, enc, [g], batch_size=batch_size)
    return g


def _reference_states(pair, corpus):
    """Per sentence, unpadded, one at a time: hidden states [2, L + 1, T, D] (float64) and the encoding."""
    out = []
    for ex in corpus:
        enc = pair.tokenizer(ex.text, return_tensors="pt")
        with torch.inference_mode():
            hs = [m.model(**enc, output_hidden_states=True).hidden_states for m in (pair.base, pair.tuned)]
        out.append((np.stack([np.stack([h[0].double().numpy() for h in hm]) for hm in hs]), enc))
    return out


def test_every_metric_equals_a_slow_per_sentence_computation(planted, encoded):
    corpus = _corpus()
    g = _run(planted, encoded, n_pairs=10, word_sample=WordSample(min_contexts=5, max_contexts=1000, max_words=1000))
    table = g.compute().table
    ref = _reference_states(planted, corpus)
    n_layers = planted.num_layers + 1
    # intra-sentence similarity: content tokens of every sentence, cosine with their mean
    intra = np.mean([[[np.mean([_cos(h[m, l, t], h[m, l, 1:-1].mean(0)) for t in range(1, h.shape[2] - 1)])
                       for l in range(n_layers)] for m in range(2)] for h, _ in ref], axis=0)
    # words: mean of pieces, lower-cased form, every sentence (no word repeats within a sentence here)
    occ: dict[str, list] = {}
    for h, enc in ref:
        wid = enc.word_ids()
        toks = planted.tokenizer.convert_ids_to_tokens(enc["input_ids"][0])
        for w in sorted({i for i in wid if i is not None}):
            pos = [t for t, i in enumerate(wid) if i == w]
            form = "".join(toks[t].removeprefix("##") for t in pos)
            occ.setdefault(form, []).append(h[:, :, pos].mean(2))
    words = sorted(f for f, v in occ.items() if len(v) >= 5)
    assert sorted(g.selected_words()) == words and "slowly" in words  # "slowly" = slow ##ly
    selfsim = np.zeros((2, n_layers))
    mev = np.zeros((2, n_layers))
    for f in words:
        v = np.stack(occ[f])  # [m, 2, L + 1, D]
        for m, l in itertools.product(range(2), range(n_layers)):
            selfsim[m, l] += np.mean([_cos(v[i, m, l], v[j, m, l]) for i, j in itertools.combinations(range(len(v)), 2)])
            mev[m, l] += PCA(1).fit(v[:, m, l]).explained_variance_ratio_[0]
    selfsim /= len(words)
    mev /= len(words)
    # anisotropy: the recorded sample (one token per sampled sentence), chained in sample order
    sample = [ref[e][0][:, :, p] for e, p in zip(g.base_examples, g.base_positions)]
    aniso = np.mean([[[_cos(sample[i][m, l], sample[(i + 1) % 10][m, l]) for i in range(10)]
                      for l in range(n_layers)] for m in range(2)], axis=2)
    mev_base = np.array([[PCA(1).fit(np.stack([s[m, l] for s in sample])).explained_variance_ratio_[0]
                          for l in range(n_layers)] for m in range(2)])
    for m, model in enumerate(("base", "tuned")):
        np.testing.assert_allclose(_metric(table, "intra_similarity", model), intra[m], atol=1e-5)
        np.testing.assert_allclose(_metric(table, "anisotropy", model), aniso[m], atol=1e-5)
        np.testing.assert_allclose(_metric(table, "mev_baseline", model), mev_base[m], atol=1e-5)
        # words are stored in float16: agreement to ~1e-3
        np.testing.assert_allclose(_metric(table, "self_similarity", model), selfsim[m], atol=2e-3)
        np.testing.assert_allclose(_metric(table, "mev", model), mev[m], atol=2e-3)
        np.testing.assert_allclose(_metric(table, "self_similarity_adjusted", model), selfsim[m] - aniso[m], atol=2e-3)
        np.testing.assert_allclose(_metric(table, "intra_similarity_adjusted", model), intra[m] - aniso[m], atol=1e-5)
        np.testing.assert_allclose(_metric(table, "mev_adjusted", model), mev[m] - mev_base[m], atol=2e-3)
    # the planted change is in layer 2 only: layers 0 and 1 identical, layer 2 differs
    for metric in ("anisotropy", "intra_similarity", "self_similarity"):
        b, t = _metric(table, metric, "base"), _metric(table, metric, "tuned")
        np.testing.assert_allclose(b[:2], t[:2], atol=1e-6)
        assert abs(b[2] - t[2]) > 1e-6


def test_stored_word_vectors_are_the_mean_of_their_pieces(planted, encoded):
    """Each kept occurrence is the float16 of its pieces' mean: within one float16 rounding step of the
    float64 mean of a per-sentence forward (float32 sums of a few pieces sit far inside that step)."""
    corpus = _corpus()
    g = _run(planted, encoded, n_pairs=10, word_sample=WordSample(min_contexts=2, max_contexts=1000, max_words=1000))
    ref = _reference_states(planted, corpus)
    checked, pieces_seen = 0, set()
    for form, word in g.words.items():
        if word.vectors is None:
            continue
        for example, stored in zip(word.occ_examples, word.vectors):
            h, enc = ref[int(example)]
            wid = enc.word_ids()
            toks = planted.tokenizer.convert_ids_to_tokens(enc["input_ids"][0])
            groups = [[t for t, i in enumerate(wid) if i == w] for w in sorted({i for i in wid if i is not None})]
            found = [pos for pos in groups if "".join(toks[t].removeprefix("##") for t in pos) == form]
            assert len(found) == 1  # no word repeats within a sentence here
            mean = h[:, :, found[0]].mean(2)  # [2, L + 1, D] float64
            step = np.spacing(np.abs(mean).astype(np.float16)).astype(np.float64)
            assert np.all(np.abs(stored.astype(np.float64) - mean) <= step + 1e-6), form
            checked += 1
            pieces_seen.add(len(found[0]))
    assert checked > 50 and max(pieces_seen) >= 2


def test_mev_fits_run_on_one_blas_thread_and_restore_it(planted, encoded, monkeypatch):
    """Every MEV fit of compute() (the baseline's, one per model and layer, and each word's) runs with BLAS on one
    thread; the caller's setting is back afterwards, and the table equals the one computed with BLAS left alone to
    rounding."""
    from threadpoolctl import threadpool_info, threadpool_limits

    import bertology.analyses.geometry_fit as geometry_module  # where the fits are

    def blas_threads():
        return {lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"}

    free = _run(planted, encoded, n_pairs=10, word_sample=WordSample(min_contexts=2)).compute().table
    g = _run(planted, encoded, n_pairs=10, word_sample=WordSample(min_contexts=2))
    seen = []
    baseline = 2 * (planted.num_layers + 1)  # one fit per model and layer
    real = geometry_module.max_explainable_variance
    monkeypatch.setattr(geometry_module, "max_explainable_variance", lambda x, **kw: seen.append(blas_threads()) or real(x, **kw))
    with threadpool_limits(2, user_api="blas"):
        table = g.compute().table
        assert blas_threads() == {2}
    assert len(seen) == baseline + len(g.selected_words()) and all(s == {1} for s in seen)
    pd.testing.assert_frame_equal(table, free, rtol=1e-12, atol=1e-12)
    # word_table() reuses compute()'s fits; a later merge makes them again
    words = g.word_table().table
    assert len(seen) == baseline + len(g.selected_words()) and len(words) == len(g.selected_words()) * 2 * (planted.num_layers + 1)
    g.merge(Geometry(planted.num_layers, tokenizer=planted.tokenizer, n_pairs=10, word_sample=WordSample(min_contexts=2)))
    g.word_table()
    assert len(seen) == 2 * (baseline + len(g.selected_words()))


def test_baseline_sample_is_the_documented_bottom_k_and_all_pairs_option(planted, encoded):
    g = _run(planted, encoded, n_pairs=6, seed=3)
    idx = np.array([it.index for it in encoded.items])
    keys = example_keys(3 ^ _SALT_BASELINE, idx)
    np.testing.assert_array_equal(g.base_examples, idx[np.lexsort((idx, keys))][:6])
    items = {it.index: it for it in encoded.items}
    assert all(not items[e].special[p] for e, p in zip(g.base_examples, g.base_positions))
    table = g.compute().table
    assert (table[table.metric == "anisotropy"].n == 6).all()
    a = _run(planted, encoded, n_pairs=6, seed=3, baseline_pairs="all")
    v = a.base_vectors.astype(np.float64)  # [k, 2, L + 1, D]
    slow = np.mean([_cos(v[i, 0, 1], v[j, 0, 1]) for i, j in itertools.combinations(range(6), 2)])
    at = a.compute().table
    assert by_layer(at, "anisotropy")["base"][1] == pytest.approx(slow, abs=1e-12)
    assert (at[at.metric == "anisotropy"].n == 15).all()
    # the special-token option: [CLS]/[SEP] may be drawn, and change the intra-sentence similarity
    s = _run(planted, encoded, n_pairs=24, include_special=True)
    assert any(items[e].special[p] for e, p in zip(s.base_examples, s.base_positions))
    assert not np.allclose(_metric(s.compute().table, "intra_similarity"), _metric(table, "intra_similarity"))


def _same(a: Geometry, b: Geometry, atol=1e-6):
    np.testing.assert_array_equal(a.base_examples, b.base_examples)
    np.testing.assert_array_equal(a.base_positions, b.base_positions)
    assert a.selected_words() == b.selected_words()
    for f in a.selected_words():
        np.testing.assert_array_equal(a.words[f].occ_examples, b.words[f].occ_examples)
        assert a.words[f].count == b.words[f].count
    ta, tb = a.compute().table, b.compute().table
    pd.testing.assert_frame_equal(ta.drop(columns=["value", "sd"]), tb.drop(columns=["value", "sd"]))
    np.testing.assert_allclose(ta.value, tb.value, atol=atol)


def test_batch_size_does_not_change_the_sample_or_the_numbers(planted, encoded):
    kw = dict(n_pairs=7, seed=1, word_sample=WordSample(max_words=4, max_contexts=6))
    runs = [_run(planted, encoded, batch_size=bs, **kw) for bs in (2, 7, 24)]
    assert len(runs[0].selected_words()) == 4
    for r in runs[1:]:
        _same(runs[0], r, atol=2e-3)  # float16 words; padding changes float32 rounding
    # the words are those with the smallest keys among the qualifying ones
    g = _run(planted, encoded, n_pairs=7, seed=1, word_sample=WordSample(max_words=1000, max_contexts=1000))
    qual = g.selected_words()
    assert runs[0].selected_words() == sorted(qual, key=lambda f: word_key(1, f))[:4]
    # a word's kept occurrences are at most max_contexts, but its sentence count is exact
    f = runs[0].selected_words()[0]
    assert len(runs[0].words[f].occ_examples) == min(6, g.words[f].count) and runs[0].words[f].count == g.words[f].count
    # memory: words that can no longer be selected are dropped
    assert len(runs[0].words) < len(g.words)
    assert _run(planted, encoded, seed=2, **{k: v for k, v in kw.items() if k != "seed"}).selected_words() != runs[0].selected_words()


def test_candidate_cap_restricts_words_to_a_hashed_subset_of_the_vocabulary(planted, encoded):
    full = _run(planted, encoded, n_pairs=7, seed=1, word_sample=WordSample(max_words=1000, max_contexts=1000, max_candidates=None))
    forms = sorted(full.words, key=lambda f: word_key(1, f))  # every word form of the corpus
    kw = dict(n_pairs=7, seed=1, word_sample=WordSample(max_words=3, max_candidates=6, max_contexts=6))
    runs = [_run(planted, encoded, batch_size=bs, **kw) for bs in (3, 24)]
    qual = [f for f in forms[:6] if full.words[f].count >= 5]
    assert runs[0].selected_words() == qual[:3]
    _same(runs[0], runs[1], atol=2e-3)
    assert len(runs[0].words) <= 6
    cut = 9
    shards = [EncodedCorpus(encoded.items[:cut], 128, "skip", cut),
              EncodedCorpus(encoded.items[cut:], 128, "skip", len(encoded.items) - cut)]
    _same(runs[0], _run(planted, shards[0], **kw).merge(_run(planted, shards[1], **kw)), atol=2e-3)
    with pytest.raises(ValueError):
        Geometry(2, word_sample=WordSample(max_words=10, max_candidates=5))


def test_merge_of_shards_equals_the_whole_corpus(planted, encoded):
    kw = dict(n_pairs=7, seed=1, word_sample=WordSample(max_words=4, max_contexts=6))
    whole = _run(planted, encoded, **kw)
    for cut in (5, 12, 19):
        shards = [EncodedCorpus(encoded.items[:cut], 128, "skip", cut),
                  EncodedCorpus(encoded.items[cut:], 128, "skip", len(encoded.items) - cut)]
        parts = [_run(planted, s, **kw) for s in shards]
        merged = parts[0].merge(parts[1])
        _same(whole, merged, atol=2e-3)
        assert merged.n_seen == whole.n_seen == merged.n_sentences == len(encoded.items)
    with pytest.raises(ValueError):
        whole.merge(Geometry(planted.num_layers, n_pairs=8))
    with pytest.raises(ValueError, match="share examples"):
        _run(planted, encoded, **kw).merge(_run(planted, encoded, **kw))


def test_identical_models_give_identical_rows(identical_pair):
    pair = ModelPair.load(*map(str, identical_pair))
    g = _run(pair, encode_corpus(_corpus(), pair.tokenizer), n_pairs=8)
    table = g.compute().table
    base = table[table.model == "base"].reset_index(drop=True)
    tuned = table[table.model == "tuned"].reset_index(drop=True)
    np.testing.assert_array_equal(base.value.to_numpy(), tuned.value.to_numpy())
    assert set(METRICS) == set(table.metric)
    assert {"model", "layer", "metric", "value", "n", "adjusted", "sd", "unit"} <= set(table.columns)
    assert sorted(table.layer.unique()) == [0, 1, 2]
    assert table[table.metric.str.endswith("_adjusted")].adjusted.all()
    words = g.word_table().table
    assert {"model", "layer", "word", "n_contexts", "self_similarity", "mev"} <= set(words.columns)
    assert len(words) == len(g.selected_words()) * 2 * 3


def test_sentence_pairs_and_tiny_corpora(planted):
    pairs = Corpus.from_list(["the cat sat .", "a dog ran .", "the movie was good"],
                             pairs=["the dog sat .", "the cat ran", "the film was bad ."])
    g = _run(planted, encode_corpus(pairs, planted.tokenizer), n_pairs=3, word_sample=WordSample(min_contexts=2))
    # words of both texts count, once per example: "the" is in 3 examples (5 times), "sat" in 1
    assert g.words["the"].count == 3 and g.words["sat"].count == 1 and g.words["dog"].count == 2
    table = g.compute().table
    assert (table[table.metric == "intra_similarity"].n == 3).all()
    one = _run(planted, encode_corpus(Corpus.from_list(["the cat sat ."]), planted.tokenizer))
    t1 = one.compute().table
    assert t1[t1.metric == "anisotropy"].value.isna().all() and (t1[t1.metric == "anisotropy"].n == 0).all()
    assert t1[t1.metric == "self_similarity"].value.isna().all()


def test_errors_and_params():
    with pytest.raises(ValueError):
        Geometry(2, n_pairs=1)
    with pytest.raises(ValueError):
        Geometry(2, word_sample=WordSample(min_contexts=1))
    with pytest.raises(ValueError):
        Geometry(2, word_sample=WordSample(min_contexts=5, max_contexts=4))
    with pytest.raises(ValueError):
        Geometry(2, baseline_pairs="random")
    with pytest.raises(ValueError, match="no tokens"):
        Geometry(2).compute()
    p = Geometry(2, seed=4, n_pairs=50, include_special=True, mev_center=False).params()
    assert (p["seed"], p["n_pairs"], p["include_special"], p["mev_center"]) == (4, 50, True, False)
    assert "float16" in p["storage"]


def test_figure_has_one_panel_per_metric_and_both_models(planted, encoded):
    table = _run(planted, encoded, n_pairs=8).compute().table
    fig = geometry_figure(table)
    assert isinstance(fig, Figure)
    visible = [ax for ax in fig.axes if ax.get_visible()]
    assert len(visible) == 8
    assert all(len(ax.get_lines()) >= 2 for ax in visible)
    fig = geometry_figure(table, metrics=["anisotropy", "mev"], band=True)
    assert len([ax for ax in fig.axes if ax.get_visible()]) == 2
    with pytest.raises(ValueError):
        geometry_figure(table, metrics=["nope"])


def test_rejected_occurrences_leave_the_word_store_as_adding_them_would():
    """_Word.rejects is exact: skipping the occurrences it rejects keeps the same bottom-k (keys with ties and
    examples out of order included) as adding every one, and the same count."""
    from bertology.analyses.geometry_sample import Word as _Word

    rng = np.random.default_rng(7)
    cap = 4
    keys = rng.integers(0, 6, 60).astype(np.uint64)  # few distinct keys: ties decided by the example
    examples = rng.permutation(60)
    every = _Word(np.uint64(0), 0, np.zeros(0, np.uint64), np.zeros(0, np.int64), None)
    skipping = _Word(np.uint64(0), 0, np.zeros(0, np.uint64), np.zeros(0, np.int64), None)
    rejected = 0
    for k, e in zip(keys, examples):
        v = np.full((1, 2, 1, 3), e, np.float16)
        every.add(np.array([k]), np.array([e]), v, 1, cap)
        if skipping.rejects(k, int(e), cap):
            skipping.count += 1
            rejected += 1
        else:
            skipping.add(np.array([k]), np.array([e]), v, 1, cap)
    assert rejected > 30  # the shortcut is taken most of the time
    assert every.count == skipping.count == 60
    np.testing.assert_array_equal(every.occ_keys, skipping.occ_keys)
    np.testing.assert_array_equal(every.occ_examples, skipping.occ_examples)
    np.testing.assert_array_equal(every.vectors, skipping.vectors)


def test_float16_storage_rounds_as_numpy_does():
    """geometry.float16 (torch's conversion) gives NumPy astype's bits: every 4099th float32 bit pattern that is
    not NaN (overflow to inf, subnormals, signed zeros included), and NaN stays NaN; float64 input goes NumPy's way."""
    from bertology.analyses.geometry_sample import float16

    bits = np.arange(0, 2**32, 4099, dtype=np.uint64).astype(np.uint32).view(np.float32)
    bits = np.concatenate([bits, np.array([65519.99, 65520.0, -65520.0, 2.0**-25, 2.0**-24, -0.0, 0.0], np.float32)])
    finite = bits[~np.isnan(bits)]
    with np.errstate(over="ignore"):
        expected = finite.astype(np.float16)
    np.testing.assert_array_equal(float16(finite).view(np.uint16), expected.view(np.uint16))
    assert np.isnan(float16(bits[np.isnan(bits)])).all()
    block = np.random.default_rng(0).standard_normal((3, 2, 4, 5)).astype(np.float32)
    assert float16(block).shape == block.shape and float16(block).dtype == np.float16
    wide = np.array([1.0 + 2.0**-11 + 2.0**-40])  # float64 just above a float16 tie: rounds up directly, down via float32
    assert float16(wide)[0] == wide.astype(np.float16)[0] != wide.astype(np.float32).astype(np.float16)[0]
