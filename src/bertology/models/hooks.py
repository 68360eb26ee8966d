"""Temporary forward hooks that capture activations; always removed, even when the body raises."""
from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
from torch import nn

from bertology.models import sites


@dataclass
class Captured:
    """Activations of one forward pass.

    ``hidden_states[l]`` for l = 0..N (``[batch, seq, hidden]``); ``attentions[l]`` for l = 1..N
    (``[batch, heads, seq, seq]``); index 0 of ``attentions`` is unused (None) so indices match layers.
    """

    hidden_states: list[torch.Tensor | None] = field(default_factory=list)
    attentions: list[torch.Tensor | None] = field(default_factory=list)


def _first(output):
    return output[0] if isinstance(output, tuple) else output


@contextmanager
def capture(model: nn.Module, *, hidden_states: bool = True, attentions: bool = True) -> Iterator[Captured]:
    """Record hidden states and/or attention probabilities of every forward pass inside the block.

    Attention probabilities are the second output of ``attention.self`` in eager mode. Each new
    forward overwrites the previous one's tensors.
    """
    n = sites.num_layers(model)
    store = Captured([None] * (n + 1), [None] * (n + 1))
    handles: list[torch.utils.hooks.RemovableHandle] = []
    try:
        if hidden_states:
            handles.append(
                sites.embeddings(model).register_forward_hook(
                    lambda _m, _i, out: store.hidden_states.__setitem__(0, _first(out))
                )
            )
            for layer, block in enumerate(sites.blocks(model), start=1):
                handles.append(
                    block.register_forward_hook(
                        lambda _m, _i, out, layer=layer: store.hidden_states.__setitem__(layer, _first(out))
                    )
                )
        if attentions:
            for layer in range(1, n + 1):
                handles.append(
                    sites.self_attention(model, layer).register_forward_hook(
                        lambda _m, _i, out, layer=layer: store.attentions.__setitem__(layer, out[1])
                    )
                )
        yield store
    finally:
        for h in handles:
            h.remove()


def count_hooks(model: nn.Module) -> int:
    """Number of forward (pre-)hooks registered anywhere in ``model`` (for leak tests)."""
    total = 0
    for module in model.modules():
        total += len(module._forward_hooks) + len(module._forward_pre_hooks)
    return total
