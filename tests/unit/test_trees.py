"""Tree metrics of the structural probes against slow reference loops and exact-tree cases."""
import itertools
from collections import deque

import numpy as np
import pytest
from scipy.stats import spearmanr

from bertology.metrics.trees import (
    SpearmanByLength,
    check_heads,
    depth_spearman_per_word,
    distance_spearman_per_word,
    gold_edges,
    mst_edges,
    root_correct,
    score_depths,
    score_distances,
    tree_depths,
    tree_distances,
    uuas_counts,
)
from bertology.testing import random_heads

# "The old man ran fast to the house ." (UD-like): ran is the root, "." attaches to it.
HEADS = (3, 3, 4, 0, 4, 8, 8, 4, 4)
UPOS = ("DET", "ADJ", "NOUN", "VERB", "ADV", "ADP", "DET", "NOUN", "PUNCT")


def _bfs_distances(heads):
    n = len(heads)
    nbrs = [[] for _ in range(n)]
    for i, h in enumerate(heads):
        if h:
            nbrs[i].append(h - 1)
            nbrs[h - 1].append(i)
    out = np.zeros((n, n))
    for s in range(n):
        seen, q = {s: 0}, deque([s])
        while q:
            u = q.popleft()
            for v in nbrs[u]:
                if v not in seen:
                    seen[v] = seen[u] + 1
                    q.append(v)
        for v, d in seen.items():
            out[s, v] = d
    return out


def _slow_depths(heads):
    out = []
    for i in range(len(heads)):
        d, cur = 0, i
        while heads[cur] != 0:
            cur = heads[cur] - 1
            d += 1
        out.append(d)
    return np.array(out, dtype=float)



def _brute_force_mst(d, keep):
    """Minimum spanning tree by trying every set of n-1 edges (tiny n only)."""
    idx = [i for i in range(len(d)) if keep[i]]
    pairs = list(itertools.combinations(idx, 2))
    best, best_w = None, np.inf
    for edges in itertools.combinations(pairs, len(idx) - 1):
        parent = {i: i for i in idx}

        def find(x):
            while parent[x] != x:
                x = parent[x]
            return x

        ok = True
        for a, b in edges:
            ra, rb = find(a), find(b)
            if ra == rb:
                ok = False
                break
            parent[ra] = rb
        if ok:
            w = sum(d[a, b] for a, b in edges)
            if w < best_w - 1e-12:
                best, best_w = set(edges), w
    return best


def test_distances_and_depths_match_slow_loops():
    rng = np.random.default_rng(0)
    for n in (1, 2, 5, 17, 40):
        for _ in range(5):
            heads = random_heads(rng, n)
            np.testing.assert_array_equal(tree_distances(heads), _bfs_distances(heads))
            np.testing.assert_array_equal(tree_depths(heads), _slow_depths(heads))


def test_known_tree():
    d = tree_distances(HEADS)
    assert d[0, 2] == 1 and d[0, 3] == 2 and d[0, 7] == 3 and d[5, 6] == 2
    np.testing.assert_array_equal(tree_depths(HEADS), [2, 2, 1, 0, 1, 2, 2, 1, 1])


@pytest.mark.parametrize("bad", [(0, 0), (2, 1), (0, 5), (1, 0), (3, 3, 2, 0)])
def test_invalid_heads_are_refused(bad):
    with pytest.raises(ValueError):
        check_heads(bad)


def test_exact_tree_distances_give_perfect_scores():
    keep = np.array([u != "PUNCT" for u in UPOS])
    d, depth = tree_distances(HEADS), tree_depths(HEADS)
    found, total = uuas_counts(d, HEADS, keep)
    assert total == 7 and found == 7  # 8 edges, one to "." left out
    # any monotone transform of the distances keeps UUAS and DSpr at 1
    found2, _ = uuas_counts(d**2 * 3.0 + 0.5, HEADS, keep)
    assert found2 == 7
    rho = distance_spearman_per_word(d**2 + 1, d)
    np.testing.assert_allclose(rho, 1.0)
    assert root_correct(depth * 2 + 0.1, HEADS, keep) is True
    assert depth_spearman_per_word(np.sqrt(depth), depth) == pytest.approx(1.0)


