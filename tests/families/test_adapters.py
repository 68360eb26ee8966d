"""Every family's adapter against the model's own outputs and against hand-written interventions.

The hand-written versions name each family's modules explicitly (not through the adapter), so a wrong
adapter path or value projection makes these tests fail.
"""
from __future__ import annotations

import os

import pytest
import torch
from torch import nn
from transformers import AutoModel, AutoModelForSequenceClassification, GPT2Config, GPT2Model

from bertology.errors import BertologyError
from bertology.models import sites
from bertology.models.ablate import ablate_heads, head_gates, skip_layers
from bertology.models.adapters import adapter_for, supported_model_types
from bertology.models.hooks import capture, count_hooks
from bertology.models.loading import load_model
from bertology.testing import FAMILY_CONFIGS, SENTENCES, save_tiny_family, tiny_tokenizer

# float32 sums of 32-wide dot products in a different order: a few ulps of values of size ~1.
ATOL = 1e-5
#: ``BERTOLOGY_TEST_DEVICE=cuda`` checks the captures on a GPU too.
DEVICE = os.environ.get("BERTOLOGY_TEST_DEVICE", "cpu")

#: model_type -> (block path, out-projection path in a block, value vectors from the attention input)
HAND: dict[str, tuple[str, str, callable]] = {
    "bert": ("encoder.layer", "attention.output.dense", lambda b, x: b.attention.self.value(x)),
    "roberta": ("encoder.layer", "attention.output.dense", lambda b, x: b.attention.self.value(x)),
    "xlm-roberta": ("encoder.layer", "attention.output.dense", lambda b, x: b.attention.self.value(x)),
    "electra": ("encoder.layer", "attention.output.dense", lambda b, x: b.attention.self.value(x)),
    "distilbert": ("transformer.layer", "attention.out_lin", lambda b, x: b.attention.v_lin(x)),
    "albert": ("encoder.albert_layer_groups.0.albert_layers", "attention.dense", lambda b, x: b.attention.value(x)),
    "deberta-v2": ("encoder.layer", "attention.output.dense", lambda b, x: b.attention.self.value_proj(x)),
    "mpnet": ("encoder.layer", "attention.attn.o", lambda b, x: b.attention.attn.v(x)),
    "modernbert": ("layers", "attn.Wo", lambda b, x: b.attn.Wqkv(x).chunk(3, dim=-1)[2]),
}
#: model_type -> the attention module of a block (its first input feeds the value projection)
HAND_ATTENTION = {
    "distilbert": "attention", "albert": "attention", "mpnet": "attention.attn", "modernbert": "attn",
}
#: (name, model_type, config overrides): every family, plus DeBERTa-v2's convolution (as in deberta-v2-xlarge)
#: and DeBERTa-v3's settings (shared position keys, layer-normed relative embeddings).
VARIANTS = [(mt, mt, {}) for mt in FAMILY_CONFIGS] + [
    ("deberta-v2-conv", "deberta-v2", {"conv_kernel_size": 3}),
    ("deberta-v3", "deberta-v2", {"share_att_key": True, "norm_rel_ebd": "layer_norm", "position_buckets": 16}),
]
FAMILIES = [pytest.param(name, mt, id=name) for name, mt, _ in VARIANTS]


def _get(root: nn.Module, path: str) -> nn.Module:
    for part in path.split("."):
        root = root[int(part)] if part.isdigit() else getattr(root, part)
    return root


def _hand_block(model: nn.Module, model_type: str, layer: int) -> nn.Module:
    blocks = _get(sites.encoder(model), HAND[model_type][0])
    return blocks[0] if model_type == "albert" else blocks[layer - 1]


@pytest.fixture(scope="module")
def batch():
    tok = tiny_tokenizer()
    return tok(SENTENCES[:4], padding=True, return_tensors="pt")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """model_type (+ variant) -> folder of a tiny encoder and of a tiny classifier."""
    root = tmp_path_factory.mktemp("families")
    out = {}
    for name, mt, extra in VARIANTS:
        out[name] = (save_tiny_family(root / name, mt, **extra),
                     save_tiny_family(root / f"{name}-clf", mt, classifier=True, num_labels=3, **extra))
    return out


