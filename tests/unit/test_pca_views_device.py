"""Issue 35: PCA views keep their sampled tokens where the hidden states are and fit there.

On the CPU the NumPy path stays (:func:`leading_pca`, Lanczos or a subset eigensolver). The device path
(``on_device=True``: tokens gathered as torch tensors, :func:`leading_pca_torch`: a full ``torch.linalg.eigh``)
runs here on the CPU and is pinned to the NumPy path; the CUDA-only test runs it where CUDA is.

Tolerances, from the arithmetic (:func:`_bounds`), for a cloud ``Xc`` ``[n, d]`` with eigenvalues
``l1 >= l2 >= l3`` of ``C = Xc' Xc`` and total variance ``t = ||Xc||_F^2``:
- the two paths perturb ``C`` differently: the torch path forms ``C`` (or the Gram ``Xc Xc'``), each entry a dot of
  ``n`` (or ``d``) products, so ``||dC|| <= max(n, d) eps t``; the Lanczos path multiplies by ``Xc`` and ``Xc'``
  (the same bound), and either eigensolver adds a backward error ``~ d eps l1 <= max(n, d) eps t``. Both paths
  together: ``||dC|| <= 4 max(n, d) eps t`` (generous: the observed differences are ~1e-15);
- an eigenvalue then moves by ``<= ||dC||`` (Weyl), so a variance ratio ``l / t`` by ``<= 4 max(n, d) eps``
  (< 1e-12 for the sizes here), and an axis by ``<= ||dC|| / gap`` (Davis-Kahan), ``gap = min(l1 - l2, l2 - l3)``;
- a coordinate ``(x - mean) . v`` moves by ``<= ||x - mean|| ||dv|| + ||d mean||``, the mean's rounding
  ``<= sqrt(d) n eps max|x|``.
The synthetic clouds are built with a clear gap (standard deviations 4 and 2 on two axes, <= 0.5 on the others, so
``gap >= l1 / 10``, asserted); the model's clouds have whatever gap they have, measured and used in the bound.
The choices (examples, positions, tokens, categories) and the stored float32 rows are copies on both paths:
exactly equal. Signs: both paths make each axis's largest-magnitude coordinate positive (``svd_flip``), checked
as equal indices of that coordinate and positive values.
"""
import numpy as np
import pandas as pd
import pytest
import torch

from bertology.activations.extract import run_analyses
from bertology.analyses.pca_views import COLUMNS, PCAViews, _Example, leading_pca, leading_pca_torch
from bertology.data.corpus import Corpus
from bertology.data.encode import EncodedCorpus, encode_corpus
from bertology.models.pair import ModelPair
from bertology.testing import SENTENCES, captured_batches, no_host_copies

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: checks the GPU path itself")

EPS = np.finfo(float).eps
LABELS = ["pos", "neg", "neg", "pos", "neg", "neg", "pos", "pos", "neg", "pos"]
FLOATS = ["x", "y", "explained_variance", "explained_variance_x", "explained_variance_y"]


def _bounds(x: np.ndarray) -> tuple[float, float, float]:
    """(axis, coordinate, ratio) bounds on the difference of the two paths' fits of ``x`` ``[n, d]`` (module notes)."""
    x = np.asarray(x, np.float64)
    n, d = x.shape
    xc = x - x.mean(0)
    lam = np.linalg.eigvalsh(xc.T @ xc)[::-1]
    total = float((xc * xc).sum())
    gap = min(lam[0] - lam[1], lam[1] - lam[2]) if len(lam) > 2 else lam[0] - lam[1]
    dc = 4 * max(n, d) * EPS * total
    axis = dc / gap if gap > 0 else np.inf
    coord = axis * np.linalg.norm(xc, axis=1).max() + np.sqrt(d) * n * EPS * np.abs(x).max()
    return axis, coord, 4 * max(n, d) * EPS


def _gapped(rng, n: int, dim: int) -> np.ndarray:
    """A cloud with a clear spectral gap: sd 4 and 2 on two axes, <= 0.5 on the rest, offset from the origin."""
    scale = np.r_[4.0, 2.0, np.linspace(0.5, 0.05, dim - 2)]
    basis = np.linalg.qr(rng.standard_normal((dim, dim)))[0]  # axes not aligned with the coordinates
    return (rng.standard_normal((n, dim)) * scale) @ basis.T + 5 * rng.standard_normal(dim)


