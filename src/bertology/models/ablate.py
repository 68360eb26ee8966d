"""Temporary hooks that disable attention heads and whole layers, gate heads, or start a forward mid-model.

transformers v5 has no ``head_mask``: every intervention here is a hook on the real Hugging Face modules
(DESIGN §2), registered on entry and removed in ``finally`` even when the body raises. Layers are 1-based
(attention layers 1..N), heads 0-based.

Head ablation modes (recorded as ``mode`` in every output):

* ``uniform`` (Kovaleva et al. 2019 §4.6): the head's attention is set to 1/L over the L non-padding
  tokens, [CLS]/[SEP] included, so its context vector is the mean of its value vectors over those
  tokens. With ``exclude_special`` the mean runs over the non-special real tokens instead (falling back
  to all real tokens for an input that has nothing else). A forward hook on ``attention.self`` rewrites
  that head's slice of the context (and its attention probabilities, so captured maps show 1/L).
* ``zero``: the head's context slice is zeroed before ``attention.output.dense`` (the old ``head_mask``).
* ``mean``: the head's context slice is replaced by its mean over a reference corpus
  (:func:`bertology.analyses.ablation.head_means`).

Whole layers: :func:`skip_layers` returns each block's input unchanged; "all heads of a layer" is
:func:`ablate_heads` with every head of that layer.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Literal

import torch
from torch import nn

from bertology.models import sites

Mode = Literal["uniform", "zero", "mean"]
MODES: tuple[str, ...] = ("uniform", "zero", "mean")

__all__ = [
    "MODES",
    "HeadGates",
    "Mode",
    "ablate_heads",
    "bypass_blocks",
    "head_gates",
    "keep_first_token",
    "replace_embeddings",
    "replay_output",
    "skip_layers",
]


def _group(heads: Iterable[tuple[int, int]], n_layers: int, n_heads: int) -> dict[int, list[int]]:
    by_layer: dict[int, list[int]] = defaultdict(list)
    for layer, head in heads:
        layer, head = int(layer), int(head)
        if not (1 <= layer <= n_layers) or not (0 <= head < n_heads):
            raise ValueError(f"no head L{layer}H{head} in a model with {n_layers} layers x {n_heads} heads")
        if head not in by_layer[layer]:
            by_layer[layer].append(head)
    return dict(by_layer)


def _real_keys(attention_mask: torch.Tensor | None, hidden: torch.Tensor) -> torch.Tensor:
    """``[B, T]`` bool, True for keys the model may attend to (non-padding), from the mask attention receives."""
    b, t = hidden.shape[:2]
    if attention_mask is None:
        return torch.ones(b, t, dtype=torch.bool, device=hidden.device)
    m = attention_mask
    if m.dim() == 4:  # [B, 1, Q, K] additive (eager) or boolean
        m = m[:, 0]
        if m.dtype == torch.bool:
            return m.any(dim=1)
        return (m > torch.finfo(m.dtype).min / 2).any(dim=1)
    if m.dim() == 2:
        return m.bool()
    raise ValueError(f"unexpected attention mask of shape {tuple(attention_mask.shape)}")


def _head_slices(head_size: int, heads: Iterable[int]) -> list[slice]:
    return [slice(h * head_size, (h + 1) * head_size) for h in heads]


@contextmanager
def ablate_heads(
    model: nn.Module,
    heads: Iterable[tuple[int, int]],
    mode: Mode = "uniform",
    *,
    exclude_special: bool = False,
    special_ids: Collection[int] | None = None,
    means: Mapping[tuple[int, int], torch.Tensor] | torch.Tensor | None = None,
) -> Iterator[None]:
    """Disable the given ``(layer, head)`` pairs for every forward pass inside the block.

    ``exclude_special`` (uniform mode) leaves the tokens whose ids are in ``special_ids`` ([CLS] and
    [SEP]; the ids are read from the ``input_ids`` the embeddings receive) out of the 1/L average.
    ``means`` (mean mode) maps ``(layer, head)`` to that head's mean context vector, or is a
    ``[layers, heads, head_size]`` tensor indexed ``[layer - 1, head]``.
    """
    if mode not in MODES:
        raise ValueError(f"unknown ablation mode {mode!r}; choose from {', '.join(MODES)}")
    n_layers = sites.num_layers(model)
    first = sites.self_attention(model, 1)
    n_heads, size = first.num_attention_heads, first.attention_head_size
    by_layer = _group(heads, n_layers, n_heads)
    if exclude_special and mode == "uniform" and not special_ids:
        raise ValueError("exclude_special needs the special token ids ([CLS], [SEP]) in special_ids")
    if mode == "mean" and means is None:
        raise ValueError("mode='mean' needs the heads' mean context vectors (means=...)")
    handles: list[torch.utils.hooks.RemovableHandle] = []
    state: dict = {}
    try:
        if mode == "uniform":
            if exclude_special:
                ids = torch.tensor(sorted(int(i) for i in special_ids or ()), dtype=torch.long)

                def remember_ids(_m, args, kwargs):
                    input_ids = kwargs.get("input_ids", args[0] if args else None)
                    state["special"] = None if input_ids is None else torch.isin(input_ids, ids.to(input_ids.device))

                handles.append(sites.embeddings(model).register_forward_pre_hook(remember_ids, with_kwargs=True))
            for layer, hs in by_layer.items():
                handles.extend(_uniform_hooks(model, layer, hs, size, state, exclude_special))
        else:
            for layer, hs in by_layer.items():
                if mode == "zero":
                    values = None
                else:
                    values = torch.stack([_mean_of(means, layer, h) for h in hs])  # [k, d]
                handles.append(
                    sites.attention_output_dense(model, layer).register_forward_pre_hook(
                        _replace_slices_hook(hs, size, values)
                    )
                )
        yield
    finally:
        for h in handles:
            h.remove()


def _mean_of(means, layer: int, head: int) -> torch.Tensor:
    if isinstance(means, torch.Tensor):
        return means[layer - 1, head]
    try:
        return torch.as_tensor(means[(layer, head)])
    except KeyError:
        raise ValueError(f"no mean context vector for L{layer}H{head}") from None


def _replace_slices_hook(heads: list[int], size: int, values: torch.Tensor | None):
    """Pre-hook on ``attention.output.dense``: zero (values None) or overwrite the heads' context slices."""

    def hook(_m, args):
        x = args[0].clone()
        for i, sl in enumerate(_head_slices(size, heads)):
            if values is None:
                x[..., sl] = 0
            else:
                x[..., sl] = values[i].to(dtype=x.dtype, device=x.device)
        return (x, *args[1:])

    return hook