def _inputs(model, batch):
    return sites.model_inputs(model, batch)


@pytest.mark.parametrize("name,model_type", FAMILIES)
def test_captured_equals_the_models_own_outputs(models, batch, name, model_type):
    model = load_model(models[name][0]).model.to(DEVICE)
    inputs = sites.model_inputs(model, batch, DEVICE)
    real = inputs["attention_mask"].bool()
    with torch.inference_mode():
        ref = model(**inputs, output_attentions=True, output_hidden_states=True)
        before = count_hooks(model)
        with capture(model) as cap:
            model(**inputs)
    assert count_hooks(model) == before
    n = model.config.num_hidden_layers
    assert len(ref.hidden_states) == n + 1 and len(ref.attentions) == n
    for layer in range(n + 1):
        torch.testing.assert_close(cap.hidden_states[layer][real], ref.hidden_states[layer][real], rtol=0, atol=0)
    for layer in range(1, n + 1):
        torch.testing.assert_close(cap.attentions[layer], ref.attentions[layer - 1], rtol=0, atol=0)


def test_sdpa_model_is_switched_to_eager_only_while_capturing(models, batch):
    model = AutoModel.from_pretrained(models["modernbert"][0], attn_implementation="sdpa").eval()
    inputs = _inputs(model, batch)
    with torch.inference_mode(), capture(model) as cap:
        model(**inputs)
    assert model.config._attn_implementation == "sdpa"
    model.set_attn_implementation("eager")
    with torch.inference_mode():
        ref = model(**inputs, output_attentions=True)
    torch.testing.assert_close(cap.attentions[2], ref.attentions[1], rtol=0, atol=0)


def test_modernbert_local_layers_give_full_maps_with_zeros_outside_the_window(models):
    model = load_model(models["modernbert"][0]).model
    tok = tiny_tokenizer()
    enc = tok(["the old man ran fast to the big red house at night ."], return_tensors="pt")
    with torch.inference_mode(), capture(model, hidden_states=False) as cap:
        model(**_inputs(model, enc))
    assert model.config.layer_types[1] == "sliding_attention"
    t = enc["input_ids"].shape[1]
    local, full = cap.attentions[2][0], cap.attentions[1][0]
    assert local.shape == full.shape == (4, t, t)
    half = model.config.sliding_window  # local_attention // 2
    far = (torch.arange(t)[:, None] - torch.arange(t)[None, :]).abs() > half
    assert far.any()
    assert float(local[:, far].abs().max()) == 0.0
    assert float(full[:, far].min()) > 0.0
    torch.testing.assert_close(local.sum(-1), torch.ones(4, t))


def _hand_zero(model, model_type, layer, head, size):
    """Zero one head's slice of the out-projection input by wrapping the Linear itself (call-counted)."""
    lin = _get(_hand_block(model, model_type, layer), HAND[model_type][1])
    calls = [0]
    original = lin.forward

    def forward(x):
        calls[0] += 1
        # ALBERT runs its one layer N times: only the layer-th call is ablated
        if model_type != "albert" or calls[0] == layer:
            x = x.clone()
            x[..., head * size:(head + 1) * size] = 0
        return original(x)

    lin.forward = forward
    return lambda: delattr(lin, "forward")


@pytest.mark.parametrize("name,model_type", FAMILIES)
def test_zero_ablation_equals_zeroing_the_heads_context_by_hand(models, batch, name, model_type):
    model = load_model(models[name][0]).model
    inputs = _inputs(model, batch)
    real = inputs["attention_mask"].bool()
    n, size = model.config.num_hidden_layers, sites.head_size(model)
    layer, head = (2, 1) if model_type == "albert" else (1, 1)  # ALBERT: a middle call of the shared layer

    def last() -> torch.Tensor:
        return model(**inputs).last_hidden_state[real]

    with torch.inference_mode():
        intact = last()
        with ablate_heads(model, [(layer, head)], "zero"):
            ours = last()
        undo = _hand_zero(model, model_type, layer, head, size)
        try:
            hand = last()
        finally:
            undo()
    assert count_hooks(model) == 0
    torch.testing.assert_close(ours, hand, rtol=0, atol=ATOL)
    assert float((ours - intact).abs().max()) > 1e-3  # the head mattered, so the comparison means something


