"""The measure-agreement table on hand-built tables: each headline's numbers checked against a hand computation
(ranks by hand for rho, sets by hand for the overlap); per-layer measures against the head mean of weights."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from bertology.experiments.measure_agreement import agreement, missing_inputs, spearman, top_k_overlap

HEADS = [(layer, head) for layer in (1, 2) for head in range(3)]


def _change(measure: str, js: list[float]) -> pd.DataFrame:
    return pd.DataFrame({"measure": measure, "layer": [u[0] for u in HEADS], "head": [u[1] for u in HEADS],
                         "cosine": 1.0, "js_divergence": js, "n_examples": 4, "mode": "cropped"})


def _rho_by_hand(a: list[float], b: list[float]) -> float:
    """Pearson of the ranks (no ties), 1 - 6 sum d^2 / (n (n^2 - 1))."""
    ra, rb = np.argsort(np.argsort(a)), np.argsort(np.argsort(b))
    n = len(a)
    return 1 - 6 * float(((ra - rb) ** 2).sum()) / (n * (n * n - 1))


def test_top_changed_heads_rho_and_overlap():
    w = [0.6, 0.5, 0.4, 0.3, 0.2, 0.1]
    norm = [0.1, 0.5, 0.4, 0.3, 0.2, 0.6]  # the top head of weights is the last under norm
    table = pd.concat([_change("weights", w), _change("norm", norm)], ignore_index=True)
    row = agreement({"attention_change": table}).iloc[0]
    assert row["rank_correlation"] == pytest.approx(_rho_by_hand(w, norm), abs=1e-12)
    # top 5 of weights: all but L2H2; of norm: all but L1H0 -> 4 shared of 5
    assert row["top_k_overlap"] == pytest.approx(4 / 5)
    assert (row["weights_unit"], row["measure_unit"], row["level"]) == ("L1H0", "L2H2", "head")
    assert bool(row["agrees"])


def test_a_per_layer_measure_is_compared_with_the_head_mean_of_each_layer():
    w = [0.6, 0.5, 0.4, 0.3, 0.2, 0.1]  # layer means 0.5 and 0.2
    rollout = pd.DataFrame({"measure": "rollout", "layer": [1, 2], "head": -1, "cosine": 1.0,
                            "js_divergence": [0.01, 0.02], "n_examples": 4, "mode": "cropped"})
    row = agreement({"attention_change": pd.concat([_change("weights", w), rollout])}).iloc[0]
    assert row["level"] == "layer" and row["n_units"] == 2
    assert row["rank_correlation"] == pytest.approx(-1.0)
    assert row["weights_value"] == pytest.approx(0.5) and row["weights_unit"] == "L1"
    assert row["measure_unit"] == "L2" and row["top_k_overlap"] == pytest.approx(1.0)  # k = 2 layers: both


def _targets(measure: str, sep: list[float], heads=(0, 1)) -> pd.DataFrame:
    rows = [{"measure": measure, "model": "base", "layer": layer, "head": head, "target": "sep", "variant": "share",
             "value": v, "unit": "attention"}
            for (layer, head), v in zip([(l, h) for l in (1, 2, 3) for h in heads], sep)]
    return pd.DataFrame(rows)


def test_target_shares_per_layer_and_the_layer_profile():
    w = [0.1, 0.3, 0.5, 0.7, 0.2, 0.2]  # layer means 0.2, 0.6, 0.2
    norm = [0.1, 0.1, 0.1, 0.1, 0.05, 0.05]  # 0.1, 0.1, 0.05: the [SEP] peak of layer 2 is gone
    out = agreement({"attention_targets": pd.concat([_targets("weights", w), _targets("norm", norm)])})
    layers = out[out["layer"].notna()].set_index("layer")
    assert layers["weights_value"].tolist() == pytest.approx([0.2, 0.6, 0.2])
    assert layers["measure_value"].tolist() == pytest.approx([0.1, 0.1, 0.05])
    assert layers["agrees"].tolist() == [True, False, False]  # |0.2 - 0.1| <= 0.1; 0.5 and 0.15 apart
    profile = out[out["layer"].isna()].iloc[0]
    assert profile["rank_correlation"] == pytest.approx(spearman([0.2, 0.6, 0.2], [0.1, 0.1, 0.05]))
    assert (out["headline"] == "sep_share").all()


def _relations(measure: str, acc: list[float], units=HEADS) -> pd.DataFrame:
    return pd.DataFrame({"measure": measure, "model": "base", "relation": "nsubj", "direction": "dep->head",
                         "layer": [u[0] for u in units], "head": [u[1] for u in units], "accuracy": acc})


def test_best_head_per_relation_same_head_and_its_scores():
    w = [0.2, 0.9, 0.1, 0.3, 0.3, 0.3]
    same = agreement({"relation_heads": pd.concat([_relations("weights", w),
                                                   _relations("norm", [0.5, 0.5, 0.1, 0.2, 0.2, 0.2])])}).iloc[0]
    # L1H1 is tied best under norm: it still is a best head there
    assert (same["weights_unit"], same["measure_unit"]) == ("L1H1", "L1H0")
    assert (same["weights_value"], same["measure_value"]) == (0.9, 0.5) and bool(same["agrees"])
    other = agreement({"relation_heads": pd.concat([_relations("weights", w),
                                                    _relations("norm", [0.5, 0.4, 0.1, 0.2, 0.2, 0.2])])}).iloc[0]
    assert other["measure_value"] == 0.4 and not bool(other["agrees"])
    layer = agreement({"relation_heads": pd.concat([_relations("weights", w),
                                                    _relations("rollout", [0.3, 0.6], [(1, -1), (2, -1)])])}).iloc[0]
    assert layer["level"] == "layer" and layer["measure_value"] == 0.3 and not bool(layer["agrees"])


def test_pattern_shares():
    def patterns(measure, fractions):
        return pd.DataFrame({"measure": measure, "model": "base", "layer": [u[0] for u in HEADS],
                             "head": [u[1] for u in HEADS], "pattern": "vertical", "fraction": fractions})
    out = agreement({"attention_patterns": pd.concat([patterns("weights", [1, 1, 1, 0, 0, 0]),
                                                      patterns("norm", [1, 0, 0, 0, 0, 0])])}).iloc[0]
    assert (out["headline"], out["weights_value"], out["measure_value"]) == ("vertical_share", 0.5, pytest.approx(1 / 6))
    assert not bool(out["agrees"])


def test_helpers_and_refusals():
    assert top_k_overlap(pd.Series([3, 2, 1]), pd.Series([1, 2, 3]), k=1) == 0.0
    assert np.isnan(spearman([1, 1, 1], [1, 2, 3]))
    assert missing_inputs(None, ("weights",)) is not None
    assert missing_inputs(None, ("norm", "rollout")) is not None  # no reference
    assert missing_inputs(None, ("weights", "norm")) is None
    assert missing_inputs({"attention_change": _change("weights", [0.0] * 6).drop(columns="measure")},
                          ("weights", "norm")) is not None
    assert agreement({}).empty
