"""Chu-Liu-Edmonds with one root (bertology.metrics.arborescence) against brute force over every tree."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from bertology.metrics.arborescence import max_spanning_tree, tree_score
from bertology.metrics.trees import check_heads


def _trees(n: int):
    """Every head assignment of ``n`` words that is one tree with exactly one root (checked by metrics.trees)."""
    for heads in itertools.product(range(n + 1), repeat=n):
        try:
            check_heads(heads)
        except ValueError:
            continue
        yield np.asarray(heads)


def _brute_force(scores: np.ndarray) -> float:
    return max(tree_score(scores, h) for h in _trees(scores.shape[0] - 1))


@pytest.mark.parametrize("n", [1, 2, 3, 4, 5])
def test_mst_matches_brute_force_over_all_one_root_trees(n):
    rng = np.random.default_rng(n)
    for _ in range(40 if n < 5 else 15):
        scores = rng.normal(size=(n + 1, n + 1)) * rng.choice([0.5, 3.0])
        heads = max_spanning_tree(scores)
        check_heads(heads)  # a tree, exactly one root
        assert tree_score(scores, heads) == pytest.approx(_brute_force(scores), abs=1e-9)


def test_root_bonus_would_make_every_word_a_root_but_one_root_is_kept():
    rng = np.random.default_rng(7)
    scores = rng.normal(size=(6, 6))
    scores[1:, 0] += 10.0  # the argmax attaches every word to the root
    heads = max_spanning_tree(scores)
    assert int((heads == 0).sum()) == 1
    assert tree_score(scores, heads) == pytest.approx(_brute_force(scores))


def test_cycles_are_broken_at_the_best_entry():
    # words 1 and 2 prefer each other (a cycle); word 3 prefers word 1; the root prefers word 2 as its child
    scores = np.full((4, 4), -5.0)
    scores[1, 2], scores[2, 1], scores[3, 1] = 10.0, 10.0, 8.0
    scores[1, 0], scores[2, 0] = 1.0, 3.0
    assert max_spanning_tree(scores).tolist() == [2, 0, 1]


def test_an_argmax_tree_is_returned_as_it_is_and_forbidden_edges_are_never_used():
    scores = np.full((4, 4), -np.inf)
    scores[1, 0], scores[2, 1], scores[3, 2] = 1.0, 1.0, 1.0
    scores[3, 1] = 0.5
    assert max_spanning_tree(scores).tolist() == [0, 1, 2]
    scores[1, 2] = np.nan  # NaN reads as not allowed
    assert max_spanning_tree(scores).tolist() == [0, 1, 2]


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError):
        max_spanning_tree(np.zeros((3, 2)))
    with pytest.raises(ValueError):
        max_spanning_tree(np.zeros((1, 1)))
