"""The crosscoder's streamed activation buffer: paired base/tuned token activations, never the corpus' copy.

Both models run batch by batch over the run's sentences (:func:`pair_chunks`: the extraction loop's batches,
hidden states only); each batch's **content tokens** (the batch's ``content`` mask: padding and the tokenizer's
special tokens such as ``[CLS]`` and ``[SEP]`` excluded) at the chosen layers (``hidden_states[layer]``: 0 = the
embeddings, ``l`` = the output of block ``l``) go into a bounded buffer of ``capacity`` tokens, shuffled with a
seeded torch generator; training batches are drawn from it, and half of it is refilled from the stream whenever
half has been read. When the sentences are exhausted the stream starts over (a new epoch over the same tokens),
so the memory held is the buffer's whatever the number of steps. When the whole token budget fits in the buffer
(``resident``), it is read in reshuffled passes and the models run once.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from bertology.activations.extract import capture_forward
from bertology.data.batching import collate, length_batches, token_arrays
from bertology.data.encode import EncodedCorpus
from bertology.models.hooks import Captured
from bertology.models.pair import ModelPair
from bertology.models.shared_base import to_device_together


@dataclass
class TokenChunk:
    """One forward batch's content tokens: activations per layer ``[n, 2, d]`` and where each token sits."""

    acts: dict[int, torch.Tensor]
    example: np.ndarray   # the example's index in the corpus
    position: np.ndarray  # the token's position in the example (0 = [CLS])
    token_id: np.ndarray


def budgeted(encoded: EncodedCorpus, tokens: int, seed: int) -> EncodedCorpus:
    """The examples (a seeded random order, then their corpus order) whose content tokens add up to ``tokens``.

    Content tokens: those the tokenizer did not mark special (``EncodedExample.special``); the last example taken
    may pass the budget by less than its own length."""
    order = np.random.default_rng(seed).permutation(len(encoded.items))
    keep, total = [], 0
    for i in order:
        if total >= tokens:
            break
        keep.append(int(i))
        total += int(len(encoded.items[i]) - int(np.sum(encoded.items[i].special)))
    items = [encoded.items[i] for i in sorted(keep)]
    return EncodedCorpus(items, encoded.max_length, encoded.overlong, encoded.n_input, list(encoded.skipped),
                         list(encoded.truncated))


def paired_hidden_states(pair: ModelPair, encoded: EncodedCorpus, *, batch_size: int = 32,
                         device: str = "cpu") -> Iterator[tuple[list, dict, tuple[Captured, Captured]]]:
    """Each length-bucketed batch of ``encoded``: its items, the collated tensors and both models' captured hidden
    states (base, tuned), each model run once (what the crosscoder and the activation-difference lens read).

    The loop of :func:`bertology.activations.extract.iter_pair_batches`, with ``inference_mode`` around each
    forward only: a generator suspended inside it would leave it on for the caller, whose training needs autograd."""
    dev = torch.device(device)
    pad_id = pair.tokenizer.pad_token_id or 0
    to_device_together((pair.base.model, pair.tuned.model), dev)
    want = frozenset({"hidden_states"})
    for items in length_batches(encoded.items, batch_size):
        t = collate(items, pad_id)
        with torch.inference_mode():
            caps = (capture_forward(pair.base.model, t, want, dev), capture_forward(pair.tuned.model, t, want, dev))
        yield items, t, caps


def pair_chunks(pair: ModelPair, encoded: EncodedCorpus, layers: Sequence[int], *, batch_size: int = 32,
                device: str = "cpu") -> Iterator[TokenChunk]:
    """Both models' hidden states at ``layers``, content tokens only, one :class:`TokenChunk` per forward batch
    (:func:`paired_hidden_states`)."""
    for items, t, caps in paired_hidden_states(pair, encoded, batch_size=batch_size, device=device):
        content = t["content"].to(torch.device(device))
        acts = {layer: torch.stack([c.hidden_states[layer][content] for c in caps], dim=1).float().cpu().clone()
                for layer in layers}  # ordinary tensors, usable by autograd
        ids, _, host_content = token_arrays(items, t["input_ids"].shape[1])
        rows, cols = np.nonzero(host_content)
        example = np.array([it.index for it in items], dtype=np.int64)[rows]
        yield TokenChunk(acts, example, cols.astype(np.int64), ids[rows, cols].astype(np.int64))