def test_mst_equals_brute_force_on_random_matrices():
    rng = np.random.default_rng(1)
    for n in (2, 3, 5, 6):
        for _ in range(6):
            a = rng.random((n, n))
            d = a + a.T
            keep = rng.random(n) > 0.25
            keep[:2] = True
            assert mst_edges(d, keep) == _brute_force_mst(d, keep)


def test_mst_handles_zero_and_negative_distances():
    d = np.array([[0.0, 0.0, 5.0], [0.0, 0.0, -1.0], [5.0, -1.0, 0.0]])
    assert mst_edges(d) == {(0, 1), (1, 2)}


def test_uuas_counts_a_wrong_tree():
    heads = (2, 0, 2)  # a <- b -> c
    d = np.array([[0, 1, 3], [1, 0, 3], [3, 3, 0.0]])  # predicts a-b and (a or b)-c
    d[0, 2] = d[2, 0] = 2
    found, total = uuas_counts(d, heads)
    assert (found, total) == (1, 2)


def test_punctuation_left_out_of_gold_and_prediction():
    keep = np.array([u != "PUNCT" for u in UPOS])
    assert all(8 not in e for e in gold_edges(HEADS, keep))
    assert all(8 not in e for e in mst_edges(np.random.default_rng(0).random((9, 9)), keep))


def test_root_accuracy_ignores_punctuation():
    heads = (2, 0, 2)
    keep = np.array([True, True, False])
    depth = np.array([1.0, 0.5, 0.0])  # punctuation is least deep but left out
    assert root_correct(depth, heads, keep) is True
    assert root_correct(depth, heads) is False
    assert root_correct(depth, heads, np.zeros(3, bool)) is None


def test_row_spearman_matches_scipy():
    rng = np.random.default_rng(2)
    for n in (3, 7, 20):
        heads = random_heads(rng, n)
        gold = tree_distances(heads)
        pred = rng.random((n, n))
        got = distance_spearman_per_word(pred, gold)
        want = [spearmanr(p, g).correlation for p, g in zip(pred, gold)]
        np.testing.assert_allclose(got, want, rtol=1e-10)
        dep = tree_depths(heads)
        pd_ = rng.random(n)
        assert depth_spearman_per_word(pd_, dep) == pytest.approx(spearmanr(pd_, dep).correlation)


def test_constant_rows_are_nan():
    assert np.isnan(distance_spearman_per_word(np.zeros((1, 1)), np.zeros((1, 1)))).all()
    assert np.isnan(depth_spearman_per_word(np.arange(3.0), np.zeros(3)))


def test_spearman_by_length_averages_within_then_across_lengths():
    acc = SpearmanByLength()
    acc.add(5, [1.0, 0.0])  # mean 0.5
    acc.add(5, [0.5, np.nan])  # pooled with the above: mean 0.5
    acc.add(6, 0.9)
    acc.add(4, -1.0)  # outside 5..50
    acc.add(51, -1.0)
    assert acc.per_length()[5] == pytest.approx(0.5)
    assert acc.score() == pytest.approx((0.5 + 0.9) / 2)
    assert np.isnan(SpearmanByLength().score())


