"""Revert (the base model's weights put back into one unit) against copies made by hand, for every family.

The hand-made models name each family's tensors explicitly (not through the adapter's WeightLayout), so a
wrong layout makes these tests fail. A reverted model and its hand copy hold the same numbers in every
weight, so the same forward gives the same bits: logits are compared with rtol=0, atol=0.
"""
from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModelForSequenceClassification

from bertology.errors import BertologyError
from bertology.models import sites
from bertology.models.loading import load_model
from bertology.models.revert import all_pieces, check_base, encoder_parameter_names, piece_names, reverted, unit_pieces
from bertology.testing import FAMILY_CONFIGS, SENTENCES, move_every_weight, save_tiny_family, tiny_tokenizer

_BERT_ATT = ["attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense",
             "attention.output.LayerNorm"]
_BERT_FFN = ["intermediate.dense", "output.dense", "output.LayerNorm"]
#: model_type -> (block prefix, attention modules, ffn modules, head row modules, head column module); modules
#: are paths inside one block, named by hand from the Hugging Face classes.
HAND = {
    "bert": ("encoder.layer", _BERT_ATT, _BERT_FFN, _BERT_ATT[:3], "attention.output.dense"),
    "roberta": ("encoder.layer", _BERT_ATT, _BERT_FFN, _BERT_ATT[:3], "attention.output.dense"),
    "xlm-roberta": ("encoder.layer", _BERT_ATT, _BERT_FFN, _BERT_ATT[:3], "attention.output.dense"),
    "electra": ("encoder.layer", _BERT_ATT, _BERT_FFN, _BERT_ATT[:3], "attention.output.dense"),
    "distilbert": ("transformer.layer", ["attention.q_lin", "attention.k_lin", "attention.v_lin", "attention.out_lin",
                                         "sa_layer_norm"], ["ffn.lin1", "ffn.lin2", "output_layer_norm"],
                   ["attention.q_lin", "attention.k_lin", "attention.v_lin"], "attention.out_lin"),
    "deberta-v2": ("encoder.layer", ["attention.self.query_proj", "attention.self.key_proj", "attention.self.value_proj",
                                     "attention.self.pos_key_proj", "attention.self.pos_query_proj",
                                     "attention.output.dense", "attention.output.LayerNorm"], _BERT_FFN,
                   ["attention.self.query_proj", "attention.self.key_proj", "attention.self.value_proj",
                    "attention.self.pos_key_proj", "attention.self.pos_query_proj"], "attention.output.dense"),
    "mpnet": ("encoder.layer", ["attention.attn.q", "attention.attn.k", "attention.attn.v", "attention.attn.o",
                                "attention.LayerNorm"], _BERT_FFN,
              ["attention.attn.q", "attention.attn.k", "attention.attn.v"], "attention.attn.o"),
    "modernbert": ("layers", ["attn_norm", "attn.Wqkv", "attn.Wo"], ["mlp_norm", "mlp.Wi", "mlp.Wo"], ["attn.Wqkv"],
                   "attn.Wo"),
}
#: model_type -> the encoder's embedding-side parameter prefixes (reverted with the embeddings unit), by hand.
HAND_EMBEDDINGS = {
    "bert": ("embeddings.",), "roberta": ("embeddings.",), "xlm-roberta": ("embeddings.",),
    "electra": ("embeddings.", "embeddings_project."), "distilbert": ("embeddings.",),
    "albert": ("embeddings.", "encoder.embedding_hidden_mapping_in."),
    "deberta-v2": ("embeddings.", "encoder.rel_embeddings."), "mpnet": ("embeddings.", "encoder.relative_attention_bias."),
    "modernbert": ("embeddings.",),
}
VARIANTS = [(mt, mt, {}) for mt in FAMILY_CONFIGS if mt != "albert"] + [
    ("deberta-v2-conv", "deberta-v2", {"conv_kernel_size": 3}),
    ("deberta-v3", "deberta-v2", {"share_att_key": True, "norm_rel_ebd": "layer_norm", "position_buckets": 16}),
]
FAMILIES = [pytest.param(name, mt, id=name) for name, mt, _ in VARIANTS]


