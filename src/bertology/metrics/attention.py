"""Comparisons of attention maps: cosine of flattened maps and Jensen-Shannon divergence of rows.

Torch functions over batched maps ``[..., q, k]`` (so they run on the extraction batch without a
copy) with a NumPy reference for tests. Rows are attention distributions over keys.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numba
import numpy as np
import torch


def map_cosine(
    a: torch.Tensor, b: torch.Tensor, rows: torch.Tensor | None = None, eps: float = 1e-12,
    scratch: torch.Tensor | None = None,
) -> torch.Tensor:
    """Cosine similarity of the flattened ``[q, k]`` maps (Kovaleva et al. 2019), over leading dims.

    ``rows`` (``[..., q]``, 0/1) keeps only some query rows, i.e. the cosine of the cropped maps when
    padding columns already hold zero attention. Row sums are accumulated in float64. ``scratch`` (a
    tensor of ``a``'s shape and dtype) holds the products, so no map-sized tensor is allocated (each
    fresh one costs page faults); the values are those of ``linalg.vecdot`` bit for bit.
    """
    def dot(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        prod = torch.mul(x, y) if scratch is None else torch.mul(x, y, out=scratch)
        return prod.sum(-1).double()

    num, aa, bb = dot(a, b), dot(a, a), dot(b, b)
    if rows is not None:
        rows = rows.double()
        num, aa, bb = num * rows, aa * rows, bb * rows
    return num.sum(-1) / (aa.sum(-1).sqrt() * bb.sum(-1).sqrt()).clamp_min(eps)


def row_entropy(p: torch.Tensor, scratch: torch.Tensor | None = None) -> torch.Tensor:
    """Shannon entropy (nats) of distributions along the last dim, with ``0 ln 0 = 0``.

    Same values as ``-xlogy(p, p).sum(-1)`` but 3-4x faster on CPU: ``log(0)`` takes a slow path in
    the vectorised kernels and attention maps are full of exact zeros (padding), so the argument is
    clamped to the smallest normal float first (a zero then contributes ``0 * log(tiny) = 0``). The
    clamp, log and product run in place in one temporary (or in ``scratch``, a tensor of ``p``'s shape
    and dtype, so nothing map-sized is allocated): bit for bit ``-vecdot(p, log(clamp(p)))``.
    """
    tiny = torch.finfo(p.dtype).tiny
    t = p.clamp_min(tiny) if scratch is None else torch.clamp_min(p, tiny, out=scratch)
    return -t.log_().mul_(p).sum(-1)


#: Clark et al. (2019)'s notebook smooths each row to ``(1 - s) p + s / n`` "to avoid NaNs" before its entropy.
CLARK_ENTROPY_SMOOTHING = 1e-4


def smoothed_entropy_sums(attn: torch.Tensor, mask: torch.Tensor, smoothing: float = CLARK_ENTROPY_SMOOTHING) -> torch.Tensor:
    """Entropies (nats) of the smoothed real rows of ``[B, H, T, T]`` maps, summed over the rows: ``[B, H]`` float64.

    Each real row ``p`` becomes ``(1 - s) p + s / n`` over the example's ``n`` real keys (``mask``
    ``[B, T]``, True for real tokens; padding keys take no mass), as Clark et al. (2019)'s
    General_Analysis notebook does with ``s = 1e-4``. Computed in float64.
    """
    real = mask.to(torch.bool)
    n = real.sum(-1).to(torch.float64).clamp_min(1.0)  # [B]
    p = attn.to(torch.float64) * (1.0 - smoothing) + (smoothing / n)[:, None, None, None]
    h = -torch.where(real[:, None, None, :], p * p.log(), 0.0).sum(-1)  # [B, H, T]
    return (h * real[:, None, :]).sum(-1)


def column_sums(a: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``[..., k]``: attention each key receives from the query rows kept by ``rows`` (``[B, q]``, 0/1).

    ``a`` is ``[B, H, q, k]``. One batched ``[1, q] @ [q, k]`` product per map: 5x faster on CPU than
    ``einsum("bhqk,bq->bhk")``, which copies the maps into a transposed layout first (the sums agree
    to float rounding).
    """
    return torch.matmul(rows.to(a.dtype)[:, None, None, :], a).squeeze(-2)


