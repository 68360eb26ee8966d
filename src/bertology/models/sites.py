"""Where each activation lives, for every supported encoder family (resolved through its adapter).

bertology hooks the real Hugging Face modules; this file turns a model and a layer number into the
module to hook, using :mod:`bertology.models.adapters` (one record per ``config.model_type``). Layer
numbering follows DESIGN §3: hidden-state layer 0 is the input of the first block (the embeddings'
output, projected to the hidden size where the family projects it), 1..N the blocks; attention layers
are 1..N. Counts come from the config.
"""
from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from bertology.errors import BertologyError
from bertology.models.adapters import Adapter, adapter_for, get_path
from bertology.models.adapters.base import ValueProjection


def encoder(model: nn.Module) -> nn.Module:
    """The bare encoder (``model.base_model``) of a task model, or the model itself."""
    base = getattr(model, "base_model", None)
    return base if base is not None else model


def adapter(model: nn.Module) -> Adapter:
    """The family adapter of ``model`` (a clear error for unsupported model types)."""
    return adapter_for(model.config)


def num_layers(model: nn.Module) -> int:
    return int(model.config.num_hidden_layers)


def num_heads(model: nn.Module) -> int:
    return int(model.config.num_attention_heads)


def blocks(model: nn.Module) -> list[nn.Module]:
    """The module run at each depth (index 0 = layer 1); ALBERT's shared layer appears N times."""
    enc = encoder(model)
    return adapter(model).block_list(enc)


def block(model: nn.Module, layer: int) -> nn.Module:
    return blocks(model)[layer - 1]


def _inside(model: nn.Module, layer: int, path: str) -> nn.Module:
    module = get_path(block(model, layer), path)
    if module is None:
        raise RuntimeError(f"{type(model).__name__}: no {path!r} in block {layer} ({adapter(model).family} adapter)")
    return module


def attention(model: nn.Module, layer: int) -> nn.Module:
    """The module whose output carries attention layer ``layer``'s probabilities (1-based)."""
    return _inside(model, layer, adapter(model).attention)


def out_proj(model: nn.Module, layer: int) -> nn.Linear:
    """The Linear whose input is the per-head context ``[B, T, H*d]`` (site of every head intervention)."""
    return _inside(model, layer, adapter(model).out_proj)


def head_size(model: nn.Module) -> int:
    return int(out_proj(model, 1).in_features) // num_heads(model)


def value_projection(model: nn.Module, layer: int) -> ValueProjection:
    """``(weight [H*d, hidden], bias)`` of layer ``layer``'s value projection."""
    return adapter(model).value(attention(model, layer))


def norm_first(model: nn.Module) -> bool:
    """Whether the family's blocks normalise before attention (pre-LN: the residual adds the block's input)."""
    return adapter(model).norm_first


def attention_norm(model: nn.Module, layer: int) -> nn.Module:
    """The LayerNorm of ``x + attention`` in block ``layer`` (post-LN; the weight layout's ``attention_norm``)."""
    ad = adapter(model)
    if ad.norm_first or ad.weights is None or "attention_norm" not in ad.weights.block:
        raise BertologyError(f"{ad.family}: no LayerNorm after the attention's residual sum "
                             f"({'it normalises before attention' if ad.norm_first else 'none declared'})")
    return _inside(model, layer, ad.weights.block["attention_norm"])


def hidden_output(model: nn.Module, layer: int) -> nn.Module:
    """The module whose output (first element) is ``hidden_states[layer]``, layer 1..N."""
    ad = adapter(model)
    if ad.layer_output is not None:
        other = ad.layer_output(encoder(model), layer)
        if other is not None:
            return other
    return block(model, layer)


def embedding_modules(model: nn.Module) -> list[nn.Module]:
    """The embeddings and, where the family has one, the projection to the hidden size (for freezing)."""
    enc = encoder(model)
    return [m for m in (get_path(enc, p) for p in adapter(model).embeddings) if m is not None]


def uses_token_types(model: nn.Module) -> bool:
    """Whether the forward takes ``token_type_ids`` (the family has them and the config has 2+ types)."""
    return adapter(model).token_types and int(getattr(model.config, "type_vocab_size", 0) or 0) >= 2


def model_inputs(model: nn.Module, tensors: Mapping[str, torch.Tensor], device: torch.device | str | None = None) -> dict:
    """``input_ids``, ``attention_mask`` and (where used) ``token_type_ids`` for ``model``'s forward."""
    keys = ("input_ids", "attention_mask") + (("token_type_ids",) if uses_token_types(model) else ())
    return {k: tensors[k] if device is None else tensors[k].to(device) for k in keys}