def _assert_same_fit(x: np.ndarray, got: tuple, ref: tuple) -> None:
    """``got`` (torch) and ``ref`` (NumPy) fits of ``x`` agree within :func:`_bounds`, with the same signs."""
    axis, coord, ratio = _bounds(x)
    mean, comps, r = (t.numpy() if isinstance(t, torch.Tensor) else t for t in got)
    np.testing.assert_allclose(mean, ref[0], rtol=0, atol=x.shape[0] * EPS * np.abs(x).max())
    np.testing.assert_allclose(comps, ref[1], rtol=0, atol=axis)
    np.testing.assert_allclose(r, ref[2], rtol=0, atol=ratio)
    np.testing.assert_allclose((x - mean) @ comps.T, (x - ref[0]) @ ref[1].T, rtol=0, atol=coord)
    for a, b in zip(comps, ref[1]):  # svd_flip: the largest-magnitude coordinate, the same one, positive
        if np.any(b):
            assert np.argmax(np.abs(a)) == np.argmax(np.abs(b)) and a[np.argmax(np.abs(a))] > 0


@pytest.mark.parametrize("n, dim", [(40, 64), (64, 64), (200, 64), (300, 200), (150, 400)])
def test_leading_pca_torch_equals_leading_pca(n, dim):
    """Both sides (Gram for n <= dim, covariance otherwise), against NumPy's dense subset eigh (smaller side <= 128)
    and Lanczos (larger): within the bounds of the module notes, on data with a clear gap (asserted)."""
    rng = np.random.default_rng(n * dim)
    x = _gapped(rng, n, dim)
    lam = np.linalg.eigvalsh(np.cov(x.T))[::-1]
    assert min(lam[0] - lam[1], lam[1] - lam[2]) >= lam[0] / 10  # the clear gap the tolerances rest on
    got = leading_pca_torch(torch.from_numpy(x))
    assert got[1].dtype == torch.float64 and got[1].shape == (2, dim)
    _assert_same_fit(x, got, leading_pca(x))
    # batched over leading axes: each slice is its own fit
    xs = np.stack([x, _gapped(rng, n, dim)])
    batched = leading_pca_torch(torch.from_numpy(xs))
    for i in range(2):
        _assert_same_fit(xs[i], [t[i] for t in batched], leading_pca(xs[i]))


def test_leading_pca_torch_rank_below_two_gives_a_zero_axis():
    """A rank-1 cloud's second axis is zeros on both paths (the same rank rule), its ratio at the rounding level (the
    eigenvalue is kept as the solver found it, <= the bound of the module notes); an all-equal cloud
    has no axis at all (coordinates 0, ratios NaN as 0/0 on both paths)."""
    rng = np.random.default_rng(3)
    for n, dim in ((30, 20), (20, 30)):
        line = np.outer(rng.standard_normal(n), rng.standard_normal(dim)) + 1.0
        mean, comps, ratio = (t.numpy() for t in leading_pca_torch(torch.from_numpy(line)))
        ref = leading_pca(line)
        assert not comps[1].any() and not ref[1][1].any()
        np.testing.assert_allclose([ratio, ref[2]], [[1.0, 0.0]] * 2, rtol=0, atol=4 * max(n, dim) * EPS)
        np.testing.assert_allclose(comps[0], ref[1][0], rtol=0, atol=4 * max(n, dim) * EPS * 10)
    flat = np.ones((5, 4))
    got, ref = leading_pca_torch(torch.from_numpy(flat)), leading_pca(flat)
    assert not got[1].any() and not ref[1].any()
    assert np.isnan(got[2].numpy()).all() and np.isnan(ref[2]).all()
    with pytest.raises(ValueError):
        leading_pca_torch(torch.zeros(1, 5))