def js_divergence(p: torch.Tensor, q: torch.Tensor, base: float = 2.0) -> torch.Tensor:
    """Jensen-Shannon divergence between distributions along the last dim (0 = equal, 1 = disjoint in base 2).

    Uses JS = H(m) - (H(p) + H(q)) / 2 with m = (p + q) / 2: three entropy passes instead of four
    (0 log 0 = 0). Computed in the input's dtype; pass float64 for reference values.
    """
    js = (row_entropy(0.5 * (p + q)) - 0.5 * (row_entropy(p) + row_entropy(q))) / math.log(base)
    return js.clamp_min(0.0)


def js_divergence_np(p: np.ndarray, q: np.ndarray, base: float = 2.0) -> float:
    """Reference JS divergence of two 1-D distributions via scipy's Jensen-Shannon distance."""
    from scipy.spatial.distance import jensenshannon

    return float(jensenshannon(p, q, base=base) ** 2)


#: Diagonal offsets kept per query row by :func:`layer_statistics`: previous token, self, next token.
DIAGONAL_OFFSETS = (-1, 0, 1)


@dataclass
class LayerStatistics:
    """What the attention analyses read from one layer's maps of both models, from one pass over them.

    ``a`` is the base map, ``b`` the tuned one; only real query rows count (padding rows are 0 below).

    - ``dots`` ``[B, H, 3]`` float64: ``sum a*b``, ``sum a*a``, ``sum b*b`` (the cosine of the cropped maps);
    - ``received`` ``[2, B, H, T]``: attention each key receives (:func:`column_sums`), base then tuned;
    - ``diagonals`` ``[2, B, H, T, 3]``: ``A[q, q + o]`` for ``o`` in :data:`DIAGONAL_OFFSETS` (0 outside the map);
    - ``entropy`` ``[2, B, H, T]``: row entropies in nats (:func:`row_entropy`);
    - ``js`` ``[B, H]`` float64: the Jensen-Shannon divergence (nats) of base and tuned rows, summed
      over the real rows, each row's clamped at 0 (rounding);
    - ``entropy_sum`` ``[2, B, H]`` and ``diagonal_sums`` ``[2, B, H, 3]`` float64: ``entropy`` and
      ``diagonals`` summed over the rows.

    ``received``, ``diagonals`` and ``entropy`` are in the maps' dtype.
    """

    dots: torch.Tensor
    received: torch.Tensor
    diagonals: torch.Tensor
    entropy: torch.Tensor
    js: torch.Tensor
    entropy_sum: torch.Tensor
    diagonal_sums: torch.Tensor


def layer_statistics(
    a: torch.Tensor, b: torch.Tensor, rows: torch.Tensor, scratch: tuple[torch.Tensor, ...] | None = None,
) -> LayerStatistics:
    """:class:`LayerStatistics` of two ``[B, H, T, T]`` maps of the same inputs; ``rows`` ``[B, T]`` marks real queries.

    On CPU, torch takes the three logs (of ``a``, ``b`` and their mixture; clamped to the smallest
    normal float as in :func:`row_entropy`) and one Numba pass reads everything once. The plain torch
    version (:func:`layer_statistics_torch`, any device) makes two dozen passes and as many small
    operations per layer, whose Python overhead cost as much as the arithmetic. Both give the same
    values up to float rounding (the kernel sums in float64). ``scratch``: three tensors of ``a``'s
    shape and dtype for the logs (contents overwritten), so nothing map-sized is allocated.
    """
    if a.shape != b.shape or a.dim() != 4 or a.shape[-1] != a.shape[-2]:
        raise ValueError(f"expected two [B, H, T, T] maps of one shape, got {tuple(a.shape)} and {tuple(b.shape)}")
    if a.device.type != "cpu" or a.dtype not in (torch.float32, torch.float64) or b.dtype != a.dtype:
        return layer_statistics_torch(a, b, rows)
    a, b = a.detach().contiguous(), b.detach().contiguous()
    if scratch is None:
        scratch = tuple(torch.empty_like(a) for _ in range(3))
    tiny = torch.finfo(a.dtype).tiny
    log_a = torch.clamp_min(a, tiny, out=scratch[0]).log_()
    log_b = torch.clamp_min(b, tiny, out=scratch[1]).log_()
    log_m = torch.add(a, b, out=scratch[2]).mul_(0.5).clamp_min_(tiny).log_()
    B, H, T, _ = a.shape
    D = len(DIAGONAL_OFFSETS)
    # LayerStatistics' fields in order, filled by the kernel in float64.
    out = (np.zeros((B, H, 3)), np.zeros((2, B, H, T)), np.zeros((2, B, H, T, D)), np.zeros((2, B, H, T)),
           np.zeros((B, H)), np.zeros((2, B, H)), np.zeros((2, B, H, D)))
    _layer_statistics_kernel(a.numpy(), b.numpy(), (log_a.numpy(), log_b.numpy(), log_m.numpy()),
                             rows.bool().cpu().numpy(), out)
    dots, received, diagonals, entropy, js, entropy_sum, diagonal_sums = map(torch.from_numpy, out)
    return LayerStatistics(dots, received.to(a.dtype), diagonals.to(a.dtype), entropy.to(a.dtype), js, entropy_sum,
                           diagonal_sums)