class ShuffledBuffer:
    """Training batches ``{layer: [batch, 2, d]}`` drawn from a bounded, shuffled buffer over a chunk stream.

    ``stream()`` starts a fresh pass over the sentences (called again at each epoch); ``scale[layer]`` divides
    each model's activations (by default :func:`rms_scale` of the first fill), so both models enter the crosscoder
    at the same mean norm.
    """

    def __init__(self, stream: Callable[[], Iterator[TokenChunk]], layers: Sequence[int], capacity: int,
                 batch: int, generator: torch.Generator, scale: dict[int, torch.Tensor] | None = None,
                 resident: bool = False) -> None:
        self.stream, self.layers, self.capacity, self.batch = stream, tuple(layers), int(capacity), int(batch)
        self.resident = resident  # the buffer holds every budgeted token: reshuffle it, never re-run the models
        self.gen, self.scale = generator, scale or {}
        self._source: Iterator[TokenChunk] = iter(())
        self._pending: dict[int, list[torch.Tensor]] = {}
        self.epochs = 0
        self.drawn = 0  # tokens taken from the models so far

    def _next_chunk(self) -> TokenChunk:
        for _ in range(2):
            chunk = next(self._source, None)
            if chunk is not None:
                return chunk
            self._source, self.epochs = self.stream(), self.epochs + 1
        raise ValueError("the crosscoder's token stream is empty: no content tokens in the sentences")

    def _take(self, n: int) -> dict[int, torch.Tensor]:
        """The next ``n`` tokens of the stream (chunks split at the boundary, the rest kept for later)."""
        got = {layer: list(self._pending.get(layer, [])) for layer in self.layers}
        have = sum(t.shape[0] for t in got[self.layers[0]])
        while have < n:
            chunk = self._next_chunk()
            for layer in self.layers:
                got[layer].append(chunk.acts[layer])
            have += chunk.acts[self.layers[0]].shape[0]
        out = {layer: torch.cat(got[layer])[:n] for layer in self.layers}
        if self.scale:
            out = {layer: t / self.scale[layer] for layer, t in out.items()}
        self._pending = {layer: [torch.cat(got[layer])[n:]] for layer in self.layers}
        self.drawn += n
        return out

    def __iter__(self) -> Iterator[dict[int, torch.Tensor]]:
        store = self._take(self.capacity)
        if not self.scale:
            self.scale = rms_scale(store)
            store = {layer: t / self.scale[layer] for layer, t in store.items()}
        half = self.capacity // 2
        while True:
            perm = torch.randperm(self.capacity, generator=self.gen)
            store = {layer: t[perm] for layer, t in store.items()}
            if self.resident:
                for start in range(0, self.capacity - self.batch + 1, self.batch):
                    yield {layer: t[start:start + self.batch] for layer, t in store.items()}
                continue
            for start in range(0, half - self.batch + 1, self.batch):
                yield {layer: t[start:start + self.batch] for layer, t in store.items()}
            fresh = self._take(half)
            store = {layer: torch.cat([fresh[layer], t[half:]]) for layer, t in store.items()}


def rms_scale(store: dict[int, torch.Tensor]) -> dict[int, torch.Tensor]:
    """Per layer ``[2, 1]``: each model's root mean squared activation norm over the tokens of ``store``.

    Dividing by it gives both models a mean squared norm of 1 at the layer, as Lindsey et al. normalise each
    model's activations before training, so that the decoder norms of the two models compare."""
    return {layer: t.double().pow(2).sum(dim=-1).mean(dim=0).sqrt().float().clamp(min=1e-12).view(2, 1)
            for layer, t in store.items()}