@pytest.mark.parametrize("name,model_type", FAMILIES)
def test_uniform_ablation_gives_the_mean_of_the_value_vectors(models, batch, name, model_type):
    model = load_model(models[name][0]).model
    inputs = _inputs(model, batch)
    real = inputs["attention_mask"].bool()
    layer = 2 if model.config.num_hidden_layers > 2 else 1
    head, size = 2, sites.head_size(model)
    seen: dict[str, torch.Tensor] = {}
    block = _hand_block(model, model_type, layer)
    attention = _get(block, HAND_ATTENTION.get(model_type, "attention.self"))
    lin = _get(block, HAND[model_type][1])
    calls = {"a": 0, "o": 0}

    def keep_attention_input(_m, args, kwargs):
        calls["a"] += 1
        if model_type != "albert" or calls["a"] == layer:
            seen["x"] = kwargs.get("hidden_states", args[0] if args else None)

    def keep_context(_m, args):
        calls["o"] += 1
        if model_type != "albert" or calls["o"] == layer:
            seen["context"] = args[0]

    with torch.inference_mode(), ablate_heads(model, [(layer, head)], "uniform"), capture(model) as cap:
        # registered after the ablation's hooks, so the context is read after the rewrite
        handles = [attention.register_forward_pre_hook(keep_attention_input, with_kwargs=True),
                   lin.register_forward_pre_hook(keep_context)]
        try:
            model(**inputs)
        finally:
            for h in handles:
                h.remove()
    with torch.inference_mode():
        values = HAND[model_type][2](block, seen["x"])[..., head * size:(head + 1) * size]  # [B, T, d]
    w = real.to(values.dtype)
    mean = (values * w[..., None]).sum(1) / w.sum(1, keepdim=True)  # [B, d]
    got = seen["context"][..., head * size:(head + 1) * size]
    torch.testing.assert_close(got, mean[:, None, :].expand_as(got), rtol=0, atol=ATOL)
    probs = cap.attentions[layer][:, head]  # the captured map shows 1/L over the real keys
    expected = (w / w.sum(1, keepdim=True))[:, None, :].expand_as(probs)
    torch.testing.assert_close(probs, expected, rtol=0, atol=1e-7)


@pytest.mark.parametrize("name,model_type", FAMILIES)
def test_layer_skip_gives_the_blocks_input(models, batch, name, model_type):
    model = load_model(models[name][0]).model
    inputs = _inputs(model, batch)
    real = inputs["attention_mask"].bool()
    n = model.config.num_hidden_layers
    layer = 2 if n > 2 else 1
    with torch.inference_mode():
        with capture(model, attentions=False) as intact:
            model(**inputs)
        intact = [h.clone() for h in intact.hidden_states]
        with skip_layers(model, [layer]), capture(model, attentions=False) as cap:
            model(**inputs)
    for below in range(layer):  # untouched below the skipped layer (ALBERT: the other calls too)
        torch.testing.assert_close(cap.hidden_states[below][real], intact[below][real], rtol=0, atol=0)
    torch.testing.assert_close(cap.hidden_states[layer][real], cap.hidden_states[layer - 1][real], rtol=0, atol=0)
    assert not torch.equal(cap.hidden_states[layer][real], intact[layer][real])


def test_albert_ablation_changes_only_the_chosen_call(models, batch):
    model = load_model(models["albert"][0]).model
    inputs = _inputs(model, batch)
    real = inputs["attention_mask"].bool()
    with torch.inference_mode():
        with capture(model) as cap:
            model(**inputs)
        intact = [h.clone() for h in cap.hidden_states]
        with ablate_heads(model, [(2, 0)], "zero"), capture(model) as cap2:
            model(**inputs)
    torch.testing.assert_close(cap2.hidden_states[1][real], intact[1][real], rtol=0, atol=0)
    assert not torch.allclose(cap2.hidden_states[2][real], intact[2][real])


@pytest.mark.parametrize("name,model_type", FAMILIES)
def test_head_gates_have_a_gradient_for_every_head(models, batch, name, model_type):
    model = load_model(models[name][1]).model
    inputs = _inputs(model, batch)
    with head_gates(model) as gates:
        gates.prepare(inputs["input_ids"].shape[0])
        model(**inputs).logits.logsumexp(-1).sum().backward()
    assert gates.grad.shape == (4, model.config.num_hidden_layers, 4)
    assert bool((gates.grad.abs().sum(0) > 0).all())
    assert count_hooks(model) == 0


