"""PCA views (van Aken et al. 2019): fits against sklearn on independently extracted vectors, the hashed
example sample (exact under batching and merge), token categories and labels, the grid figure."""
import numpy as np
import pytest
import torch
from matplotlib.figure import Figure
from sklearn.decomposition import PCA

from bertology.activations.extract import run_analyses
from bertology.analyses.head_map import example_keys
from bertology.analyses.pca_views import _SALT, COLUMNS, PCAViews
from bertology.data.corpus import Corpus, Example
from bertology.data.encode import EncodedCorpus, encode_corpus
from bertology.models.pair import ModelPair
from bertology.testing import SENTENCES
from bertology.viz.geometry import pca_grid

LABELS = ["pos", "neg", "neg", "pos", "neg", "neg", "pos", "pos", "neg", "pos"]


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def planted(planted_pair):
    return ModelPair.load(*map(str, planted_pair))


@pytest.fixture(scope="module")
def corpus():
    return Corpus.from_list(SENTENCES, labels=LABELS)


@pytest.fixture(scope="module")
def encoded(planted, corpus):
    return encode_corpus(corpus, planted.tokenizer)


def _run(pair, enc, corpus=None, batch_size=4, **kw):
    kw.setdefault("tokenizer", pair.tokenizer)
    a = PCAViews(pair.num_layers, corpus=corpus, **kw)
    run_analyses(pair, enc, [a], batch_size=batch_size)
    return a


def _reference(pair, corpus, indices, layer, special=True):
    """Per sentence, unpadded: each model's token vectors at ``layer``, concatenated in (example, position) order."""
    xs = [[], []]
    for i in sorted(indices):
        enc = pair.tokenizer(corpus[i].text, return_tensors="pt")
        with torch.inference_mode():
            for m, model in enumerate((pair.base, pair.tuned)):
                h = model.model(**enc, output_hidden_states=True).hidden_states[layer][0].double().numpy()
                xs[m].append(h if special else h[1:-1])
    return [np.concatenate(x) for x in xs]


def _rows(table, model, layer, fit):
    return table[(table.model == model) & (table.layer == layer) & (table.fit == fit)]


def test_shared_fit_equals_sklearn_on_the_concatenation_and_per_layer_fits_each_model(planted, corpus, encoded):
    a = _run(planted, encoded, corpus, examples=4, seed=1)
    table = a.compute().table
    assert list(table.columns[: len(COLUMNS)]) == COLUMNS
    for layer in range(planted.num_layers + 1):
        xb, xt = _reference(planted, corpus, a.sample, layer)
        shared = PCA(2, svd_solver="full").fit(np.concatenate([xb, xt]))
        for model, x in (("base", xb), ("tuned", xt)):
            rows = _rows(table, model, layer, "shared")
            np.testing.assert_allclose(rows[["x", "y"]].to_numpy(), shared.transform(x), atol=1e-4)
            assert rows.explained_variance.iloc[0] == pytest.approx(shared.explained_variance_ratio_.sum(), abs=1e-5)
            own = PCA(2, svd_solver="full").fit(x)
            rows = _rows(table, model, layer, "per_layer")
            np.testing.assert_allclose(rows[["x", "y"]].to_numpy(), own.transform(x), atol=1e-4)
            np.testing.assert_allclose(rows[["explained_variance_x", "explained_variance_y"]].iloc[0],
                                       own.explained_variance_ratio_, atol=1e-5)
    # one row per model x layer x fit x token
    n_tokens = sum(len(encoded.items[[it.index for it in encoded.items].index(i)]) for i in a.sample)
    assert len(table) == 2 * 3 * 2 * n_tokens and (table.n_tokens == n_tokens).all()
    # layers 0 and 1 are unchanged by the planted head (layer 2): shared coordinates coincide there only
    for layer, same in ((0, True), (1, True), (2, False)):
        b, t = _rows(table, "base", layer, "shared"), _rows(table, "tuned", layer, "shared")
        assert np.allclose(b[["x", "y"]].to_numpy(), t[["x", "y"]].to_numpy(), atol=1e-5) == same


def test_sample_is_the_hashed_bottom_k_and_batching_does_not_change_it(planted, corpus, encoded):
    idx = np.array([it.index for it in encoded.items])
    keys = example_keys(5 ^ _SALT, idx)
    expected = sorted(idx[np.lexsort((idx, keys))][:3].tolist())
    runs = [_run(planted, encoded, corpus, batch_size=bs, examples=3, seed=5) for bs in (1, 4, 10)]
    tables = [r.compute().table for r in runs]
    for r, t in zip(runs, tables):
        assert r.sample == expected and len(r.kept) == 3  # only the chosen examples are kept
        assert (t.drop(columns=["x", "y", "explained_variance", "explained_variance_x", "explained_variance_y"])
                .equals(tables[0].drop(columns=["x", "y", "explained_variance", "explained_variance_x",
                                                "explained_variance_y"])))
        np.testing.assert_allclose(t[["x", "y"]].to_numpy(), tables[0][["x", "y"]].to_numpy(), atol=1e-4)
    assert _run(planted, encoded, corpus, examples=3, seed=6).sample != expected


