"""PEFT (LoRA) adapters as models: for every family, what bertology captures from an adapter equals what
``peft``'s own merged model gives, and an adapted model goes through compare, ablate and probe.

The adapters are made here with ``peft`` itself (``init_lora_weights=False``: a non-zero update, so an
adapter that was silently dropped would fail the tests) on tiny random models of each family.
"""
from __future__ import annotations

import json
import sys

import pandas as pd
import pytest
import torch
from transformers import AutoModelForSequenceClassification

from bertology.errors import BertologyError
from bertology.models import sites
from bertology.models.hooks import capture
from bertology.models.loading import load_model, quiet_transformers, resolve_model
from bertology.testing import (FAMILY_CONFIGS, LORA_HEADS, SENTENCES, peft_merged_model, save_lora_adapter,
                               save_tiny_family, tiny_tokenizer)

peft = pytest.importorskip("peft")
pytestmark = [pytest.mark.usefixtures("one_thread"),
              pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")]
N_LABELS = 3


def _classifier(base) -> torch.nn.Module:
    with quiet_transformers():
        return AutoModelForSequenceClassification.from_pretrained(base, num_labels=N_LABELS, attn_implementation="eager")


def make_lora(base, folder, seed: int = 0, heads=LORA_HEADS):
    """A LoRA adapter on every linear layer of ``base``'s encoder, its 3-label head saved whole, into ``folder``."""
    return save_lora_adapter(base, folder, num_labels=N_LABELS, seed=seed, heads=heads)


def peft_merged(base, adapter) -> torch.nn.Module:
    """peft's own merged model, built independently of bertology's loader."""
    return peft_merged_model(base, adapter, num_labels=N_LABELS)


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    """model_type -> (base folder, adapter folder)."""
    root = tmp_path_factory.mktemp("peft")
    return {mt: (save_tiny_family(root / mt, mt), make_lora(root / mt, root / f"{mt}-lora"))
            for mt in FAMILY_CONFIGS}


@pytest.fixture(scope="module")
def batch():
    return tiny_tokenizer()(SENTENCES[:4], padding=True, return_tensors="pt")


@pytest.mark.parametrize("model_type", list(FAMILY_CONFIGS))
def test_captured_maps_of_an_adapter_equal_peft_merged_models(adapters, batch, model_type):
    base, adapter = adapters[model_type]
    assert resolve_model(adapter)[0] == "adapter"
    loaded = load_model(adapter)
    assert loaded.is_classifier and loaded.describe()["adapter"]["peft_type"] == "LORA"
    reference = peft_merged(base, adapter)
    model = loaded.model
    inputs = sites.model_inputs(model, batch)
    real = inputs["attention_mask"].bool()
    with torch.inference_mode():
        want = reference(**inputs, output_attentions=True, output_hidden_states=True)
        with capture(model) as cap:
            got = model(**inputs)
        unmerged = peft.PeftModel.from_pretrained(_classifier(base), adapter).eval()(**inputs).logits
        plain = _classifier(base)(**inputs).logits
    n = model.config.num_hidden_layers
    # the same merge of the same tensors: equal bit for bit
    for layer in range(1, n + 1):
        torch.testing.assert_close(cap.attentions[layer], want.attentions[layer - 1], rtol=0, atol=0)
    for layer in range(n + 1):
        torch.testing.assert_close(cap.hidden_states[layer][real], want.hidden_states[layer][real], rtol=0, atol=0)
    torch.testing.assert_close(got.logits, want.logits, rtol=0, atol=0)
    # and the adapter unmerged (x W + x A B s, another summation order): equal to float32 rounding
    torch.testing.assert_close(got.logits, unmerged, rtol=1e-4, atol=1e-5)
    assert not torch.allclose(got.logits, plain, atol=1e-3)  # the adapter and its head did change the model


def test_an_adapter_goes_through_compare_ablate_and_probe(adapters, tmp_path):
    import bertology as bt

    base, adapter = adapters["bert"]
    data = tmp_path / "d.csv"
    pd.DataFrame({"text": SENTENCES * 2, "label": [i % N_LABELS for i in range(2 * len(SENTENCES))]}).to_csv(data, index=False)
    run = bt.compare(base, adapter, data, analyses=["attention_change", "ablation"], out=tmp_path / "cmp",
                     ablation_bootstrap=20, report=False)
    manifest = json.loads((tmp_path / "cmp/manifest.json").read_text())
    info = manifest["models"]["tuned"]["adapter"]
    assert info["peft_type"] == "LORA" and info["merged"] is True and info["base"] == base.as_posix()
    assert run.attention_change["js_divergence"].max() > 0
    assert len(run.ablation) > 0
    ablated = bt.ablate(str(adapter), data, n_bootstrap=20)
    assert len(ablated.ablation) > 0

    conllu = tmp_path / "t.conllu"
    conllu.write_text("".join(
        f"# text = {s}\n" + "".join(f"{i}\t{w}\t{w}\tX\t_\t_\t{i - 1}\t{'root' if i == 1 else 'dep'}\t_\t_\n"
                                    for i, w in enumerate(s.split(), 1)) + "\n" for s in SENTENCES), encoding="utf-8")
    probed = bt.probe(str(base), conllu, conllu, tuned=str(adapter), rank=4, epochs=1)
    assert set(probed.probe["model"]) == {"base", "tuned"}


def test_an_adapter_on_a_base_of_another_shape_is_one_clear_error(adapters, tmp_path):
    _, adapter = adapters["bert"]
    other = save_tiny_family(tmp_path / "wide", "bert", hidden_size=48)
    # the recorded-base check sees the other weights first; a base it cannot check falls to the shape check
    with pytest.raises(BertologyError, match=r"The PEFT adapter .* was trained on .*whose weights differ.*Pass --base"):
        load_model(adapter, adapter_base=str(other))


def test_without_peft_an_adapter_names_the_extra(adapters, monkeypatch):
    _, adapter = adapters["bert"]
    monkeypatch.setitem(sys.modules, "peft", None)
    with pytest.raises(BertologyError, match=r"is a PEFT adapter; reading it needs the peft library: pip install 'bertology\[peft\]'"):
        load_model(adapter)


def test_head_weights_the_adapter_did_not_save_are_named_in_the_manifest(tmp_path, caplog):
    base = save_tiny_family(tmp_path / "deberta", "deberta-v2")
    adapter = make_lora(base, tmp_path / "lora", heads=["classifier"])  # DeBERTa's pooler left out, as peft's default
    loaded = load_model(adapter)
    assert loaded.describe()["adapter"]["unsaved_head_weights"] == ["pooler.dense.bias", "pooler.dense.weight"]
    assert "does not hold pooler.dense.bias, pooler.dense.weight" in caplog.text
    assert load_model(make_lora(base, tmp_path / "whole")).describe()["adapter"]["unsaved_head_weights"] == []


def _changed_by(adapter) -> set[str]:
    """The full parameter names the adapter changes: its LoRA targets' weights (the head is modules_to_save)."""
    from safetensors import safe_open

    with safe_open(str(adapter / "adapter_model.safetensors"), "pt") as f:
        keys = list(f.keys())
    return {k.removeprefix("base_model.model.").split(".lora_")[0] + ".weight" for k in keys if ".lora_A" in k}


@pytest.mark.parametrize("model_type", list(FAMILY_CONFIGS))
def test_an_adapter_compared_with_its_base_shares_every_tensor_it_does_not_change(adapters, batch, model_type):
    from bertology.models.pair import ModelPair

    base, adapter = adapters[model_type]
    alone = load_model(base)
    inputs = sites.model_inputs(alone.model, batch)
    with torch.inference_mode():
        before = alone.model(**inputs, output_hidden_states=True).hidden_states
    pair = ModelPair.load(str(base), str(adapter))
    base_ptrs = {t.data_ptr() for t in (*pair.base.model.parameters(), *pair.base.model.buffers())}
    changed = _changed_by(adapter)
    n_shared = n_own = 0
    for name, tensor in pair.tuned.model.named_parameters():
        own = name in changed or any(f".{h}." in f".{name}" for h in LORA_HEADS)  # a LoRA target or modules_to_save
        assert (tensor.data_ptr() not in base_ptrs) == own, name
        n_shared, n_own = n_shared + (not own), n_own + own
    assert changed and n_shared > 0
    info = pair.tuned.describe()["adapter"]
    assert info["shares_base_weights"]["own_tensors"] == n_own and "sharing its base's tensors" in info["weights"]
    # the same numbers as peft's own merge, bit for bit
    reference = peft_merged(base, adapter)
    model = pair.tuned.model
    with torch.inference_mode():
        want = reference(**inputs, output_attentions=True)
        with capture(model) as cap:
            got = model(**inputs)
        after = pair.base.model(**inputs, output_hidden_states=True).hidden_states
    for layer in range(1, model.config.num_hidden_layers + 1):
        torch.testing.assert_close(cap.attentions[layer], want.attentions[layer - 1], rtol=0, atol=0)
    torch.testing.assert_close(got.logits, want.logits, rtol=0, atol=0)
    # nothing merged into the base in place: its outputs are those of the base loaded alone
    for b, a in zip(before, after):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_moving_a_sharing_pair_keeps_one_copy(adapters):
    from bertology.models.pair import ModelPair
    from bertology.models.shared_base import to_device_together

    base, adapter = adapters["bert"]
    pair = ModelPair.load(str(base), str(adapter))
    shared = lambda: {n for n, t in pair.tuned.model.named_parameters()  # noqa: E731
                      if t.data_ptr() in {b.data_ptr() for b in pair.base.model.parameters()}}
    names = shared()
    to_device_together((pair.base.model, pair.tuned.model), "cpu", torch.float64)  # each tensor converted once
    assert shared() == names and next(pair.tuned.model.parameters()).dtype == torch.float64
    before = {n: t.data_ptr() for n, t in pair.base.model.named_parameters()}
    to_device_together((pair.base.model, pair.tuned.model), "cpu")  # already there: nothing moves
    assert {n: t.data_ptr() for n, t in pair.base.model.named_parameters()} == before and shared() == names
