"""Geometry's fits: the anisotropy baseline, MEV and the words' self-similarity from the kept samples (Ethayarajh 2019).

Pure functions of the samples :class:`bertology.analyses.geometry.Geometry` keeps: the NumPy fits (host state) and
the same formulas in torch where the device path's state is (:mod:`bertology.metrics.geometry_torch`). Split from the
streaming analysis so each path's arithmetic reads on its own; the numbers are unchanged.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from bertology.analyses.device_state import host
from bertology.blas import one_blas_thread
from bertology.metrics.geometry import (
    chain_pairs,
    max_explainable_variance,
    mean_offdiagonal_cosine,
    pair_cosines,
    unit_rows,
)
from bertology.metrics.geometry_torch import (
    max_explainable_variance_torch,
    mean_offdiagonal_cosine_torch,
    pair_cosines_torch,
    unit_rows_torch,
)

#: ``metric -> (mean [2, L + 1], sd [2, L + 1], n)``, as ``compute`` reads them.
Stats = dict[str, tuple[np.ndarray, np.ndarray, int]]


def to_host(tensors: list[torch.Tensor]) -> list[np.ndarray]:
    """float64 NumPy copies of ``tensors`` (one device), in one transfer: the only one of ``compute`` on the device."""
    flat = torch.cat([t.reshape(-1).to(torch.float64) for t in tensors]).cpu().numpy()
    ends = np.cumsum([t.numel() for t in tensors])
    return [flat[end - t.numel(): end].reshape(t.shape) for t, end in zip(tensors, ends)]


def word_stats(vectors: Sequence, n_layers: int, mev_center: bool) -> tuple[np.ndarray, np.ndarray]:
    """Per word (its kept occurrences ``[m, 2, L + 1, D]``): self-similarity and MEV ``[n, 2, L + 1]`` (NumPy)."""
    ss = np.full((len(vectors), 2, n_layers), np.nan)
    mev = np.full((len(vectors), 2, n_layers), np.nan)
    with one_blas_thread():  # small fits: see baseline_stats
        for i, v in enumerate(vectors):
            x = np.moveaxis(host(v).astype(np.float64), 0, 2)  # [2, L + 1, m, D]
            ss[i] = mean_offdiagonal_cosine(x)
            mev[i] = max_explainable_variance(x, center=mev_center)
    return ss, mev


def baseline_stats(base_vectors, n_layers: int, baseline_pairs: str, mev_center: bool) -> Stats:
    """``anisotropy`` and ``mev_baseline`` of the sampled tokens ``[k, 2, L + 1, D]`` (NumPy)."""
    nan = np.full((2, n_layers), np.nan)
    k = 0 if base_vectors is None else len(base_vectors)
    if k < 2:
        return {"anisotropy": (nan, nan, 0), "mev_baseline": (nan, nan, k)}
    aniso_mean, aniso_sd, mev = np.empty((2, n_layers)), np.empty((2, n_layers)), np.empty((2, n_layers))
    if baseline_pairs == "chain":
        a, b = chain_pairs(k)
        n_pairs = len(a)
    else:
        iu = np.triu_indices(k, 1)
        n_pairs = len(iu[0])
    # One (model, layer) stack at a time, [k, D] float64 (3 MB at BERT-base), not all 2 (L + 1) at once: that
    # was 80 MB, plus its gathers and unit-vector copies, ~500 MB of fresh pages per compute, whose zeroing
    # took more kernel time than the arithmetic took user time (0.8 vs 0.4 s in a fresh process on our shared
    # cores; now 0.1 s). The same formulas on the same rows; a mean over pairs sums in another order (the
    # numbers moved by <= 1.2e-14).
    # BLAS on one thread, as pca_views' fits: LAPACK's tridiagonal reduction of the 2 (L + 1) Grams (768 x 768
    # at BERT-base) synchronises its threads per column, and two threads on a shared 2-core machine took
    # 2.8-7.7 s against 1.5-2.3 s with one (docs/results/benchmarks.md). Values change by rounding only.
    base_vectors = host(base_vectors)  # the device path's sample comes to the host once
    with one_blas_thread():
        for m in range(2):
            for layer in range(n_layers):
                v = base_vectors[:, m, layer].astype(np.float64)  # [k, D]
                if baseline_pairs == "chain":
                    cos = pair_cosines(v[a], v[b])
                else:
                    u = unit_rows(v)
                    cos = np.einsum("id,jd->ij", u, u)[iu]
                aniso_mean[m, layer] = cos.mean()
                aniso_sd[m, layer] = cos.std(ddof=1) if n_pairs > 1 else np.nan
                mev[m, layer] = max_explainable_variance(v, center=mev_center)
    return {"anisotropy": (aniso_mean, aniso_sd, n_pairs), "mev_baseline": (mev, nan, k)}


def baseline_stats_torch(base_vectors, n_layers: int, baseline_pairs: str, mev_center: bool,
                         device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]:
    """:func:`baseline_stats` in torch on ``device``: ``(anisotropy mean, sd, MEV baseline, n pairs)``, each
    ``[2, L + 1]`` float64 there (NaN below two tokens), one model's ``[L + 1, k, D]`` stack at a time."""
    k = 0 if base_vectors is None else len(base_vectors)
    nan = torch.full((2, n_layers), torch.nan, dtype=torch.float64, device=device)
    aniso_mean, aniso_sd, mev_base = nan.clone(), nan.clone(), nan.clone()
    n_pairs = 0
    if k < 2:
        return aniso_mean, aniso_sd, mev_base, n_pairs
    vectors = torch.as_tensor(base_vectors).to(device)
    if baseline_pairs == "chain":
        a, b = (torch.from_numpy(i).to(device) for i in chain_pairs(k))
        n_pairs = len(a)
    else:
        iu = torch.triu_indices(k, k, 1, device=device)
        n_pairs = iu.shape[1]
    for m in range(2):
        v = vectors[:, m].transpose(0, 1).double()  # [L + 1, k, D]
        if baseline_pairs == "chain":
            cos = pair_cosines_torch(v[:, a], v[:, b])
        else:
            u = unit_rows_torch(v)
            cos = (u @ u.transpose(-1, -2))[:, iu[0], iu[1]]
        aniso_mean[m] = cos.mean(-1)
        if n_pairs > 1:
            aniso_sd[m] = cos.std(-1, correction=1)
        mev_base[m] = max_explainable_variance_torch(v, center=mev_center)
    return aniso_mean, aniso_sd, mev_base, n_pairs


def word_stats_torch(vectors: Sequence, n_layers: int, mev_center: bool,
                     device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`word_stats` in torch on ``device``, the words batched by occurrence count, 64 at a time
    (``[64, 2, L + 1, m, D]``): self-similarity and MEV ``[n, 2, L + 1]`` float64 there."""
    ss = torch.full((len(vectors), 2, n_layers), torch.nan, dtype=torch.float64, device=device)
    mev = ss.clone()
    by_count: dict[int, list[int]] = {}
    for i, v in enumerate(vectors):
        by_count.setdefault(len(v), []).append(i)
    for ids in by_count.values():
        for start in range(0, len(ids), 64):
            chunk = ids[start: start + 64]
            x = torch.stack([torch.as_tensor(vectors[i]).to(device) for i in chunk])
            x = x.permute(0, 2, 3, 1, 4).double()  # [w, 2, L + 1, m, D], as the NumPy path's moveaxis per word
            at = torch.from_numpy(np.array(chunk, dtype=np.int64)).to(device)
            ss[at] = mean_offdiagonal_cosine_torch(x)
            mev[at] = max_explainable_variance_torch(x, center=mev_center)
    return ss, mev
