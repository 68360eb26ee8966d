"""Changed vs needed: Spearman with a bootstrap interval over units, on hand-made tables with a known answer."""
import numpy as np
import pandas as pd
import pytest
import scipy.stats as st

from bertology.experiments.changed_vs_needed import (
    describe_link, missing_inputs, paired_units, rank_links, summary, weight_change_units,
)
from bertology.metrics.rank_link import bootstrap_spearman, spearman_interval


def test_a_perfectly_monotone_pair_gives_one_and_a_reversed_pair_minus_one():
    x = np.array([0.1, 0.5, 0.2, 0.9, 0.3, 0.7])
    up = spearman_interval(x, x**3 + 2, n_bootstrap=200, seed=1)
    down = spearman_interval(x, -np.exp(x), n_bootstrap=200, seed=1)
    assert up.spearman == pytest.approx(1.0) and up.ci_low == pytest.approx(1.0) and up.ci_high == pytest.approx(1.0)
    assert down.spearman == pytest.approx(-1.0) and down.ci_high == pytest.approx(-1.0)
    assert up.n_units == 6 and up.reason is None


def test_a_constant_side_or_too_few_units_is_undefined_with_a_reason():
    const = spearman_interval([0.1, 0.2, 0.3, 0.4], [0.5] * 4, names=("change", "revert drop"))
    assert const.spearman is None and const.ci_low is None and "revert drop is the same for every unit" in const.reason
    few = spearman_interval([0.1, float("nan"), 0.3], [1.0, 2.0, 3.0])
    assert few.spearman is None and few.n_units == 2 and "at least 3" in few.reason


def test_the_bootstrap_equals_scipy_spearmanr_on_each_resample_and_is_seeded():
    rng = np.random.default_rng(0)
    x = rng.normal(size=12)
    y = np.round(x + rng.normal(size=12), 1)  # ties, as accuracy deltas have
    rhos = bootstrap_spearman(x, y, 50, seed=7)
    idx = np.random.default_rng(7).integers(0, 12, size=(50, 12))
    for r, i in zip(rhos, idx):
        ref = st.spearmanr(x[i], y[i]).statistic
        assert (np.isnan(r) and np.isnan(ref)) or r == pytest.approx(ref, abs=1e-12)
    a, b = spearman_interval(x, y, seed=3), spearman_interval(x, y, seed=3)
    assert a == b and a.ci_low < a.spearman < a.ci_high
    assert a.spearman == pytest.approx(st.spearmanr(x, y).statistic)


def _tables(need_order):
    """Two layers x two heads; weight change grows with (layer, head); the revert drop follows ``need_order``."""
    units = [(1, 0), (1, 1), (2, 0), (2, 1)]
    rows = []
    for i, (layer, head) in enumerate(units):
        for module in ("query", "key", "value", "attention_output"):
            rows.append({"layer": layer, "module": module, "head": head, "relative_change": 0.1 * (i + 1),
                         "delta_norm": np.nan, "base_norm": np.nan})
    for layer, d in ((1, 1.0), (2, 3.0)):
        rows.append({"layer": layer, "module": "ffn_in", "head": None, "relative_change": d / 2, "delta_norm": d,
                     "base_norm": 2.0})
    weight = pd.DataFrame(rows)
    abl = [{"target": "intact", "layer": None, "head": None, "layer_mode": None, "metric": "accuracy", "delta": 0.0}]
    abl += [{"target": "head", "layer": l, "head": h, "layer_mode": None, "metric": "accuracy", "delta": -0.1 * k}
            for (l, h), k in zip(units, need_order)]
    abl += [{"target": "layer", "layer": l, "head": None, "layer_mode": "revert_layer", "metric": "accuracy",
             "delta": -0.2 * l} for l in (1, 2)]
    ablation = pd.DataFrame(abl).assign(mode="revert", task="classification")
    return {"weight_change": weight, "ablation": ablation}


def test_the_table_pairs_each_head_and_layer_with_its_revert_drop():
    tables = _tables([1, 2, 3, 4])
    units = paired_units(tables)
    heads = units[units["level"] == "head"]
    assert list(heads["change"].round(6)) == [0.1, 0.2, 0.3, 0.4] and list(heads["needed"].round(6)) == [0.1, 0.2, 0.3, 0.4]
    layers = weight_change_units(tables["weight_change"]).query("level == 'layer'")
    assert list(layers["change"]) == [0.5, 1.5]  # sqrt(sum delta^2) / sqrt(sum base^2) over the block
    links = rank_links(units, 100, 0).set_index("level")
    assert links.loc["head", "spearman"] == pytest.approx(1.0) and links.loc["head", "n_units"] == 4
    assert links.loc["layer", "n_units"] == 2 and pd.isna(links.loc["layer", "spearman"])
    assert "at least 3" in links.loc["layer", "reason"]
    text = summary({"changed_vs_needed": links.reset_index()})
    assert "changed vs needed (heads): Spearman 1.00 [1.00, 1.00] between weight change and revert delta" in text
    assert "changed vs needed (layers): undefined (2 units" in text and "nan" not in text.lower()
    reversed_ = rank_links(paired_units(_tables([4, 3, 2, 1])), 100, 0)
    assert reversed_.loc[reversed_["level"] == "head", "spearman"].item() == pytest.approx(-1.0)


def test_a_constant_revert_drop_is_undefined_and_said_so():
    links = rank_links(paired_units(_tables([2, 2, 2, 2])), 100, 0)
    row = links[links["level"] == "head"].iloc[0]
    assert pd.isna(row["spearman"]) and "constant input" in row["reason"]
    assert describe_link(row).startswith("undefined (the drop in accuracy when reverted is the same")


def test_missing_inputs_name_what_is_missing():
    assert "revert mode" in missing_inputs(None, "uniform")
    assert missing_inputs(None, "revert") is None  # before the run: only the mode is known
    tables = _tables([1, 2, 3, 4])
    assert missing_inputs(tables, "revert") is None
    assert "weight_change or attention_change" in missing_inputs({"ablation": tables["ablation"]}, "revert")
    assert "no revert ablation" in missing_inputs({"weight_change": tables["weight_change"]}, "revert")