def _pair(root, name: str, model_type: str, extra: dict):
    """(base encoder, tuned classifier): the classifier starts from the base encoder, then everything is perturbed."""
    folder = save_tiny_family(root / name, model_type, **extra)
    base = load_model(folder).model
    torch.manual_seed(1)
    tuned = AutoModelForSequenceClassification.from_pretrained(folder, num_labels=3, attn_implementation="eager").eval()
    move_every_weight(tuned.parameters(), 0.2)  # a stand-in for fine-tuning
    return base, tuned


@pytest.fixture(scope="module")
def pairs(tmp_path_factory):
    root = tmp_path_factory.mktemp("revert")
    out = {name: _pair(root, name, mt, extra) for name, mt, extra in VARIANTS}
    out["albert"] = _pair(root, "albert", "albert", {})
    return out


@pytest.fixture(scope="module")
def batch():
    return tiny_tokenizer()(SENTENCES[:4], padding=True, return_tensors="pt")


def _logits(model, batch) -> torch.Tensor:
    with torch.inference_mode():
        return model(**sites.model_inputs(model, batch)).logits


def _copy_in(hand, base, names_and_index) -> None:
    """Copy ``base``'s tensors (or their slices) into the hand-made model: ``(param name from the encoder, index)``."""
    hand_enc, base_enc = sites.encoder(hand), sites.encoder(base)
    with torch.no_grad():
        for name, index in names_and_index:
            hand_enc.get_parameter(name)[index] = base_enc.get_parameter(name)[index]


def _params_of(model, module_path: str) -> list[str]:
    """The parameters of one module by name; none when the model lacks it (DeBERTa-v3 shares its position keys)."""
    try:
        module = sites.encoder(model).get_submodule(module_path)
    except AttributeError:
        return []
    return [f"{module_path}.{n}" for n, _ in module.named_parameters()]


def _hand_unit(tuned, model_type: str, unit: str, layer: int) -> list:
    prefix, att, ffn, _, _ = HAND[model_type]
    blk = f"{prefix}.{layer - 1}"
    modules = {"attention": att, "ffn": ffn, "layer": att + ffn}[unit]
    names = [n for m in modules for n in _params_of(tuned, f"{blk}.{m}")]
    if unit == "layer" and model_type == "deberta-v2" and layer == 1 and getattr(tuned.config, "conv_kernel_size", 0) > 0:
        names += _params_of(tuned, "encoder.conv")  # hidden state 1 is the convolution's output
    if unit == "layer" and model_type == "modernbert" and layer == tuned.config.num_hidden_layers:
        names += ["final_norm.weight"]  # the last hidden state is the final norm's output
    return [(n, slice(None)) for n in names]


def _hand_head(tuned, model_type: str, layer: int, head: int) -> list:
    prefix, _, _, rows, cols = HAND[model_type]
    blk = f"{prefix}.{layer - 1}"
    d = tuned.config.hidden_size // tuned.config.num_attention_heads
    hidden = tuned.config.hidden_size
    out = []
    for m in rows:
        for name in _params_of(tuned, f"{blk}.{m}"):
            chunks = 3 if m == "attn.Wqkv" else 1  # ModernBERT: query, key, value stacked in one Linear
            out += [(name, slice(c * hidden + head * d, c * hidden + (head + 1) * d)) for c in range(chunks)]
    out.append((f"{blk}.{cols}.weight", (slice(None), slice(head * d, (head + 1) * d))))
    return out


@pytest.mark.parametrize("name,model_type", FAMILIES)
def test_reverting_one_unit_equals_copying_its_base_tensors_by_hand(pairs, batch, name, model_type):
    base, tuned = pairs[name]
    n = tuned.config.num_hidden_layers
    before = {k: v.clone() for k, v in tuned.state_dict().items()}
    intact = _logits(tuned, batch)
    cases = [("head", 1, 2), ("attention", 1, -1), ("ffn", n, -1), ("layer", 1, -1), ("layer", n, -1)]
    for unit, layer, head in cases:
        hand = copy.deepcopy(tuned)
        _copy_in(hand, base, _hand_head(tuned, model_type, layer, head) if unit == "head"
                 else _hand_unit(tuned, model_type, unit, layer))
        with reverted(tuned, base, unit_pieces(tuned, unit, layer, head)):
            ours = _logits(tuned, batch)
        torch.testing.assert_close(ours, _logits(hand, batch), rtol=0, atol=0, msg=f"{unit} L{layer} H{head}")
        assert not torch.equal(ours, intact), f"{unit} L{layer}: the revert changed nothing"
    after = tuned.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # restored bit for bit


