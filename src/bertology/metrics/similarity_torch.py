"""RSA and CKA grids in torch, where the vectors are: the device path of :func:`similarity_grids`.

:func:`bertology.metrics.similarity.similarity_grids` is the NumPy/Numba version: on the CPU it is faster
(a hand-written radix sort ranks the cosines, layers run in threads) and stays the CPU path. This module does
the same arithmetic in float64 torch operations on the tensors' device, so on a GPU the ``n x n`` Gram
matrices, the rank transforms and the ``m = n (n - 1) / 2``-long dot products never leave it: only the
``L x L`` grids and each layer's ``diag(Kc)`` (``L x n`` values) cross to the host, where the CKA
formulas of :func:`bertology.metrics.similarity._cka_from_gram_terms` (one copy of them) finish the job.

Same values as the NumPy path to rounding, pinned by ``tests/unit/test_similarity_torch.py`` (CPU) and the
CUDA-only test beside it: every product sums in another order (cuBLAS / torch's BLAS against NumPy's), so a
cosine differs by a few ``eps sqrt(d)``; RSA-Pearson and CKA are smooth in them (``~1e-12``). RSA-Spearman
is exact when the two paths order the cosines alike; two distinct cosines closer than their rounding can
swap, which moves the correlation by at most ``~12 / m`` per swap (expected count ``~m^2 eps``: none at
test sizes, ~0.2 at 2,000 tokens).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from bertology.metrics.similarity import _cka_from_gram_terms

def average_ranks_torch(v: torch.Tensor) -> torch.Tensor:
    """``scipy.stats.rankdata(v)`` ('average') in float64 torch operations on ``v``'s device, without a sync.

    One stable sort; each tie group's first and last sorted positions come from a running max / min over
    the group starts and ends (fixed sizes, so nothing waits on the device), and its members get
    ``(first + last) / 2 + 1``, exact in float64 (integers below 2**53). ``-0.0`` is made ``+0.0`` first
    (they tie, as in scipy, whatever the sort does with their bits). Any NaN makes every rank NaN, as
    scipy's default ``nan_policy="propagate"``.
    """
    v = v.reshape(-1).to(torch.float64) + 0.0  # -0.0 + 0.0 == +0.0
    n = v.numel()
    if n == 0:
        return v.clone()
    s, order = torch.sort(v, stable=True)
    pos = torch.arange(n, device=v.device)
    starts = torch.ones(n, dtype=torch.bool, device=v.device)
    starts[1:] = s[1:] != s[:-1]
    ends = torch.ones_like(starts)
    ends[:-1] = starts[1:]
    first = torch.where(starts, pos, 0).cummax(0).values
    last = torch.where(ends, pos, n - 1).flip(0).cummin(0).values.flip(0)
    mean_rank = (first + last).to(torch.float64) / 2.0 + 1.0
    ranks = torch.empty_like(v)
    ranks[order] = mean_rank
    return ranks.masked_fill_(torch.isnan(v).any(), float("nan"))


def _zscore(v: torch.Tensor) -> torch.Tensor:
    """``v`` centred and scaled to unit length (a dot product of two is their Pearson correlation)."""
    v = v - v.mean()
    norm = torch.linalg.vector_norm(v)
    return v / torch.where(norm > 0, norm, 1.0)


def _layer_terms(x: torch.Tensor, upper: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One layer's Pearson and Spearman signatures, centred Gram triangle and diagonal (float64, ``x``'s device).

    :func:`bertology.metrics.similarity.layer_terms` step for step: the cosine matrix of unit rows, then
    ``K = C |x_i| |x_j|`` centred on both sides; ``upper`` is the flat index of the strict upper triangle.
    """
    x = x.to(torch.float64)
    norms = torch.linalg.vector_norm(x, dim=1, keepdim=True)
    xn = x / torch.where(norms > 0, norms, 1.0)
    gram = xn @ xn.T
    cos = gram.view(-1)[upper]
    gram *= norms
    gram *= norms.T
    means = gram.mean(dim=1)
    gram -= means[:, None]
    gram -= means[None, :]
    gram += means.mean()
    centred, diag = gram.view(-1)[upper], gram.diagonal().clone()
    del gram
    return _zscore(cos), _zscore(average_ranks_torch(cos)), centred, diag


def similarity_grids_torch(xs: Sequence[torch.Tensor], ys: Sequence[torch.Tensor]) -> dict[str, np.ndarray]:
    """:func:`bertology.metrics.similarity.similarity_grids` computed on the tensors' device in float64.

    Every ``xs`` layer's three ``m``-long vectors are kept (``24 len(xs) m`` bytes of device memory: 624 MB at
    13 layers and 2,000 tokens), each ``ys`` layer is reduced to its row of dot products as soon as it is made
    (one ``8 n^2`` Gram matrix and a few ``8 m`` temporaries in flight). Needs float64 on the device (CUDA
    and the CPU have it; MPS does not: the caller computes there with the NumPy path on a host copy).
    """
    n = xs[0].shape[0] if len(xs) else 0
    for mat in [*xs, *ys]:
        if mat.ndim != 2 or mat.shape[0] != n:
            raise ValueError(f"every layer must be [{n}, dim], got shape {tuple(mat.shape)}")
    if n < 4:
        raise ValueError("debiased CKA needs at least 4 items")
    device = xs[0].device
    iu = torch.triu_indices(n, n, 1, device=device)
    upper = iu[0] * n + iu[1]
    del iu
    base = [_layer_terms(x, upper) for x in xs]
    pearson_x = torch.stack([b[0] for b in base])
    spearman_x = torch.stack([b[1] for b in base])
    centred_x = torch.stack([b[2] for b in base])
    diag_x = torch.stack([b[3] for b in base])
    del base
    own_x = 2.0 * (centred_x * centred_x).sum(1) + (diag_x * diag_x).sum(1)
    cols = []
    for y in ys:
        p, s, c, d = _layer_terms(y, upper)
        cols.append((pearson_x @ p, spearman_x @ s, 2.0 * (centred_x @ c) + diag_x @ d, 2.0 * (c @ c) + d @ d, d))
    host = [torch.stack([c[k] for c in cols], dim=1).cpu().numpy() for k in range(3)]  # [nx, ny] each
    own_y = torch.stack([c[3] for c in cols]).cpu().numpy()
    diag_y = torch.stack([c[4] for c in cols]).cpu().numpy()
    cka = _cka_from_gram_terms(host[2], own_x.cpu().numpy(), own_y, diag_x.cpu().numpy(), diag_y)
    return {"rsa_pearson": host[0], "rsa_spearman": host[1], **cka}
