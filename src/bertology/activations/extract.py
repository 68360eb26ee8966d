"""The extraction loop: length-bucketed batches, one forward per model per batch, every analysis fed.

Sorting by length keeps padding (and quadratic attention cost) low; ``inference_mode`` avoids autograd
bookkeeping; hooks capture only what the attached analyses require and are removed afterwards.
"""
from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple

import torch

from bertology.activations.batch import PairBatch
from bertology.activations.contributions import MEASURES, attention_inputs, maps_from_forward
from bertology.activations.stream import Consumer
from bertology.blas import one_blas_thread
from bertology.data.batching import collate, length_batches
from bertology.data.encode import EncodedCorpus
from bertology.models import sites
from bertology.models.hooks import Captured, capture
from bertology.models.pair import ModelPair
from bertology.models.shared_base import to_device_together

logger = logging.getLogger(__name__)


#: How a consumer asks for a contribution measure's maps in its ``requires``: ``MEASURE_PREFIX + "norm"``.
MEASURE_PREFIX = "measure:"


def capture_forward(model: torch.nn.Module, tensors: dict, want: frozenset[str], device: torch.device) -> Captured:
    """Run one model on a collated batch with hooks capturing ``want`` (hidden states and/or attention maps).

    A model run in bfloat16 or float16 (``--dtype``) has its activations widened to float32 here, so
    every analysis does the same arithmetic as in a float32 run; float32 ones are returned as they are.
    ``want`` may name contribution measures (``"measure:norm"``): their maps come from the same forward
    pass (value zeroing adds its re-runs) into ``Captured.measures``.
    """
    encoder = sites.encoder(model)
    inputs = sites.model_inputs(encoder, tensors, device)
    measures = tuple(m for m in MEASURES if MEASURE_PREFIX + m in want and m != "weights")
    attentions = "attentions" in want or bool(measures)
    with (attention_inputs(encoder) if measures else contextlib.nullcontext({})) as xs, \
            capture(encoder, hidden_states="hidden_states" in want, attentions=attentions) as cap:
        encoder(**inputs)
    if measures:
        cap.measures = maps_from_forward(encoder, inputs, cap.attentions, xs, measures)
        xs.clear()
    cap.hidden_states = [widen(h) for h in cap.hidden_states]
    cap.attentions = [widen(a) for a in cap.attentions]
    return cap


def widen(t: torch.Tensor | None) -> torch.Tensor | None:
    """A reduced-precision float tensor as float32 (the same tensor when it is float32 or float64)."""
    return t.float() if t is not None and t.dtype in (torch.bfloat16, torch.float16) else t


def iter_pair_batches(
    pair: ModelPair,
    encoded: EncodedCorpus,
    *,
    batch_size: int = 32,
    requires: frozenset[str] = frozenset({"hidden_states", "attentions"}),
    pad_to: int | None = None,
    device: str = "cpu",
) -> Iterator[PairBatch]:
    """Yield one :class:`PairBatch` per length bucket, each model run once on it."""
    dev = torch.device(device)
    pad_id = pair.tokenizer.pad_token_id or 0
    to_device_together((pair.base.model, pair.tuned.model), dev)  # an adapter's shared base tensors stay shared
    with torch.inference_mode():
        for items in length_batches(encoded.items, batch_size):
            t = collate(items, pad_id, pad_to)
            base = capture_forward(pair.base.model, t, requires, dev)
            tuned = capture_forward(pair.tuned.model, t, requires, dev)
            yield PairBatch(items, t["input_ids"], t["mask"].to(dev), t["content"].to(dev), t["lengths"], base, tuned)


