"""Head map (Clark et al. 2019 §6): pairwise head JS divergence, the hashed example sample, MDS, figure."""
import numpy as np
import pandas as pd
import pytest
import torch
from matplotlib.figure import Figure
from scipy.spatial.distance import jensenshannon, pdist, squareform
from scipy.stats import pearsonr, spearmanr

from bertology.activations.extract import run_analyses
from bertology.analyses.head_map import (
    HeadMap,
    example_keys,
    head_index,
    head_representatives,
    mds_embedding,
    most_moved,
    unchanged_heads,
)
from bertology.data.corpus import Corpus
from bertology.data.encode import EncodedCorpus, encode_corpus
from bertology.metrics.head_distance import (
    classical_mds,
    expand_pairs,
    pair_indices,
    paired_js_sums,
    pairwise_js,
    pairwise_js_sums,
    square,
    stress1,
)
from bertology.models.pair import ModelPair
from bertology.testing import SENTENCES
from bertology.viz.head_map import head_map_figure


def _maps(rng, k, r, n, zeros=0.3):
    """k heads x r rows of distributions over n keys, with exact zeros (0 log 0)."""
    p = rng.random((k, r, n)) ** 3
    p[rng.random(p.shape) < zeros] = 0.0
    p[..., 0] += 1e-3
    return p / p.sum(-1, keepdims=True)


# ----------------------------------------------------------------------------------------- metrics
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pairwise_js_matches_scipy_and_is_a_proper_divergence_matrix(seed):
    rng = np.random.default_rng(seed)
    k, r, n = 5, 4, 7
    p = _maps(rng, k, r, n)
    ours = pairwise_js(torch.tensor(p))
    slow = np.array([[np.mean([jensenshannon(p[i, t], p[j, t], base=2) ** 2 for t in range(r)])
                      for j in range(k)] for i in range(k)])
    np.testing.assert_allclose(ours, slow, atol=1e-12)
    assert np.array_equal(ours, ours.T) and np.all(np.diag(ours) == 0)
    assert ours.min() >= 0 and ours.max() <= 1
    # float32 input: same numbers to float32 precision
    np.testing.assert_allclose(pairwise_js(torch.tensor(p, dtype=torch.float32)), slow, atol=1e-6)
    # paired (precise) form agrees with the matrix on matching heads
    paired = paired_js_sums(torch.tensor(p[:2]), torch.tensor(p[2:4])).numpy() / r
    np.testing.assert_allclose(paired, [slow[0, 2], slow[1, 3]], atol=1e-12)


def test_disjoint_heads_are_one_bit_apart_and_identical_heads_exactly_zero():
    p = torch.zeros(3, 2, 4, dtype=torch.float32)
    p[0, :, 0] = 1.0
    p[1, :, 1] = 1.0
    p[2] = p[0]
    d = pairwise_js(p)
    assert d[0, 1] == pytest.approx(1.0) and d[0, 2] == 0.0
    q = torch.softmax(torch.randn(4, 6, 6), -1)
    assert torch.all(paired_js_sums(q, q.clone()) == 0)


def test_padded_masked_batch_equals_an_unpadded_loop_and_blocks_do_not_matter():
    rng = np.random.default_rng(5)
    k, width = 6, 9
    lengths = [9, 4, 7]
    batch = np.zeros((len(lengths), k, width, width))
    rows = np.zeros((len(lengths), width), dtype=bool)
    slow = []
    for b, n in enumerate(lengths):
        p = _maps(rng, k, n, n)
        batch[b, :, :n, :n] = p
        batch[b, :, n:, :] = rng.random((k, width - n, width))  # garbage in padding query rows
        rows[b, :n] = True
        slow.append(pairwise_js_sums(torch.tensor(p)).numpy())
    fast = pairwise_js_sums(torch.tensor(batch), torch.tensor(rows)).numpy()
    np.testing.assert_allclose(fast, np.stack(slow), atol=1e-10)
    tiny_blocks = pairwise_js_sums(torch.tensor(batch), torch.tensor(rows), block_elements=1).numpy()
    np.testing.assert_allclose(tiny_blocks, fast, atol=1e-12)
    paired = paired_js_sums(torch.tensor(batch[:, :3]), torch.tensor(batch[:, 3:]), torch.tensor(rows)).numpy()
    ia, ib = pair_indices(k)
    pos = [int(np.nonzero((ia == i) & (ib == i + 3))[0][0]) for i in range(3)]
    np.testing.assert_allclose(paired, fast[:, pos], atol=1e-10)


