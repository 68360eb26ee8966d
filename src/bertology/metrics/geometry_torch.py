"""Ethayarajh's geometry metrics in torch, where the vectors are: the device path of
:mod:`bertology.metrics.geometry`.

The NumPy functions stay the CPU path; these do the same arithmetic in float64 torch operations on the tensors'
device, so geometry's ``compute`` on a GPU (the baseline's cosines and MEV, the words' self-similarity and MEV)
reads nothing back until its final ``[2, L + 1]`` and ``[words, 2, L + 1]`` arrays. Same formulas, same
conventions (zero vectors have cosine 0, a stack without variance has MEV 1, the same "no variance" floor and the
same smaller-side Gram matrix), summed in another order and solved by ``torch.linalg.eigvalsh`` (no Lanczos on a
GPU): equal to the NumPy functions to rounding, pinned by ``tests/unit/test_geometry_device.py``.
"""
from __future__ import annotations

import numpy as np
import torch

from bertology.metrics.principal import DENSE_UP_TO, top_eigenpairs_torch

__all__ = ["unit_rows_torch", "pair_cosines_torch", "mean_offdiagonal_cosine_torch", "max_explainable_variance_torch"]


def unit_rows_torch(x: torch.Tensor) -> torch.Tensor:
    """:func:`bertology.metrics.geometry.unit_rows` (float64; zero vectors stay zero)."""
    x = x.double()
    norms = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
    return x / torch.where(norms > 0, norms, 1.0)


def pair_cosines_torch(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """:func:`bertology.metrics.geometry.pair_cosines`: the cosine of row i of ``x`` with row i of ``y``."""
    if x.shape != y.shape:
        raise ValueError(f"x and y must have the same shape ({tuple(x.shape)} != {tuple(y.shape)})")
    return (unit_rows_torch(x) * unit_rows_torch(y)).sum(-1)


def mean_offdiagonal_cosine_torch(x: torch.Tensor) -> torch.Tensor:
    """:func:`bertology.metrics.geometry.mean_offdiagonal_cosine` of each ``[n, dim]`` stack of ``x`` ``[..., n, dim]``
    (from the sum of the unit vectors; NaN when ``n < 2``): a tensor ``[...]``."""
    n = x.shape[-2]
    if n < 2:
        return torch.full(x.shape[:-2], torch.nan, dtype=torch.float64, device=x.device)
    u = unit_rows_torch(x)
    s = u.sum(-2)
    return ((s * s).sum(-1) - (u * u).sum((-2, -1))) / (n * (n - 1))


def max_explainable_variance_torch(x: torch.Tensor, center: bool = True) -> torch.Tensor:
    """:func:`bertology.metrics.geometry.max_explainable_variance` of each ``[n, dim]`` stack of ``x``: a tensor ``[...]``.

    The same floor (``1e-12`` of the largest squared row norm before centring, times ``n``) below which a stack has
    no variance (MEV 1). Small stacks (smaller side up to :data:`DENSE_UP_TO`): the clipped eigenvalues of the
    smaller Gram matrix, their sum the total, as the NumPy function; larger ones: the top eigenvalue by
    :func:`bertology.metrics.principal.top_eigenpairs_torch` (the NumPy function's Lanczos, done densely) over the
    trace ``||X||_F^2``.
    """
    x = x.double()
    n, dim = x.shape[-2:]
    if n == 0:
        return torch.ones(x.shape[:-2], dtype=torch.float64, device=x.device)
    scale = (x * x).sum(-1).amax(-1).clamp_min(0.0)
    if center:
        x = x - x.mean(-2, keepdim=True)
    floor = 1e-12 * scale.clamp_min(np.finfo(float).tiny) * n
    if min(n, dim) > DENSE_UP_TO:
        total = (x * x).sum((-2, -1))
        top = top_eigenpairs_torch(x, 1, vectors=False)[0][..., 0]
    else:
        xt = x.transpose(-1, -2)
        ev = torch.linalg.eigvalsh(x @ xt if n <= dim else xt @ x).clamp_min(0.0)
        total, top = ev.sum(-1), ev[..., -1]
    flat = total <= floor
    return torch.where(flat, 1.0, top / torch.where(flat, 1.0, total))
