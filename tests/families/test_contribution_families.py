"""Contribution maps on every family: value zeroing against zeroing the value projection's output itself."""
import pytest
import torch
from transformers import AutoModel

from bertology.activations.contributions import contribution_maps
from bertology.models import sites
from bertology.models.adapters.base import get_path
from bertology.testing import FAMILY_CONFIGS, tiny_family_config, tiny_tokenizer

# float64 throughout: cosine distances of ~1e-4 keep ~12 digits, so 1e-8 is far above rounding
TOL = 1e-8
# ModernBERT's eager attention takes its softmax in float32 whatever the model's dtype: rows sum to 1 within 2^-23
ROW_TOL = 1e-6


def _value_module(model, layer):
    """The family's value Linear of ``layer`` (None where it is a chunk of a fused projection)."""
    path = sites.adapter(model).weights.block.get("value", "")
    return None if ":" in path else get_path(sites.block(model, layer), path)


@pytest.mark.parametrize("model_type", sorted(FAMILY_CONFIGS))
def test_value_zeroing_equals_zeroed_value_outputs(model_type):
    torch.manual_seed(0)
    model = AutoModel.from_config(tiny_family_config(model_type, tiny_tokenizer())).eval().double()
    ids = torch.randint(5, 40, (1, 6))
    t = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)}
    inputs = sites.model_inputs(model, t)
    with torch.no_grad():
        maps = contribution_maps(model, t, ("weights", "norm", "rollout", "value_zeroing"))
        hidden = model(**inputs, output_hidden_states=True).hidden_states
    for measure, per_layer in maps.items():
        for m in per_layer[1:]:
            torch.testing.assert_close(m.sum(-1), torch.ones(m.shape[:-1], dtype=m.dtype), atol=ROW_TOL, rtol=0)
    if _value_module(model, 1) is None:
        pytest.skip(f"{model_type} fuses its value projection; the batched path is checked on the others")
    shared = sites.block(model, 1) is sites.block(model, 2)
    for layer in range(1, sites.num_layers(model) + 1):
        module = _value_module(model, layer)
        dist = []
        for j in range(6):
            calls = []

            def zero(_m, _i, out, j=j, calls=calls):
                calls.append(1)  # ALBERT runs one shared module at every depth: zero it at this depth only
                if shared and len(calls) != layer:
                    return out
                out = out.clone()
                out[:, j] = 0
                return out
            handle = module.register_forward_hook(zero)
            try:
                with torch.no_grad():
                    h = model(**inputs, output_hidden_states=True).hidden_states[layer]
            finally:
                handle.remove()
            dist.append(1 - torch.cosine_similarity(h[0], hidden[layer][0], dim=-1))
        ref = torch.stack(dist, -1)
        torch.testing.assert_close(maps["value_zeroing"][layer][0, 0], ref / ref.sum(-1, keepdim=True),
                                   atol=TOL, rtol=TOL)
