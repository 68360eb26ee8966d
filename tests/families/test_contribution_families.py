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


def _zeroed_by_full_reruns(model, inputs, layer, j):
    """hidden_states[layer] of a full forward (every block run) with token j's value vectors removed from layer
    ``layer``'s contexts at its output projection's input (ALBERT's shared module: at that depth's call only)."""
    from bertology.activations.contributions import attention_inputs

    with torch.no_grad(), attention_inputs(model) as xs:
        out = model(**inputs, output_attentions=True, output_hidden_states=True)
    probs, x = out.attentions[layer - 1], xs[layer]
    weight, bias = sites.value_projection(model, layer)
    heads = sites.num_heads(model)
    v = (x @ weight.T + (0 if bias is None else bias)).view(*x.shape[:2], heads, -1).transpose(1, 2)  # [B, H, T, d]
    removed = (probs[..., j, None] * v[:, :, j, None]).transpose(1, 2).reshape(*x.shape[:2], -1)  # [B, T, H*d]
    calls = []

    def hook(_m, args):
        calls.append(1)
        if len(calls) != layer and sites.out_proj(model, 1) is sites.out_proj(model, 2):
            return None
        return (args[0] - removed,) + tuple(args[1:])

    handle = sites.out_proj(model, layer).register_forward_pre_hook(hook)
    try:
        with torch.no_grad():
            return model(**inputs, output_hidden_states=True).hidden_states[layer], out.hidden_states[layer]
    finally:
        handle.remove()


@pytest.mark.parametrize("model_type", sorted(FAMILY_CONFIGS))
def test_value_zeroing_skipping_lower_blocks_in_chunks_equals_full_reruns(model_type, monkeypatch):
    """Three layers, a padded batch of two: the re-runs that skip the blocks below the zeroed layer (and split the
    zeroed tokens into chunks of one) give what full forwards give."""
    from bertology.activations import contributions

    torch.manual_seed(1)
    model = AutoModel.from_config(tiny_family_config(model_type, tiny_tokenizer(), num_hidden_layers=3)).eval().double()
    ids = torch.randint(5, 40, (2, 5))
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])
    t = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}
    inputs = sites.model_inputs(model, t)
    with torch.no_grad():
        whole = contribution_maps(model, t, ("value_zeroing",))["value_zeroing"]
        monkeypatch.setattr(contributions, "ZEROING_CHUNK", 1)
        assert contributions.zeroing_chunk(2, 5, 4, 32) == 1
        chunked = contribution_maps(model, t, ("value_zeroing",))["value_zeroing"]
    for layer in (1, 2, 3):
        torch.testing.assert_close(chunked[layer], whole[layer], atol=TOL, rtol=TOL)
        dist = []
        for j in range(5):
            h, original = _zeroed_by_full_reruns(model, inputs, layer, j)
            dist.append((1 - torch.cosine_similarity(h, original, dim=-1)).clamp_min(0) * mask[:, j, None])
        ref = torch.stack(dist, -1)                                                   # [B, i, j]
        ref = ref / ref.sum(-1, keepdim=True)
        for b, real in enumerate(mask.sum(1).tolist()):  # padded query rows are no one's output
            torch.testing.assert_close(whole[layer][b, 0, :real], ref[b, :real], atol=TOL, rtol=TOL)