def _synthetic(on_device: bool, layers: int = 2, dim: int = 48) -> PCAViews:
    """Three examples of nine tokens whose clouds have a clear gap; tensors (the device path) or NumPy arrays."""
    rng = np.random.default_rng(4)
    a = PCAViews(layers - 1)
    basis = np.linalg.qr(rng.standard_normal((dim, dim)))[0]
    scale = np.r_[4.0, 2.0, np.linspace(0.5, 0.05, dim - 2)]
    for i in range(3):
        v = ((rng.standard_normal((9, 2, layers, dim)) * scale) @ basis.T + 5 * rng.standard_normal(dim)).astype(np.float32)
        a.kept.append(_Example(np.uint64(i), i, ["t"] * 9, ["word"] * 9, np.arange(9), torch.from_numpy(v) if on_device else v))
    return a


def _assert_same_tables(got: pd.DataFrame, ref: pd.DataFrame, views: PCAViews) -> None:
    """Equal metadata columns exactly; coordinates and ratios within each fit's bound (module notes)."""
    pd.testing.assert_frame_equal(got.drop(columns=FLOATS), ref.drop(columns=FLOATS), check_exact=True)
    for layer in views.layers:
        xs = [views.token_matrix(m, layer) for m in range(2)]
        for fit in views.fits:
            for m, model in enumerate(("base", "tuned")):
                _, coord, ratio = _bounds(np.concatenate(xs) if fit == "shared" else xs[m])
                sel = (ref.model == model) & (ref.layer == layer) & (ref.fit == fit)
                assert sel.sum() == len(xs[m])
                np.testing.assert_allclose(got.loc[sel, ["x", "y"]], ref.loc[sel, ["x", "y"]], rtol=0, atol=coord)
                np.testing.assert_allclose(got.loc[sel, FLOATS[2:]], ref.loc[sel, FLOATS[2:]], rtol=0, atol=2 * ratio)


def test_compute_on_device_equals_the_numpy_compute_on_gapped_clouds():
    dev, ref = _synthetic(True), _synthetic(False)
    got, want = dev.compute().table, ref.compute().table
    assert list(got.columns[: len(COLUMNS)]) == COLUMNS
    _assert_same_tables(got, want, ref)
    # the observed differences are far inside the bounds (rounding, not the bounds' worst case)
    assert np.abs(got[["x", "y"]].to_numpy() - want[["x", "y"]].to_numpy()).max() < 1e-11 * np.abs(want[["x", "y"]].to_numpy()).max()


def test_compute_takes_the_numpy_path_on_the_cpu_and_the_torch_path_for_tensors(monkeypatch):
    import bertology.analyses.pca_views as pv

    calls = []
    for name in ("leading_pca", "leading_pca_torch"):
        real = getattr(pv, name)
        monkeypatch.setattr(pv, name, lambda x, _n=name, _r=real: calls.append(_n) or _r(x))
    _synthetic(False).compute()
    assert set(calls) == {"leading_pca"}
    calls.clear()
    _synthetic(True).compute()
    assert set(calls) == {"leading_pca_torch"}


@pytest.fixture(scope="module")
def planted(planted_pair):
    return ModelPair.load(*map(str, planted_pair))


@pytest.fixture(scope="module")
def corpus():
    return Corpus.from_list(SENTENCES, labels=LABELS)


@pytest.fixture(scope="module")
def encoded(planted, corpus):
    return encode_corpus(corpus, planted.tokenizer)


def _run(on_device, pair, enc, corpus, batch_size=4, device="cpu", **kw) -> PCAViews:
    """``on_device=True``: the path a GPU takes, forced (on the CPU); None: the default for the tensors' device."""
    kw = {"examples": 4, "seed": 1, **kw}
    a = PCAViews(pair.num_layers, tokenizer=pair.tokenizer, corpus=corpus, **kw)
    a.on_device = on_device
    run_analyses(pair, enc, [a], batch_size=batch_size, device=device)
    return a


def _same_sample(got: PCAViews, ref: PCAViews) -> None:
    """The same examples, tokens and positions kept (the choice, not the float rows)."""
    assert [e.index for e in got.kept] == [e.index for e in ref.kept] and got.n_seen == ref.n_seen
    for g, r in zip(got.kept, ref.kept):
        assert g.key == r.key and g.tokens == r.tokens and g.categories == r.categories
        np.testing.assert_array_equal(g.positions, r.positions)


def _assert_same_state(got: PCAViews, ref: PCAViews) -> None:
    _same_sample(got, ref)
    for g, r in zip(got.kept, ref.kept):
        np.testing.assert_array_equal(g.vectors.cpu().numpy(), r.vectors)  # float32 copies of the same values