def layer_statistics_torch(a: torch.Tensor, b: torch.Tensor, rows: torch.Tensor) -> LayerStatistics:
    """Reference (and non-CPU) version of :func:`layer_statistics` in plain torch operations."""
    real = rows.to(torch.float64)[:, None, :, None]  # [B, 1, T, 1]
    a64, b64 = a.double() * real, b.double() * real
    dots = torch.stack([(a64 * b64).sum((-1, -2)), (a64 * a64).sum((-1, -2)), (b64 * b64).sum((-1, -2))], -1)
    received = torch.stack([a64.sum(-2), b64.sum(-2)]).to(a.dtype)
    T = a.shape[-1]
    q = torch.arange(T, device=a.device)
    diags = []
    for m in (a64, b64):
        cols = []
        for o in DIAGONAL_OFFSETS:
            k = q + o
            inside = (k >= 0) & (k < T)
            cols.append(torch.where(inside, m[..., q, k.clamp(0, T - 1)], torch.zeros((), dtype=m.dtype, device=m.device)))
        diags.append(torch.stack(cols, -1))
    real_rows = real[..., 0]  # [B, 1, T]
    h_a, h_b = row_entropy(a64) * real_rows, row_entropy(b64) * real_rows
    h_m = row_entropy(0.5 * (a64 + b64)) * real_rows
    js = (h_m - 0.5 * (h_a + h_b)).clamp_min(0.0).sum(-1)
    entropy = torch.stack([h_a, h_b])
    diagonals = torch.stack(diags)
    return LayerStatistics(dots, received, diagonals.to(a.dtype), entropy.to(a.dtype), js, entropy.sum(-1),
                           diagonals.sum(-2))


@numba.njit(cache=True, parallel=True, nogil=True, fastmath=True)
def _layer_statistics_kernel(a, b, logs, rows, out):
    """Fill ``out`` (:class:`LayerStatistics`' arrays, in field order); ``logs``: of ``a``, ``b`` and their mean."""
    log_a, log_b, log_m = logs
    dots, received, diagonals, entropy, js, entropy_sum, diagonal_sums = out
    B, H, T = a.shape[0], a.shape[1], a.shape[2]
    for task in numba.prange(B * H):
        i, h = task // H, task % H
        ab = aa = bb = js_sum = 0.0
        ra, rb = received[0, i, h], received[1, i, h]
        for q in range(T):
            if not rows[i, q]:
                continue
            x, y = a[i, h, q], b[i, h, q]
            lx, ly, lm = log_a[i, h, q], log_b[i, h, q], log_m[i, h, q]
            ha = hb = hm = 0.0
            for k in range(T):
                xk, yk = np.float64(x[k]), np.float64(y[k])
                ab += xk * yk
                aa += xk * xk
                bb += yk * yk
                ra[k] += xk
                rb[k] += yk
                ha -= xk * lx[k]
                hb -= yk * ly[k]
                hm -= np.float64((x[k] + y[k]) * np.float32(0.5)) * lm[k]
            entropy[0, i, h, q] = ha
            entropy[1, i, h, q] = hb
            entropy_sum[0, i, h] += ha
            entropy_sum[1, i, h] += hb
            js_sum += max(hm - 0.5 * (ha + hb), 0.0)
            for j in range(3):  # DIAGONAL_OFFSETS, -1..1
                k = q + j - 1
                if 0 <= k < T:
                    diagonals[0, i, h, q, j] = x[k]
                    diagonals[1, i, h, q, j] = y[k]
                    diagonal_sums[0, i, h, j] += x[k]
                    diagonal_sums[1, i, h, j] += y[k]
        dots[i, h, 0], dots[i, h, 1], dots[i, h, 2] = ab, aa, bb
        js[i, h] = js_sum
