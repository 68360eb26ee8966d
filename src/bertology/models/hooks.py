"""Temporary hooks on the real modules: per-layer registration (call-order keyed for shared blocks) and capture.

Every hook is removed in ``finally``, even when the body raises.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from bertology.errors import BertologyError
from bertology.models import sites

Site = Callable[[nn.Module, int], nn.Module]


@dataclass
class Captured:
    """Activations of one forward pass.

    ``hidden_states[l]`` for l = 0..N (``[batch, seq, hidden]``); ``attentions[l]`` for l = 1..N
    (``[batch, heads, seq, seq]``); index 0 of ``attentions`` is unused (None) so indices match layers.
    ``measures``: contribution maps by measure, laid out as ``attentions`` (``[batch, 1, seq, seq]`` for a
    per-layer measure), when the capture was asked for them (bertology.activations.contributions).
    """

    hidden_states: list[torch.Tensor | None] = field(default_factory=list)
    attentions: list[torch.Tensor | None] = field(default_factory=list)
    measures: dict[str, list[torch.Tensor | None]] = field(default_factory=dict)


def _first(output):
    return output[0] if isinstance(output, tuple) else output


def block_input(args: tuple, kwargs: dict) -> torch.Tensor:
    """The hidden states a block or attention module receives (first positional or ``hidden_states``)."""
    return kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]


def on_layers(
    model: nn.Module,
    site: Site,
    hooks: Mapping[int, Callable],
    *,
    pre: bool = False,
    with_kwargs: bool = False,
) -> list[RemovableHandle]:
    """Register ``hooks[layer]`` on ``site(model, layer)`` for each layer; return the handles.

    A module that serves several depths (ALBERT's shared layer) gets one hook that counts its calls
    within a forward pass (reset by a pre-hook on the encoder) and dispatches to the hook of the depth
    being run, so a hook for layer 3 fires on the third call only. Hook signatures are PyTorch's.
    """
    n = sites.num_layers(model)
    modules = {layer: site(model, layer) for layer in range(1, n + 1)}
    depths: dict[int, list[int]] = {}
    for layer, module in modules.items():
        depths.setdefault(id(module), []).append(layer)
    bad = [layer for layer in hooks if not 1 <= layer <= n]
    if bad:
        raise ValueError(f"no layer {bad[0]} in a model with {n} layers")
    handles: list[RemovableHandle] = []
    try:
        shared = {key: ls for key, ls in depths.items() if len(ls) > 1 and any(l in hooks for l in ls)}
        for layer, hook in hooks.items():
            if id(modules[layer]) not in shared:
                handles.append(_register(modules[layer], hook, pre, with_kwargs))
        for key, ls in shared.items():
            handles.extend(_register_shared(model, modules[ls[0]], ls, hooks, pre, with_kwargs))
    except BaseException:
        remove_hooks(handles)
        raise
    return handles


def _register(module: nn.Module, hook: Callable, pre: bool, with_kwargs: bool) -> RemovableHandle:
    if pre:
        return module.register_forward_pre_hook(hook, with_kwargs=with_kwargs)
    return module.register_forward_hook(hook, with_kwargs=with_kwargs)


def _register_shared(model, module, layers: list[int], hooks: Mapping[int, Callable], pre: bool, with_kwargs: bool):
    """One hook on a module run at several depths: its k-th call within a forward is depth ``layers[k]``.

    The counter belongs to this registration (a pre-hook and a forward hook each count the calls they see)
    and is reset by a pre-hook on the encoder at the start of every forward pass.
    """
    calls = [0]

    def reset(_m, _args):
        calls[0] = 0

    def dispatch(*hook_args):
        k = calls[0]
        calls[0] += 1
        hook = hooks.get(layers[k]) if k < len(layers) else None
        return None if hook is None else hook(*hook_args)

    return [
        sites.encoder(model).register_forward_pre_hook(reset),
        _register(module, dispatch, pre, with_kwargs),
    ]


@contextmanager
def eager_attention(model: nn.Module) -> Iterator[None]:
    """Run ``model`` with eager attention inside the block (sdpa/flash return no probabilities)."""
    cfg = model.config
    old = getattr(cfg, "_attn_implementation", None)
    if old in (None, "eager"):
        yield
        return
    try:
        model.set_attn_implementation("eager")
    except Exception as err:  # transformers raises several types here
        raise BertologyError(
            f"{type(model).__name__} runs with {old!r} attention and cannot switch to eager, which bertology needs to "
            f"read attention maps: load it with attn_implementation='eager' ({err})."
        ) from err
    try:
        yield
    finally:
        model.set_attn_implementation(old)


@contextmanager
def forward_kwargs(model: nn.Module, extra: Mapping[str, object]) -> Iterator[None]:
    """Pass ``extra`` keyword arguments to every call of the encoder's forward inside the block."""
    if not extra:
        yield
        return

    def add(_m, args, kwargs):
        kwargs.update(extra)
        return args, kwargs

    handle = sites.encoder(model).register_forward_pre_hook(add, with_kwargs=True)
    try:
        yield
    finally:
        handle.remove()


def remove_hooks(handles: Iterable[RemovableHandle]) -> None:
    """Remove every handle (used in ``finally`` blocks and on a failed registration)."""
    for h in handles:
        h.remove()


@contextmanager
def capture(model: nn.Module, *, hidden_states: bool = True, attentions: bool = True) -> Iterator[Captured]:
    """Record hidden states and/or attention probabilities of every forward pass inside the block.

    Hidden state 0 is the input of the first block; hidden state ``l`` the output of
    :func:`sites.hidden_output` (the block, or the module the family runs after it). Attention maps are
    the attention module's output at the adapter's ``probs_index``, with eager attention and the
    adapter's ``forward_kwargs`` in force. Each new forward overwrites the previous one's tensors.
    """
    n = sites.num_layers(model)
    ad = sites.adapter(model)
    store = Captured([None] * (n + 1), [None] * (n + 1))
    handles: list[RemovableHandle] = []

    def keep_input(_m, args, kwargs):
        store.hidden_states[0] = block_input(args, kwargs)

    def keep_hidden(layer: int):
        return lambda _m, _i, out: store.hidden_states.__setitem__(layer, _first(out))

    def keep_probs(layer: int):
        def hook(module, _i, out):
            probs = out[ad.probs_index] if isinstance(out, tuple) and len(out) > ad.probs_index else None
            if probs is None:
                raise BertologyError(
                    f"{type(module).__name__} returned no attention probabilities at layer {layer}; "
                    f"bertology reads them from eager attention ({ad.family} adapter)."
                )
            store.attentions[layer] = probs

        return hook

    with eager_attention(model) if attentions else nullcontext(), forward_kwargs(model, ad.forward_kwargs if attentions else {}):
        try:
            if hidden_states:
                handles += on_layers(model, sites.block, {1: keep_input}, pre=True, with_kwargs=True)
                handles += on_layers(model, sites.hidden_output, {l: keep_hidden(l) for l in range(1, n + 1)})
            if attentions:
                handles += on_layers(model, sites.attention, {l: keep_probs(l) for l in range(1, n + 1)})
            yield store
        finally:
            remove_hooks(handles)


def count_hooks(model: nn.Module) -> int:
    """Number of forward (pre-)hooks registered anywhere in ``model`` (for leak tests)."""
    total = 0
    for module in model.modules():
        total += len(module._forward_hooks) + len(module._forward_pre_hooks)
    return total
