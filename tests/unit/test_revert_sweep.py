"""The revert sweep: the tuned model is bit-identical afterwards, each unit's records equal a hand-made model's,
ALBERT's plan holds the embeddings only (with the reason), and the table reads like the other modes'."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from transformers import AutoModelForSequenceClassification

from bertology.data.corpus import Corpus, Example
from bertology.data.encode import encode_corpus
from bertology.errors import BertologyError
from bertology.experiments.ablation_units import SweepPlan
from bertology.experiments.interventions import run_revert
from bertology.experiments.revert_sweep import plan_revert_units
from bertology.experiments.scoring import HeadScoring
from bertology.models.loading import load_model
from bertology.testing import SENTENCES, move_every_weight, save_tiny_family, tiny_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")


def _pair(tmp_path, model_type: str = "bert"):
    folder = save_tiny_family(tmp_path / model_type, model_type)
    base = load_model(folder).model
    torch.manual_seed(1)
    tuned = AutoModelForSequenceClassification.from_pretrained(folder, num_labels=2, attn_implementation="eager").eval()
    move_every_weight(tuned.parameters())
    return base, tuned


def _encoded(tuned):
    tok = tiny_tokenizer()
    texts = SENTENCES * 2
    with torch.inference_mode():
        pred = tuned(**tok(texts, padding=True, return_tensors="pt")).logits.argmax(-1).tolist()
    corpus = Corpus([Example(t, label=str(y)) for t, y in zip(texts, pred)], source="test")
    return encode_corpus(corpus, tok, 64), np.array(pred)


def test_revert_sweep_restores_the_model_and_each_unit_equals_a_hand_copy(tmp_path):
    base, tuned = _pair(tmp_path)
    encoded, labels = _encoded(tuned)
    before = {k: v.clone() for k, v in tuned.state_dict().items()}
    scoring = HeadScoring.for_tokenizer(tiny_tokenizer(), batch_size=8)
    result = run_revert(tuned, base, encoded, labels, scoring, n_bootstrap=50)
    assert all(torch.equal(before[k], v) for k, v in tuned.state_dict().items())  # bit-identical after the sweep
    # layer 2 reverted by hand (tensors named explicitly), scored as an intact model: the same records, exactly
    hand = copy.deepcopy(tuned)
    with torch.no_grad():
        for name, p in hand.bert.encoder.layer[1].named_parameters():
            p.copy_(base.encoder.layer[1].get_parameter(name))
    ref = run_revert(hand, base, encoded, labels, scoring, sweep=SweepPlan(heads=False, layer_modes=()), n_bootstrap=0)
    for rec in ("pred", "loss"):
        np.testing.assert_array_equal(result.per_example["layer-layer-L2"][rec], ref.per_example["intact"][rec])
    assert not np.array_equal(result.per_example["intact"]["loss"], ref.per_example["intact"]["loss"])
    t = result.table
    assert set(t["mode"]) == {"revert"} and result.params["refused"] is None
    assert set(t.loc[t["target"] == "layer", "layer_mode"]) == {
        "revert_attention", "revert_ffn", "revert_layer", "revert_embeddings"}
    assert "degenerate" in result.params and result.params["method"] == "cached"


def test_albert_plans_the_embeddings_only_and_says_why(tmp_path):
    _, tuned = _pair(tmp_path, "albert")
    units, refused = plan_revert_units(tuned)
    assert [u.key for u in units] == ["intact", "layer-embeddings-L0"]
    assert "shares one layer's weights across all depths" in refused
    with pytest.raises(BertologyError, match="leave --layers out"):
        plan_revert_units(tuned, layers=[2])
