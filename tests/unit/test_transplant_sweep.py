"""The transplant sweep: curve endpoints equal the head alone and the tuned model exactly, the model is restored
bit for bit, the gain formula on hand-made numbers, and the undefined-denominator case says why."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import AutoModelForSequenceClassification

from bertology.data.corpus import Corpus, Example
from bertology.data.encode import encode_corpus
from bertology.errors import BertologyError
from bertology.experiments.scoring import HeadScoring
from bertology.experiments.transplant_score import denominator_reason, gain_of, gain_recovered
from bertology.experiments.transplant_sweep import plan_transplant, run_transplant
from bertology.models.loading import load_model
from bertology.models.transplant import transplanted
from bertology.testing import SENTENCES, move_every_weight, save_tiny_family, tiny_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")


def _pair(tmp_path, model_type: str = "bert", scale: float = 0.3):
    folder = save_tiny_family(tmp_path / model_type, model_type)
    base = load_model(folder).model
    torch.manual_seed(1)
    tuned = AutoModelForSequenceClassification.from_pretrained(folder, num_labels=2, attn_implementation="eager").eval()
    move_every_weight(tuned.parameters(), scale)
    return base, tuned


def _encoded(tuned, labels=None):
    tok = tiny_tokenizer()
    texts = SENTENCES * 3
    with torch.inference_mode():
        pred = tuned(**tok(texts, padding=True, return_tensors="pt")).logits.argmax(-1).tolist()
    labels = pred if labels is None else labels
    corpus = Corpus([Example(t, label=str(y)) for t, y in zip(texts, labels)], source="test")
    return encode_corpus(corpus, tok, 64), np.array(labels)


def test_curve_endpoints_are_the_head_alone_and_the_tuned_model_exactly(tmp_path):
    base, tuned = _pair(tmp_path)
    encoded, labels = _encoded(tuned)  # labels = the tuned model's predictions: accuracy 1 tuned
    before = {k: v.clone() for k, v in tuned.state_dict().items()}
    scoring = HeadScoring.for_tokenizer(tiny_tokenizer(), batch_size=8)
    result = run_transplant(tuned, base, encoded, labels, scoring, n_bootstrap=200)
    assert all(torch.equal(before[k], v) for k, v in tuned.state_dict().items())  # bit-identical after the sweep
    t, n = result.table, result.params["n_layers"]
    curve = t[t["unit_kind"] == "layers"]
    for metric in ("accuracy", "loss"):
        c = curve[curve["metric"] == metric]
        k0, kL = c[c["k"] == 0], c[c["k"] == n]
        assert len(k0) == len(kL) == 2  # top and bottom
        assert (k0["value"] == k0["value_head_alone"]).all()
        assert (kL["value"] == kL["value_tuned"]).all()  # the transplant of everything is the tuned model, exactly
    # the tuned model's loss, computed on its own, equals the k = L transplant's records bit for bit
    key_all = next(r.key for r in result.rows if r.kind == "layers" and r.k == n)
    np.testing.assert_array_equal(result.per_example[key_all]["loss"], result.per_example["intact"]["loss"])
    assert not np.array_equal(result.per_example["transplant-none"]["loss"], result.per_example["intact"]["loss"])
    loss = curve[curve["metric"] == "loss"]
    assert np.allclose(loss.loc[loss["k"] == n, "gain_recovered"], 1.0)
    assert np.allclose(loss.loc[loss["k"] == 0, "gain_recovered"], 0.0)
    assert set(t["unit_kind"]) == {"embeddings", "layer", "attention", "ffn", "layers"}  # heads: off by default
    assert (loss["ci_low"] <= loss["gain_recovered"] + 1e-12).all()


def test_gain_formula_on_hand_made_numbers():
    # accuracy: head alone 0.5, tuned 0.9, unit 0.8 -> (0.8 - 0.5) / (0.9 - 0.5) = 0.75
    assert gain_recovered(np.array(0.8), np.array(0.5), np.array(0.9)) == pytest.approx(0.75)
    # loss (lower is better): head alone 2.0, tuned 1.0, unit 1.5 -> 0.5
    point = np.array([1.0, 2.0, 1.5])  # tuned, head alone, unit
    g = gain_of(point, None, 2, 1, 0, higher_is_better=False)
    assert g.value == pytest.approx(0.5) and g.reason == "" and np.isnan(g.ci_low)
    boot = np.array([[1.0, 2.0, 1.5], [1.0, 3.0, 2.0], [0.5, 1.5, 1.0]] * 10)
    g = gain_of(point, boot, 2, 1, 0, higher_is_better=False)
    assert g.ci_low == pytest.approx(0.5) and g.ci_high == pytest.approx(0.5)  # each resample's ratio is 0.5


def test_gain_is_undefined_when_the_tuned_model_is_not_better_than_the_head_alone():
    point = np.array([0.70, 0.68, 0.80])  # tuned barely above head alone; the unit above both
    boot = np.array([[0.70, 0.72, 0.8], [0.71, 0.66, 0.8], [0.69, 0.69, 0.8]] * 10)  # interval spans 0
    g = gain_of(point, boot, 2, 1, 0, higher_is_better=True)
    assert np.isnan(g.value) and np.isnan(g.ci_low) and "not better than the head alone" in g.reason
    assert "interval" in denominator_reason(-0.1, -0.2, 0.05, True)
    assert denominator_reason(0.1, 0.02, 0.2, True) == ""
    assert "not better" in denominator_reason(0.0, float("nan"), float("nan"), True)  # no bootstrap, no gain


def test_sweep_says_undefined_in_the_rows_when_the_tuned_model_gains_nothing(tmp_path):
    base, tuned = _pair(tmp_path)
    with transplanted(tuned, base, []):  # labels = the head alone's predictions: the tuned model is worse
        encoded, labels = _encoded(tuned)
    scoring = HeadScoring.for_tokenizer(tiny_tokenizer(), batch_size=8)
    t = run_transplant(tuned, base, encoded, labels, scoring, n_bootstrap=200).table
    acc = t[t["metric"] == "accuracy"]
    undefined = acc[acc["reason"] != ""]
    assert len(undefined) == len(acc) and undefined["gain_recovered"].isna().all() and undefined["ci_low"].isna().all()
    assert acc["value_tuned"].iloc[0] < acc["value_head_alone"].iloc[0] == 1.0


def test_albert_plans_the_embeddings_only_and_says_why(tmp_path):
    _, tuned = _pair(tmp_path, "albert")
    rows, refused = plan_transplant(tuned)
    assert [r.kind for r in rows] == ["embeddings"] and "shares one layer" in refused
    with pytest.raises(BertologyError, match="leave --layers out"):
        plan_transplant(tuned, layers=[1])
    _, bert = _pair(tmp_path, "bert")
    rows, _ = plan_transplant(bert, heads=True)
    assert sum(r.kind == "head" for r in rows) == 2 * 4