def run_analyses(
    pair: ModelPair,
    encoded: EncodedCorpus,
    analyses: Sequence[Consumer],
    *,
    batch_size: int = 32,
    device: str = "cpu",
    on_batch: Callable[[int], None] | None = None,
    store=None,
    timings: dict[str, float] | None = None,
) -> list[Consumer]:
    """Stream the corpus once through both models and feed every analysis (and the optional store); the analyses
    fed, in order, so ``[a.compute() for a in run_analyses(...)]`` gives their tables."""
    consumers: list = list(analyses) + ([_StoreConsumer(store)] if store is not None else [])
    run_shared_analyses(pair.base.model, [TunedConsumers(pair.tuned.model, consumers)], pair.tokenizer.pad_token_id or 0,
                        encoded, batch_size=batch_size, device=device, on_batch=on_batch, timings=timings)
    return list(analyses)


class _StoreConsumer:
    """An activation store seen as a consumer of the loop (it takes batches with ``add``)."""

    name = "activation_store"

    def __init__(self, store) -> None:
        self.store, self.requires = store, store.requires

    def extraction_options(self) -> dict:
        return {}

    def update(self, batch: PairBatch) -> None:
        self.store.add(batch)


def _charge(timings: dict[str, float] | None, key: str, since: float) -> float:
    """Add the seconds since ``since`` to ``timings[key]`` (when timing) and return the clock now."""
    now = time.perf_counter()
    if timings is not None:
        timings[key] = timings.get(key, 0.0) + now - since
    return now


class TunedConsumers(NamedTuple):
    """One tuned model of a shared pass and the consumers its pair batches (the base beside it) feed."""

    model: torch.nn.Module
    consumers: Sequence[Consumer]


def run_shared_analyses(
    base: torch.nn.Module,
    tuned: Sequence[TunedConsumers],
    pad_id: int,
    encoded: EncodedCorpus,
    *,
    batch_size: int = 32,
    device: str = "cpu",
    on_batch: Callable[[int], None] | None = None,
    timings: dict[str, float] | None = None,
) -> None:
    """Stream the corpus once: per length batch the base forward runs once and is shared by every tuned model.

    ``tuned[i].consumers`` are fed ``PairBatch(base, tuned[i].model)``. Per batch at most two models' activations
    are alive: the base's, and one tuned model's (dropped before the next tuned forward); every model's
    weights stay resident. The batches, padding and arithmetic are those of a single pair's loop, so a
    pair's numbers are the same whether it streams alone or beside others. ``on_batch`` gets the
    examples of each batch once it has been through every model. ``timings``, when given, gains the
    seconds spent in the forward passes (``forward``) and in each consumer's ``update`` (``update:<name>``);
    on a GPU the forward is queued, so its time lands on the first update that waits for it.
    """
    models, consumers = [t.model for t in tuned], [t.consumers for t in tuned]
    dev = torch.device(device)
    wants = [frozenset().union(*(c.requires for c in cs)) if cs else frozenset() for cs in consumers]
    base_wants = frozenset().union(*wants)
    pad_to = None
    for c in (c for cs in consumers for c in cs):
        opt = c.extraction_options().get("pad_to")
        if opt is not None:
            pad_to = max(pad_to or 0, opt)
    active = [i for i, cs in enumerate(consumers) if cs]
    to_device_together((base, *(models[i] for i in active)), dev)  # an adapter's shared base tensors stay shared
    # NumPy's BLAS on one thread for the whole pass: the analyses' small products beside torch's threads
    # (bertology.blas explains why)
    with torch.inference_mode(), one_blas_thread():
        for items in length_batches(encoded.items, batch_size):
            t = collate(items, pad_id, pad_to)
            mask, content = t["mask"].to(dev), t["content"].to(dev)
            clock = time.perf_counter()
            base_cap = capture_forward(base, t, base_wants, dev)
            for i in active:
                batch = PairBatch(items, t["input_ids"], mask, content, t["lengths"], base_cap,
                                  capture_forward(models[i], t, wants[i], dev))
                clock = _charge(timings, "forward", clock)
                for c in consumers[i]:
                    c.update(batch)
                    clock = _charge(timings, f"update:{getattr(c, 'name', type(c).__name__)}", clock)
                del batch  # this tuned model's activations go before the next one's forward
            if on_batch is not None:
                on_batch(len(items))
