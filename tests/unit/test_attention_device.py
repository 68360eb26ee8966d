"""Issue 35: attention_patterns, attention_targets, head_map and relation_heads keep their per-batch state where the maps are.

On the CPU the tables are those of before (tests/unit/test_attention_targets.py, test_patterns.py, test_head_map.py,
test_relation_heads.py pin them; the key masks now come from the items, the same values). Where a device path
differs from the CPU path it is forced here on the CPU and pinned to it; the host-copy guard runs every update
with ``Tensor.cpu/numpy/item/tolist/__array__`` and the scalar conversions (``bool/int/float/__index__``) refused; the CUDA-only tests run wherever CUDA is.

Tolerances, from the arithmetic:
- counts (pattern classes, target occurrences, relation hits) are integers: exactly equal;
- attention_patterns' device path sums a batch's ``B`` float64 features (each in [0, 1]) in torch's order, the
  CPU path in NumPy's: ``|err| <= B eps`` per batch and feature sum, so a mean over ``n`` examples moves by at
  most ``max B eps ~ 1e-14``: 1e-12 absolute;
- head_map's device path keeps the same float64 per-example sums (the same kernel) as tensors and adds the
  ``k`` kept examples in torch's order: ``k eps`` relative, 1e-12 relative on the divergences; the MDS map,
  a smooth function of them from the deterministic classical start, to 1e-9;
- on a GPU the shared layer statistics and the head distances take their float32 sums and logs in torch rather
  than in the CPU kernels: the tables agree to rtol 1e-5 / atol 1e-6 as in tests/unit/test_layer_statistics.py;
  head-pair divergences to twice the float32 entropy bound of tests/unit/test_head_map.py (per query row
  ``(n + 3) 2^-24`` times the three entropies' ``sum |m ln m| <= 3 ln n`` nats); a pattern class would flip only for
  a feature within 1e-6 of a threshold (none here: compared exactly).
"""
import numpy as np
import pandas as pd
import pytest
import torch

import bertology.metrics.head_distance as head_distance
from bertology.activations.batch import PairBatch
from bertology.activations.extract import run_analyses
from bertology.analyses.attention_patterns import AttentionPatterns
from bertology.analyses.attention_targets import AttentionTargets, TargetConventions
from bertology.analyses.head_map import HeadMap
from bertology.analyses.relation_heads import RelationHeads
from bertology.data.corpus import Corpus, Example
from bertology.data.encode import EncodedCorpus, encode_corpus
from bertology.models.pair import ModelPair
from bertology.testing import SENTENCES, SideBySide, captured_batches, no_host_copies, random_annotated_corpus

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: checks the GPU path itself")

def _corpus() -> Corpus:
    """Annotated sentences (trees, UPOS, XPOS) and pairs annotated over both texts, plus unannotated ones."""
    annotated = random_annotated_corpus(26, 0, min_words=3, pair_every=5).examples
    return Corpus(annotated + [Example(s) for s in SENTENCES[:5]] + [Example(SENTENCES[5], text_pair=SENTENCES[6])])


CORPUS = _corpus()


@pytest.fixture(scope="module")
def planted(planted_pair):
    return ModelPair.load(*map(str, planted_pair))


@pytest.fixture(scope="module")
def encoded(planted):
    return encode_corpus(CORPUS, planted.tokenizer)


def _analyses(pair: ModelPair, device_path: bool) -> dict:
    """One of each analysis, on the device paths or the CPU ones (both paths of targets' word categories, both head-map sampling modes; the hint is
    the whole corpus's indices, as every shard must be given)."""
    L, H, tok = pair.num_layers, pair.num_heads, pair.tokenizer
    made = {
        "patterns": AttentionPatterns(tok, L, H),
        "targets": AttentionTargets(CORPUS, tok, L, H),
        "targets_kovaleva": AttentionTargets(CORPUS, tok, L, H, conventions=TargetConventions(
            punctuation="clark2019", entropy_smoothing="clark2019", word_categories="kovaleva2019")),
        "head_map": HeadMap(L, H, max_examples=6, seed=3),
        "head_map_hinted": HeadMap(L, H, max_examples=6, seed=3, example_indices=range(len(CORPUS))),
        "relations": RelationHeads(CORPUS, L, H, min_count=1),
    }
    if device_path:  # the paths a GPU takes, forced on the CPU (None: chosen from the maps' device)
        for name in ("patterns", "head_map", "head_map_hinted"):
            made[name].on_device = True
        made["relations"].score_on_device = True
    return made


def _tables(a) -> list[pd.DataFrame]:
    return [a.compute().table] + [r.table for r in a.extra_results()]