@pytest.mark.parametrize("include_special", [True, False])
def test_device_path_on_the_cpu_equals_the_numpy_path(planted, corpus, encoded, include_special):
    ref = _run(None, planted, encoded, corpus, include_special=include_special)
    dev = _run(True, planted, encoded, corpus, include_special=include_special)
    assert all(isinstance(e.vectors, np.ndarray) for e in ref.kept)
    assert all(isinstance(e.vectors, torch.Tensor) and e.vectors.dtype == torch.float32 for e in dev.kept)
    _assert_same_state(dev, ref)
    _assert_same_tables(dev.compute().table, ref.compute().table, ref)


def test_device_path_shards_merge_to_the_whole_corpus(planted, corpus, encoded):
    # Each shard is batched by length on its own, so its forward passes run other batch shapes than the whole
    # corpus's: the rows then differ by float32 accumulation order. The whole-corpus run pins the sample kept;
    # the float rows and fits are pinned exactly against the NumPy path merged from the same shards.
    whole = _run(None, planted, encoded, corpus)
    shards = [EncodedCorpus(encoded.items[:4], 128, "skip", 4), EncodedCorpus(encoded.items[4:], 128, "skip", 6)]
    ref = _run(None, planted, shards[0], corpus).merge(_run(None, planted, shards[1], corpus))
    _same_sample(ref, whole)
    merged = _run(True, planted, shards[0], corpus).merge(_run(True, planted, shards[1], corpus))
    _assert_same_state(merged, ref)
    want = ref.compute().table
    _assert_same_tables(merged.compute().table, want, ref)
    # a host shard merged with a device one, either way round: the tensors' device holds the merged sample
    for first, second in ((None, True), (True, None)):
        mixed = _run(first, planted, shards[0], corpus).merge(_run(second, planted, shards[1], corpus))
        assert all(isinstance(e.vectors, torch.Tensor) for e in mixed.kept)
        _assert_same_state(mixed, ref)
        _assert_same_tables(mixed.compute().table, want, ref)
    with pytest.raises(ValueError, match="share examples"):
        _run(True, planted, encoded, corpus).merge(_run(None, planted, encoded, corpus))


def test_the_updates_make_no_host_copy(planted, corpus, encoded):
    """What a GPU run would copy to the host per batch: nothing (guarded on the CPU by refusing the copies)."""
    batches = captured_batches(planted, encoded, frozenset({"hidden_states"}), batch_size=3)
    a = PCAViews(planted.num_layers, tokenizer=planted.tokenizer, corpus=corpus, examples=4, seed=1)
    a.on_device = True  # the path a GPU takes
    with no_host_copies(), torch.inference_mode():
        for batch in batches:
            a.update(batch)
    ref = _run(None, planted, encoded, corpus, batch_size=3)  # the same batches: the same padding, the same sums
    _assert_same_state(a, ref)
    _assert_same_tables(a.compute().table, ref.compute().table, ref)


@needs_cuda
def test_on_a_gpu_the_tokens_stay_there_and_the_fits_equal_the_cpu_fits(planted_pair, corpus, encoded):
    ref = _run(None, ModelPair.load(*map(str, planted_pair)), encoded, corpus)
    gpu = _run(None, ModelPair.load(*map(str, planted_pair)), encoded, corpus, device="cuda")
    assert all(e.vectors.device.type == "cuda" for e in gpu.kept)
    assert [e.index for e in gpu.kept] == [e.index for e in ref.kept]
    # the same rows on the GPU: only the fits' arithmetic differs, within the bounds
    same = _run(None, ModelPair.load(*map(str, planted_pair)), encoded, corpus)
    for e in same.kept:
        e.vectors = torch.from_numpy(e.vectors).cuda()
    _assert_same_tables(same.compute().table, ref.compute().table, ref)
    # the GPU's own forward pass (float32 kernels of another device): close, not equal
    a, b = gpu.compute().table, ref.compute().table
    pd.testing.assert_frame_equal(a.drop(columns=FLOATS), b.drop(columns=FLOATS), check_exact=True)
    np.testing.assert_allclose(a[["x", "y"]], b[["x", "y"]], rtol=0, atol=1e-3 * np.abs(b[["x", "y"]].to_numpy()).max())