def _uniform_hooks(model, layer: int, heads: list[int], size: int, state: dict, exclude_special: bool):
    """A forward hook on ``attention.self`` that rewrites the heads' context as the mean of their values.

    The heads' value vectors are recomputed from the module's input (``d`` of the ``H*d`` rows of the
    value projection per head), so the hook also works when the module's output is replayed from a
    cache (:func:`replay_output`).
    """
    attn = sites.self_attention(model, layer)
    slices = _head_slices(size, heads)

    def rewrite(_m, args, kwargs, output):
        hidden = kwargs.get("hidden_states", args[0] if args else None)
        keys = _real_keys(kwargs.get("attention_mask"), hidden)
        if exclude_special:
            special = state.get("special")
            if special is None or special.shape != keys.shape:
                raise RuntimeError("exclude_special: the input ids of this forward pass were not seen")
            content = keys & ~special
            keys = torch.where(content.any(dim=1, keepdim=True), content, keys)
        weights = keys.to(hidden.dtype)
        weights = weights / weights.sum(dim=1, keepdim=True).clamp_min(1)  # [B, T]: 1/L on real keys
        context, probs = output[0].clone(), output[1]
        probs = probs.clone() if probs is not None else None
        w, b = attn.value.weight, attn.value.bias
        pooled = torch.einsum("bt,bth->bh", weights, hidden)  # mean of the inputs, then the (affine) projection
        for h, sl in zip(heads, slices):
            mean = nn.functional.linear(pooled, w[sl], None if b is None else b[sl])
            context[..., sl] = mean[:, None, :].to(context.dtype)
            if probs is not None:
                probs[:, h] = weights[:, None, :].to(probs.dtype)
        return (context, probs, *output[2:])

    return [attn.register_forward_hook(rewrite, with_kwargs=True)]


def _block_input(args, kwargs) -> torch.Tensor:
    return kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]


@contextmanager
def skip_layers(model: nn.Module, layers: Iterable[int]) -> Iterator[None]:
    """Disable whole blocks: each returns its input hidden states unchanged (the block still runs)."""
    blocks = sites.blocks(model)
    handles = []

    def hook(_m, args, kwargs, output):
        hidden = _block_input(args, kwargs)
        return (hidden, *output[1:]) if isinstance(output, tuple) else hidden

    try:
        for layer in sorted(set(int(x) for x in layers)):
            if not 1 <= layer <= len(blocks):
                raise ValueError(f"no layer {layer} in a model with {len(blocks)} layers")
            handles.append(blocks[layer - 1].register_forward_hook(hook, with_kwargs=True))
        yield
    finally:
        for h in handles:
            h.remove()


@contextmanager
def bypass_blocks(model: nn.Module, layers: Iterable[int]) -> Iterator[None]:
    """Make the given blocks cost nothing: their ``forward`` temporarily returns its input.

    Used with :func:`replace_embeddings` to start a forward pass at a later block from cached hidden
    states (exact: the blocks above see the same input and the same attention mask). Hooks registered
    on a bypassed block still fire. The instance attribute is restored (or removed) in ``finally``.
    """
    blocks = sites.blocks(model)
    saved: list[tuple[nn.Module, object]] = []
    marker = object()

    def identity(hidden_states, *args, **kwargs):
        return hidden_states

    try:
        for layer in sorted(set(int(x) for x in layers)):
            block = blocks[layer - 1]
            saved.append((block, block.__dict__.get("forward", marker)))
            block.forward = identity
        yield
    finally:
        for block, old in reversed(saved):
            if old is marker:
                del block.forward
            else:
                block.forward = old


