"""Transplant (the base encoder under the tuned head, plus tuned units) against models built by hand.

The hand-made models name each family's tensors explicitly (not through the adapter's WeightLayout): every
encoder tensor from the base but the pooler (the task head's), then the named layer's tuned tensors copied back.
Same numbers in every weight give the same bits: logits are compared with rtol=0, atol=0.
"""
from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModelForSequenceClassification

from bertology.errors import BertologyError
from bertology.models import sites
from bertology.models.loading import load_model
from bertology.models.transplant import Part, parts_key, transplanted
from bertology.testing import SENTENCES, move_every_weight, save_tiny_family, tiny_tokenizer

pytestmark = pytest.mark.usefixtures("one_thread")

#: model_type -> (the encoder's parameter prefixes of layer ``l`` (1-based), by hand; the head-only prefixes)
HAND = {
    "bert": (lambda l, n: [f"encoder.layer.{l - 1}."], ("pooler.",)),
    "distilbert": (lambda l, n: [f"transformer.layer.{l - 1}."], ()),
    # ModernBERT's last hidden state is the final norm's output: it belongs to the last layer
    "modernbert": (lambda l, n: [f"layers.{l - 1}."] + (["final_norm."] if l == n else []), ()),
}


def _pair(root, model_type: str):
    folder = save_tiny_family(root / model_type, model_type)
    base = load_model(folder).model
    torch.manual_seed(1)
    tuned = AutoModelForSequenceClassification.from_pretrained(folder, num_labels=3, attn_implementation="eager").eval()
    move_every_weight(tuned.parameters(), 0.2)
    return base, tuned


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    root = tmp_path_factory.mktemp("transplant")
    return {mt: _pair(root, mt) for mt in (*HAND, "albert")}


@pytest.fixture(scope="module")
def batch():
    return tiny_tokenizer()(SENTENCES[:4], padding=True, return_tensors="pt")


def _logits(model, batch) -> torch.Tensor:
    with torch.inference_mode():
        return model(**sites.model_inputs(model, batch)).logits


def _by_hand(tuned, base, model_type: str, layers: list[int]):
    """A copy of ``tuned`` with every base encoder tensor but the head's, then ``layers``' tuned tensors put back."""
    prefixes, head_only = HAND[model_type]
    n = tuned.config.num_hidden_layers
    keep = tuple(p for layer in layers for p in prefixes(layer, n))
    hand = copy.deepcopy(tuned)
    hand_enc, base_enc = sites.encoder(hand), sites.encoder(base)
    with torch.no_grad():
        for name, p in hand_enc.named_parameters():
            if not name.startswith(head_only) and not (keep and name.startswith(keep)):
                p.copy_(base_enc.get_parameter(name))
    return hand


@pytest.mark.parametrize("model_type", list(HAND))
def test_head_alone_and_one_layer_equal_the_models_built_by_hand(pairs, batch, model_type):
    base, tuned = pairs[model_type]
    before = {k: v.clone() for k, v in tuned.state_dict().items()}
    tuned_logits = _logits(tuned, batch)
    n = tuned.config.num_hidden_layers
    with transplanted(tuned, base, []):
        head_alone = _logits(tuned, batch)
    assert torch.equal(head_alone, _logits(_by_hand(tuned, base, model_type, []), batch))
    assert not torch.equal(head_alone, tuned_logits)  # the base encoder really is in
    for layer in (1, n):
        with transplanted(tuned, base, [Part("layer", layer)]):
            got = _logits(tuned, batch)
        hand = _logits(_by_hand(tuned, base, model_type, [layer]), batch)
        torch.testing.assert_close(got, hand, rtol=0, atol=0)
        assert not torch.equal(got, head_alone)
    # every layer and the embeddings transplanted: the tuned model, exactly
    with transplanted(tuned, base, [Part("embeddings"), *(Part("layer", x) for x in range(1, n + 1))]):
        torch.testing.assert_close(_logits(tuned, batch), tuned_logits, rtol=0, atol=0)
    assert all(torch.equal(before[k], v) for k, v in tuned.state_dict().items())


def test_one_head_transplanted_keeps_its_rows_only(pairs, batch):
    base, tuned = pairs["bert"]
    d = tuned.config.hidden_size // tuned.config.num_attention_heads
    hand = _by_hand(tuned, base, "bert", [])
    blk = "encoder.layer.1.attention"
    with torch.no_grad():
        for name in ("self.query.weight", "self.query.bias", "self.key.weight", "self.key.bias", "self.value.weight",
                     "self.value.bias"):
            hand.bert.get_parameter(f"{blk}.{name}")[2 * d:3 * d] = tuned.bert.get_parameter(f"{blk}.{name}")[2 * d:3 * d]
        hand.bert.get_parameter(f"{blk}.output.dense.weight")[:, 2 * d:3 * d] = \
            tuned.bert.get_parameter(f"{blk}.output.dense.weight")[:, 2 * d:3 * d]
    with transplanted(tuned, base, [Part("head", 2, 2)]):
        torch.testing.assert_close(_logits(tuned, batch), _logits(hand, batch), rtol=0, atol=0)


def test_restored_when_the_body_raises_and_albert_refuses_layers(pairs):
    base, tuned = pairs["bert"]
    before = {k: v.clone() for k, v in tuned.state_dict().items()}
    with pytest.raises(RuntimeError), transplanted(tuned, base, [Part("ffn", 1)]):
        raise RuntimeError("boom")
    assert all(torch.equal(before[k], v) for k, v in tuned.state_dict().items())
    a_base, a_tuned = pairs["albert"]
    with pytest.raises(BertologyError, match="shares one layer"):
        with transplanted(a_tuned, a_base, [Part("layer", 1)]):
            pass
    with transplanted(a_tuned, a_base, [Part("embeddings")]):  # its embeddings can be transplanted
        pass
    assert parts_key([Part("layer", 2), Part("embeddings")]) == parts_key([Part("embeddings"), Part("layer", 2)])