def test_merge_of_shards_equals_the_whole_corpus(planted, corpus, encoded):
    whole = _run(planted, encoded, corpus, examples=4, seed=2)
    shards = [EncodedCorpus(encoded.items[:4], 128, "skip", 4), EncodedCorpus(encoded.items[4:], 128, "skip", 6)]
    merged = _run(planted, shards[0], corpus, examples=4, seed=2).merge(_run(planted, shards[1], corpus, examples=4, seed=2))
    assert merged.sample == whole.sample and merged.n_seen == whole.n_seen == 10
    np.testing.assert_allclose(merged.compute().table[["x", "y"]].to_numpy(), whole.compute().table[["x", "y"]].to_numpy(),
                               atol=1e-4)
    with pytest.raises(ValueError):
        whole.merge(PCAViews(planted.num_layers, examples=5, seed=2))
    with pytest.raises(ValueError, match="share examples"):
        _run(planted, encoded, examples=2).merge(_run(planted, encoded, examples=2))


def test_chosen_examples_layers_and_special_tokens(planted, corpus, encoded):
    a = _run(planted, encoded, corpus, examples=[7, 2], layers=[2], fits=["shared"], include_special=False)
    table = a.compute().table
    assert a.sample == [2, 7] and set(table.example) == {2, 7}
    assert set(table.layer) == {2} and set(table.fit) == {"shared"}
    assert "special" not in set(table.category) and "[CLS]" not in set(table.token)
    xb, xt = _reference(planted, corpus, [2, 7], 2, special=False)
    pca = PCA(2, svd_solver="full").fit(np.concatenate([xb, xt]))
    np.testing.assert_allclose(_rows(table, "base", 2, "shared")[["x", "y"]].to_numpy(), pca.transform(xb), atol=1e-4)
    # the labels are the examples'
    assert dict(zip(table.example, table.label)) == {2: LABELS[2], 7: LABELS[7]}


def test_categories_special_punct_word_and_part_of_speech(planted, corpus, encoded):
    table = _run(planted, encoded, corpus, examples=[1]).compute().table
    tok = _rows(table, "base", 0, "shared").set_index("token").category
    assert tok["[CLS]"] == "special" and tok["[SEP]"] == "special"
    assert tok["."] == "punct" and tok[","] == "punct" and tok["plot"] == "word"
    # an annotated corpus: coarse POS per word, inherited by every piece
    ex = Example("the dogs ran slowly .", words=("the", "dogs", "ran", "slowly", "."),
                 upos=("DET", "NOUN", "VERB", "ADV", "PUNCT"), heads=(2, 3, 0, 3, 3),
                 deprels=("det", "nsubj", "root", "advmod", "punct"))
    ann = Corpus([ex])
    t = _run(planted, encode_corpus(ann, planted.tokenizer), ann).compute().table
    rows = _rows(t, "base", 0, "shared")
    assert list(zip(rows.token, rows.category)) == [
        ("[CLS]", "special"), ("the", "det"), ("dog", "noun"), ("##s", "noun"), ("ran", "verb"),
        ("slow", "adv"), ("##ly", "adv"), (".", "punct"), ("[SEP]", "special")]
    assert rows.label.isna().all()


def test_errors_and_params():
    with pytest.raises(ValueError):
        PCAViews(2, examples=0)
    with pytest.raises(ValueError):
        PCAViews(2, fits=["tsne"])
    with pytest.raises(ValueError):
        PCAViews(2, layers=[3])
    with pytest.raises(ValueError, match="at least 3 tokens"):
        PCAViews(2).compute()
    p = PCAViews(2, examples=[3, 1, 3], seed=9).params()
    assert p["examples"] == [1, 3] and p["n_examples"] == 2 and p["seed"] == 9