def test_corpus_scores_of_exact_trees_are_perfect_and_match_slow_loops():
    rng = np.random.default_rng(3)
    trees = [random_heads(rng, n) for n in (3, 5, 5, 8, 12, 30, 60)]
    keeps = [rng.random(len(h)) > 0.1 for h in trees]
    exact = score_distances([_bfs_distances(h) for h in trees], trees, keeps)
    assert exact["uuas"] == 1.0 and exact["dspr"] == pytest.approx(1.0)
    dep = score_depths([_slow_depths(h) + 0.5 for h in trees], trees, [np.ones(len(h), bool) for h in trees])
    assert dep["root_acc"] == 1.0 and dep["nspr"] == pytest.approx(1.0)

    preds = [rng.random((len(h), len(h))) for h in trees]
    preds = [p + p.T for p in preds]
    got = score_distances(preds, trees, keeps)
    # slow reference: per-sentence loops, scipy's spearmanr, brute force over lengths
    found = total = 0
    by_len = {}
    for p, h, k in zip(preds, trees, keeps):
        g = gold_edges(h, k)
        found += len(g & mst_edges(p, k))
        total += len(g)
        gold = _bfs_distances(h)
        for i in range(len(h)):
            r = spearmanr(p[i], gold[i]).correlation
            if np.isfinite(r):
                by_len.setdefault(len(h), []).append(r)
    assert got["uuas"] == pytest.approx(found / total)
    assert got["dspr"] == pytest.approx(np.mean([np.mean(v) for n, v in by_len.items() if 5 <= n <= 50]))
    dpreds = [rng.random(len(h)) for h in trees]
    got = score_depths(dpreds, trees, keeps)
    ok = [int(np.argmin(np.where(k, d, np.inf))) == h.index(0) for d, h, k in zip(dpreds, trees, keeps)]
    assert got["root_acc"] == pytest.approx(np.mean(ok))
    by_len = {}
    for d, h in zip(dpreds, trees):
        by_len.setdefault(len(h), []).append(spearmanr(d, _slow_depths(h)).correlation)
    assert got["nspr"] == pytest.approx(np.mean([np.mean(v) for n, v in by_len.items() if 5 <= n <= 50]))


def test_tree_problem_names_a_cycle_and_reads_pairs_as_two_trees():
    from bertology.metrics.trees import tree_problem

    assert tree_problem([2, 0, 2]) is None
    assert tree_problem([0, 3, 2]) == "heads contain a cycle"
    assert "exactly one root" in tree_problem([0, 0])
    # a pair: words 1-2 and 3-4 are two trees (heads index the concatenation), two roots is right
    assert tree_problem([2, 0, 0, 3], n_first_words=2) is None
    assert tree_problem([2, 0, 4, 3], n_first_words=2) is not None


def test_sentence_bootstrap_equals_scoring_each_resample_by_hand():
    """Resampled corpus scores (weights = how often each sentence is drawn) equal the corpus scores of the resampled
    sentence lists; the all-ones row is the point estimate."""
    from bertology.metrics.bootstrap import bootstrap_counts
    from bertology.metrics.trees import _sentence_scores, uuas_counts

    rng = np.random.default_rng(5)
    trees = [random_heads(rng, n) for n in (3, 5, 5, 6, 8, 8, 12, 30)]
    keeps = [rng.random(len(h)) > 0.1 for h in trees]
    preds = [(lambda p: p + p.T)(rng.random((len(h), len(h)))) for h in trees]
    per = _sentence_scores(preds, trees, keeps, None, tree_distances, uuas_counts, distance_spearman_per_word)
    counts = bootstrap_counts(len(trees), 6, seed=1)
    uuas, dspr = per.scores(counts)
    for r, row in enumerate(counts):
        drawn = [i for i, c in enumerate(row) for _ in range(int(c))]
        by_hand = score_distances([preds[i] for i in drawn], [trees[i] for i in drawn], [keeps[i] for i in drawn])
        assert uuas[r] == pytest.approx(by_hand["uuas"]) and dspr[r] == pytest.approx(by_hand["dspr"], nan_ok=True)
    point = score_distances(preds, trees, keeps, n_bootstrap=200, seed=0)
    lo, hi = point["uuas_ci"]
    assert lo <= point["uuas"] <= hi and lo < hi


def test_the_linear_chain_baseline_is_perfect_on_chains_and_scored_as_a_probe_elsewhere():
    from bertology.metrics.trees import linear_chain_scores

    chains = [[0] + list(range(1, n)) for n in (4, 6, 9)]  # word i+1 headed by word i, the first the root
    keeps = [np.ones(len(h), bool) for h in chains]
    got = linear_chain_scores(chains, keeps)
    assert got["uuas"] == 1.0 and got["root_acc"] == 1.0 and got["dspr"] == pytest.approx(1.0)
    got = linear_chain_scores([list(HEADS)], [np.array([u != "PUNCT" for u in UPOS])], n_bootstrap=50)
    chain = np.abs(np.subtract.outer(np.arange(9), np.arange(9))).astype(float)
    expect = score_distances([chain], [list(HEADS)], [np.array([u != "PUNCT" for u in UPOS])])
    assert got["uuas"] == expect["uuas"] < 1 and got["root_acc"] == 0.0 and "uuas_ci" in got