def _assert_tables_close(name: str, got: list[pd.DataFrame], ref: list[pd.DataFrame], rtol: float, atol: float,
                         exact: tuple[str, ...] = ()) -> None:
    """Non-numeric columns and ``exact`` ones equal, the other numbers within ``rtol``/``atol``."""
    for g, r in zip(got, ref, strict=True):
        assert list(g.columns) == list(r.columns) and len(g) == len(r), name
        numeric = [c for c in r.select_dtypes("number").columns if c not in exact]
        pd.testing.assert_frame_equal(g.drop(columns=numeric), r.drop(columns=numeric), check_exact=True, obj=name)
        np.testing.assert_allclose(g[numeric].to_numpy(float), r[numeric].to_numpy(float), rtol=rtol, atol=atol,
                                   err_msg=name)


def _assert_paths_agree(got: dict, ref: dict) -> None:
    """The device paths' tables against the CPU paths' (bounds in the module docstring)."""
    for name in ref:
        g, r = _tables(got[name]), _tables(ref[name])
        if name == "patterns":
            _assert_tables_close(name, g, r, rtol=0, atol=1e-12, exact=("fraction", "count", "n_examples", "n_pairs"))
        elif name.startswith("head_map"):
            _assert_tables_close(name, g, r, rtol=1e-9, atol=1e-12, exact=("layer", "head", "n_examples", "n_tokens"))
        else:  # targets: one path; relations: counts
            for x, y in zip(g, r, strict=True):
                pd.testing.assert_frame_equal(x, y, check_exact=True, obj=name)


def test_device_paths_on_the_cpu_equal_the_cpu_paths(planted, encoded):
    ref, dev = _analyses(planted, False), _analyses(planted, True)
    run_analyses(planted, encoded, list(ref.values()) + list(dev.values()), batch_size=5)
    # where the state lives: tensors for the device paths (NumPy for head_map's CPU path)
    assert dev["patterns"].counts.dtype == torch.int64 and dev["patterns"].feature_sums.dtype == torch.float64
    assert dev["targets"].sums.dtype == torch.float64 and dev["targets"].counts.dtype == torch.int64
    assert isinstance(dev["head_map"].sums, torch.Tensor) and isinstance(dev["head_map_hinted"].total, torch.Tensor)
    assert isinstance(ref["head_map"].sums, np.ndarray) and isinstance(ref["head_map_hinted"].total, np.ndarray)
    assert dev["relations"]._device_correct is not None and ref["relations"]._device_correct is None
    assert ref["patterns"].n_pairs > 0 and ref["targets"].n_annotated > 0 and ref["relations"].n_examples > 0
    np.testing.assert_array_equal(dev["patterns"].counts.numpy(), ref["patterns"].counts.numpy())
    np.testing.assert_array_equal(dev["relations"].correct, ref["relations"].correct)
    assert dev["relations"]._device_correct is None  # read once: folded into the host counts
    assert ref["relations"].correct[ref["relations"].relations.index("all")].sum() > 0
    np.testing.assert_allclose(dev["head_map"].divergence_matrix(), ref["head_map"].divergence_matrix(),
                               rtol=1e-12, atol=0)
    np.testing.assert_array_equal(dev["head_map"].sample, ref["head_map"].sample)
    _assert_paths_agree(dev, ref)


def _shards(encoded: EncodedCorpus, cut: int = 17) -> list[EncodedCorpus]:
    return [EncodedCorpus(encoded.items[:cut], 128, "skip", cut),
            EncodedCorpus(encoded.items[cut:], 128, "skip", len(encoded.items) - cut)]


def _merged(pair: ModelPair, parts: list[dict]) -> dict:
    """Each analysis of ``parts[0]`` merged with ``parts[1]``'s; the hinted head map merged into an empty instance
    (which takes the first shard's form and device)."""
    merged = {name: parts[0][name].merge(parts[1][name]) for name in parts[0] if name != "head_map_hinted"}
    merged["head_map_hinted"] = _analyses(pair, False)["head_map_hinted"]
    for part in parts:
        merged["head_map_hinted"].merge(part["head_map_hinted"])
    return merged


def test_shards_merge_across_paths(planted, encoded):
    """Shards on the device paths merge with each other and with host ones: the host shards' merged tables.

    (Against the shards, not the whole corpus: other batches pad to other widths, which moves the float32 maps.)
    """
    shards = _shards(encoded)

    def run(paths):
        parts = [_analyses(planted, path) for path in paths]
        for part, shard in zip(parts, shards):
            run_analyses(planted, shard, list(part.values()), batch_size=5)
        return _merged(planted, parts)

    ref = run((False, False))
    for paths in ((True, True), (False, True), (True, False)):
        got = run(paths)
        assert isinstance(got["head_map_hinted"].total, torch.Tensor) == paths[0]
        _assert_paths_agree(got, ref)


def _keep_batches(pair: ModelPair, enc: EncodedCorpus) -> list[PairBatch]:
    def stats(batch: PairBatch) -> None:  # the shared statistics (their CPU kernel reads NumPy views)
        for layer in range(1, pair.num_layers + 1):
            batch.layer_stats(layer)

    return captured_batches(pair, enc, frozenset({"attentions"}), batch_size=5, each=stats)


