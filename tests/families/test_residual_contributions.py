"""norm_residual (Kobayashi et al. 2021) and alti (Ferrando et al. 2022) on every family, against a recomputation
written per token from the tensors the model itself computes (its block inputs, value vectors, attention probabilities,
output projection and the LayerNorm's own input and output), recorded with plain forward hooks."""
import pytest
import torch
from transformers import AutoModel

from bertology.activations.contributions import contribution_maps
from bertology.models import sites
from bertology.models.adapters.base import get_path
from bertology.testing import FAMILY_CONFIGS, tiny_family_config, tiny_tokenizer

# float64 throughout: sums of 32-wide products and LayerNorms of order-1 values agree to ~1e-14
TOL = 1e-10
T = 6
REAL = (6, 4)  # the second sentence is padded after 4 tokens


def _model(model_type):
    torch.manual_seed(0)
    return AutoModel.from_config(tiny_family_config(model_type, tiny_tokenizer())).eval().double()


def _inputs(model):
    torch.manual_seed(1)
    ids = torch.randint(5, 40, (2, T))
    mask = torch.ones_like(ids)
    mask[1, REAL[1]:] = 0
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}


def _recorded(model, inputs):
    """Per layer: the block's input ``x``, the value vectors ``v`` [T, H*d] per sentence, and ``u``/``y``: the
    LayerNorm's input and output after attention (post-LN), or ``x + Wo(context)`` twice (pre-LN)."""
    layout = sites.adapter(model).weights.block
    n = sites.num_layers(model)
    calls: dict[int, dict[str, list]] = {}
    handles = []

    def rec(key, module, pre=False, take=lambda t: t):
        store = calls.setdefault(id(block), {}).setdefault(key, [])
        if pre:
            return module.register_forward_pre_hook(
                lambda m, a, kw: store.append(take(a[0] if a else kw["hidden_states"])), with_kwargs=True)
        return module.register_forward_hook(lambda m, a, out: store.append((a[0], take(out))))

    seen = set()
    for layer in range(1, n + 1):
        block = sites.block(model, layer)
        if id(block) in seen:
            continue  # ALBERT: one module for every depth, its calls in depth order
        seen.add(id(block))
        handles.append(rec("x", block, pre=True))
        path = layout["value"]
        if ":" in path:  # ModernBERT's fused Wqkv: rows 2/3 are the values
            lin = get_path(block, path.split(":")[0])
            handles.append(rec("v", lin, take=lambda t: t[..., 2 * t.shape[-1] // 3:]))
        else:
            handles.append(rec("v", get_path(block, path)))
        if sites.norm_first(model):
            handles.append(rec("o", get_path(block, layout["attention_output"])))
        else:
            handles.append(rec("ln", get_path(block, layout["attention_norm"])))
    try:
        with torch.no_grad():
            out = model(**sites.model_inputs(model, inputs), output_attentions=True)
    finally:
        for h in handles:
            h.remove()
    per_layer = []
    for layer in range(1, n + 1):
        block = sites.block(model, layer)
        k = sum(sites.block(model, m) is block for m in range(1, layer))
        c = calls[id(block)]
        x = c["x"][k]
        v = c["v"][k][1]
        if sites.norm_first(model):
            o = c["o"][k][1]
            u = y = x + o
        else:
            u, y = c["ln"][k]
        per_layer.append(dict(x=x, v=v, u=u, y=y, probs=out.attentions[layer - 1], block=block))
    return per_layer


def _by_hand(model, rec, b, real):
    """``T_i(x_j)`` [real, real, hidden] of sentence ``b``, written per query i and key j, and the block output y."""
    layout = sites.adapter(model).weights.block
    heads = sites.num_heads(model)
    block = rec["block"]
    w_o = get_path(block, layout["attention_output"]).weight
    d = w_o.shape[1] // heads
    x, v, y, a = rec["x"][b], rec["v"][b], rec["y"][b], rec["probs"][b]
    if sites.norm_first(model):
        gamma, sigma, centre = torch.ones(x.shape[-1], dtype=x.dtype), torch.ones(T, dtype=x.dtype), False
    else:
        ln = get_path(block, layout["attention_norm"])
        u = rec["u"][b]
        gamma, centre = ln.weight, True
        sigma = (u.var(-1, unbiased=False) + ln.eps).sqrt()
    vec = torch.zeros(real, real, x.shape[-1], dtype=x.dtype)
    for i in range(real):
        for j in range(real):
            z = sum(a[h, i, j] * (v[j, h * d:(h + 1) * d] @ w_o[:, h * d:(h + 1) * d].T) for h in range(heads))
            if i == j:
                z = z + x[i]
            if centre:
                z = z - z.mean()
            vec[i, j] = gamma * z / sigma[i]
    return vec, y[:real]


@pytest.mark.parametrize("model_type", sorted(FAMILY_CONFIGS))
def test_norm_residual_and_alti_equal_the_definitions_by_hand(model_type):
    model = _model(model_type)
    inputs = _inputs(model)
    with torch.no_grad():
        maps = contribution_maps(model, inputs, ("norm_residual", "alti"))
    recs = _recorded(model, inputs)
    rolled = {}
    for layer, rec in enumerate(recs, 1):
        for b, real in enumerate(REAL):
            vec, y = _by_hand(model, rec, b, real)
            norms = vec.norm(dim=-1)
            torch.testing.assert_close(maps["norm_residual"][layer][b, 0, :real, :real],
                                       norms / norms.sum(-1, keepdim=True), atol=TOL, rtol=TOL)
            c = (y.abs().sum(-1)[:, None] - (y[:, None] - vec).abs().sum(-1)).clamp_min(0)
            c = c / c.sum(-1, keepdim=True)
            rolled[b] = c if layer == 1 else c @ rolled[b]
            torch.testing.assert_close(maps["alti"][layer][b, 0, :real, :real], rolled[b], atol=TOL, rtol=TOL)
    real = inputs["attention_mask"].bool()
    for measure in ("norm_residual", "alti"):  # padded keys hold no share, in any row; real rows sum to 1
        for m in maps[measure][1:]:
            assert torch.isfinite(m).all() and float(m[1, 0, :, REAL[1]:].abs().max()) == 0.0
            sums = m[:, 0].sum(-1)[real]
            torch.testing.assert_close(sums, torch.ones_like(sums), atol=TOL, rtol=0)


@pytest.mark.parametrize("model_type", sorted(FAMILY_CONFIGS))
def test_the_transformed_vectors_sum_to_the_block_output(model_type):
    """sum_j T_i(x_j) is y_i less the terms of no token: N(b_O) / sigma_i + beta (post-LN), b_O (pre-LN)."""
    model = _model(model_type)
    recs = _recorded(model, _inputs(model))
    layout = sites.adapter(model).weights.block
    for rec in recs:
        vec, y = _by_hand(model, rec, 0, T)
        bias = get_path(rec["block"], layout["attention_output"]).bias
        bias = torch.zeros(y.shape[-1], dtype=y.dtype) if bias is None else bias
        if sites.norm_first(model):
            rest = bias.expand_as(y)
        else:
            ln = get_path(rec["block"], layout["attention_norm"])
            sigma = (rec["u"][0].var(-1, unbiased=False) + ln.eps).sqrt()
            rest = ln.weight * (bias - bias.mean()) / sigma[:, None] + ln.bias
        torch.testing.assert_close(vec.sum(1) + rest, y, atol=TOL, rtol=TOL)