class _Replacement:
    """The hidden states the embeddings module returns while :func:`replace_embeddings` is active."""

    def __init__(self) -> None:
        self.hidden: torch.Tensor | None = None

    def set(self, hidden: torch.Tensor) -> None:
        self.hidden = hidden


@contextmanager
def replace_embeddings(model: nn.Module) -> Iterator[_Replacement]:
    """Make the embeddings module return ``r.hidden`` (set it before each forward) instead of its output."""
    repl = _Replacement()

    def hook(_m, _inp, out):
        if repl.hidden is None:
            raise RuntimeError("replace_embeddings: set() the hidden states before the forward pass")
        if repl.hidden.shape != out.shape:
            raise RuntimeError(f"replacement hidden states {tuple(repl.hidden.shape)} != embeddings {tuple(out.shape)}")
        return repl.hidden

    handle = sites.embeddings(model).register_forward_hook(hook)
    try:
        yield repl
    finally:
        handle.remove()


class _Replay:
    """The output a replayed module returns on its next call (set it before each forward)."""

    def __init__(self) -> None:
        self.value = None

    def set(self, value) -> None:
        self.value = value


@contextmanager
def replay_output(module: nn.Module) -> Iterator[_Replay]:
    """Skip ``module``'s computation: its ``forward`` returns ``r.value`` (set before each call) instead.

    Its forward hooks still run on the replayed output, so an ablation hook can edit a cached
    intact output (the sweep replays ``attention.self`` of the ablated layer: the other heads' contexts
    are unchanged, so the query/key/value projections need not run again). Restored in ``finally``.
    """
    rp = _Replay()
    marker = object()
    old = module.__dict__.get("forward", marker)

    def replayed(*args, **kwargs):
        if rp.value is None:
            raise RuntimeError("replay_output: set() the output before the forward pass")
        return rp.value

    module.forward = replayed
    try:
        yield rp
    finally:
        if old is marker:
            del module.forward
        else:
            module.forward = old


@contextmanager
def keep_first_token(model: nn.Module) -> Iterator[None]:
    """Let the last block's feed-forward run on the first token only (exact when the head reads [CLS] only).

    A forward hook on the last block's ``attention.output`` keeps position 0, so the block's
    intermediate and output layers (most of its cost) skip the other positions. Only valid for
    classifiers that read the first token of the last hidden state (BERT's pooler, RoBERTa/ELECTRA
    classification heads); callers check the logits against a full forward first.
    """
    last = sites.blocks(model)[-1].attention.output
    handle = last.register_forward_hook(lambda _m, _i, out: out[:, :1])
    try:
        yield
    finally:
        handle.remove()


class HeadGates:
    """Per-example gates ξ multiplying each head's context (Michel et al. 2019), all 1 in the forward pass.

    Call :meth:`prepare` with the batch size before each forward; after ``loss.backward()``
    ``grad`` is ``[batch, layers, heads]``: per example, because each example has its own gates and
    examples do not interact.
    """

    def __init__(self, n_layers: int, n_heads: int, head_size: int) -> None:
        self.n_layers, self.n_heads, self.head_size = n_layers, n_heads, head_size
        self.gates: torch.Tensor | None = None

    def prepare(self, batch_size: int, device: torch.device | str = "cpu", dtype: torch.dtype = torch.float32) -> torch.Tensor:
        self.gates = torch.ones(batch_size, self.n_layers, self.n_heads, device=device, dtype=dtype, requires_grad=True)
        return self.gates

    @property
    def grad(self) -> torch.Tensor | None:
        return None if self.gates is None else self.gates.grad

    def _hook(self, layer: int):
        def hook(_m, args):
            if self.gates is None:
                raise RuntimeError("HeadGates: call prepare(batch_size) before the forward pass")
            x = args[0]
            b, t = x.shape[:2]
            g = self.gates[:, layer - 1].to(x.dtype)  # [B, H]
            x = (x.view(b, t, self.n_heads, self.head_size) * g[:, None, :, None]).view(b, t, -1)
            return (x, *args[1:])

        return hook


@contextmanager
def head_gates(model: nn.Module) -> Iterator[HeadGates]:
    """Install a gate on every head of every layer (pre-hooks on ``attention.output.dense``)."""
    n = sites.num_layers(model)
    attn = sites.self_attention(model, 1)
    gates = HeadGates(n, attn.num_attention_heads, attn.attention_head_size)
    handles = []
    try:
        for layer in range(1, n + 1):
            handles.append(sites.attention_output_dense(model, layer).register_forward_pre_hook(gates._hook(layer)))
        yield gates
    finally:
        for h in handles:
            h.remove()
