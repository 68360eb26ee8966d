"""What one extraction step hands to every analysis: the padded batch and both models' activations."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import torch

from bertology.data.batching import token_arrays
from bertology.data.encode import EncodedExample
from bertology.metrics.attention import LayerStatistics, layer_statistics
from bertology.models.hooks import Captured


@dataclass
class PairBatch:
    """One batch of examples run through the base and the tuned model.

    ``mask`` is ``[batch, seq]`` bool, True for real (non-padding) tokens; ``content`` additionally
    excludes special tokens ([CLS], [SEP], ...). ``lengths`` are the real token counts.
    """

    items: list[EncodedExample]
    input_ids: torch.Tensor
    mask: torch.Tensor
    content: torch.Tensor
    lengths: torch.Tensor
    base: Captured
    tuned: Captured
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def size(self) -> int:
        return len(self.items)

    @property
    def lengths_host(self) -> np.ndarray:
        """The real token counts as NumPy int64, from the items (``lengths`` may sit on a GPU)."""
        return np.array([len(it) for it in self.items], dtype=np.int64)

    def host_tokens(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``input_ids``, ``mask`` and ``content`` as NumPy ``[B, T]`` arrays built from the items (padding ids 0).

        The same values as the tensors (:func:`bertology.data.batching.token_arrays`, which ``collate`` uses), on
        the host whatever device the tensors are on: lookups by token id run here without a copy back.
        Computed once per batch for the analyses that share it.
        """
        key = ("host_tokens",)
        if key not in self._cache:
            self._cache[key] = token_arrays(self.items, self.mask.shape[1])
        return self._cache[key]

    @property
    def example_indices(self) -> np.ndarray:
        return np.array([it.index for it in self.items], dtype=np.int64)

    def measured(self, measure: str) -> "PairBatch":
        """This batch as an attention analysis sees it under contribution ``measure``: the same tokens, with
        ``attentions`` replaced by that measure's maps (``Captured.measures``) in both models; ``weights``
        is the batch itself. Made once per batch and measure, with caches of its own (the shared layer
        statistics of one measure's maps are not another's), so the analyses of one measure share them.
        """
        if measure == "weights":
            return self
        key = ("measured", measure)
        if key not in self._cache:
            sides = []
            for cap in (self.base, self.tuned):
                if measure not in cap.measures:
                    raise KeyError(f"the capture holds no {measure!r} maps (its consumers did not ask for them)")
                sides.append(Captured(cap.hidden_states, cap.measures[measure]))
            self._cache[key] = dataclasses.replace(self, base=sides[0], tuned=sides[1], _cache={})
        return self._cache[key]

    def captured(self, model: int) -> Captured:
        """Activations of model 0 (base) or 1 (tuned)."""
        return (self.base, self.tuned)[model]

    def row_entropy(self, model: int, layer: int) -> torch.Tensor:
        """Shannon entropy (nats) of every real attention row of one layer, ``[B, H, T]`` (padding rows 0).

        Several analyses need it; it comes with the other shared statistics of the layer (one pass).
        """
        return self.layer_stats(layer).entropy[model]

    def scratch(self, like: torch.Tensor, slot: int = 0) -> torch.Tensor:
        """A reusable buffer of ``like``'s shape, dtype and device (``slot`` tells buffers apart).

        For map-sized temporaries: a fresh ``[B, H, T, T]`` tensor is a new memory mapping whose pages
        fault in on first touch, which costs as much as the arithmetic. The contents are undefined;
        a caller must not keep the buffer across calls that may use the same slot.
        """
        key = ("scratch", slot, tuple(like.shape), like.dtype, like.device)
        buf = self._cache.get(key)
        if buf is None:
            buf = self._cache[key] = torch.empty_like(like, memory_format=torch.contiguous_format)
        return buf

    def layer_stats(self, layer: int) -> LayerStatistics:
        """Cosine parts, column sums, near diagonals, row entropies and JS of one layer's maps, both models in one pass.

        :func:`bertology.metrics.attention.layer_statistics`, computed once per batch and layer for
        the analyses that share it (change, patterns, targets).
        """
        key = ("stats", layer)
        if key not in self._cache:
            a = self.base.attentions[layer]
            self._cache[key] = layer_statistics(a, self.tuned.attentions[layer], self.mask,
                                                scratch=tuple(self.scratch(a, slot) for slot in (0, 1, 2)))
        return self._cache[key]

    def received(self, model: int, layer: int) -> torch.Tensor:
        """Attention each key receives, summed over the real query rows: ``[B, H, T]`` (maps' dtype).

        Shared by the analyses that need column sums (targets, patterns), computed once per batch.
        """
        return self.layer_stats(layer).received[model]