def test_copied_heads_take_their_originals_pairs_bit_for_bit():
    """Pairs computed once over distinct heads and expanded == all heads computed together (float64)."""
    rng = np.random.default_rng(7)
    p = torch.tensor(_maps(rng, 5, 4, 6))
    full = torch.cat([p[:3], p[[0, 1]] , p[3:]])  # heads 3 and 4 are copies of heads 0 and 1
    rep = torch.tensor([0, 1, 2, 0, 1, 3, 4])
    fast = expand_pairs(pairwise_js_sums(p[[0, 1, 2, 3, 4]]), rep)
    np.testing.assert_allclose(fast.numpy(), pairwise_js_sums(full).numpy(), atol=1e-12)
    sq = square(fast, 7)
    np.testing.assert_array_equal(sq[0], sq[3])
    np.testing.assert_array_equal(sq[1], sq[4])
    assert sq[0, 3] == 0 and sq[0, 1] > 0
    # the representatives of a base/tuned stack: tuned head 1 equals base head 1
    base, tuned = p[:3], p[2:5].clone()
    tuned[1] = base[1]
    rep, distinct = unchanged_heads(base, tuned)
    assert rep.tolist() == [0, 1, 2, 3, 1, 4] and distinct.tolist() == [True] * 4 + [False, True]
    assert expand_pairs(torch.zeros(0), torch.zeros(3, dtype=torch.long)).tolist() == [0.0] * 3
    # the device form: every head computed, the unchanged tuned head pointing at its base version; the same pairs
    stack = torch.cat([base, tuned])
    every = head_representatives(base, tuned)
    assert every.tolist() == [0, 1, 2, 3, 1, 5]
    np.testing.assert_array_equal(expand_pairs(pairwise_js_sums(stack), every, n_distinct=6).numpy(),
                                  expand_pairs(pairwise_js_sums(stack[distinct]), rep).numpy())


def test_points_with_identical_distance_rows_coincide_exactly_from_the_classical_start():
    rng = np.random.default_rng(11)
    z = rng.normal(size=(12, 5))
    z = np.vstack([z, z[[2, 7]]])  # points 12 and 13 are copies of 2 and 7
    d = squareform(pdist(z))
    xy, stress = mds_embedding(d, seed=0)
    np.testing.assert_array_equal(xy[12], xy[2])
    np.testing.assert_array_equal(xy[13], xy[7])
    assert np.all(squareform(pdist(xy[:12])) + np.eye(12) > 0)  # distinct points stay apart
    assert stress == stress1(d, xy)


def test_square_and_classical_mds_recover_a_planar_configuration():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(12, 2))
    d = squareform(pdist(x))
    ia, ib = pair_indices(12)
    np.testing.assert_array_equal(square(d[ia, ib], 12), d)
    y = classical_mds(d)
    np.testing.assert_allclose(squareform(pdist(y)), d, atol=1e-9)
    assert stress1(d, y) < 1e-9
    emb, stress = mds_embedding(d, seed=0)
    assert emb.shape == (12, 2) and stress < 1e-3
    # noisy high-dimensional distances: the 2-D map keeps their order
    z = rng.normal(size=(30, 6)) * [3, 2, 0.5, 0.3, 0.2, 0.1]
    dz = squareform(pdist(z))
    emb, stress = mds_embedding(dz, seed=1)
    iu = np.triu_indices(30, 1)
    assert spearmanr(dz[iu], squareform(pdist(emb))[iu]).statistic > 0.9
    assert stress == pytest.approx(stress1(dz, emb))


def test_mds_is_seeded_and_oriented():
    rng = np.random.default_rng(3)
    d = squareform(pdist(rng.normal(size=(10, 4))))
    layers = np.arange(10)
    a, _ = mds_embedding(d, seed=4, layers=layers)
    b, _ = mds_embedding(d, seed=4, layers=layers)
    np.testing.assert_array_equal(a, b)
    assert np.corrcoef(a[:, 0], layers)[0, 1] >= 0 and np.corrcoef(a[:, 1], layers)[0, 1] >= 0
    r, _ = mds_embedding(d, seed=4, init="random", n_init=2, layers=layers)
    assert r.shape == (10, 2)


