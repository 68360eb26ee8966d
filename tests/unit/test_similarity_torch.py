"""Issue 35: representation_similarity and attention_change keep their state and arithmetic where the tensors are.

The device path (torch, float64) runs here with device="cpu" and is pinned to the NumPy/Numba path the CPU
uses; ``BERTOLOGY_TEST_DEVICE`` is not needed: the CUDA-only tests run wherever CUDA is.

Tolerances, from the arithmetic (float64 throughout, the sample's float32 values widened exactly):
- the ranks of equal values and the token sample are integers or copies: exactly equal;
- a cosine or Gram entry is a length-``d`` dot product summed in another order (another BLAS):
  ``|err| <= d eps |x||y|``, ~1e-13 at d = 64..768; RSA-Pearson is a dot product of two unit vectors
  of length ``m = n (n - 1) / 2`` (``m eps`` ~ 1e-11 at n = 300), CKA a ratio of such sums: 1e-9
  absolute leaves two orders of magnitude. RSA-Spearman: equal where the paths order the cosines alike
  (no two distinct cosines within rounding of each other at these sizes; repeated rows give exact ties);
- attention_change on a GPU: float64 sums of the same float32 maps in another order (1e-12), except the
  JS divergence whose logs the CPU kernel takes in float32 (rtol 1e-5 as tests/unit/test_layer_statistics.py).
"""
import numpy as np
import pandas as pd
import pytest
import torch
from scipy.stats import rankdata

from bertology.activations.batch import PairBatch
from bertology.activations.extract import run_analyses
from bertology.analyses.attention_change import AttentionChange
from bertology.analyses.representation_similarity import RepresentationSimilarity
from bertology.data.corpus import Corpus
from bertology.data.encode import EncodedCorpus, encode_corpus
from bertology.metrics.similarity import similarity_grids
from bertology.metrics.similarity_torch import average_ranks_torch, similarity_grids_torch
from bertology.models.pair import ModelPair
from bertology.testing import SENTENCES, SideBySide, captured_batches, no_host_copies

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: checks the GPU path itself")


