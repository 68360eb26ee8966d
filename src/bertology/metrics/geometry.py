"""Geometry of contextual representations (Ethayarajh 2019): anisotropy, self-similarity, MEV.

Pure functions on NumPy arrays, float64 throughout. Rows are vectors (token or word representations);
the "stack" functions accept leading batch dimensions (``[..., n, dim]``, e.g. one stack per layer) and
return one value per stack.

Definitions (Ethayarajh 2019, §3):

- anisotropy baseline: mean cosine of random pairs of representations from different sentences
  (:func:`mean_pair_cosine` on the paired rows, or :func:`mean_offdiagonal_cosine` over all pairs);
- self-similarity of a word: mean cosine over all pairs of its occurrences (:func:`mean_offdiagonal_cosine`);
- intra-sentence similarity: mean cosine of each token with the sentence's mean vector
  (:func:`intra_similarity`);
- maximum explainable variance (MEV): share of the variance of the occurrence matrix on its first
  principal component (:func:`max_explainable_variance`). The paper writes it as sigma_1^2 / sum
  sigma_i^2 of the raw occurrence matrix; its released code fits ``sklearn.decomposition.PCA``, which
  centres the occurrences first. ``center=True`` (the default) follows the code, which produced the
  published numbers; ``center=False`` is the paper's formula. When all occurrences are identical
  (zero variance) a static vector explains them perfectly and MEV is 1 by convention.
"""
from __future__ import annotations

import numpy as np
import torch

from bertology.metrics.principal import DENSE_UP_TO, top_eigenpairs

__all__ = [
    "unit_rows",
    "pair_cosines",
    "mean_pair_cosine",
    "mean_offdiagonal_cosine",
    "intra_similarity",
    "masked_intra_similarity",
    "max_explainable_variance",
    "chain_pairs",
]


def _as64(x: np.ndarray, min_ndim: int = 2) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    if x.ndim < min_ndim:
        raise ValueError(f"expected an array [..., n, dim], got shape {x.shape}")
    return x


def unit_rows(x: np.ndarray) -> np.ndarray:
    """Vectors (last axis) scaled to unit L2 norm (float64); zero vectors stay zero (cosine 0 with anything)."""
    x = _as64(x, 1)
    norms = np.linalg.norm(x, axis=-1, keepdims=True)
    return x / np.where(norms > 0, norms, 1.0)