@pytest.mark.parametrize("name,model_type", FAMILIES)
def test_reverting_every_unit_gives_the_base_encoder_under_the_tuned_head(pairs, batch, name, model_type):
    base, tuned = pairs[name]
    hand = copy.deepcopy(tuned)
    state = {k: v for k, v in sites.encoder(base).state_dict().items() if not k.startswith("pooler.")}
    missing, unexpected = sites.encoder(hand).load_state_dict(state, strict=False)
    assert not unexpected and all(k.startswith("pooler.") for k in missing)
    pieces = all_pieces(tuned)
    assert piece_names(pieces) == set(encoder_parameter_names(tuned))
    with reverted(tuned, base, pieces):
        ours = _logits(tuned, batch)
    torch.testing.assert_close(ours, _logits(hand, batch), rtol=0, atol=0)
    assert not torch.equal(ours, _logits(tuned, batch))


@pytest.mark.parametrize("name,model_type", FAMILIES)
def test_attention_and_ffn_cover_the_block_and_embeddings_are_named(pairs, name, model_type):
    _, tuned = pairs[name]
    prefix = HAND[model_type][0]
    for layer in range(1, tuned.config.num_hidden_layers + 1):
        block = {n for n in encoder_parameter_names(tuned) if n.startswith(f"{prefix}.{layer - 1}.")}
        att, ffn = (piece_names(unit_pieces(tuned, u, layer)) for u in ("attention", "ffn"))
        assert att | ffn == block and not att & ffn
    emb = piece_names(unit_pieces(tuned, "embeddings"))
    want = {n for n in encoder_parameter_names(tuned) if n.startswith(HAND_EMBEDDINGS[model_type])}
    if model_type == "deberta-v2" and getattr(tuned.config, "norm_rel_ebd", "none") == "layer_norm":
        want |= {n for n in encoder_parameter_names(tuned) if n.startswith("encoder.LayerNorm.")}
    assert emb == want


def test_the_model_is_restored_when_the_body_raises(pairs):
    base, tuned = pairs["bert"]
    before = {k: v.clone() for k, v in tuned.state_dict().items()}
    with pytest.raises(RuntimeError), reverted(tuned, base, all_pieces(tuned)):
        assert not torch.equal(tuned.state_dict()["bert.encoder.layer.0.attention.self.query.weight"],
                               before["bert.encoder.layer.0.attention.self.query.weight"])
        raise RuntimeError("boom")
    assert all(torch.equal(before[k], v) for k, v in tuned.state_dict().items())


def test_albert_refuses_per_layer_and_per_head_units_with_the_reason(pairs, batch):
    base, tuned = pairs["albert"]
    for unit, head in (("layer", -1), ("attention", -1), ("head", 0)):
        with pytest.raises(BertologyError, match="shares one layer's weights across all depths"):
            unit_pieces(tuned, unit, 2, head)
    hand = copy.deepcopy(tuned)
    names = [n for n in encoder_parameter_names(tuned) if n.startswith(HAND_EMBEDDINGS["albert"])]
    _copy_in(hand, base, [(n, slice(None)) for n in names])
    with reverted(tuned, base, unit_pieces(tuned, "embeddings")):
        ours = _logits(tuned, batch)
    torch.testing.assert_close(ours, _logits(hand, batch), rtol=0, atol=0)


def test_a_base_of_another_shape_is_refused_in_one_line(pairs, tmp_path):
    _, tuned = pairs["bert"]
    other = load_model(save_tiny_family(tmp_path / "wide", "bert", intermediate_size=48)).model
    with pytest.raises(BertologyError, match="intermediate.dense.weight is of shape") as err:
        check_base(tuned, other, "wide")
    assert "\n" not in str(err.value)
    with pytest.raises(BertologyError, match="DistilBERT model"):
        check_base(tuned, pairs["distilbert"][0], "distil")