# ---------------------------------------------------------------------------------------- analysis
def _encoded(pair, sentences=SENTENCES):
    return encode_corpus(Corpus.from_list(sentences), pair.tokenizer)


def _run(pair, enc, batch_size=4, **kw):
    a = HeadMap(pair.num_layers, pair.num_heads, **kw)
    run_analyses(pair, enc, [a], batch_size=batch_size)
    return a


@pytest.fixture(scope="module")
def planted(planted_pair):
    return ModelPair.load(*map(str, planted_pair))


def test_identical_models_have_zero_moved_everywhere(identical_pair):
    pair = ModelPair.load(*map(str, identical_pair))
    a = _run(pair, _encoded(pair))
    table = a.compute().table
    assert len(table) == 2 * 2 * 4
    assert (table.moved == 0).all()
    base, tuned = table[table.model == "base"], table[table.model == "tuned"]
    # the two copies of each head get identical distance rows (computed once) and so the same point
    d = a.distance_matrix()
    np.testing.assert_array_equal(d[:8], d[8:])
    xy_base, xy_tuned = base[["x", "y"]].to_numpy(), tuned[["x", "y"]].to_numpy()
    np.testing.assert_array_equal(xy_base, xy_tuned)
    assert np.abs(xy_base).max() > 0  # a map, not all points at the origin
    assert not [t for t in head_map_figure(table).axes[0].texts if t.get_text()]  # nothing moved: no labels


def test_planted_head_moves_most_and_no_other_head_moves(planted):
    a = _run(planted, _encoded(planted))
    table = a.compute().table
    assert {"model", "layer", "head", "x", "y", "moved", "n_examples"} <= set(table.columns)
    top = most_moved(table, 3)
    assert (top.loc[0, "layer"], top.loc[0, "head"], top.loc[0, "label"]) == (2, 1, "L2H1")
    assert top.loc[0, "moved"] > 0.5
    # Layer 1 is unchanged, and only L2H1's query/key changed in layer 2 (tiny_bert_pair has 2 layers).
    others = table[~((table.layer == 2) & (table["head"] == 1))]
    assert (others.moved == 0).all()
    assert (table.n_examples == len(SENTENCES)).all() and (table.n_examples_seen == len(SENTENCES)).all()
    # The moved value is the head's base-vs-tuned entry of the distance matrix.
    d = a.distance_matrix()
    k = head_index(2, 4)
    i = k.index[(k.model == "base") & (k.layer == 2) & (k["head"] == 1)][0]
    j = k.index[(k.model == "tuned") & (k.layer == 2) & (k["head"] == 1)][0]
    assert d[i, j] == pytest.approx(top.loc[0, "moved"])
    # on the map, every unchanged head sits exactly on its base version; the moved one does not
    xy = table.set_index(["model", "layer", "head"])[["x", "y"]]
    gap = np.linalg.norm(xy.loc["base"].to_numpy() - xy.loc["tuned"].to_numpy(), axis=1)
    moved_row = list(xy.loc["base"].index).index((2, 1))
    assert np.all(np.delete(gap, moved_row) == 0)
    assert gap[moved_row] > 0.1 * top.loc[0, "moved"]


