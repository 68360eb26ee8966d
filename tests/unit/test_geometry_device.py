"""Issue 35: the geometry analysis keeps its per-batch state where the hidden states are.

On the CPU the NumPy path stays (views of the tensors, no copy; its tables are those of before, unchanged code).
The device path (``on_device=True``: torch gathers, pooling and float16 rounding on the tensors' device, float64
intra-sentence sums there, and ``compute`` in torch there: :mod:`bertology.metrics.geometry_torch`) runs here on the
CPU and is pinned to the NumPy path; the CUDA-only test runs it where CUDA is.

Tolerances, from the arithmetic:
- the choices (baseline examples and positions, words, their occurrences and counts) are made on the host from
  the same keys on both paths: exactly equal;
- the baseline rows are copies of float32 values: exactly equal;
- a stored word vector is the float32 mean of its pieces rounded to float16. NumPy sums the pieces by a one-hot
  matrix product, torch by ``index_add`` in sentence order: for one or two pieces the sum is one rounding and
  equal; for three or more the float32 sums may differ by an ulp (2^-24 relative), which flips a float16
  rounding only where the float32 mean lies within an ulp of a float16 tie. Equal here (tested exactly on the CPU);
- ``compute`` measures the same arrays with the same formulas in another summation order: a cosine of unit vectors
  in ``d`` dimensions moves by ``<= d eps`` (NumPy's einsum vs torch's sum), a mean or sd over pairs or words by
  as much; an MEV ``l_1 / total`` by ``<= 8 max(n, d) eps`` (each path's Gram matrix and eigensolver perturb the
  eigenvalues by ``<= max(n, d) eps total``, Weyl). At the test sizes (``d = 32``, ``n <= 9``) all are below
  ``3e-14``; 1e-12 (values, word table) leaves margin;
- the intra-sentence sums add the same float64 per-sentence values (one kernel) in another order: NumPy sums
  a batch's ``b`` values pairwise, torch in its own order, each partial sum rounded: ``|err| <= b eps`` per batch
  on values in [-1, 1], so the mean over ``n`` sentences moves by ``<= max_b b eps ~ 1e-14`` and the sd (from
  ``sum x^2 - n m^2``) by ``~ n eps / sd``: 1e-12 absolute on the value and 1e-9 on the sd leave margin.
"""
import numpy as np
import pandas as pd
import pytest
import torch

from bertology.activations.extract import run_analyses
from bertology.analyses.geometry import Geometry, WordSample
from bertology.data.corpus import Corpus
from bertology.data.encode import EncodedCorpus, encode_corpus
from bertology.models.pair import ModelPair
from bertology.testing import captured_batches, no_host_copies

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: checks the GPU path itself")

WORDS = ["the", "cat", "dogs", "sat", "on", "mat", "good", "movies", "slowly", "reading", "readingly", "was", "very", "a", "big",
         "slowingers", "."]
KW = dict(n_pairs=9, seed=1, word_sample=WordSample(max_words=6, max_contexts=6))


def _corpus(n=30, seed=0):
    rng = np.random.default_rng(seed)
    return Corpus.from_list([" ".join(rng.choice(WORDS, size=int(rng.integers(4, 10)), replace=False)) for _ in range(n)])


@pytest.fixture(scope="module")
def planted(planted_pair):
    return ModelPair.load(*map(str, planted_pair))


@pytest.fixture(scope="module")
def encoded(planted):
    return encode_corpus(_corpus(), planted.tokenizer)


def _run(on_device, pair, enc, batch_size=4, device="cpu", **kw):
    """``on_device=True``: the path a GPU takes, forced (on the CPU); None: the default for the tensors' device."""
    g = Geometry(pair.num_layers, tokenizer=pair.tokenizer, **{**KW, **kw})
    g.on_device = on_device
    run_analyses(pair, enc, [g], batch_size=batch_size, device=device)
    return g


def _assert_same_state(got: Geometry, ref: Geometry) -> None:
    np.testing.assert_array_equal(got.base_examples, ref.base_examples)
    np.testing.assert_array_equal(got.base_positions, ref.base_positions)
    np.testing.assert_array_equal(got.base_vectors.cpu().numpy(), ref.base_vectors)
    assert set(got.words) == set(ref.words) and got.threshold == ref.threshold
    for f, w in ref.words.items():
        g = got.words[f]
        assert g.count == w.count
        np.testing.assert_array_equal(g.occ_examples, w.occ_examples)
        np.testing.assert_array_equal(g.occ_keys, w.occ_keys)
        np.testing.assert_array_equal(g.vectors.cpu().numpy(), w.vectors, err_msg=f)
    assert got.n_sentences == ref.n_sentences and got.n_seen == ref.n_seen


