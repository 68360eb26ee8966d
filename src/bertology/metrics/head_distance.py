"""Distances between attention heads (Clark et al. 2019, §6) and the 2-D embedding helpers of the head map.

The distance between heads ``i`` and ``j`` is the Jensen-Shannon divergence (base 2) between their
attention distributions over keys for the same query token, averaged over tokens. For ``K`` heads that
is ``K (K - 1) / 2`` mixture entropies per query row, so :func:`pairwise_js_sums` works on all heads of
one input at once, shares each head's own entropy across its pairs, and walks the upper triangle in
blocks that bound memory (on a GPU) or in one fused Numba kernel (on the CPU). Pure functions, no
model code.
"""
from __future__ import annotations

import math

import numba
import numpy as np
import torch

from bertology import transfer
from bertology.metrics.fast_log import log32

#: Default block size (elements of one mixture tensor, 1 MB in float32): the passes over it stay in cache.
BLOCK_ELEMENTS = 1 << 18


def pair_indices(k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``K (K - 1) / 2`` unordered pairs ``i < j`` in the order every function here uses (row-major)."""
    return np.triu_indices(k, 1)


def pairwise_js_sums(
    p: torch.Tensor,
    rows: torch.Tensor | None = None,
    *,
    block_elements: int = BLOCK_ELEMENTS,
) -> torch.Tensor:
    """Sum over query rows of the JS divergence (bits) between every pair of heads.

    ``p`` is ``[..., K, R, N]``: ``K`` heads, ``R`` query rows, distributions over ``N`` keys (padding
    keys must hold exactly 0). ``rows`` (``[..., R]``, bool or 0/1) keeps only some query rows, e.g. the
    real tokens of a padded batch. Returns float64 ``[..., K (K - 1) / 2]`` in :func:`pair_indices`
    order. JS = H((p + q) / 2) - (H(p) + H(q)) / 2: entropies are computed per row in ``p``'s dtype and
    summed over rows in float64, and each pair's total is clamped at 0 (rounding).

    Work is ``K² R N / 2`` logs. Float32 (or narrower) maps on the CPU go through one fused Numba
    kernel (:func:`_cpu_mixture_sums`, ~20x the torch form on BERT-base's 288 heads); float64 maps and
    maps on a GPU through torch ops (:func:`_torch_mixture_sums`). The two differ by float32 rounding
    (another log, another summation order): ~1e-6 relative in each entropy sum.

    In the torch form the layout is chosen for speed: keys outermost (``[B, N, R, K]``),
    so each entropy is a sum of contiguous slabs rather than many short row reductions (3-5x faster
    for sentence-length rows); halves are taken once (``0.5 p`` is exact), so a mixture is one add
    and identical rows give the same terms bit for bit. Heads ``i0:i1`` are mixed with heads ``i0:``
    per block, so at most ``block_elements`` mixture values exist at a time, in two buffers that every
    block reuses; per block, four passes (add, log, multiply, sum) and nothing per row.
    """
    *lead, k, r, n = p.shape
    if p.device.type == "cpu" and p.dtype != torch.float64:
        mix_sum = _cpu_mixture_sums(p.reshape(-1, k, r, n), None if rows is None else rows.reshape(-1, r))
    else:
        mix_sum = _torch_mixture_sums(p.reshape(-1, k, r, n), None if rows is None else rows.reshape(-1, r),
                                      block_elements)
    # JS summed over rows = sum H(m) - (sum H(p) + sum H(q)) / 2, clamped at 0 (rounding). The diagonal
    # "mixture" of a head with itself is the head (m = 2 p/2 exactly), so -mix_sum[i, i] is H(p_i) summed.
    h_sum = -torch.diagonal(mix_sum, dim1=1, dim2=2)
    ia, ib = (transfer.send(x, p.device) for x in pair_indices(k))
    js = (-mix_sum[:, ia, ib] - 0.5 * (h_sum[:, ia] + h_sum[:, ib])).clamp_min_(0.0)
    out = js / math.log(2.0)
    return out.reshape(*lead, len(ia))


def _torch_mixture_sums(p: torch.Tensor, rows: torch.Tensor | None, block_elements: int) -> torch.Tensor:
    """``sum_r w_r sum_n m ln m`` for ``m = (p_i + p_j) / 2``, ``i <= j``, as float64 ``[B, K, K]`` (upper triangle).

    Torch ops on ``p``'s device and dtype (the GPU path, and float64 input); see :func:`pairwise_js_sums`.
    """
    b, k, r, n = p.shape
    tiny = torch.finfo(p.dtype).tiny
    # Halves clamped once to the smallest normal float: every mixture is then >= 2 tiny, so its log
    # needs no clamp (log(0) takes a slow path and 0 log 0 must be 0; a zero now adds ~1e-36).
    half = (0.5 * p).clamp_min_(tiny).permute(0, 3, 2, 1).contiguous()  # [B, N, R, K]
    # Row weights (padding rows 0) fold into the sums: sum_r w_r H_r of every head and of every mixture,
    # each summed over keys (in p's dtype) and then over rows (in float64) in the same way: a mixture
    # of a head with an identical one has exactly the head's terms and sums, so their JS is 0.
    w_rows = None if rows is None else rows.reshape(b, 1, r, 1, 1).to(p.dtype)
    mix_sum = torch.zeros(b, k, k, dtype=torch.float64, device=p.device)  # sum_r w_r sum_n m ln m, upper triangle
    per_pair = b * r * n
    blocks = []  # heads i0:i1 against heads i0: per block (the diagonal is each head's own entropy)
    i0 = 0
    while i0 < k:
        width = k - i0
        bi = max(1, min(width, block_elements // max(1, width * per_pair)))
        blocks.append((i0, i0 + bi))
        i0 += bi
    most = max((i1 - i0) * (k - i0) for i0, i1 in blocks) * per_pair if blocks else 0
    mix_buf = torch.empty(most, dtype=p.dtype, device=p.device)  # reused by every block
    log_buf = torch.empty(most, dtype=p.dtype, device=p.device)
    for i0, i1 in blocks:
        bi, width = i1 - i0, k - i0
        shape = (b, n, r, bi, width)
        size = b * n * r * bi * width
        m = torch.add(half[..., i0:i1, None], half[..., None, i0:], out=mix_buf[:size].view(shape))
        mlogm = torch.log(m, out=log_buf[:size].view(shape)).mul_(m)
        if w_rows is not None:
            mlogm.mul_(w_rows)
        mix_sum[:, i0:i1, i0:] = mlogm.sum(1).sum(1, dtype=torch.float64)  # over keys, then rows in float64
    return mix_sum


def _cpu_mixture_sums(p: torch.Tensor, rows: torch.Tensor | None) -> torch.Tensor:
    """:func:`_torch_mixture_sums` for float32 (or narrower) maps on the CPU, in one fused Numba pass.

    The torch form makes four passes over every mixture block (add, log, multiply, sum), ~8 ns per
    pair, key and row on two cores; the kernel keeps each key row of all heads in L1 and each pair's
    running sum in a register lane: ~0.4-0.8 ns per element and core, depending on the CPU (0.8 on our 2 shared
    AMD EPYC cores; :mod:`bertology.metrics.fast_log`).
    Sums over keys are float32 (as in the torch form), over rows float64. Each pair is summed by one
    thread in a fixed order, so the result does not depend on the number of threads.
    """
    b, k, r, n = p.shape
    tiny = np.finfo(np.float32).tiny
    kp = -(-k // LANES) * LANES
    half = np.full((b, r, n, kp), 0.5, dtype=np.float32)  # [B, R, N, K padded]; a padded lane's value is dropped
    half[..., :k] = (0.5 * p.float()).clamp_min_(tiny).permute(0, 2, 3, 1).numpy()
    weights = np.ones((b, r)) if rows is None else rows.to(torch.float64).reshape(b, r).numpy()
    out = np.zeros((b, k, k))
    _mixture_sums_kernel(half, weights, _balanced_starts(k, 4 * numba.get_num_threads()), out)
    return torch.from_numpy(out)


def _balanced_starts(k: int, chunks: int) -> np.ndarray:
    """Row boundaries ``0 = s_0 < ... < s_C = k`` that split the upper triangle's ``k (k + 1) / 2`` pairs evenly."""
    work = np.cumsum(np.arange(k, 0, -1))  # pairs in rows 0..i
    cuts = np.searchsorted(work, work[-1] * np.arange(1, chunks) / chunks) + 1
    return np.unique(np.concatenate([[0], cuts, [k]])).astype(np.int64)


@numba.njit(cache=True, fastmath={"contract"}, inline="always")
def _add_mixture_terms(a, row, acc):
    """acc[j] += m ln m for m = a + row[j] (a loop from 0 over 1-D views, the form LLVM vectorises).

    Only ``contract`` of the fast-math flags (fused multiply-adds, applied alike in the vector body and
    the scalar remainder), so a head mixed with an identical copy gets its own terms bit for bit
    wherever the copy sits.
    """
    for j in range(row.shape[0]):
        m = a + row[j]
        acc[j] += m * log32(m)


#: Head rows are padded to a multiple of this many lanes (16 float32: one AVX-512 register), and each pair row
#: starts at a multiple of it, so the vectorised loop of :func:`_add_mixture_terms` has no scalar remainder.
LANES = 16


@numba.njit(cache=True, parallel=True, nogil=True)
def _mixture_sums_kernel(half, weights, starts, out):
    """out[b, i, j] += sum_r w[b, r] sum_n m ln m, m = half[b, r, n, i] + half[b, r, n, j], for i <= j < k.

    ``half``'s head axis is padded to a multiple of :data:`LANES` (``out`` is ``[B, k, k]``). Row ``i`` runs
    from ``j = i - i % LANES`` to the padded end: the few pairs before ``i`` and after ``k`` are computed in
    vector lanes and dropped. Why: the scalar remainder of a row of arbitrary length cost ~10 % of the
    kernel (each of its elements a whole scalar logarithm); every kept pair gets the same operations in the
    same order (contract-only fast maths), so the sums are bit for bit those of exact-length rows (tested).
    Rows ``starts[c]:starts[c + 1]`` of the triangle are one task; per task a float32 accumulator of
    those rows, flushed to float64 after every query row.
    """
    nb, nr, nn, kp = half.shape
    k = out.shape[1]
    nc = len(starts) - 1
    for task in numba.prange(nb * nc):
        b, c = task // nc, task % nc
        i0, i1 = starts[c], starts[c + 1]
        acc = np.zeros((i1 - i0, kp), dtype=np.float32)
        for r in range(nr):
            w = weights[b, r]
            if w == 0.0:  # a padding row (its values may be anything)
                continue
            acc[:] = 0.0
            for n in range(nn):
                row = half[b, r, n]
                for ii in range(i1 - i0):
                    i = i0 + ii
                    s = i - i % LANES
                    _add_mixture_terms(row[i], row[s:], acc[ii, s:])
            for ii in range(i1 - i0):
                for j in range(i0 + ii, k):
                    out[b, i0 + ii, j] += w * acc[ii, j]


def paired_js_sums(p: torch.Tensor, q: torch.Tensor, rows: torch.Tensor | None = None) -> torch.Tensor:
    """Sum over query rows of JS(p[k], q[k]) (bits) for matching heads: ``[..., K, R, N]`` twice -> ``[..., K]``.

    The precise form for small divergences, e.g. a head against its own fine-tuned version: float64
    and the KL form JS = (KL(p | m) + KL(q | m)) / 2, which has no cancellation between two large
    entropies and is exactly 0 for identical rows (``2p / (p + p) == 1``). The entropy form of
    :func:`pairwise_js_sums` leaves float32 noise of ~1e-8 bits there, i.e. ~1e-4 in JS distance.
    """
    p, q = p.to(torch.float64), q.to(torch.float64)
    s = p + q
    safe = torch.where(s > 0, s, torch.ones_like(s))
    js = 0.5 * (torch.special.xlogy(p, 2.0 * p / safe) + torch.special.xlogy(q, 2.0 * q / safe)).sum(-1)
    js = js.clamp_min(0.0)
    if rows is not None:
        js = js * rows.to(torch.float64).unsqueeze(-2)
    return js.sum(-1) / math.log(2.0)


def expand_pairs(values: torch.Tensor, representative: torch.Tensor, n_distinct: int | None = None) -> torch.Tensor:
    """Pair values of ``K`` heads from those of their distinct representatives: ``[..., K' (K' - 1) / 2] -> [..., K (K - 1) / 2]``.

    ``representative[k]`` (``[K]``, integers in ``0..K'-1``) is head ``k``'s index among the ``K'``
    distinct heads whose pairs ``values`` holds (:func:`pair_indices` order). Two heads with the same
    representative get 0; every other pair takes its representatives' value, so heads with identical
    maps get identical rows bit for bit, whatever block or position their pairs would have had.
    ``n_distinct`` is ``K'`` when the caller knows it (without it ``K'`` is read from ``representative``:
    a device sync on a GPU). ``values`` may hold more heads than are represented (``K' = K``, every head
    computed, copies pointing at their originals: :func:`~bertology.analyses.head_map.head_representatives`).
    """
    rep = representative.to(torch.long)
    kd = n_distinct if n_distinct is not None else (int(rep.max()) + 1 if rep.numel() else 0)
    ia, ib = (transfer.send(x, rep.device) for x in pair_indices(rep.numel()))
    if kd < 2:  # every head the same: all pairs 0
        return values.new_zeros((*values.shape[:-1], len(ia)))
    lo, hi = torch.minimum(rep[ia], rep[ib]), torch.maximum(rep[ia], rep[ib])
    same = lo == hi
    # Row-major position of (lo, hi), lo < hi, among the K' (K' - 1) / 2 pairs.
    pos = lo * kd - lo * (lo + 1) // 2 + (hi - lo - 1)
    out = values[..., pos.clamp_min(0).to(values.device)]
    return out.masked_fill(same.to(values.device), 0)


def square(pairs: np.ndarray | torch.Tensor, k: int) -> np.ndarray:
    """Symmetric ``[K, K]`` matrix with a zero diagonal from values in :func:`pair_indices` order."""
    values = np.asarray(pairs.cpu() if isinstance(pairs, torch.Tensor) else pairs, dtype=np.float64)
    out = np.zeros((k, k))
    ia, ib = pair_indices(k)
    out[ia, ib] = values
    out[ib, ia] = values
    return out


def pairwise_js(p: torch.Tensor, rows: torch.Tensor | None = None) -> np.ndarray:
    """Mean JS divergence (bits) over query rows between all heads of ``p`` (``[K, R, N]``), as ``[K, K]``."""
    k, r = p.shape[-3], p.shape[-2]
    n_rows = float(r if rows is None else rows.to(torch.float64).sum())
    return square(pairwise_js_sums(p, rows), k) / n_rows


def classical_mds(d: np.ndarray, n_components: int = 2) -> np.ndarray:
    """Torgerson's classical scaling of a distance matrix: the top eigenvectors of the double-centred ``-D²/2``.

    A deterministic starting point for SMACOF (what ``sklearn``'s ``init="classical_mds"`` does, for
    any ``sklearn`` version) and already PCA-aligned.
    """
    d = np.asarray(d, dtype=np.float64)
    n = d.shape[0]
    j = np.eye(n) - 1.0 / n
    b = -0.5 * j @ (d**2) @ j
    vals, vecs = np.linalg.eigh((b + b.T) / 2)
    top = np.argsort(vals)[::-1][:n_components]
    x = vecs[:, top] * np.sqrt(np.clip(vals[top], 0.0, None))
    # Sign of each axis fixed by its largest-magnitude coordinate (eigh's sign is arbitrary).
    signs = np.sign(x[np.abs(x).argmax(0), np.arange(x.shape[1])])
    return x * np.where(signs == 0, 1.0, signs)


def stress1(d: np.ndarray, x: np.ndarray) -> float:
    """Kruskal's Stress-1 of an embedding ``x`` of distances ``d``: sqrt(sum (d - |xi - xj|)² / sum d²) over i < j.

    0 is a perfect fit; about 0.05 good, 0.1 fair, 0.2 poor (Kruskal 1964).
    """
    ia, ib = pair_indices(d.shape[0])
    target = np.asarray(d, dtype=np.float64)[ia, ib]
    got = np.linalg.norm(x[ia] - x[ib], axis=1)
    denom = float((target**2).sum())
    return float(np.sqrt(((target - got) ** 2).sum() / denom)) if denom > 0 else 0.0
