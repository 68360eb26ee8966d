"""The extraction loop: length-bucketed batches, one forward per model per batch, every analysis fed.

Sorting by length keeps padding (and quadratic attention cost) low; ``inference_mode`` avoids autograd
bookkeeping; hooks capture only what the attached analyses require and are removed afterwards.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence

import torch

from bertology.activations.batch import PairBatch
from bertology.activations.stream import Consumer
from bertology.data.batching import collate, length_batches
from bertology.data.encode import EncodedCorpus
from bertology.models import sites
from bertology.models.hooks import Captured, capture
from bertology.models.pair import ModelPair

logger = logging.getLogger(__name__)


def capture_forward(model: torch.nn.Module, tensors: dict, want: frozenset[str], device: torch.device) -> Captured:
    """Run one model on a collated batch with hooks capturing ``want`` (hidden states and/or attention maps).

    A model run in bfloat16 or float16 (``--dtype``) has its activations widened to float32 here, so
    every analysis does the same arithmetic as in a float32 run; float32 ones are returned as they are.
    """
    encoder = sites.encoder(model)
    inputs = sites.model_inputs(encoder, tensors, device)
    with capture(encoder, hidden_states="hidden_states" in want, attentions="attentions" in want) as cap:
        encoder(**inputs)
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
    for model in (pair.base.model, pair.tuned.model):
        model.to(dev).eval()
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
) -> None:
    """Stream the corpus once through both models and feed every analysis (and the optional store)."""
    requires: frozenset[str] = frozenset().union(*(a.requires for a in analyses)) if analyses else frozenset()
    if store is not None:
        requires = requires | store.requires
    pad_to = None
    for a in analyses:
        opt = a.extraction_options().get("pad_to")
        if opt is not None:
            pad_to = max(pad_to or 0, opt)
    for batch in iter_pair_batches(pair, encoded, batch_size=batch_size, requires=requires, pad_to=pad_to, device=device):
        for a in analyses:
            a.update(batch)
        if store is not None:
            store.add(batch)
        if on_batch is not None:
            on_batch(batch.size)
