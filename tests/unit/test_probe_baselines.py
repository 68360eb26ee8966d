"""The structural probes' yardsticks: the linear-chain baseline on real TreeSets and the capacity warning."""
import numpy as np
import pytest

from bertology.data.corpus import Corpus, Example
from bertology.experiments.probe_baselines import (
    BASELINE_COLUMNS,
    baseline_record,
    baseline_result,
    baseline_table,
    capacity_warning,
)
from bertology.experiments.probe_trees import tree_set


def _trees(heads_per_sentence, name):
    examples = []
    for heads in heads_per_sentence:
        words = [f"w{i}" for i in range(len(heads))]
        examples.append(Example(text=" ".join(words), words=words, heads=list(heads), upos=["X"] * len(heads)))
    return tree_set(Corpus(examples, name=name), name=name)


def test_the_baseline_scores_the_edges_and_roots_a_chain_gets_right_counted_by_hand():
    # star: word 1 heads every other word (edges 1-2, 1-3, 1-4); the chain has 1-2, 2-3, 3-4: 1 of 3 edges,
    # and its root (the first word) is right. Left chain: word k+1 heads word k: every edge, the wrong root.
    star, left = [0, 1, 1, 1], [2, 3, 4, 0]
    t = baseline_table({"dev": _trees([star], "dev"), "test": _trees([star, left], "test")})
    assert list(t.columns) == BASELINE_COLUMNS
    dev = t[t.split == "dev"].set_index("probe")
    assert dev.loc["distance", "uuas"] == pytest.approx(1 / 3) and dev.loc["depth", "root_acc"] == 1.0
    test = t[t.split == "test"].set_index("probe")
    assert test.loc["distance", "uuas"] == pytest.approx((1 + 3) / 6)  # corpus UUAS: 4 of the 6 gold edges
    assert test.loc["depth", "root_acc"] == 0.5 and (test["n_sentences"] == 2).all()
    assert np.isnan(test.loc["distance", "root_acc"]) and np.isnan(test.loc["depth", "uuas"])


def test_the_baseline_goes_through_json_and_back_with_its_intervals():
    trees = _trees([[0, 1, 1, 1], [2, 3, 4, 0], [0, 1, 2, 3]], "test")
    t = baseline_table({"test": trees}, n_bootstrap=200, seed=3)
    dist = t[t.probe == "distance"].iloc[0]
    assert dist.uuas_ci_low <= dist.uuas <= dist.uuas_ci_high and dist.uuas_ci_low < dist.uuas_ci_high
    record = baseline_record(t)
    assert all(v is None or not (isinstance(v, float) and v != v) for row in record for v in row.values())
    back = baseline_result({"linear_chain": record}).table
    np.testing.assert_array_equal(back.select_dtypes("number").to_numpy(), t.select_dtypes("number").to_numpy())
    assert baseline_result({}) is None  # a probe run from before the baseline existed


def test_the_capacity_warning_fires_below_one_word_per_weight_and_names_a_rank_that_fits():
    assert capacity_warning(128 * 384, 128, 384) is None
    said = capacity_warning(10_000, 128, 384)
    assert "10,000 words for 49,152 weights" in said and "lower --probe-rank to 26 or less" in said
    assert "give more training sentences." in capacity_warning(100, 8, 384) and "--probe-rank" not in capacity_warning(100, 8, 384)