def test_pca_grid_is_layers_by_models_with_a_legend(planted, corpus, encoded):
    table = _run(planted, encoded, corpus, examples=3).compute().table
    fig = pca_grid(table, color_by="category")
    assert isinstance(fig, Figure)
    assert len(fig.axes) == 3 * 2
    legend = fig.legends[0]
    assert {t.get_text() for t in legend.get_texts()} == set(table.category)
    # shared fit: both panels of a row share their limits
    assert fig.axes[0].get_xlim() == fig.axes[1].get_xlim()
    fig = pca_grid(table, fit="per_layer", color_by="label", layers=[0, 2])
    assert len(fig.axes) == 2 * 2
    assert {t.get_text() for t in fig.legends[0].get_texts()} == set(table.label)
    assert not fig.axes[0].collections[0].get_rasterized()
    assert pca_grid(table, rasterize_above=1).axes[0].collections[0].get_rasterized()
    with pytest.raises(ValueError):
        pca_grid(table, fit="nope")


@pytest.mark.parametrize("n, dim", [(40, 64), (200, 64), (3, 5), (64, 64)])
def test_leading_pca_equals_sklearn_full_svd(n, dim):
    """On small clouds (the dense subset eigh; large ones take Lanczos: test_principal.py) leading_pca gives
    sklearn's full-SVD PCA: mean, axes (with svd_flip's signs), variance ratios and coordinates to 1e-10 of
    the data's scale. The data has a clear spectral gap (sd 3, 2, then <= 1), so the
    axes are determined to ~eps * sigma_1^2 / gap; a rank-1 cloud's second axis is zeros (coordinates 0 either way)."""
    from bertology.analyses.pca_views import leading_pca

    rng = np.random.default_rng(n + dim)
    scale = np.r_[3.0, 2.0, np.linspace(1.0, 0.1, dim - 2)]
    x = rng.standard_normal((n, dim)) * scale + 5 * rng.standard_normal(dim)
    p = PCA(2, svd_solver="full").fit(x)
    mean, comps, ratio = leading_pca(x)
    np.testing.assert_allclose(mean, p.mean_, rtol=0, atol=1e-12)
    np.testing.assert_allclose(comps, p.components_, rtol=0, atol=1e-10)
    np.testing.assert_allclose(ratio, p.explained_variance_ratio_, rtol=1e-10)
    np.testing.assert_allclose((x - mean) @ comps.T, p.transform(x), rtol=0, atol=1e-10 * np.abs(x).max())
    line = np.outer(rng.standard_normal(n), rng.standard_normal(dim)) + 1.0  # rank 1 after centring
    mean, comps, ratio = leading_pca(line)
    assert ratio[0] == pytest.approx(1.0) and ratio[1] == pytest.approx(0.0, abs=1e-12)
    np.testing.assert_allclose((line - mean) @ comps.T, PCA(2, svd_solver="full").fit(line).transform(line), atol=1e-9)


def test_compute_fits_on_one_blas_thread_and_equals_sklearn():
    """compute() runs its fits with BLAS on one thread (restored after; two threads stall on a shared machine) and
    gives sklearn's full-SVD PCA: data with a clear spectral gap (sd 3, 2, then <= 1), so the coordinates agree to
    1e-10 of the data's scale, as for leading_pca alone."""
    from threadpoolctl import threadpool_info, threadpool_limits

    import bertology.analyses.pca_views as pv
    from bertology.analyses.pca_views import _Example

    def blas_threads():
        return {lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"}

    rng = np.random.default_rng(4)
    dim, layers = 48, 2
    scale = np.r_[3.0, 2.0, np.linspace(1.0, 0.1, dim - 2)]
    a = PCAViews(layers - 1)
    for i in range(3):
        v = rng.standard_normal((9, 2, layers, dim)) * scale + 5 * rng.standard_normal(dim)
        a.kept.append(_Example(np.uint64(i), i, ["t"] * 9, ["word"] * 9, np.arange(9), v.astype(np.float32)))
    seen = []
    real = pv.leading_pca
    with pytest.MonkeyPatch.context() as mp, threadpool_limits(2, user_api="blas"):
        mp.setattr(pv, "leading_pca", lambda x: seen.append(blas_threads()) or real(x))
        table = a.compute().table
        assert blas_threads() == {2}
    assert seen == [{1}] * (3 * layers)
    for layer in range(layers):
        xb, xt = a.token_matrix(0, layer), a.token_matrix(1, layer)
        both = np.concatenate([xb, xt])
        shared = PCA(2, svd_solver="full").fit(both)
        for model, x in (("base", xb), ("tuned", xt)):
            tol = 1e-10 * np.abs(both).max()
            got = _rows(table, model, layer, "shared")[["x", "y"]].to_numpy()
            np.testing.assert_allclose(got, shared.transform(x), rtol=0, atol=tol)
            got = _rows(table, model, layer, "per_layer")[["x", "y"]].to_numpy()
            np.testing.assert_allclose(got, PCA(2, svd_solver="full").fit(x).transform(x), rtol=0, atol=tol)