def pair_cosines(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Cosine of row i of ``x`` with row i of ``y``, for every i (float64, shape ``x.shape[:-1]``)."""
    x, y = _as64(x, 1), _as64(y, 1)
    if x.shape != y.shape:
        raise ValueError(f"x and y must have the same shape ({x.shape} != {y.shape})")
    return np.einsum("...d,...d->...", unit_rows(x), unit_rows(y))


def mean_pair_cosine(x: np.ndarray, y: np.ndarray) -> float:
    """Mean cosine of row i of ``x`` with row i of ``y`` (``x``, ``y``: ``[n, dim]``).

    With rows drawn at random from different sentences this is Ethayarajh's anisotropy baseline.
    NaN when there are no rows.
    """
    x, y = _as64(x), _as64(y)
    c = pair_cosines(x, y)
    return float(c.mean()) if c.size else float("nan")


def mean_offdiagonal_cosine(x: np.ndarray) -> np.ndarray | float:
    """Mean cosine over all unordered pairs of distinct rows of each ``[n, dim]`` stack (``n >= 2``).

    Computed from the sum of the unit vectors, ``(||sum u||^2 - sum ||u||^2) / (n (n - 1))``, so it costs
    O(n dim) instead of O(n^2 dim). This is a word's self-similarity when the rows are its occurrences.
    Returns a float for one stack, an array for a batch of stacks; NaN when ``n < 2``.
    """
    x = _as64(x)
    n = x.shape[-2]
    if n < 2:
        out = np.full(x.shape[:-2], np.nan)
    else:
        u = unit_rows(x)
        s = u.sum(axis=-2)
        total = np.einsum("...d,...d->...", s, s) - np.einsum("...nd,...nd->...", u, u)
        out = total / (n * (n - 1))
    return float(out) if out.ndim == 0 else out


def intra_similarity(x: np.ndarray) -> np.ndarray | float:
    """Mean cosine between each row and the mean of the rows, per ``[n, dim]`` stack (one sentence).

    NaN for an empty stack; a float for one stack, an array for a batch of stacks.
    """
    x = _as64(x)
    if x.shape[-2] == 0:
        out = np.full(x.shape[:-2], np.nan)
    else:
        mean = x.mean(axis=-2, keepdims=True)
        out = pair_cosines(x, np.broadcast_to(mean, x.shape)).mean(axis=-1)
    return float(out) if np.ndim(out) == 0 else out


def masked_intra_similarity(h: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """:func:`intra_similarity` of every row of a padded batch at once: ``h`` ``[..., B, T, D]``, ``mask``
    ``[B, T]`` (the tokens that count): ``[..., B]`` float64, NaN for a row with no token.

    Why: the per-sentence NumPy version costs a float64 copy and several passes per sentence, layer and
    model; this is one pass over the batch (float64 in torch, on the tensors' device). The same
    arithmetic (mean of the row's tokens, cosine of each with it, mean over the row), summed in another
    order: equal to :func:`intra_similarity` to ~1e-15 (tested).
    """
    x = h.to(torch.float64)
    m = mask.to(device=x.device, dtype=torch.float64)[..., None]  # [B, T, 1]
    count = m.sum(-2)  # [B, 1]
    mean = (x * m).sum(-2) / count.clamp_min(1.0)  # [..., B, D]
    xn = x.norm(dim=-1)  # [..., B, T]
    mn = mean.norm(dim=-1, keepdim=True)  # [..., B, 1]
    dots = (x * mean[..., None, :]).sum(-1)  # [..., B, T]
    denom = xn * mn
    cos = torch.where(denom > 0, dots / torch.where(denom > 0, denom, 1.0), 0.0)
    out = (cos * m[..., 0]).sum(-1) / count[..., 0].clamp_min(1.0)
    return torch.where(count[..., 0] > 0, out, torch.nan)


def max_explainable_variance(x: np.ndarray, center: bool = True) -> np.ndarray | float:
    """Share of the variance of each ``[n, dim]`` stack explained by its first principal component.

    ``lambda_max / sum(lambda)`` of the (centred, with ``center``) Gram matrix ``X X'`` (its eigenvalues
    are the squared singular values of ``X``). 1 when the stack has no variance at all (identical rows,
    or a single row): a static vector explains it perfectly. A float for one stack, else an array.

    Small stacks (a word's few occurrences) are solved together by a batched dense eigensolver, the sum of
    the eigenvalues as the total. Stacks whose smaller side exceeds
    :data:`bertology.metrics.principal.DENSE_UP_TO` (the baseline's hundreds of tokens) take ``lambda_max`` by
    Lanczos (:func:`bertology.metrics.principal.top_eigenpairs`) and the total as the trace ``||X||_F^2``,
    without forming or diagonalising the Gram matrix: equal to the dense route to rounding.
    """
    x = _as64(x)
    # Size of the data before centring, to tell "no variance" from rounding noise.
    scale = np.einsum("...nd,...nd->...n", x, x).max(axis=-1, initial=0.0)
    if center:
        x = x - x.mean(axis=-2, keepdims=True)
    floor = 1e-12 * np.maximum(scale, np.finfo(float).tiny) * max(x.shape[-2], 1)  # no variance below this
    if min(x.shape[-2:]) > DENSE_UP_TO:
        total = np.einsum("...nd,...nd->...", x, x)
        top = np.zeros(total.shape)
        for at in np.ndindex(total.shape):
            if total[at] > floor[at]:  # a flat stack needs no eigenvalue (MEV 1 below)
                top[at] = top_eigenpairs(x[at], 1, vectors=False)[0][0]
    else:
        xt = np.swapaxes(x, -1, -2)
        g = x @ xt if x.shape[-2] <= x.shape[-1] else xt @ x  # the smaller Gram matrix (BLAS, not einsum loops)
        ev = np.clip(np.linalg.eigvalsh(g), 0.0, None)
        total = ev.sum(axis=-1)
        top = ev[..., -1] if ev.shape[-1] else np.zeros(total.shape)
    # Zero variance up to rounding (identical rows): the convention MEV = 1.
    flat = total <= floor
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.where(flat, 1.0, top / np.where(flat, 1.0, total))
    return float(out) if out.ndim == 0 else out


def chain_pairs(k: int) -> tuple[np.ndarray, np.ndarray]:
    """Index pairs ``(i, i + 1 mod k)`` for ``i < k``: ``k`` pairs of distinct items, each item used twice.

    One token from each of ``k`` sentences then gives ``k`` cross-sentence pairs (Ethayarajh: 1,000
    sentences, 1,000 pairs). ``k = 2`` gives the one pair ``(0, 1)``; ``k < 2`` none.
    """
    if k < 2:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    if k == 2:
        return np.array([0]), np.array([1])
    i = np.arange(k, dtype=np.int64)
    return i, (i + 1) % k
