"""The degenerate-classifier check: the Wilson interval against a hand computation, the verdicts, and
what the ablation summary and report section say (and do not say) for a constant classifier."""
import math

import numpy as np
import pytest

from bertology.experiments.ablation import TABLE_COLUMNS, plan_units, score_units, summary
from bertology.experiments.ablation_table import Bootstrap
from bertology.experiments.degenerate import (
    CHECK_COLUMNS,
    accuracy_interval,
    chance_rate,
    check_predictions,
    table_degeneracy,
)

Z = 1.959963984540054  # the 0.975 quantile of the standard normal


def _wilson_by_hand(k: int, n: int) -> tuple[float, float]:
    p, z2 = k / n, Z * Z
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = Z / (1 + z2 / n) * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    return centre - half, centre + half


def test_accuracy_interval_is_wilson_by_hand():
    # 10 of 20: centre 0.5, half-width 1.959964 / 1.192073 * sqrt(0.0125 + 0.0024009) = 0.200702
    assert accuracy_interval(10, 20) == pytest.approx((0.299298, 0.700702), abs=1e-6)
    for k, n in [(0, 7), (7, 7), (130, 200), (1, 3)]:
        assert accuracy_interval(k, n) == pytest.approx(_wilson_by_hand(k, n), abs=1e-12)
    with pytest.raises(ValueError):
        accuracy_interval(0, 0)


def test_chance_is_the_majority_class_rate():
    assert chance_rate(np.array([0, 1, 0, 1])) == 0.5
    assert chance_rate(np.array([2, 2, 2, 0, 1])) == pytest.approx(0.6)


def test_verdicts():
    constant = check_predictions(0.5, 200, 1, 0.5)  # the RTE run
    assert constant.flagged and constant.constant_predictions and constant.at_chance
    assert "one class for every example" in constant.note and "no head or layer can be called needed" in constant.note
    near_chance = check_predictions(0.54, 200, 2, 0.5)  # 108/200: the interval's low end is 0.471
    assert near_chance.flagged and not near_chance.constant_predictions and "not above chance" in near_chance.note
    good = check_predictions(0.9, 200, 2, 0.5)
    assert not good.flagged and "above chance" in good.note
    below = check_predictions(0.1, 200, 2, 0.5)  # worse than always guessing the majority class is not above chance
    assert below.at_chance and below.flagged
    d = constant.to_dict()
    assert d["ci"] == list(accuracy_interval(100, 200)) and d["chance"] == 0.5 and d["flagged"] is True


def _table(pred_intact: np.ndarray, y: np.ndarray, rng: np.random.Generator):
    units = plan_units(1, 2)
    per_example = {}
    for u in units:
        pred = pred_intact if u.target == "intact" else np.where(rng.random(len(y)) < 0.2, 1 - pred_intact, pred_intact)
        per_example[u.key] = {"pred": pred, "loss": rng.random(len(y))}
    return score_units(units, per_example, y, mode="uniform", exclude_special=False, bootstrap=Bootstrap(50))


def test_constant_classifier_summary_names_no_head():
    rng = np.random.default_rng(0)
    y = np.arange(40) % 2
    t = _table(np.zeros(40, dtype=np.int64), y, rng)
    assert list(t.columns) == TABLE_COLUMNS and list(t.columns[-4:-2]) == list(CHECK_COLUMNS)
    assert list(t.columns[-2:]) == ["task", "main_metric"] and set(t["main_metric"]) == {"accuracy"}
    intact = t[t["target"] == "intact"]
    assert set(intact["n_predicted"]) == {1} and set(t["chance"]) == {0.5}
    assert table_degeneracy(t).constant_predictions
    lines = summary({"ablation": t}).splitlines()
    assert lines[0].startswith("DEGENERATE CLASSIFIER: the tuned model predicts one class for every example (accuracy 0.500")
    assert lines[0].endswith("no head or layer can be called needed")
    assert lines[1].startswith("intact: accuracy 0.5000")
    assert not any("hurts beyond" in line for line in lines)


def test_separable_classifier_is_not_flagged():
    rng = np.random.default_rng(0)
    y = np.arange(40) % 2
    t = _table(y.copy(), y, rng)
    verdict = table_degeneracy(t)
    assert verdict is not None and not verdict.flagged and verdict.value == 1.0 and verdict.n_predicted == 2
    text = summary({"ablation": t})
    assert "DEGENERATE" not in text and "removal hurts beyond the 95% CI (accuracy):" in text


def test_table_without_the_check_columns_says_nothing():
    """A run written before the check existed: no verdict either way, and the summary reads as before."""
    rng = np.random.default_rng(0)
    y = np.arange(40) % 2
    old = _table(np.zeros(40, dtype=np.int64), y, rng).drop(columns=list(CHECK_COLUMNS))
    assert table_degeneracy(old) is None
    assert summary({"ablation": old}).startswith("intact: accuracy")


def test_report_section_names_no_needed_head_for_a_constant_classifier(tmp_path):
    from bertology.report.sections.ablation import ablation_section
    from bertology.report.sections.base import Figures

    rng = np.random.default_rng(0)
    y = np.arange(40) % 2
    warnings: list[str] = []
    for pred, flagged in ((np.zeros(40, dtype=np.int64), True), (y.copy(), False)):
        derived: list[dict] = []
        t = _table(pred, y, rng)
        out = ablation_section({"ablation": t}, Figures(tmp_path, warnings), derived, warnings)
        card = next(c for c in derived if c["label"] == "Unit the task needs most")
        if flagged:
            assert card["text"] == "none can be named" and "predictions constant" in out["degenerate"]
            assert out["facts"][0][0] == "Degenerate classifier"
            assert warnings and "cannot say which heads the task needs" in warnings[-1]
        else:
            hurt = t[(t["metric"] == "accuracy") & t["hurts"] & (t["ci_high"] > t["ci_low"])].sort_values("delta")
            assert card["text"] == (hurt["label"].iloc[0] if len(hurt) else "none beyond its interval")
            assert out["degenerate"] is None
            assert len(warnings) == 1  # nothing added for the good classifier


def test_a_rank_correlation_that_cannot_exist_is_said_in_words_not_printed_as_nan():
    """A model whose every removal changes nothing: importance vs deltas has no ranks to correlate."""
    import pandas as pd

    y = np.arange(40) % 2
    units = plan_units(1, 2)
    same = {u.key: {"pred": np.zeros(40, dtype=np.int64), "loss": np.full(40, 0.5)} for u in units}
    t = score_units(units, same, y, mode="uniform", exclude_special=False, bootstrap=Bootstrap(20))
    imp = pd.DataFrame({"layer": [1, 1], "head": [0, 1], "importance": [0.2, 0.8], "importance_raw": [0.1, 0.4]})
    text = summary({"ablation": t, "head_importance": imp})
    line = next(x for x in text.splitlines() if x.startswith("head importance vs single-head deltas"))
    assert "nan" not in line and line.count("undefined (no variation)") == 3
