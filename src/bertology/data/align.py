"""Sub-word -> word alignment: the one place where token vectors and attention maps become word-level.

Word-level analyses (syntax probes, dependency heads, POS) need one vector per word and one attention
weight per word pair, while the model works on WordPiece tokens. Every analysis pools through these
functions so the choice (first / mean / sum / max piece) is made, and recorded, in one place.

Conventions: ``word_ids[t]`` is the word of token ``t`` and -1 marks special tokens ([CLS], [SEP],
padding), which belong to no word and are left out. For a sentence pair the tokenizer restarts word
ids at 0 in the second sentence; pass ``segment`` (0/1, -1 for specials) and the second sentence's
words are numbered after the first's (see :func:`global_word_ids`). A word with no tokens (a gap in
the ids, or ``n_words`` beyond the last id) pools to NaN, or to 0 with ``"sum"``.
"""
from __future__ import annotations

from typing import Literal, TypeVar

import numpy as np
import torch

from bertology import transfer

Pooling = Literal["first", "mean", "sum", "max"]
POOLING_METHODS: tuple[str, ...] = ("first", "mean", "sum", "max")

ArrayT = TypeVar("ArrayT", np.ndarray, torch.Tensor)


def _as_index(ids, what: str) -> np.ndarray:
    if isinstance(ids, torch.Tensor):
        ids = ids.detach().cpu().numpy()
    arr = np.asarray(ids)
    if arr.ndim != 1:
        raise ValueError(f"{what} must be one-dimensional, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{what} must be integers, got dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False)


def global_word_ids(word_ids, segment=None) -> np.ndarray:
    """Word index per token across all segments (-1 for special tokens).

    Without ``segment`` this is ``word_ids``. With it, segment ``s`` words are shifted by the number
    of words in segments ``0..s-1`` (each segment's count being its largest word id + 1), so a
    sentence pair's words get one numbering: first sentence 0..n1-1, second n1..n1+n2-1.
    """
    w = _as_index(word_ids, "word_ids")
    if segment is None:
        return np.where(w >= 0, w, -1)
    s = _as_index(segment, "segment")
    if s.shape != w.shape:
        raise ValueError(f"segment has shape {s.shape} but word_ids has shape {w.shape}")
    valid = (w >= 0) & (s >= 0)
    out = np.full_like(w, -1)
    if not valid.any():
        return out
    per_segment = np.zeros(int(s[valid].max()) + 1, dtype=np.int64)
    np.maximum.at(per_segment, s[valid], w[valid] + 1)
    offsets = np.concatenate([[0], np.cumsum(per_segment)[:-1]])
    out[valid] = w[valid] + offsets[s[valid]]
    return out


def _n_words(gids: np.ndarray, n_words: int | None) -> int:
    found = int(gids.max()) + 1 if gids.size and gids.max() >= 0 else 0
    if n_words is None:
        return found
    if n_words < found:
        raise ValueError(f"n_words={n_words} but the word ids go up to {found - 1}")
    return int(n_words)


def _check_method(method: str, what: str) -> None:
    if method not in POOLING_METHODS:
        raise ValueError(f"{what} must be one of {POOLING_METHODS}, not {method!r}")


def _pool_numpy(x: np.ndarray, gids: np.ndarray, W: int, method: str, axis: int) -> np.ndarray:
    x = np.moveaxis(np.asarray(x), axis, 0)
    dtype = x.dtype if np.issubdtype(x.dtype, np.floating) else np.float64
    keep = gids >= 0
    idx, xs = gids[keep], x[keep].astype(dtype, copy=False)
    rest = x.shape[1:]
    counts = np.bincount(idx, minlength=W)
    if method in ("sum", "mean"):
        onehot = (np.arange(W)[:, None] == idx[None, :]).astype(dtype)  # [W, T_kept]
        out = (onehot @ xs.reshape(len(idx), int(np.prod(rest)))).reshape((W,) + rest)
        if method == "mean":
            with np.errstate(invalid="ignore", divide="ignore"):
                out = out / counts.reshape((W,) + (1,) * len(rest)).astype(dtype)
    elif method == "first":
        out = np.full((W,) + rest, np.nan, dtype=dtype)
        words, first = np.unique(idx, return_index=True)
        out[words] = xs[first]
    else:  # max
        out = np.full((W,) + rest, -np.inf, dtype=dtype)
        np.maximum.at(out, idx, xs)
        out[counts == 0] = np.nan
    return np.moveaxis(out, 0, axis)


def _pool_torch(x: torch.Tensor, gids: np.ndarray, W: int, method: str, axis: int) -> torch.Tensor:
    x = x.movedim(axis, 0)
    dtype = x.dtype if x.is_floating_point() else torch.get_default_dtype()
    keep = gids >= 0
    idx_np = gids[keep]
    idx = transfer.send(idx_np, x.device)
    xs = x[transfer.send(np.flatnonzero(keep), x.device)].to(dtype)  # positions, not a mask: no device sync
    shape = (W,) + tuple(x.shape[1:])
    if method in ("sum", "mean"):
        out = torch.zeros(shape, dtype=dtype, device=x.device).index_add(0, idx, xs)
        if method == "mean":  # counted on the host (torch.bincount on a GPU reads its maximum back)
            counts = transfer.send(np.bincount(idx_np, minlength=W), x.device)
            out = out / counts.to(dtype).reshape((W,) + (1,) * (x.dim() - 1))  # 0/0 -> NaN for words without tokens
    elif method == "first":
        words, first = np.unique(idx_np, return_index=True)
        out = torch.full(shape, float("nan"), dtype=dtype, device=x.device)
        out = out.index_copy(0, transfer.send(words, x.device), xs[transfer.send(first, x.device)])
    else:  # max
        out = torch.full(shape, float("-inf"), dtype=dtype, device=x.device)
        index = idx.reshape((-1,) + (1,) * (x.dim() - 1)).expand_as(xs)
        out = out.scatter_reduce(0, index, xs, "amax", include_self=False)
        empty = transfer.send(np.bincount(idx_np, minlength=W) == 0, x.device)
        out = out.masked_fill(empty.reshape((W,) + (1,) * (x.dim() - 1)), float("nan"))
    return out.movedim(0, axis)


def _pool(x: ArrayT, gids: np.ndarray, W: int, method: str, axis: int) -> ArrayT:
    if x.shape[axis] != len(gids):
        raise ValueError(f"{x.shape[axis]} tokens along axis {axis} but {len(gids)} word ids")
    if isinstance(x, torch.Tensor):
        return _pool_torch(x, gids, W, method, axis)
    return _pool_numpy(x, gids, W, method, axis)


def pool_words(
    token_vectors: ArrayT,
    word_ids,
    method: Pooling = "mean",
    *,
    segment=None,
    n_words: int | None = None,
) -> ArrayT:
    """Pool token vectors ``[T, ...]`` into word vectors ``[W, ...]`` (same array type and device).

    ``method``: ``"first"`` piece, ``"mean"`` or ``"sum"`` of the pieces, or ``"max"`` per feature.
    Special tokens (word id -1) are left out. ``W`` is ``n_words`` when given, else the largest
    (global) word id + 1. The result is floating point.
    """
    _check_method(method, "method")
    gids = global_word_ids(word_ids, segment)
    return _pool(token_vectors, gids, _n_words(gids, n_words), method, axis=0)


def word_attention(
    attn: ArrayT,
    word_ids,
    to_method: Pooling = "sum",
    from_method: Pooling = "mean",
    *,
    segment=None,
    n_words: int | None = None,
) -> ArrayT:
    """Word-to-word attention ``[..., W, W]`` from a token attention map ``[..., T, T]`` (rows attend).

    Following Clark et al. (2019), attention *to* a word sums its pieces' columns (so a row keeps
    its mass) and attention *from* a word averages its pieces' rows (columns are pooled first, then
    rows). Rows and columns of special tokens are left out, so a word row sums to at most 1; renormalise
    if you need distributions. Leading dimensions (layers, heads) are kept.
    """
    _check_method(to_method, "to_method")
    _check_method(from_method, "from_method")
    if attn.shape[-1] != attn.shape[-2]:
        raise ValueError(f"attention must be square in its last two dimensions, got {tuple(attn.shape)}")
    gids = global_word_ids(word_ids, segment)
    W = _n_words(gids, n_words)
    to_words = _pool(attn, gids, W, to_method, axis=attn.ndim - 1)
    return _pool(to_words, gids, W, from_method, axis=attn.ndim - 2)


def annotated_word_ids(word_ids, segment, n_first_words: int | None) -> np.ndarray:
    """Per token, the index into an example's annotated ``words`` (-1: no annotated word).

    Tokens of the first text keep their word id. Tokens of a pair's second text map to
    ``n_first_words + id`` when the annotations cover both texts (``n_first_words`` set), and to -1
    otherwise (only the first text was annotated).
    """
    w = _as_index(word_ids, "word_ids")
    s = _as_index(segment, "segment")
    out = np.where((s == 0) & (w >= 0), w, -1)
    if n_first_words is not None:
        second = (s == 1) & (w >= 0)
        out[second] = w[second] + int(n_first_words)
    return out


def first_pieces(word_ids, n_words: int, shared: dict[int, int] | None = None) -> np.ndarray:
    """Position of each word's first piece ``[n_words]`` (-1: the word has no token of its own).

    Token-level heads (tagging, parsing) read a word from its first sub-word piece (Devlin et al. 2019;
    Dozat & Manning-style parsers on BERT). ``word_ids`` is one sentence's token -> word map (-1 for
    special tokens, :class:`~bertology.data.encode.EncodedExample.word_ids`). A word without a token of
    its own (it shares a surface form's token, ``EncodedExample.shared_words``; or truncation cut it off)
    is -1, unless ``shared`` is given: then such a word gets the token it shares.
    """
    w = _as_index(word_ids, "word_ids")
    out = np.full(int(n_words), -1, dtype=np.int64)
    keep = (w >= 0) & (w < n_words)
    words, first = np.unique(w[keep], return_index=True)
    out[words] = np.flatnonzero(keep)[first]
    for word, token in (shared or {}).items():
        if 0 <= word < n_words and out[word] < 0:
            out[word] = int(token)
    return out
