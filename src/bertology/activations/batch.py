"""What one extraction step hands to every analysis: the padded batch and both models' activations."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from bertology.data.encode import EncodedExample
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

    @property
    def size(self) -> int:
        return len(self.items)

    @property
    def example_indices(self) -> np.ndarray:
        return np.array([it.index for it in self.items], dtype=np.int64)
