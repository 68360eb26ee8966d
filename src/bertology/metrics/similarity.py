"""Representation similarity between two sets of vectors for the same items: CKA and RSA.

Pure functions on NumPy arrays, float64 throughout. ``X`` and ``Y`` are ``[n_items, dim]`` with rows
aligned (row i of both is the same token).

Written by hand because no maintained library offers debiased CKA or RSA on token samples with the
precision and memory profile we need: the CKA forms below work in feature space (O(n d^2)) so they
never build the n x n Gram matrices.
"""
from __future__ import annotations

import numpy as np
from scipy.stats import rankdata


def _as64(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError(f"expected a 2-D array [n_items, dim], got shape {x.shape}")
    return x


def _check_pair(x: np.ndarray, y: np.ndarray) -> None:
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"X and Y must have the same number of rows ({x.shape[0]} != {y.shape[0]})")


def center(x: np.ndarray) -> np.ndarray:
    """Subtract the column means."""
    x = _as64(x)
    return x - x.mean(axis=0, keepdims=True)


def linear_cka(x: np.ndarray, y: np.ndarray) -> float:
    """Linear CKA (Kornblith et al. 2019): ||Y'X||_F^2 / (||X'X||_F ||Y'Y||_F) on centred features."""
    x, y = center(x), center(y)
    _check_pair(x, y)
    cross = np.linalg.norm(y.T @ x, "fro") ** 2
    denom = np.linalg.norm(x.T @ x, "fro") * np.linalg.norm(y.T @ y, "fro")
    return float(cross / denom) if denom > 0 else float("nan")


def _hsic_unbiased_terms(x: np.ndarray, y: np.ndarray) -> float:
    """Unbiased HSIC (Song et al. 2012) with linear kernels, computed without Gram matrices.

    With K = XX', L = YY' and K~, L~ their copies with a zero diagonal:
    HSIC = [tr(K~L~) + (1'K~1)(1'L~1)/((n-1)(n-2)) - 2/(n-2) 1'K~L~1] / (n(n-3)).
    """
    n = x.shape[0]
    if n < 4:
        raise ValueError("debiased CKA needs at least 4 items")
    kx = np.einsum("ij,ij->i", x, x)  # diag(K)
    ly = np.einsum("ij,ij->i", y, y)  # diag(L)
    sx, sy = x.sum(0), y.sum(0)
    tr_kl = np.linalg.norm(y.T @ x, "fro") ** 2 - float(kx @ ly)
    k1 = x @ sx - kx  # K~ 1
    l1 = y @ sy - ly  # L~ 1
    sum_k, sum_l = float(k1.sum()), float(l1.sum())
    return (tr_kl + sum_k * sum_l / ((n - 1) * (n - 2)) - 2.0 / (n - 2) * float(k1 @ l1)) / (n * (n - 3))


def debiased_cka(x: np.ndarray, y: np.ndarray) -> float:
    """Debiased linear CKA (Nguyen et al. 2021): CKA with the unbiased HSIC estimator.

    Less inflated than linear CKA when the dimension is large relative to the number of items.
    """
    x, y = center(x), center(y)
    _check_pair(x, y)
    xy = _hsic_unbiased_terms(x, y)
    xx = _hsic_unbiased_terms(x, x)
    yy = _hsic_unbiased_terms(y, y)
    denom = np.sqrt(xx * yy) if xx > 0 and yy > 0 else 0.0
    return float(xy / denom) if denom > 0 else float("nan")


def cosine_similarity_upper(x: np.ndarray) -> np.ndarray:
    """Upper triangle (k=1) of the items' cosine-similarity matrix, as a flat vector (Merchant et al.)."""
    x = _as64(x)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    xn = x / np.where(norms > 0, norms, 1.0)
    sim = xn @ xn.T
    iu = np.triu_indices(x.shape[0], k=1)
    return sim[iu]


def _zscore(v: np.ndarray) -> np.ndarray:
    v = v - v.mean()
    n = np.linalg.norm(v)
    return v / n if n > 0 else v


def rsa(x: np.ndarray, y: np.ndarray, method: str = "pearson") -> float:
    """RSA: correlation of the upper triangles of the two cosine-similarity matrices."""
    _check_pair(_as64(x), _as64(y))
    a, b = cosine_similarity_upper(x), cosine_similarity_upper(y)
    if method == "spearman":
        a, b = rankdata(a), rankdata(b)
    elif method != "pearson":
        raise ValueError(f"method must be 'pearson' or 'spearman', not {method!r}")
    return float(_zscore(a) @ _zscore(b))


def rsa_signatures(x: np.ndarray) -> dict[str, np.ndarray]:
    """Normalised similarity vectors of one layer, so a layer x layer RSA grid is just dot products."""
    upper = cosine_similarity_upper(x)
    return {"pearson": _zscore(upper), "spearman": _zscore(rankdata(upper))}
