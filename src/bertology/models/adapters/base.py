"""The adapter record: where one encoder family keeps its blocks, attention, heads and hidden states.

Every hook in bertology (capture, ablation, gates, layer skipping, surgery) finds its module through an
:class:`Adapter` looked up by ``config.model_type`` (:func:`adapter_for`), never by guessing attribute
names. Paths are dotted attribute paths: ``blocks`` from the bare encoder (``model.base_model``), the
others from one block. Head and layer counts come from the config, never from module attributes.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import torch
from torch import nn

from bertology.errors import BertologyError

#: A value projection as ``(weight [H*d, hidden], bias [H*d] | None)``, read from the attention module.
ValueProjection = tuple[torch.Tensor, torch.Tensor | None]


def get_path(root: nn.Module, path: str) -> Any:
    """``root.a.b.0.c`` for ``path="a.b.0.c"`` (numeric parts index a ModuleList); ``None`` if absent."""
    obj: Any = root
    for part in path.split("."):
        if part.isdigit() and isinstance(obj, (nn.ModuleList, nn.Sequential)):
            idx = int(part)
            obj = obj[idx] if idx < len(obj) else None
        else:
            obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


def linear_value(path: str) -> Callable[[nn.Module], ValueProjection]:
    """Value projection that is a whole ``nn.Linear`` at ``path`` inside the attention module."""

    def value(attention: nn.Module) -> ValueProjection:
        lin = get_path(attention, path)
        return lin.weight, lin.bias

    return value


def absolute_positions(config: Any) -> int | None:
    """Longest input of a model with a learned position table: ``max_position_embeddings``."""
    n = getattr(config, "max_position_embeddings", None)
    return int(n) if n else None


def positions_after_padding(config: Any) -> int | None:
    """RoBERTa-style position ids start after the pad id, so ``pad_token_id + 1`` rows are never usable."""
    n = absolute_positions(config)
    pad = getattr(config, "pad_token_id", None)
    return None if n is None else n - (int(pad) + 1 if pad is not None else 0)


def fused_value(path: str, index: int, parts: int = 3) -> Callable[[nn.Module], ValueProjection]:
    """Value projection stored as rows ``index`` of ``parts`` equal chunks of a fused Linear (ModernBERT's Wqkv)."""

    def value(attention: nn.Module) -> ValueProjection:
        lin = get_path(attention, path)
        rows = lin.weight.shape[0] // parts
        sl = slice(index * rows, (index + 1) * rows)
        return lin.weight[sl], None if lin.bias is None else lin.bias[sl]

    return value


@dataclass(frozen=True)
class WeightLayout:
    """Where one family keeps the weights the weight-space comparison reads, by canonical module name.

    ``block``: paths inside one block (``query``, ``key``, ``value``, ``attention_output``, ``attention_norm``,
    ``ffn_in``, ``ffn_out``, ``ffn_norm``, and family extras); ``embeddings``: paths from the bare encoder of
    what runs before block 1 (reported as layer 0); ``top``: paths from the encoder of what runs after the last
    block (reported as layer N). A path ending in ``:i/n`` is the ``i``-th of ``n`` equal row chunks of a fused
    Linear (ModernBERT's ``Wqkv``). A module a model does not have (ModernBERT's first block has no attention
    norm, DeBERTa-v3 no position projections) is simply absent.
    """

    block: Mapping[str, str]
    embeddings: Mapping[str, str]
    top: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


@dataclass(frozen=True)
class Adapter:
    """One encoder family's layout, as data.

    ``attention`` is the module whose output tuple holds the attention probabilities ``[B, H, T, T]``
    at ``probs_index``; its first positional input feeds the value projection. ``out_proj`` is the
    Linear whose INPUT is the per-head context ``[B, T, H*d]`` (head ``h`` is columns ``h*d:(h+1)*d``):
    the one site of every head intervention. ``forward_kwargs`` are passed to the encoder's forward while
    maps are captured (DeBERTa returns probabilities only when asked). ``layer_blocks`` (ALBERT) lists
    the module run at each depth when blocks are shared; ``layer_output`` names a module other than the
    block whose output is ``hidden_states[layer]`` (DeBERTa-v2's convolution after block 1, ModernBERT's
    final norm after the last block), or returns None to use the block. ``cached_sweep`` says the exact
    cached ablation sweep applies (blocks return ``(hidden, ...)`` and can be bypassed, the attention
    module's output is the per-head context and can be replayed); other families use the plain sweep.
    ``first_token_site`` (in a block) is where the last block may be cut to the first token.
    ``max_tokens(config)`` is the longest input the position encoding allows (None: no limit).
    ``weights`` names the family's weight matrices for the weight-space comparison (None: not supported).
    ``norm_first`` says the block normalises before attention (pre-LN, ModernBERT): the attention module reads
    ``LN(x)``, the residual adds the block's own input ``x`` and no LayerNorm follows the sum; otherwise
    ``weights.block["attention_norm"]`` is the LayerNorm of ``x + attention`` (post-LN, BERT).
    """

    family: str
    model_types: tuple[str, ...]
    blocks: str
    attention: str
    out_proj: str
    value: Callable[[nn.Module], ValueProjection]
    probs_index: int = 1
    embeddings: tuple[str, ...] = ("embeddings",)
    forward_kwargs: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    token_types: bool = True
    shared_blocks: bool = False
    layer_blocks: Callable[[nn.Module], list[nn.Module]] | None = None
    layer_output: Callable[[nn.Module, int], nn.Module | None] | None = None
    cached_sweep: bool = False
    first_token_site: str | None = None
    max_tokens: Callable[[Any], int | None] = absolute_positions
    tokenizer: str = "WordPiece"
    notes: str = ""
    weights: WeightLayout | None = None
    norm_first: bool = False

    def block_list(self, encoder: nn.Module) -> list[nn.Module]:
        """The module run at each depth 1..N (index 0 = layer 1); shared blocks repeat."""
        if self.layer_blocks is not None:
            return self.layer_blocks(encoder)
        blocks = get_path(encoder, self.blocks)
        if not isinstance(blocks, nn.ModuleList):
            raise BertologyError(
                f"{type(encoder).__name__} ({self.family} adapter) has no transformer blocks at {self.blocks!r}; "
                "the checkpoint does not have the layout its model_type promises."
            )
        return list(blocks)


_REGISTRY: dict[str, Adapter] = {}


def register_adapter(adapter: Adapter) -> Adapter:
    """Add a family to the registry (one line per family in ``families.py``)."""
    for model_type in adapter.model_types:
        if model_type in _REGISTRY:
            raise ValueError(f"model_type {model_type!r} already has an adapter ({_REGISTRY[model_type].family})")
        _REGISTRY[model_type] = adapter
    return adapter


def registered() -> Mapping[str, Adapter]:
    """model_type -> adapter, for documentation and conformance tests."""
    return MappingProxyType(_REGISTRY)


def supported_model_types() -> tuple[str, ...]:
    return tuple(sorted(_REGISTRY))


def adapter_for(model_or_config: Any) -> Adapter:
    """The adapter of a model, a config, or a ``model_type`` string; one clear error for anything else."""
    cfg = getattr(model_or_config, "config", model_or_config)
    model_type = cfg if isinstance(cfg, str) else getattr(cfg, "model_type", None)
    adapter = _REGISTRY.get(str(model_type))
    if adapter is None:
        raise BertologyError(
            f"bertology does not support model_type {model_type!r}: it analyses bidirectional Transformer "
            f"encoders. Supported model types: {', '.join(supported_model_types())}."
        )
    return adapter
