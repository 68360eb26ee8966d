"""Batching of encoded examples, shared by extraction, the experiments and the fine-tuning lab."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from bertology.data.encode import EncodedExample


def length_batches(items: Sequence[EncodedExample], batch_size: int) -> list[list[EncodedExample]]:
    """Group examples of similar length, longest batches first.

    Longest-first means the widest batch's buffers are allocated once and reused by the shorter ones
    (memory stays flat in corpus size) and an out-of-memory error shows up at the first batch.
    """
    order = sorted(range(len(items)), key=lambda i: -len(items[i]))
    return [[items[i] for i in order[s : s + batch_size]] for s in range(0, len(order), batch_size)]


def collate(items: Sequence[EncodedExample], pad_id: int, pad_to: int | None = None) -> dict[str, torch.Tensor]:
    """Pad a batch to its longest example (or to ``pad_to``) and build the masks."""
    width = max(len(it) for it in items)
    if pad_to is not None:
        width = max(width, pad_to)
    n = len(items)
    ids = np.full((n, width), pad_id, dtype=np.int64)
    tti = np.zeros((n, width), dtype=np.int64)
    mask = np.zeros((n, width), dtype=bool)
    content = np.zeros((n, width), dtype=bool)
    for row, it in enumerate(items):
        k = len(it)
        ids[row, :k] = it.input_ids
        tti[row, :k] = it.token_type_ids
        mask[row, :k] = True
        content[row, :k] = ~it.special
    return {
        "input_ids": torch.from_numpy(ids),
        "token_type_ids": torch.from_numpy(tti),
        "attention_mask": torch.from_numpy(mask.astype(np.int64)),
        "mask": torch.from_numpy(mask),
        "content": torch.from_numpy(content),
        "lengths": torch.tensor([len(it) for it in items]),
    }
