"""Geometry's hashed samples: which words are analysed and which of their occurrences are kept (Ethayarajh 2019).

The per-word store (:class:`Word`: the bottom ``max_contexts`` occurrences by key, float16), the word keys, and
:class:`WordSample`, the rules that pick the analysed words. Split from :mod:`bertology.analyses.geometry` so the
streaming analysis reads as its steps; the choices and their bits are unchanged.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import torch

from bertology import transfer
from bertology.analyses.representation_similarity import token_keys

_SALT_WORD = 0x776F7264  # "word": keeps the word keys apart from the other hashed choices
_MASK63 = (1 << 63) - 1


def word_hash(word: str) -> int:
    """A stable 63-bit hash of a word form (Python's ``hash`` is salted per process)."""
    return int.from_bytes(hashlib.blake2b(word.encode("utf-8"), digest_size=8).digest(), "little") & _MASK63


def word_key(seed: int, word: str) -> np.uint64:
    """The sampling key of a word: words with the smallest keys are analysed."""
    return token_keys(seed ^ _SALT_WORD, np.array([word_hash(word)]), np.array([_SALT_WORD]))[0]


def float16(x: np.ndarray) -> np.ndarray:
    """``x.astype(np.float16)``, the same bits, converted by torch.

    Why: both round to nearest even (identical on every 4099th float32 bit pattern in the tests, and on every
    97th when this was written; infinities, overflow and subnormals included), but NumPy converts one value at a
    time and torch with the CPU's vector instructions: ~57 us vs ~5 us for one word's ``[2, 13, 768]`` at
    BERT-base, thousands per corpus.
    """
    x = np.ascontiguousarray(x)
    if x.dtype != np.float32:  # e.g. float64: one rounding, as NumPy does it (via float32 would round twice)
        return x.astype(np.float16)
    return torch.from_numpy(x).to(torch.float16).numpy()


@dataclass
class Word:
    """One word's kept occurrences (bottom ``max_contexts`` by occurrence key)."""

    key: np.uint64
    count: int  # sentences seen
    occ_keys: np.ndarray  # uint64 [m]
    occ_examples: np.ndarray  # int64 [m]
    vectors: np.ndarray | None  # float16 [m, 2, L + 1, hidden]

    def rejects(self, key: np.uint64, example: int, cap: int) -> bool:
        """Whether an occurrence would fall outside the bottom ``cap`` by ``(key, example)``, as :meth:`add` orders them.

        Why: most occurrences of a frequent word are dropped by :meth:`add` once ``cap`` are kept; seeing that
        first spares pooling's float16 copy and the store's concatenation (exact: the kept ones are the same).
        """
        if len(self.occ_keys) < cap:
            return False
        last_key, last_example = self.occ_keys[-1], int(self.occ_examples[-1])
        return bool(key > last_key or (key == last_key and example > last_example))

    def add(self, keys: np.ndarray, examples: np.ndarray, vectors, count: int, cap: int) -> None:
        """Add occurrences; ``vectors`` NumPy, or a tensor where the kept ones are tensors (the device path)."""
        self.count += count
        k = np.concatenate([self.occ_keys, keys])
        e = np.concatenate([self.occ_examples, examples])
        order = np.lexsort((e, k))[:cap]
        self.occ_keys, self.occ_examples = k[order], e[order]
        self.vectors = kept(self.vectors, vectors, order)


def kept(mine, new, order: np.ndarray):
    """``concatenate([mine, new])[order]`` (``mine`` may be None), in torch on ``mine``'s device when either is a tensor."""
    if isinstance(mine, torch.Tensor) or isinstance(new, torch.Tensor):
        ref = mine if isinstance(mine, torch.Tensor) else new
        new = torch.as_tensor(new).to(ref.device)
        v = new if mine is None else torch.cat([torch.as_tensor(mine).to(ref.device), new])
        return v[transfer.send(order, ref.device)]
    v = new if mine is None else np.concatenate([mine, new])
    return v[order]


@dataclass(frozen=True)
class WordSample:
    """Which words self-similarity and MEV are measured on, and how many of their occurrences are kept.

    Words seen in at least ``min_contexts`` sentences qualify; the ``max_words`` with the smallest keys
    are analysed, each with at most ``max_contexts`` occurrences; only the ``max_candidates`` word forms
    with the smallest keys are considered at all (None: every form; bounds memory). See :mod:`bertology.analyses.geometry`.
    """

    min_contexts: int = 5
    max_contexts: int = 10
    max_words: int = 500
    max_candidates: int | None = 2000

    def __post_init__(self):
        if self.min_contexts < 2:
            raise ValueError("min_contexts must be at least 2 (self-similarity needs two contexts)")
        if self.max_contexts < self.min_contexts:
            raise ValueError(f"max_contexts ({self.max_contexts}) must be at least min_contexts ({self.min_contexts})")
        if self.max_words < 1:
            raise ValueError("max_words must be at least 1")
        if self.max_candidates is not None and self.max_candidates < self.max_words:
            raise ValueError(f"max_candidates ({self.max_candidates}) must be at least max_words ({self.max_words})")
