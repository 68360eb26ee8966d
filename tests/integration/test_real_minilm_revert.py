"""Revert on the packaged all-MiniLM-L6-v2 (marker `real`): one layer and one head reverted through the weight layout
equal the model built by copying the base tensors by hand, and the cached revert sweep gives the hand copy's records.

The hand copies name BERT's tensors explicitly (not through the adapter), so a wrong layout fails here. Same weights,
same forward: logits are compared with rtol=0, atol=0.
"""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from bertology.data.corpus import Corpus, Example
from bertology.data.encode import encode_corpus
from bertology.experiments.ablation_units import SweepPlan
from bertology.experiments.interventions import run_revert
from bertology.experiments.scoring import HeadScoring
from bertology.models.loading import load_model
from bertology.models.revert import reverted, unit_pieces
from bertology.testing import SENTENCES, move_every_weight

pytestmark = [pytest.mark.real, pytest.mark.usefixtures("one_thread")]


@pytest.fixture(scope="module")
def minilm():
    """(base encoder, "tuned" 2-label classifier: every weight moved, tokenizer)."""
    base = load_model("minilm", kind="encoder").model
    loaded = load_model("minilm", kind="classifier", num_labels=2)
    torch.manual_seed(0)
    move_every_weight(loaded.model.parameters(), 0.2)
    return base, loaded.model, loaded.tokenizer


def _logits(model, inputs) -> torch.Tensor:
    with torch.inference_mode():
        return model(**inputs).logits


def test_reverting_one_layer_and_one_head_of_minilm_equals_a_hand_copy(minilm):
    base, tuned, tok = minilm
    inputs = tok(SENTENCES[:6], padding=True, return_tensors="pt")
    hand = copy.deepcopy(tuned)
    with torch.no_grad():
        for name, p in hand.bert.encoder.layer[3].named_parameters():
            p.copy_(base.encoder.layer[3].get_parameter(name))
    with reverted(tuned, base, unit_pieces(tuned, "layer", 4)):
        got = _logits(tuned, inputs)
    assert torch.equal(got, _logits(hand, inputs)) and not torch.equal(got, _logits(tuned, inputs))
    hand = copy.deepcopy(tuned)
    d, h = 32, 5  # 384 / 12 heads
    rows = slice(h * d, (h + 1) * d)
    mine, theirs = hand.bert.encoder.layer[1].attention, base.encoder.layer[1].attention
    with torch.no_grad():
        for proj in ("query", "key", "value"):
            getattr(mine.self, proj).weight[rows] = getattr(theirs.self, proj).weight[rows]
            getattr(mine.self, proj).bias[rows] = getattr(theirs.self, proj).bias[rows]
        mine.output.dense.weight[:, rows] = theirs.output.dense.weight[:, rows]
    with reverted(tuned, base, unit_pieces(tuned, "head", 2, h)):
        got = _logits(tuned, inputs)
    assert torch.equal(got, _logits(hand, inputs)) and not torch.equal(got, _logits(tuned, inputs))


def test_the_cached_revert_sweep_on_minilm_equals_the_hand_copy(minilm):
    base, tuned, tok = minilm
    texts = SENTENCES * 2
    labels = np.array([i % 2 for i in range(len(texts))])
    encoded = encode_corpus(Corpus([Example(t, label=str(y)) for t, y in zip(texts, labels)], source="test"), tok, 64)
    scoring = HeadScoring.for_tokenizer(tok, batch_size=8)
    result = run_revert(tuned, base, encoded, labels, scoring, n_bootstrap=0,
                        sweep=SweepPlan(layers=[4], heads=False, layer_modes=("layer",)))
    hand = copy.deepcopy(tuned)
    with torch.no_grad():
        for name, p in hand.bert.encoder.layer[3].named_parameters():
            p.copy_(base.encoder.layer[3].get_parameter(name))
    ref = run_revert(hand, base, encoded, labels, scoring, sweep=SweepPlan(heads=False, layer_modes=()), n_bootstrap=0)
    assert result.params["method"] == "cached"
    for rec in ("pred", "loss"):
        np.testing.assert_array_equal(result.per_example["layer-layer-L4"][rec], ref.per_example["intact"][rec])
    assert not np.array_equal(result.per_example["intact"]["loss"], ref.per_example["intact"]["loss"])