def _vectors(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    """Anisotropic like hidden states (a shared offset 4x the spread), with repeated rows (tied cosines)."""
    scale = np.geomspace(3.0, 0.05, dim)
    x = rng.standard_normal((n, dim)) * scale + 4.0 * rng.standard_normal(dim) * scale
    x[1::37] = x[0]
    return x.astype(np.float32)


def test_average_ranks_on_the_device_are_scipys_exactly():
    rng = np.random.default_rng(1)
    v = np.round(rng.standard_normal(100_000), 2)  # many ties
    v[:7], v[7:11] = -0.0, 0.0  # tie with each other
    np.testing.assert_array_equal(average_ranks_torch(torch.from_numpy(v)).numpy(), rankdata(v))
    assert average_ranks_torch(torch.zeros(0)).numel() == 0
    v[5] = np.nan
    assert torch.isnan(average_ranks_torch(torch.from_numpy(v))).all()  # scipy: nan_policy="propagate"
    np.testing.assert_array_equal(np.isnan(rankdata(v)), True)


@pytest.mark.parametrize("dim", [64, 768])
def test_torch_grids_on_the_cpu_equal_the_numpy_grids(dim):
    rng = np.random.default_rng(dim)
    xs = [_vectors(rng, 300, dim) for _ in range(3)]
    ys = [_vectors(rng, 300, dim) for _ in range(2)] + [xs[1]]
    ref = similarity_grids(xs, ys, workers=2)
    got = similarity_grids_torch([torch.from_numpy(x) for x in xs], [torch.from_numpy(y) for y in ys])
    assert set(got) == set(ref)
    for name in ref:
        assert got[name].shape == (3, 3)
        np.testing.assert_allclose(got[name], ref[name], rtol=0, atol=1e-9, err_msg=name)
    for name in ref:  # xs[1] against itself: 1 on both paths
        assert got[name][1, 2] == pytest.approx(1.0, abs=1e-12)


class _TorchOnCpu(RepresentationSimilarity):
    """The path a GPU takes (sample and grids in torch), forced on the CPU."""

    compute_on_device = True
    host_rows = False


def _side_by_side(planted_pair, here, there, device: str, batch_size: int = 3):
    pair = ModelPair.load(*map(str, planted_pair))
    enc = encode_corpus(Corpus.from_list(SENTENCES), pair.tokenizer)
    run_analyses(pair, enc, [SideBySide(here, there, device)], batch_size=batch_size)
    return pair


def _assert_rs_equal(got: pd.DataFrame, ref: pd.DataFrame) -> None:
    key = ["layer_base", "layer_tuned", "metric"]
    got, ref = got.sort_values(key).reset_index(drop=True), ref.sort_values(key).reset_index(drop=True)
    pd.testing.assert_frame_equal(got.drop(columns="value"), ref.drop(columns="value"))
    np.testing.assert_allclose(got["value"], ref["value"], rtol=0, atol=1e-9)


def test_representation_similarity_torch_path_on_the_cpu_equals_the_numpy_path(planted_pair):
    ref, dev = RepresentationSimilarity(2, n_tokens=40, seed=5), _TorchOnCpu(2, n_tokens=40, seed=5)
    _side_by_side(planted_pair, [ref], [dev], "cpu")
    assert isinstance(dev.base[0], torch.Tensor) and dev.base[0].dtype == torch.float32
    (ids, base, tuned), (ids_t, base_t, tuned_t) = ref.token_sample(), dev.token_sample()
    np.testing.assert_array_equal(ids, ids_t)
    for x, y in zip(base + tuned, base_t + tuned_t):  # rows copied by NumPy == rows copied by torch
        np.testing.assert_array_equal(x, y)
    _assert_rs_equal(dev.compute().table, ref.compute().table)
    # shards merged on the torch path give the whole corpus's table
    halves = [_TorchOnCpu(2, n_tokens=40, seed=5) for _ in range(2)]
    pair = ModelPair.load(*map(str, planted_pair))
    enc = encode_corpus(Corpus.from_list(SENTENCES), pair.tokenizer)
    k = len(enc.items) // 2
    for part, items in zip(halves, (enc.items[:k], enc.items[k:])):
        run_analyses(pair, EncodedCorpus(items, 128, "skip", len(items)), [part], batch_size=4)
    _assert_rs_equal(halves[0].merge(halves[1]).compute().table, ref.compute().table)


def test_the_updates_make_no_host_copy(planted_pair):
    """What a GPU run would copy to the host per batch: nothing (guarded on the CPU by refusing the copies)."""
    pair = ModelPair.load(*map(str, planted_pair))
    enc = encode_corpus(Corpus.from_list(SENTENCES), pair.tokenizer)

    def stats(batch: PairBatch) -> None:  # the shared statistics (their CPU kernel reads NumPy views)
        for layer in range(1, 3):
            batch.layer_stats(layer)

    batches = captured_batches(pair, enc, frozenset({"hidden_states", "attentions"}), batch_size=4, each=stats)
    analyses = [AttentionChange(2, 4), _TorchOnCpu(2, n_tokens=10, seed=1)]  # rows copied by torch, as on a GPU
    with no_host_copies():
        for batch in batches:
            for a in analyses:
                a.update(batch)
    assert analyses[1].n_seen > 10 and analyses[0].n == len(SENTENCES)


@needs_cuda
def test_on_a_gpu_both_analyses_stay_there_and_equal_the_cpu_tables(planted_pair):
    cpu = [AttentionChange(2, 4), AttentionChange(2, 4, mode="padded", pad_length=40), RepresentationSimilarity(2, 40, 5)]
    gpu = [AttentionChange(2, 4), AttentionChange(2, 4, mode="padded", pad_length=40), RepresentationSimilarity(2, 40, 5)]
    _side_by_side(planted_pair, cpu, gpu, "cuda")
    assert all(t.device.type == "cuda" for a in gpu[:2] for t in (a.cos_sum, a.cos_sq, a.js_sum))
    assert gpu[2].base[0].device.type == "cuda" and isinstance(gpu[2].keys, np.ndarray)  # the bookkeeping: on the host
    for c, g in zip(cpu[:2], gpu[:2]):
        ref, got = c.compute().table, g.compute().table
        pd.testing.assert_frame_equal(got.drop(columns=["cosine", "cosine_std", "js_divergence"]),
                                      ref.drop(columns=["cosine", "cosine_std", "js_divergence"]))
        np.testing.assert_allclose(got.cosine, ref.cosine, rtol=0, atol=1e-12)
        np.testing.assert_allclose(got.cosine_std, ref.cosine_std, rtol=0, atol=1e-6)  # sqrt of a 1e-12-exact variance
        np.testing.assert_allclose(got.js_divergence, ref.js_divergence, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(gpu[2].token_sample()[0], cpu[2].token_sample()[0])
    _assert_rs_equal(gpu[2].compute().table, cpu[2].compute().table)


@needs_cuda
def test_torch_grids_on_a_gpu_equal_the_numpy_grids():
    rng = np.random.default_rng(2)
    xs, ys = [_vectors(rng, 500, 768) for _ in range(3)], [_vectors(rng, 500, 768) for _ in range(3)]
    ref = similarity_grids(xs, ys)
    got = similarity_grids_torch([torch.from_numpy(x).cuda() for x in xs], [torch.from_numpy(y).cuda() for y in ys])
    for name in ref:
        np.testing.assert_allclose(got[name], ref[name], rtol=0, atol=1e-9, err_msg=name)