def test_the_updates_make_no_host_copy(planted, encoded, monkeypatch):
    """What a GPU run would copy to the host per batch: nothing (guarded on the CPU by refusing the copies).

    The device paths are forced; the head distances take their torch form, as on a GPU (the CPU kernel reads
    NumPy views of the maps).
    """
    batches = _keep_batches(planted, encoded)
    analyses = _analyses(planted, True)

    monkeypatch.setattr(head_distance, "_cpu_mixture_sums",
                        lambda p, rows: head_distance._torch_mixture_sums(p, rows, head_distance.BLOCK_ELEMENTS))
    with no_host_copies(), torch.inference_mode():
        for batch in batches:
            for a in analyses.values():
                a.update(batch)
    monkeypatch.undo()
    ref = _analyses(planted, False)
    run_analyses(planted, encoded, list(ref.values()), batch_size=5)
    assert analyses["patterns"].n_examples == len(encoded.items) == ref["patterns"].n_examples
    np.testing.assert_array_equal(analyses["relations"].correct, ref["relations"].correct)
    for name in ("patterns", "targets", "targets_kovaleva", "relations"):  # head_map: another float32 form (above)
        _assert_paths_agree({name: analyses[name]}, {name: ref[name]})


def _max_pair_bound(enc: EncodedCorpus) -> float:
    """Twice the float32 bound of one query row's JS (bits) at the longest example: see the module docstring."""
    n = max(len(it) for it in enc.items)
    return 2 * (n + 3) * 2.0**-24 * 3 * np.log(n) / np.log(2.0)


def _assert_head_maps_close(got: HeadMap, ref: HeadMap, bound: float) -> None:
    """The same sample; divergences within the float32 bound; ``moved`` (the float64 form) to float64 rounding."""
    np.testing.assert_array_equal(got.sample, ref.sample)
    np.testing.assert_allclose(got.divergence_matrix(), ref.divergence_matrix(), rtol=0, atol=bound)
    g, r = got.compute().table, ref.compute().table
    np.testing.assert_allclose(g.moved_js_divergence, r.moved_js_divergence, rtol=1e-9, atol=1e-12)
    assert r.moved_js_divergence.max() > 0.01  # the planted head moved


def _assert_gpu_tables(gpu: dict, ref: dict, enc: EncodedCorpus) -> None:
    """GPU-path tables against the CPU tables of the same maps (bounds in the module docstring)."""
    np.testing.assert_array_equal(gpu["relations"].correct, ref["relations"].correct)
    pd.testing.assert_frame_equal(gpu["relations"].compute().table, ref["relations"].compute().table, check_exact=True)
    for name in ("patterns", "targets", "targets_kovaleva"):
        _assert_tables_close(name, _tables(gpu[name]), _tables(ref[name]), rtol=1e-5, atol=1e-6,
                             exact=("count", "n", "n_examples", "n_pairs"))
    for name in ("head_map", "head_map_hinted"):
        _assert_head_maps_close(gpu[name], ref[name], _max_pair_bound(enc))


@needs_cuda
def test_on_a_gpu_the_state_stays_there_and_the_tables_equal_the_cpu_tables(planted, encoded):
    ref, gpu = _analyses(planted, False), _analyses(planted, False)
    run_analyses(planted, encoded, [SideBySide(list(ref.values()), list(gpu.values()), "cuda")], batch_size=5)
    assert gpu["patterns"].counts.device.type == "cuda" and gpu["patterns"].feature_sums.device.type == "cuda"
    assert gpu["targets"].sums.device.type == "cuda" and gpu["targets"].counts.device.type == "cuda"
    assert gpu["head_map"].sums.device.type == "cuda" and gpu["head_map_hinted"].total.device.type == "cuda"
    assert gpu["relations"]._device_correct.device.type == "cuda"
    np.testing.assert_array_equal(gpu["patterns"].counts.cpu().numpy(), ref["patterns"].counts.numpy())
    np.testing.assert_array_equal(gpu["targets"].counts.cpu().numpy(), ref["targets"].counts.numpy())
    _assert_gpu_tables(gpu, ref, encoded)


@needs_cuda
def test_on_a_gpu_shards_merge_with_cpu_shards(planted, encoded):
    """A shard run on the GPU and one on the CPU (the same maps) merge into the CPU shards' merged tables."""
    shards = _shards(encoded)
    ref = [_analyses(planted, False) for _ in shards]
    parts = [_analyses(planted, False) for _ in shards]
    run_analyses(planted, shards[0], [SideBySide(list(ref[0].values()), list(parts[0].values()), "cuda")], batch_size=5)
    for part in (ref[1], parts[1]):
        run_analyses(planted, shards[1], list(part.values()), batch_size=5)
    merged, ref = _merged(planted, parts), _merged(planted, ref)
    assert merged["head_map_hinted"].total.device.type == "cuda" and merged["targets"].sums.device.type == "cuda"
    _assert_gpu_tables(merged, ref, encoded)
