"""A LoRA adapter on the packaged all-MiniLM-L6-v2 (marker `real`), compared with its base as ``compare`` loads the
pair (the tuned model on the base's own tensors): the attention maps and hidden states bertology captures equal those
of ``peft``'s merged model bit for bit, and the base's are those of minilm loaded alone."""
from __future__ import annotations

import pytest
import torch

from bertology.models import sites
from bertology.models.hooks import capture
from bertology.models.loading import load_model, resolve_model
from bertology.models.pair import ModelPair
from bertology.testing import SENTENCES, peft_merged_model, save_lora_adapter

pytest.importorskip("peft")
pytestmark = [pytest.mark.real, pytest.mark.usefixtures("one_thread"),
              pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")]


def test_minilm_adapter_maps_equal_peft_merged_model_and_the_base_is_untouched(tmp_path):
    base_dir = resolve_model("minilm")[1]
    adapter = save_lora_adapter(base_dir, tmp_path / "lora", num_labels=2)
    pair = ModelPair.load("minilm", str(adapter))
    shared = pair.tuned.describe()["adapter"]["shares_base_weights"]
    assert shared["shared_tensors"] > 0 and shared["own_tensors"] > 0
    batch = pair.tokenizer(SENTENCES[:4], padding=True, return_tensors="pt")
    inputs = sites.model_inputs(pair.tuned.model, batch)
    real = inputs["attention_mask"].bool()
    reference = peft_merged_model(base_dir, adapter, num_labels=2)
    alone = load_model("minilm").model
    with torch.inference_mode():
        want = reference(**inputs, output_attentions=True, output_hidden_states=True)
        with capture(pair.tuned.model) as tuned:
            got = pair.tuned.model(**inputs)
        with capture(pair.base.model) as base:
            pair.base.model(**inputs)
        base_want = alone(**inputs, output_attentions=True)
    n = pair.num_layers
    for layer in range(1, n + 1):
        torch.testing.assert_close(tuned.attentions[layer], want.attentions[layer - 1], rtol=0, atol=0)
        torch.testing.assert_close(base.attentions[layer], base_want.attentions[layer - 1], rtol=0, atol=0)
    for layer in range(n + 1):
        torch.testing.assert_close(tuned.hidden_states[layer][real], want.hidden_states[layer][real], rtol=0, atol=0)
    torch.testing.assert_close(got.logits, want.logits, rtol=0, atol=0)
    assert not torch.allclose(tuned.attentions[n], base.attentions[n], atol=1e-4)  # the adapter did change the maps