def _assert_same_tables(got: Geometry, ref: Geometry, atol: float = 1e-12, sd_atol: float = 1e-9) -> None:
    a, b = got.compute().table, ref.compute().table
    pd.testing.assert_frame_equal(a.drop(columns=["value", "sd"]), b.drop(columns=["value", "sd"]))
    np.testing.assert_allclose(a.value, b.value, rtol=0, atol=atol)
    np.testing.assert_allclose(a.sd, b.sd, rtol=0, atol=sd_atol)
    a, b = got.word_table().table, ref.word_table().table
    floats = ["self_similarity", "mev", "self_similarity_adjusted", "mev_adjusted"]
    pd.testing.assert_frame_equal(a.drop(columns=floats), b.drop(columns=floats), check_exact=True)
    np.testing.assert_allclose(a[floats], b[floats], rtol=0, atol=atol)


def test_device_path_on_the_cpu_equals_the_numpy_path(planted, encoded):
    assert any(len(w) >= 3 for w in (planted.tokenizer.tokenize(x) for x in WORDS))  # words of 3+ pieces are pooled
    ref, dev = _run(None, planted, encoded), _run(True, planted, encoded)
    assert isinstance(dev.base_vectors, torch.Tensor) and dev.base_vectors.dtype == torch.float32
    assert isinstance(dev.intra_sum, torch.Tensor) and dev.intra_sum.dtype == torch.float64
    assert all(isinstance(w.vectors, torch.Tensor) and w.vectors.dtype == torch.float16
               for w in dev.words.values() if w.vectors is not None)
    assert len(ref.selected_words()) == 6
    _assert_same_state(dev, ref)
    _assert_same_tables(dev, ref)
    np.testing.assert_allclose(dev.intra_sum.numpy(), ref.intra_sum, rtol=0, atol=1e-12)


def test_device_path_all_pairs_and_uncentred_mev_equal_the_numpy_path(planted, encoded):
    kw = dict(baseline_pairs="all", mev_center=False, include_special=True)
    ref, dev = _run(None, planted, encoded, **kw), _run(True, planted, encoded, **kw)
    _assert_same_state(dev, ref)
    _assert_same_tables(dev, ref)


def test_device_path_shards_merge_to_the_whole_corpus(planted, encoded):
    """Each shard is batched by length on its own, so a sentence may sit in a batch of another padded length
    than in the whole corpus, and its float32 hidden states move by a few ulps (another matmul blocking). The
    float rows are pinned at 1e-12 against the NumPy path merged from the same shards; against the whole corpus
    the choices are equal exactly and the values within float32 rounding of cosines in ``d = 32`` dimensions
    (``d * 2^-24 ~ 2e-6``)."""
    ref = _run(None, planted, encoded)
    cut = 13
    shards = [EncodedCorpus(encoded.items[:cut], 128, "skip", cut),
              EncodedCorpus(encoded.items[cut:], 128, "skip", len(encoded.items) - cut)]
    host = _run(None, planted, shards[0]).merge(_run(None, planted, shards[1]))
    merged = _run(True, planted, shards[0]).merge(_run(True, planted, shards[1]))
    _assert_same_state(merged, ref)
    _assert_same_tables(merged, host)
    _assert_same_tables(merged, ref, atol=2e-6, sd_atol=2e-6)
    # a host shard merged into a device one, and the other way round
    mixed = _run(None, planted, shards[0]).merge(_run(True, planted, shards[1]))
    _assert_same_tables(mixed, host)
    mixed = _run(True, planted, shards[0]).merge(_run(None, planted, shards[1]))
    _assert_same_tables(mixed, host)


