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


def padded_rows(rows: Sequence[np.ndarray], width: int, fill, dtype) -> np.ndarray:
    """``[len(rows), width]``: each row's values first, ``fill`` after them (one boolean assignment, row-major)."""
    out = np.full((len(rows), width), fill, dtype=dtype)
    if len(rows):
        out[np.arange(width) < np.array([len(r) for r in rows], dtype=np.int64)[:, None]] = np.concatenate(rows)
    return out


def token_arrays(
    items: Sequence[EncodedExample], width: int, pad_id: int = 0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``[B, width]`` NumPy input ids (``pad_id`` after each example), real-token mask and content mask.

    The content mask is the real tokens that are not special ([CLS], [SEP]...). What :func:`collate` sends to the
    models, built on the host from the items: analyses whose batch tensors sit on a GPU read these instead of
    copying the tensors back.
    """
    ids = padded_rows([it.input_ids for it in items], width, pad_id, np.int64)
    mask = np.arange(width) < np.array([len(it) for it in items], dtype=np.int64)[:, None]
    content = padded_rows([~np.asarray(it.special, dtype=bool) for it in items], width, False, bool)
    return ids, mask, content


def collate(items: Sequence[EncodedExample], pad_id: int, pad_to: int | None = None) -> dict[str, torch.Tensor]:
    """Pad a batch to its longest example (or to ``pad_to``) and build the masks (:func:`token_arrays`)."""
    width = max(len(it) for it in items)
    if pad_to is not None:
        width = max(width, pad_to)
    ids, mask, content = token_arrays(items, width, pad_id)
    tti = padded_rows([it.token_type_ids for it in items], width, 0, np.int64)
    return {
        "input_ids": torch.from_numpy(ids),
        "token_type_ids": torch.from_numpy(tti),
        "attention_mask": torch.from_numpy(mask.astype(np.int64)),
        "mask": torch.from_numpy(mask),
        "content": torch.from_numpy(content),
        "lengths": torch.tensor([len(it) for it in items]),
    }
