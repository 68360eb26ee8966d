"""Geometry of contextual representations (Ethayarajh 2019): anisotropy, self-similarity, MEV.

Pure functions on NumPy arrays, float64 throughout. Rows are vectors (token representations).
"""
from __future__ import annotations

import numpy as np


def _as64(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError(f"expected a 2-D array [n, dim], got shape {x.shape}")
    return x


def unit_rows(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit L2 norm (float64); zero rows stay zero (their cosine with anything is 0)."""
    x = _as64(x)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.where(norms > 0, norms, 1.0)


def pair_cosines(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Cosine of row i of ``x`` with row i of ``y``, for every i (float64 vector)."""
    x, y = _as64(x), _as64(y)
    if x.shape != y.shape:
        raise ValueError(f"x and y must have the same shape ({x.shape} != {y.shape})")
    return np.einsum("ij,ij->i", unit_rows(x), unit_rows(y))


def mean_pair_cosine(x: np.ndarray, y: np.ndarray) -> float:
    """Mean cosine of row i of ``x`` with row i of ``y``.

    With rows drawn at random from different sentences this is Ethayarajh's anisotropy baseline.
    NaN when there are no rows.
    """
    c = pair_cosines(x, y)
    return float(c.mean()) if c.size else float("nan")