@pytest.mark.parametrize("n, d", [(2, 32), (9, 32), (10, 768), (200, 150), (300, 140)])
@pytest.mark.parametrize("center", [True, False])
def test_geometry_metrics_in_torch_equal_the_numpy_metrics(n, d, center):
    """Cosines, self-similarity and MEV in torch against NumPy on stacks ``[2, 3, n, d]`` (dense route up to a
    smaller side of 128, Lanczos on the NumPy side above): within the bounds of the module notes, ``d eps`` for
    cosines and ``8 max(n, d) eps`` for MEV; zero rows (cosine 0) and flat stacks (MEV 1) alike."""
    from bertology.metrics.geometry import max_explainable_variance, mean_offdiagonal_cosine, pair_cosines
    from bertology.metrics.geometry_torch import (max_explainable_variance_torch, mean_offdiagonal_cosine_torch,
                                                  pair_cosines_torch)

    rng = np.random.default_rng(n + d)
    x = rng.standard_normal((2, 3, n, d)) * np.r_[3.0, np.linspace(1.0, 0.1, d - 1)] + rng.standard_normal(d)
    x[0, 0, 0] = 0.0  # a zero row
    x[1, 2] = x[1, 2, :1]  # a flat stack: every row the same
    eps = np.finfo(float).eps
    t = torch.from_numpy(x)
    np.testing.assert_allclose(pair_cosines_torch(t, t.flip(-2)).numpy(), pair_cosines(x, x[..., ::-1, :]),
                               rtol=0, atol=d * eps)
    np.testing.assert_allclose(mean_offdiagonal_cosine_torch(t).numpy(), mean_offdiagonal_cosine(x), rtol=0,
                               atol=d * eps)
    got, want = max_explainable_variance_torch(t, center=center).numpy(), max_explainable_variance(x, center=center)
    np.testing.assert_allclose(got, want, rtol=0, atol=8 * max(n, d) * eps)
    if center:
        assert got[1, 2] == want[1, 2] == 1.0


def test_compute_runs_in_torch_where_the_state_is(planted, encoded, monkeypatch):
    """The forced device path's compute is the torch one (no NumPy fit), the host path's the NumPy one."""
    import bertology.analyses.geometry_fit as geo  # where the fits are

    dev, ref = _run(True, planted, encoded), _run(None, planted, encoded)

    def refuse(*args, **kwargs):
        raise AssertionError("a NumPy fit on the device path")

    with monkeypatch.context() as mp:
        for name in ("max_explainable_variance", "mean_offdiagonal_cosine", "pair_cosines"):
            mp.setattr(geo, name, refuse)
        table = dev.compute().table
    assert table.value.notna().any()
    with monkeypatch.context() as mp:
        mp.setattr(geo, "max_explainable_variance_torch", refuse)
        ref.compute()


def test_the_updates_make_no_host_copy(planted, encoded):
    """What a GPU run would copy to the host per batch: nothing (guarded on the CPU by refusing the copies)."""
    batches = captured_batches(planted, encoded, frozenset({"hidden_states"}), batch_size=4)
    g = Geometry(planted.num_layers, tokenizer=planted.tokenizer, **KW)
    g.on_device = True  # the path a GPU takes
    with no_host_copies(), torch.inference_mode():
        for batch in batches:
            g.update(batch)
    assert g.n_seen == len(encoded.items) and len(g.selected_words()) == 6
    _assert_same_tables(g, _run(None, planted, encoded))


@needs_cuda
def test_on_a_gpu_the_state_stays_there_and_the_tables_equal_the_cpu_tables(planted_pair, encoded):
    ref = _run(None, ModelPair.load(*map(str, planted_pair)), encoded)
    gpu = _run(None, ModelPair.load(*map(str, planted_pair)), encoded, device="cuda")
    assert gpu.base_vectors.device.type == "cuda" and gpu.intra_sum.device.type == "cuda"
    assert all(w.vectors.device.type == "cuda" for w in gpu.words.values() if w.vectors is not None)
    # the choices are the host's; the values are another device's forward pass (float32 kernels): close, not equal
    np.testing.assert_array_equal(gpu.base_examples, ref.base_examples)
    np.testing.assert_array_equal(gpu.base_positions, ref.base_positions)
    assert gpu.selected_words() == ref.selected_words()
    # the CPU's own state moved to the GPU: only compute's arithmetic differs (module notes)
    same = _run(None, ModelPair.load(*map(str, planted_pair)), encoded)
    same.base_vectors = torch.from_numpy(same.base_vectors).cuda()
    same.intra_sum, same.intra_sq = (torch.from_numpy(t).cuda() for t in (same.intra_sum, same.intra_sq))
    for w in same.words.values():
        w.vectors = None if w.vectors is None else torch.from_numpy(w.vectors).cuda()
    _assert_same_tables(same, ref)
    a, b = gpu.compute().table, ref.compute().table
    pd.testing.assert_frame_equal(a.drop(columns=["value", "sd"]), b.drop(columns=["value", "sd"]))
    np.testing.assert_allclose(a.value, b.value, rtol=0, atol=2e-3)  # float16 words, float32 forward on another device
