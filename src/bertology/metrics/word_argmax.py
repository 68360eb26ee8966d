"""Which word each attention head points to, at word level: the scoring kernel of the relation heads.

For one layer's token attention maps ``[B, H, T, T]`` and the gold word pairs of every example, a
head "hits" a pair (``dep``, ``gov``) when the first argmax of its word-level attention, taken over
the example's candidate words other than the word itself, is the wanted word (Clark et al. 2019,
§4.2):

- ``dep->head``: ``argmax_{w != dep} A[dep, w] == gov`` (the row of the dependent);
- ``head->dep`` with ``transpose=True``: ``argmax_{w != dep} A[w, dep] == gov`` (its column, Clark's
  ``head<-dep``), else ``argmax_{w != gov} A[gov, w] == dep`` (the row of the head).

Word-level attention pools the columns of a word's pieces (``to_method``) and then its rows
(``from_method``): ``sum``, ``mean``, ``first`` piece or ``max``, exactly as
:func:`bertology.data.align.word_attention` (same float64 values: pieces are added in token order).

``self_as_zero=True`` is Clark et al.'s released notebook: the word's own entry is set to 0 and stays
a candidate (it wins only when every other candidate is 0, e.g. float16 underflow), instead of being
left out. :func:`clark_float16_columns` prepares maps for their code's pooling (first piece's row,
float16 sums of the pieces' columns).

Written by hand, in Numba, because no library does this in one pass: pooling with NumPy or torch
makes several map-sized temporaries per layer (two matrix products, a transposed copy, masks) and the
argmax over short rows is slow in both, which made this the most expensive attention analysis. Here
each example's word map lives in a small buffer, and the examples of a batch run in parallel.
It runs on CPU: maps computed on an accelerator are copied to host memory first.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numba
import numpy as np

#: Pooling method -> code used inside the kernel.
POOLING_CODES = {"sum": 0, "mean": 1, "first": 2, "max": 3}


class WordAlignment(NamedTuple):
    """Tokens to words for a batch: ``word_ids`` ``[B, T]`` the word of each token (-1: none, e.g. special tokens
    and padding), ``n_words`` ``[B]`` the words of each example, ``allowed`` ``[B, W]`` bool, the candidate words."""

    word_ids: np.ndarray
    n_words: np.ndarray
    allowed: np.ndarray


class WordPairs(NamedTuple):
    """The scored word pairs of a batch: those of example ``b`` are ``start[b]:start[b+1]`` of ``dep``/``gov``."""

    start: np.ndarray
    dep: np.ndarray
    gov: np.ndarray


def word_argmax_hits(
    att: np.ndarray | Sequence[np.ndarray],
    words: WordAlignment | tuple[np.ndarray, np.ndarray, np.ndarray],
    pairs: WordPairs | tuple[np.ndarray, np.ndarray, np.ndarray],
    *,
    to_method: str = "sum",
    from_method: str = "mean",
    transpose: bool = True,
    self_as_zero: bool = False,
) -> np.ndarray:
    """Hits ``[2, H, P]`` bool (``dep->head``, ``head->dep``) of every head for every scored pair.

    ``att``: float32 or float64 ``[B, H, T, T]``, or a sequence of such maps of the same inputs (e.g.
    every layer of both models: one call per batch; the result is then ``[M, 2, H, P]``);
    ``words``: :class:`WordAlignment` ``(word_ids, n_words, allowed)``, each token's word and the candidate words;
    ``pairs``: :class:`WordPairs` ``(start, dep, gov)``, word indices, both candidates. ``self_as_zero``: the word itself is a candidate of value 0 (Clark's notebook)
    rather than left out.
    """
    for method in (to_method, from_method):
        if method not in POOLING_CODES:
            raise ValueError(f"pooling must be one of {tuple(POOLING_CODES)}, not {method!r}")
    single = isinstance(att, np.ndarray)
    maps = tuple(np.ascontiguousarray(a) for a in ([att] if single else att))
    if not maps or any(a.shape != maps[0].shape or a.dtype != maps[0].dtype for a in maps):
        raise ValueError("att must be one [B, H, T, T] map or a non-empty sequence of maps of one shape and dtype")
    H = maps[0].shape[1]
    start, dep, gov = (np.ascontiguousarray(x, dtype=np.int64) for x in pairs)
    hits = np.zeros((len(maps), 2, H, len(dep)), dtype=np.bool_)
    if len(dep):
        word_ids, n_words, allowed = words
        alignment = (np.ascontiguousarray(word_ids, dtype=np.int64), np.ascontiguousarray(n_words, dtype=np.int64),
                     np.ascontiguousarray(allowed, dtype=np.bool_))
        args = (alignment, (start, dep, gov), POOLING_CODES[to_method], POOLING_CODES[from_method], bool(transpose),
                bool(self_as_zero))
        # One call per map keeps one compiled signature whatever the number of layers (a tuple of
        # maps would be compiled again for every model depth); the calls cost ~20 us each.
        for mi, a in enumerate(maps):
            _kernel(a, *args, hits[mi])
    return hits[0] if single else hits


def clark_float16_columns(att: np.ndarray, word_ids: np.ndarray) -> np.ndarray:
    """Token maps ``[B, H, T, T]`` pooled to words' columns as Clark et al. (2019)'s released code does.

    Their extraction stores the maps as float16; ``get_word_word_attention`` then writes into each
    word's first piece's column the sum of its pieces' columns. NumPy adds their float16 columns one
    piece at a time, rounding each partial sum to float16 (checked on NumPy 2.4), and so does this.
    The other pieces' columns are left as they were. Scored with ``to_method="first"`` and
    ``from_method="first"`` (their default ``mode="first"``: a word attends as its first piece's row),
    this is their word-level map. ``word_ids``: ``[B, T]`` word of each token (-1: none; a word's
    pieces contiguous). Returns float32 (every float16 value is exact in it).
    """
    half = np.asarray(att).astype(np.float16)
    out = half.copy()
    wid = np.asarray(word_ids, dtype=np.int64)
    B, T = wid.shape
    pos = np.broadcast_to(np.arange(T), (B, T))
    starts = (wid >= 0) & np.concatenate([np.ones((B, 1), bool), wid[:, 1:] != wid[:, :-1]], axis=1)
    first = np.maximum.accumulate(np.where(starts, pos, 0), axis=1)  # each token's word's first piece
    rank = pos - first  # 0 for a first piece, 1 for the second, ...
    for r in range(1, int(rank[wid >= 0].max(initial=0)) + 1):
        b, t = np.nonzero((rank == r) & (wid >= 0))
        f = first[b, t]
        out[b, :, :, f] = (out[b, :, :, f].astype(np.float32) + half[b, :, :, t].astype(np.float32)).astype(np.float16)
    return out.astype(np.float32)


@numba.njit(cache=True, inline="always")
def _pool_columns(out, row, tokens, tw, first, count, method) -> None:
    """``out[j]``: the attention of one token ``row`` to word ``j``, its pieces' columns pooled.

    Pieces are visited in token order (sum and max as ``index_add``/``scatter_reduce`` would); mean
    divides the sum by the piece count.
    """
    W = out.shape[0]
    if method == 2:  # first piece
        for j in range(W):
            out[j] = row[tokens[first[j]]] if first[j] >= 0 else 0.0
    elif method == 3:  # max
        out[:] = -np.inf
        for t in range(tokens.shape[0]):
            v = np.float64(row[tokens[t]])
            if v > out[tw[t]]:
                out[tw[t]] = v
    else:
        out[:] = 0.0
        for t in range(tokens.shape[0]):
            out[tw[t]] += row[tokens[t]]
        if method == 1:
            for j in range(W):
                if count[j] > 0:
                    out[j] /= count[j]


@numba.njit(cache=True, inline="always")
def _add_row(words, i, line, t, first, method) -> None:
    """Pool token ``t``'s word-column row ``line`` into word row ``i`` (rows are added in token order)."""
    W = line.shape[0]
    if method == 3:
        for j in range(W):
            if line[j] > words[i, j]:
                words[i, j] = line[j]
    elif method == 2:
        if first[i] == t:
            for j in range(W):
                words[i, j] = line[j]
    else:
        for j in range(W):
            words[i, j] += line[j]


@numba.njit(cache=True, parallel=True, nogil=True)
def _kernel(att, alignment, pairs, to_code, from_code, transpose, self_zero, hits):
    """Fill ``hits`` ``[2, H, P]`` of one map; ``alignment``: ``(word_ids, n_words, allowed)``; ``pairs``: :class:`WordPairs`."""
    word_ids, n_words, allowed = alignment
    pair_start, dep, gov = pairs
    B, H = att.shape[0], att.shape[1]
    for b in numba.prange(B):
        p0, p1 = pair_start[b], pair_start[b + 1]
        if p0 == p1:
            continue
        W = n_words[b]
        # The example's word tokens (special tokens and padding left out), their words, each word's
        # piece count and first piece (as a position in ``tokens``).
        tokens = np.flatnonzero(word_ids[b] >= 0)
        n = tokens.shape[0]
        tw = word_ids[b][tokens]
        count = np.zeros(W, dtype=np.int64)
        first = np.full(W, -1, dtype=np.int64)
        for t in range(n):
            if count[tw[t]] == 0:
                first[tw[t]] = t
            count[tw[t]] += 1
        cand = allowed[b, :W]
        line = np.empty(W)
        words = np.empty((W, W))  # word-level attention of one head: word row -> word column
        row_best = np.empty(W, dtype=np.int64)
        col_best = np.empty(W, dtype=np.int64)
        col_max = np.empty(W)
        for h in range(H):
            a = att[b, h]
            words[:, :] = -np.inf if from_code == 3 else 0.0
            for t in range(n):
                _pool_columns(line, a[tokens[t]], tokens, tw, first, count, to_code)
                _add_row(words, tw[t], line, t, first, from_code)
            # One pass over the candidates (the word itself only as a 0 with self_zero): the first
            # maximum of every row and of every column (strict ">" in index order keeps the first
            # one). Mean rows are divided here, as word_attention does, so ties compare the same values.
            col_max[:] = -np.inf
            col_best[:] = -1
            for i in range(W):
                row_best[i] = -1
                if not cand[i]:
                    continue
                scale = count[i] if from_code == 1 and count[i] > 1 else 1
                best = -np.inf
                for j in range(W):
                    if not cand[j] or (j == i and not self_zero):
                        continue
                    if j == i:
                        v = 0.0  # Clark's notebook: attention to self set to 0, still a candidate
                    else:
                        v = words[i, j] / scale if scale != 1 else words[i, j]
                    if v > best or row_best[i] < 0:
                        best = v
                        row_best[i] = j
                    if v > col_max[j] or col_best[j] < 0:
                        col_max[j] = v
                        col_best[j] = i
            for p in range(p0, p1):
                d, g = dep[p], gov[p]
                hits[0, h, p] = row_best[d] == g
                hits[1, h, p] = col_best[d] == g if transpose else row_best[g] == d