def test_whole_pipeline_equals_a_per_sentence_unpadded_computation(planted):
    """Batched, padded, length-sorted == one sentence at a time through HF with no padding."""
    a = _run(planted, _encoded(planted), batch_size=3)
    sums, rows = np.zeros(16 * 15 // 2), 0
    for s in SENTENCES:
        enc = planted.tokenizer(s, return_tensors="pt")
        with torch.inference_mode():
            att = [m.model(**enc, output_attentions=True).attentions for m in (planted.base, planted.tuned)]
        p = torch.cat([att[m][layer][0] for m in range(2) for layer in range(2)]).double()
        sums += pairwise_js_sums(p).numpy()
        rows += p.shape[1]
    np.testing.assert_allclose(a.divergence_matrix(), square(sums / rows, 16), atol=1e-6)


def test_batch_size_does_not_change_the_sample_or_the_numbers(planted):
    enc = _encoded(planted)
    runs = [_run(planted, enc, batch_size=bs, max_examples=4, seed=3) for bs in (1, 3, 10)]
    keys = example_keys(3, np.array([it.index for it in enc.items]))
    expected = np.array([it.index for it in enc.items])[np.argsort(keys)[:4]]
    for a in runs:
        np.testing.assert_array_equal(a.sample, expected)
        np.testing.assert_allclose(a.divergence_matrix(), runs[0].divergence_matrix(), atol=1e-7)
    tables = [a.compute().table for a in runs]
    assert (tables[0].n_examples == 4).all() and (tables[0].n_examples_seen == 10).all()
    for t in tables[1:]:
        np.testing.assert_allclose(t[["x", "y", "moved"]].to_numpy(), tables[0][["x", "y", "moved"]].to_numpy(), atol=1e-4)
    # Another seed draws another sample.
    assert set(_run(planted, enc, max_examples=4, seed=4).sample) != set(expected)


def test_example_indices_hint_skips_work_but_not_results(planted):
    enc = _encoded(planted)
    idx = [it.index for it in enc.items]
    plain = _run(planted, enc, max_examples=3, seed=1)
    hinted = _run(planted, enc, max_examples=3, seed=1, example_indices=idx)
    np.testing.assert_array_equal(plain.sample, hinted.sample)
    np.testing.assert_allclose(plain.divergence_matrix(), hinted.divergence_matrix(), rtol=1e-12, atol=1e-15)
    assert hinted.sums is None and plain.sums.shape == (3, 16 * 15 // 2)  # the hint keeps only totals
    with pytest.raises(ValueError, match="not in example_indices"):
        _run(planted, enc, max_examples=3, example_indices=idx[:5])


def test_merge_of_shards_with_the_corpus_hint_is_exact_and_own_hints_are_refused(planted):
    enc = _encoded(planted)
    idx = [it.index for it in enc.items]
    half = len(enc.items) // 2
    shards = [EncodedCorpus(enc.items[:half], 128, "skip", half),
              EncodedCorpus(enc.items[half:], 128, "skip", len(enc.items) - half)]
    whole = _run(planted, enc, max_examples=4, seed=2)
    parts = [_run(planted, s, max_examples=4, seed=2, example_indices=idx) for s in shards]
    merged = parts[0].merge(parts[1])
    np.testing.assert_array_equal(merged.sample, whole.sample)
    np.testing.assert_allclose(merged.divergence_matrix(), whole.divergence_matrix(), atol=1e-7)
    # a per-example shard merged with a totals-only shard (nothing to evict) is exact too
    mixed = _run(planted, shards[0], max_examples=4, seed=2).merge(
        _run(planted, shards[1], max_examples=4, seed=2, example_indices=idx))
    np.testing.assert_allclose(mixed.divergence_matrix(), whole.divergence_matrix(), atol=1e-7)
    own = [_run(planted, s, max_examples=4, seed=2, example_indices=[it.index for it in s.items]) for s in shards]
    with pytest.raises(ValueError, match="whole corpus"):
        own[0].merge(own[1])


def test_merge_of_shards_equals_the_whole_corpus(planted):
    enc = _encoded(planted)
    half = len(enc.items) // 2
    shards = [EncodedCorpus(enc.items[:half], 128, "skip", half),
              EncodedCorpus(enc.items[half:], 128, "skip", len(enc.items) - half)]
    whole = _run(planted, enc, max_examples=5, seed=2)
    parts = [_run(planted, s, max_examples=5, seed=2) for s in shards]
    merged = parts[0].merge(parts[1])
    np.testing.assert_array_equal(merged.sample, whole.sample)
    np.testing.assert_allclose(merged.divergence_matrix(), whole.divergence_matrix(), atol=1e-7)
    assert merged.n_seen == whole.n_seen == len(enc.items)
    with pytest.raises(ValueError):
        merged.merge(HeadMap(2, 4, max_examples=6, seed=2))
    with pytest.raises(ValueError, match="share examples"):
        _run(planted, shards[0], max_examples=5, seed=2).merge(_run(planted, shards[0], max_examples=5, seed=2))


def test_map_positions_follow_the_distances_and_the_distance_table(planted):
    a = _run(planted, _encoded(planted))
    table = a.compute().table
    d = a.distance_matrix()
    assert table[["x", "y"]].to_numpy().shape == (16, 2)
    iu = np.triu_indices(16, 1)
    mapped = squareform(pdist(table[["x", "y"]].to_numpy()))
    # Dominated by the one planted head (the others sit within ~0.005 of each other in JS distance).
    assert pearsonr(d[iu], mapped[iu]).statistic > 0.99
    assert spearmanr(d[iu], mapped[iu]).statistic > 0.6
    assert 0 <= table.stress.iloc[0] < 0.1
    dist = a.distances()
    assert dist.name == "head_distance" and len(dist.table) == 16 * 15 // 2
    assert {"model_a", "layer_a", "head_a", "model_b", "layer_b", "head_b", "js_divergence", "js_distance"} <= set(dist.table.columns)
    np.testing.assert_allclose(dist.table.js_distance, np.sqrt(dist.table.js_divergence))
    np.testing.assert_allclose(dist.table.js_distance, d[iu])
    row = dist.table[(dist.table.model_a == "base") & (dist.table.layer_a == 2) & (dist.table.head_a == 1)
                     & (dist.table.model_b == "tuned") & (dist.table.layer_b == 2) & (dist.table.head_b == 1)]
    assert row.js_distance.item() == pytest.approx(table.moved.max())
    div = HeadMap(2, 4, distance="js_divergence")
    run_analyses(planted, _encoded(planted), [div], batch_size=4)
    assert (div.compute().table.distance == "js_divergence").all()
    np.testing.assert_allclose(div.distance_matrix(), a.divergence_matrix(), atol=1e-12)


def test_errors_and_params():
    with pytest.raises(ValueError):
        HeadMap(2, 4, max_examples=0)
    with pytest.raises(ValueError):
        HeadMap(2, 4, distance="cosine")
    with pytest.raises(ValueError, match="no examples"):
        HeadMap(2, 4).compute()
    p = HeadMap(2, 4, seed=5).params()
    assert p["seed"] == 5 and p["mds"]["random_state"] == 5 and p["distance"] == "js_distance"


def test_figure_labels_the_moved_head(planted):
    table = _run(planted, _encoded(planted)).compute().table
    fig = head_map_figure(table, top_k=3)
    assert isinstance(fig, Figure)
    labels = [t.get_text() for t in fig.axes[0].texts if t.get_text()]
    assert labels == ["L2H1"]  # only heads that moved at all are labelled
    assert "stress" in fig.axes[0].get_title(loc="left")
    with pytest.raises(ValueError):
        head_map_figure(pd.DataFrame({"layer": [1]}))


# ------------------------------------------------------------------- the CPU kernel (float32 maps)
def _entropy_bound(p: np.ndarray, rows: np.ndarray | None = None) -> np.ndarray:
    """Rounding bound of each float32 pair's JS sum, in bits: per query row, three entropies of ``n``
    float32 terms, each within (n + 3) u of the sum of |m ln m| (a sum of n terms, one product, a log
    within 1 ulp; u = 2^-24); the row sums themselves are float64."""
    k, r, n = p.shape
    half = np.maximum(0.5 * p, np.finfo(np.float32).tiny)
    ia, ib = pair_indices(k)
    m = half[ia] + half[ib]
    mix = np.abs(m * np.log(m)).sum(-1)  # [pairs, R]
    own = np.abs(2 * half * np.log(2 * half)).sum(-1)  # [K, R]
    per_row = mix + 0.5 * (own[ia] + own[ib])
    if rows is not None:
        per_row = per_row * rows
    return (n + 3) * 2.0**-24 * per_row.sum(-1) / np.log(2.0)


@pytest.mark.parametrize("k", [5, 40])
def test_cpu_kernel_for_float32_maps_equals_float64_within_its_rounding_bound(k):
    rng = np.random.default_rng(k)
    p = _maps(rng, k, 9, 11)
    exact = pairwise_js_sums(torch.tensor(p)).numpy()  # float64: torch ops
    p32 = p.astype(np.float32)
    fast = pairwise_js_sums(torch.tensor(p32)).numpy()  # float32 on the CPU: the Numba kernel
    bound = _entropy_bound(p32.astype(np.float64)) + np.abs(exact) * 2.0**-24  # + the input's own rounding
    assert np.all(np.abs(fast - exact) <= bound)
    assert np.abs(fast - exact).max() > 0  # the two paths really differ (float32 vs float64)


def test_cpu_kernel_gives_exactly_zero_for_copies_in_the_vector_body_and_the_remainder():
    """Copies at both ends and in the middle of a 40-head row (AVX vector body and scalar tail)."""
    rng = np.random.default_rng(3)
    p = _maps(rng, 40, 6, 7).astype(np.float32)
    copies = [(0, 39), (3, 21), (17, 38), (36, 37)]
    for a, b in copies:
        p[b] = p[a]
    d = pairwise_js(torch.tensor(p))
    for a, b in copies:
        assert d[a, b] == 0.0
    assert np.all(d[np.triu_indices(40, 1)][d[np.triu_indices(40, 1)] != 0] > 1e-3)


def test_cpu_kernel_pairs_do_not_depend_on_where_the_heads_sit():
    """The kernel pads the head axis to whole vector registers and starts each pair row at a register boundary;
    every pair still gets the same operations in the same order: 40 heads shifted by 1 to 17 places (other
    heads in front, so their pairs fall in other lanes, before and after the padding) give the same sums to
    the last bit."""
    rng = np.random.default_rng(11)
    p = _maps(rng, 40, 6, 7).astype(np.float32)
    want = pairwise_js(torch.tensor(p))
    for shift in (1, 5, 15, 16, 17):
        front = _maps(rng, shift, 6, 7).astype(np.float32)
        got = pairwise_js(torch.tensor(np.concatenate([front, p])))
        np.testing.assert_array_equal(got[shift:, shift:], want)


def test_cpu_kernel_padding_rows_are_skipped_and_threads_do_not_change_a_bit():
    import numba

    rng = np.random.default_rng(9)
    k, width, lengths = 24, 8, [8, 3, 6]
    batch = np.zeros((len(lengths), k, width, width), dtype=np.float32)
    rows = np.zeros((len(lengths), width), dtype=bool)
    for b, n in enumerate(lengths):
        batch[b, :, :n, :n] = _maps(rng, k, n, n)
        batch[b, :, n:, :] = np.nan  # padding query rows: garbage that must not reach the sums
        rows[b, :n] = True
    loop = np.stack([pairwise_js_sums(torch.tensor(batch[b, :, :n, :n])).numpy() for b, n in enumerate(lengths)])
    before = numba.get_num_threads()
    try:
        outs = []
        for threads in sorted({1, before}):
            numba.set_num_threads(threads)
            outs.append(pairwise_js_sums(torch.tensor(batch), torch.tensor(rows)).numpy())
    finally:
        numba.set_num_threads(before)
    assert np.isfinite(outs[0]).all()
    for out in outs:
        np.testing.assert_array_equal(out, outs[0])
    # cropping the keys changes nothing (padding keys hold 0, clamped alike); rows are float64 sums
    np.testing.assert_allclose(outs[0], loop, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("which", ["identical_pair", "planted_pair"])
def test_device_form_of_unchanged_heads_equals_the_cpu_form_bit_for_bit(which, request):
    """Issue 35: the device form computes every head's pairs (which tuned heads are unchanged is not read back to
    the host) and points the unchanged ones at their base versions; forced on the CPU, where each pair's sum depends
    only on its two heads (the kernel test above), every example's sums equal the CPU form's to the last bit. (Their
    total is added by torch there, by NumPy here: ``k eps`` relative for ``k`` examples, 1e-12 on the divergences;
    the MDS map, a smooth function of them from the deterministic classical start, to 1e-9.) The identical pair has
    every tuned head unchanged, the planted one every tuned head but the planted one."""
    pair = ModelPair.load(*map(str, request.getfixturevalue(which)))
    enc = _encoded(pair)
    host, dev = HeadMap(pair.num_layers, pair.num_heads, seed=1), HeadMap(pair.num_layers, pair.num_heads, seed=1)
    dev.on_device = True
    run_analyses(pair, enc, [host, dev], batch_size=4)
    assert isinstance(dev.sums, torch.Tensor) and isinstance(host.sums, np.ndarray)
    np.testing.assert_array_equal(dev.sums.numpy(), host.sums)
    half = pair.num_layers * pair.num_heads
    moved = np.diag(host.divergence_matrix()[:half, half:])
    assert (moved == 0).sum() == (half if which == "identical_pair" else half - 1)  # the unchanged tuned heads
    np.testing.assert_allclose(dev.divergence_matrix(), host.divergence_matrix(), rtol=1e-12, atol=0)
    pd.testing.assert_frame_equal(dev.compute().table, host.compute().table, rtol=1e-9, atol=1e-12)