def test_every_registered_family_is_tested():
    assert set(supported_model_types()) - {"camembert"} == set(FAMILY_CONFIGS)


def test_a_decoder_is_refused_with_the_supported_types(tmp_path):
    GPT2Model(GPT2Config(n_layer=1, n_head=2, n_embd=8, vocab_size=50)).save_pretrained(tmp_path)
    tiny_tokenizer().save_pretrained(tmp_path)
    with pytest.raises(BertologyError, match=r"model_type 'gpt2'.*Supported model types: albert, bert"):
        load_model(tmp_path)
    with pytest.raises(BertologyError, match="does not support model_type 'gpt2'"):
        adapter_for(GPT2Config())


def test_classifier_wrappers_resolve_to_the_same_sites(models):
    clf = AutoModelForSequenceClassification.from_pretrained(models["distilbert"][1], attn_implementation="eager")
    assert sites.out_proj(clf, 1) is clf.distilbert.transformer.layer[0].attention.out_lin


@pytest.mark.parametrize("name,model_type", FAMILIES)
def test_padding_changes_nothing_on_the_real_tokens(models, name, model_type):
    """A padded batch gives each sentence the maps and states it gets alone (no padding, ModernBERT's
    local windows included): what the length-bucketed batches rely on."""
    model = load_model(models[name][0]).model
    tok = tiny_tokenizer()
    texts = [SENTENCES[6], SENTENCES[5]]  # long, short
    padded = tok(texts, padding=True, return_tensors="pt")
    with torch.inference_mode(), capture(model) as cap:
        model(**_inputs(model, padded))
        batch_maps = [a.clone() for a in cap.attentions[1:]]
        batch_states = [h.clone() for h in cap.hidden_states]
        for row, text in enumerate(texts):
            alone = tok([text], return_tensors="pt")
            t = alone["input_ids"].shape[1]
            model(**_inputs(model, alone))
            for got, ref in zip(batch_maps, cap.attentions[1:]):
                torch.testing.assert_close(got[row, :, :t, :t], ref[0], rtol=0, atol=ATOL)
                to_padding = got[row, :, :t, t:]
                assert to_padding.numel() == 0 or float(to_padding.abs().max()) == 0.0
            for got, ref in zip(batch_states, cap.hidden_states):
                torch.testing.assert_close(got[row, :t], ref[0], rtol=0, atol=1e-4)


@pytest.mark.parametrize("name,model_type", FAMILIES)
def test_the_cached_ablation_sweep_equals_the_naive_rerun_bit_for_bit(models, name, model_type):
    """Every family with the BERT block layout takes the cached sweep; its per-example losses and table equal
    the naive full re-run's exactly (the last block's one-token shortcut only where it gives the same bits;
    ``experiments.ablation``). Families without that layout run the plain sweep for both methods."""
    import numpy as np
    import pandas as pd

    from bertology.data.corpus import Corpus, Example
    from bertology.data.encode import encode_corpus
    from bertology.experiments.ablation import HeadScoring, SweepPlan, label_ids_for, run_ablation

    loaded = load_model(models[name][1])
    corpus = Corpus([Example(text=t, label=str(i % 3)) for i, t in enumerate(SENTENCES * 2)])
    enc = encode_corpus(corpus, loaded.tokenizer)
    y = label_ids_for(corpus, loaded.model)
    scoring = HeadScoring(batch_size=3)
    naive = run_ablation(loaded.model, enc, y, scoring, n_bootstrap=10, sweep=SweepPlan(method="naive"))
    cached = run_ablation(loaded.model, enc, y, scoring, n_bootstrap=10, sweep=SweepPlan(method="cached"))
    for key, ref in naive.per_example.items():
        np.testing.assert_array_equal(cached.per_example[key]["loss"], ref["loss"])
    pd.testing.assert_frame_equal(cached.table, naive.table, check_exact=True)
    assert (cached.params["first_token_shortcut_batches"] is not None) == sites.adapter(loaded.model).cached_sweep
