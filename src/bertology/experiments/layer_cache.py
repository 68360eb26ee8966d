"""Score many weight variants of one model, reusing a reference's hidden states below each one's first changed layer.

The revert and transplant sweeps score many copies of one model that differ from a reference in a few weights:
a revert unit differs from the tuned model in one layer (or the embeddings); a transplant differs from the head
alone (the base encoder under the tuned head) in its transplanted units, and a bottom-k transplant differs from
the tuned model in the layers above k. A variant whose first changed layer is ``l`` receives, at block ``l``, the
same hidden states as its reference, bit for bit, so the blocks below ``l`` need not run again.

:func:`run_variants` runs each reference once, layer by layer, keeping only the hidden states entering the
current block for every batch (as the ablation sweep's cached method does, :mod:`bertology.experiments.ablation_sweep`):
at layer ``l`` the variants that start there run blocks ``l..L`` and the task head from the cache (blocks below
are bypassed and block 1 receives the cached states), then the cache advances through the reference's block ``l``.
A variant whose embeddings differ (``start`` 0) runs a full forward. Every block sees the input and mask it sees in
a full forward and every matrix product keeps its shape, so the logits equal the full forward's bit for bit.

The path needs blocks that can be bypassed with their input handed on (the adapter's ``cached_sweep``: BERT,
RoBERTa, XLM-R, ELECTRA). Other families (DistilBERT, ALBERT's shared layer, DeBERTa whose relative position
embeddings and convolution sit outside the blocks, MPNet, ModernBERT) run every variant as a full forward;
:func:`run_variants` returns which method ran, for the manifest.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Literal

import torch

from bertology.experiments.scoring import Batches, _logits, tile_rows
from bertology.models import sites
from bertology.models.ablate import bypass_blocks, keep_first_token, replace_embeddings
from bertology.models.hooks import block_input

Method = Literal["cached", "naive"]
#: Puts weights into the model for the length of a ``with`` block and restores them on exit.
Weights = Callable[[], AbstractContextManager]
#: A reference's weights for block ``layer`` (0: the embeddings), while its hidden states are computed.
ReferenceWeights = Callable[[int], AbstractContextManager]


@dataclass(frozen=True)
class Variant:
    """One model to score: ``key`` (its store key), ``weights`` (puts its weights in place), ``reference`` (whose
    hidden states it reuses) and ``start``: the first block (1-based) whose weights differ from the reference's,
    0 when the embeddings differ (a full forward), L + 1 when nothing differs (the reference's own logits)."""

    key: str
    weights: Weights
    reference: str = ""
    start: int = 0


def no_change() -> AbstractContextManager:
    """The model as it is (a variant or reference that is the tuned model)."""
    return nullcontext()


def first_layer(model: torch.nn.Module, names: Iterable[str]) -> int:
    """The first block (1-based) holding one of the encoder parameters ``names``; 0 when one lies outside the blocks
    (the embeddings, or anything else: conservative), L + 1 when ``names`` is empty."""
    prefix = sites.adapter(model).blocks + "."
    layers = []
    for name in names:
        if not name.startswith(prefix):
            return 0
        layers.append(int(name[len(prefix):].split(".", 1)[0]) + 1)
    return min(layers, default=sites.num_layers(model) + 1)


def full_forward(model: torch.nn.Module, batches: Batches) -> list[torch.Tensor]:
    """The logits of every batch from a plain forward."""
    return [_logits(model, inp) for inp in batches.inputs]


def run_from(model: torch.nn.Module, batches: Batches, start: int, cache: Sequence[torch.Tensor], *,
             stop: int | None = None, shortcut: Sequence[bool] | None = None,
             extra: Callable[[int], None] | None = None, repeat: int = 1) -> list[torch.Tensor]:
    """Logits of every batch for a forward that enters block ``start`` with the cached hidden states ``cache[b]``.

    Blocks before ``start`` (and after ``stop``) are bypassed; ``start = L + 1`` runs no block. ``shortcut[b]``:
    batch ``b`` runs the last block's feed-forward on the first token only; ``extra(b)`` runs before batch ``b``.
    ``repeat``: every batch's rows (inputs and cached states) ``repeat`` times over
    (:func:`~bertology.experiments.scoring.tile_rows`), for a forward that scores that many units at once; its
    logits then hold ``repeat`` row groups.
    """
    n = sites.num_layers(model)
    bypass = [l for l in range(1, n + 1) if l < start or (stop is not None and l > stop)]
    runs_last = start <= n and (stop is None or stop >= n)
    out = []
    with replace_embeddings(model) as repl, bypass_blocks(model, bypass):
        for b, inp in enumerate(batches.inputs):
            repl.set(tile_rows(cache[b], repeat))
            if extra is not None:
                extra(b)
            cut = shortcut is not None and shortcut[b] and runs_last
            with keep_first_token(model) if cut else nullcontext():
                out.append(_logits(model, tile_rows(inp, repeat)))
    return out


def embedded(model: torch.nn.Module, batches: Batches) -> list[torch.Tensor]:
    """The hidden states entering block 1 for every batch (every block bypassed)."""
    cache: list[torch.Tensor] = []
    grab = sites.block(model, 1).register_forward_pre_hook(
        lambda _m, args, kwargs: cache.append(block_input(args, kwargs)), with_kwargs=True)
    try:
        with bypass_blocks(model, range(1, sites.num_layers(model) + 1)):
            full_forward(model, batches)
    finally:
        grab.remove()
    return cache


def advance(model: torch.nn.Module, batches: Batches, layer: int, cache: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The hidden states leaving block ``layer`` for every batch, from ``cache`` (the states entering it)."""
    nxt: list[torch.Tensor] = []
    handle = sites.block(model, layer).register_forward_hook(
        lambda _m, _i, out: nxt.append(out[0] if isinstance(out, tuple) else out))
    try:
        run_from(model, batches, layer, cache, stop=layer)
    finally:
        handle.remove()
    return nxt


def _from_reference(model: torch.nn.Module, batches: Batches, variants: Sequence[Variant], weights: ReferenceWeights,
                    finish: Callable[[str, list[torch.Tensor]], None]) -> None:
    """Run ``variants`` (all with ``start`` >= 1) from one reference's hidden states, layer by layer."""
    top = max(v.start for v in variants)
    with weights(0):
        cache = embedded(model, batches)
    for layer in range(1, top + 1):
        for v in variants:
            if v.start == layer:
                with v.weights():
                    finish(v.key, run_from(model, batches, layer, cache))
        if layer < top:
            with weights(layer):
                cache = advance(model, batches, layer, cache)


def run_variants(model: torch.nn.Module, batches: Batches, variants: Sequence[Variant],
                 references: Mapping[str, ReferenceWeights], finish: Callable[[str, list[torch.Tensor]], None],
                 method: Method = "cached") -> Method:
    """Score every variant (``finish(key, logits)`` after each) and return the method that ran: ``cached`` (see the
    module docstring) where the family's blocks allow it, else ``naive`` (a full forward per variant)."""
    if method not in ("cached", "naive"):
        raise ValueError(f"method must be 'cached' or 'naive', not {method!r}")
    if not sites.adapter(model).cached_sweep:
        method = "naive"
    with torch.inference_mode():
        for v in variants:
            if method == "naive" or v.start <= 0:
                with v.weights():
                    finish(v.key, full_forward(model, batches))
        if method == "cached":
            for name, weights in references.items():
                mine = [v for v in variants if v.reference == name and v.start > 0]
                if mine:
                    _from_reference(model, batches, mine, weights, finish)
    return method
