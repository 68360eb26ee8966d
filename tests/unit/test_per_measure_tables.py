"""How a table of several attention measures is stacked, and how a reader of one measure takes it back."""
from __future__ import annotations

import pandas as pd

from bertology.analyses.per_measure import stack
from bertology.results import weights_rows


def _table(value: float) -> pd.DataFrame:
    return pd.DataFrame({"layer": [1, 1, 2], "head": [0, 1, 0], "value": [value, value + 1, value + 2]})


def test_stack_puts_the_measure_first_and_one_head_for_a_per_layer_measure():
    t = stack({"weights": _table(0.0), "norm": _table(10.0), "rollout": _table(20.0).iloc[[0, 2]]})
    assert list(t.columns) == ["measure", "layer", "head", "value"]
    assert t["measure"].tolist() == ["weights"] * 3 + ["norm"] * 3 + ["rollout"] * 2
    assert t["head"].tolist() == [0, 1, 0, 0, 1, 0, -1, -1]
    assert t["value"].tolist() == [0, 1, 2, 10, 11, 12, 20, 22]


def test_the_head_distances_name_two_heads():
    pairs = pd.DataFrame({"layer_a": [1], "head_a": [0], "layer_b": [2], "head_b": [0], "js_divergence": [0.5]})
    t = stack({"value_zeroing": pairs})
    assert (t["head_a"].tolist(), t["head_b"].tolist(), t["layer_b"].tolist()) == ([-1], [-1], [2])


def test_weights_rows_give_back_the_weights_table():
    plain = _table(0.0)
    pd.testing.assert_frame_equal(weights_rows(stack({"norm": _table(5.0), "weights": plain})), plain)
    pd.testing.assert_frame_equal(weights_rows(plain), plain)  # a table of one measure is itself
    pd.testing.assert_frame_equal(weights_rows(stack({"norm": _table(5.0), "rollout": _table(9.0)})),
                                  _table(5.0))  # no weights: the first measure asked
