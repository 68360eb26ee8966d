"""Leading principal axes of a centred data matrix, by Lanczos iteration (ARPACK) when it is large.

PCA views (van Aken et al.) and the MEV baseline (Ethayarajh) need the one or two leading eigenpairs of
``Xc' Xc`` for clouds of hundreds of tokens in hundreds of dimensions (768 at BERT-base). The dense route
forms the smaller of ``Xc Xc'`` and ``Xc' Xc`` and tridiagonalises all of it, ``O(s^2 l + s^3)`` for sides
``s <= l``; Lanczos (``scipy.sparse.linalg.eigsh``, ARPACK) only multiplies by ``Xc`` and ``Xc'``, ``O(s l)`` per
step. Measured on captured BERT-base clouds (460-920 tokens x 768, one BLAS thread): PCA views' 39 fits
0.87 -> 0.35 s, the MEV baseline's 26 stacks 0.43 -> 0.19 s; on synthetic ones of that shape 0.19x and 0.24x
(``benchmarks/principal_axes.py``; ``docs/results/benchmarks.md``). :func:`top_eigenpairs_torch` is the
same solve in torch for tensors on a GPU, a full ``eigh`` there.

Accuracy: ARPACK runs to ``tol=0``, i.e. a residual ``|A v - lambda v|`` of about machine epsilon times
``lambda``, as a dense solver's: eigenvalues to ``~eps sigma_1^2``, an axis to ``~eps sigma_1^2 / gap``. So the
two routes agree to rounding wherever the axes are determined at all (tested against the dense route and
scikit-learn's full SVD). The start vector is a fixed pseudo-random one, and restarts draw from a seeded
generator, so a fit is deterministic (the all-ones start vector would be exactly in the null space of a
centred Gram matrix). Small matrices (smaller side up to :data:`DENSE_UP_TO`), and any case ARPACK does not
converge on, take the dense route.
"""
from __future__ import annotations

import inspect

import numpy as np
import scipy.linalg
import torch
from scipy.sparse.linalg import ArpackError, ArpackNoConvergence, LinearOperator, eigsh

#: Up to this smaller side the dense eigensolver is used: it takes well under a millisecond there, less than
#: ARPACK's Python round trips.
DENSE_UP_TO = 128
_TAKES_RNG = "rng" in inspect.signature(eigsh).parameters


def _start_vector(size: int) -> np.ndarray:
    """A fixed start vector for Lanczos (the same in every call and process)."""
    return np.random.default_rng(0x5EED).standard_normal(size)


def _lanczos(xc: np.ndarray, k: int, gram_side: bool, vectors: bool):
    """ARPACK's ``k`` largest eigenpairs of ``Xc Xc'`` (``gram_side``) or ``Xc' Xc``, ascending; None if it fails."""
    size = xc.shape[0] if gram_side else xc.shape[1]
    xt = xc.T
    if gram_side:
        def product(u: np.ndarray) -> np.ndarray:
            return xc @ (xt @ u)
    else:
        def product(u: np.ndarray) -> np.ndarray:
            return xt @ (xc @ u)
    op = LinearOperator((size, size), matvec=product, dtype=np.float64)
    # A restart (an invariant subspace found, e.g. a rank below k) draws a random vector: from a seeded generator
    # where eigsh takes one (its ``rng``), not from the OS's entropy (older SciPy: ARPACK's own generator).
    seeded = {"rng": np.random.default_rng(0x5EED)} if _TAKES_RNG else {}
    try:
        return eigsh(op, k=k, which="LA", tol=0, v0=_start_vector(size), return_eigenvectors=vectors, **seeded)
    except (ArpackNoConvergence, ArpackError):
        return None


def top_eigenpairs(xc: np.ndarray, k: int, vectors: bool = True) -> tuple[np.ndarray, np.ndarray | None]:
    """The ``k`` largest eigenvalues of ``Xc' Xc`` (descending, clipped at 0) and, with ``vectors``, their unit
    eigenvectors as rows ``[k, dim]`` (signs as the solver gives them).

    ``xc`` ``[n, dim]`` float64, usually centred; ``k <= min(n, dim)``. The eigenproblem is solved on the smaller
    side (from the Gram side an axis is ``Xc' u / sqrt(lambda)``). An axis whose eigenvalue is at the rounding
    level (``<= max(n, dim) eps lambda_1``: the cloud's rank is below ``k``) is returned as zeros: it is not
    determined (from the Gram side the quotient would be noise), and it projects every point to ~0 anyway.
    """
    n, dim = xc.shape
    if not 1 <= k <= min(n, dim):
        raise ValueError(f"cannot find {k} eigenpairs of a {n} x {dim} matrix")
    gram_side = n <= dim
    size = min(n, dim)
    iterate = size > DENSE_UP_TO and k < size and np.any(xc)  # ARPACK needs k < size and a nonzero operator
    found = _lanczos(xc, k, gram_side, vectors) if iterate else None
    if found is None:
        mat = xc @ xc.T if gram_side else xc.T @ xc
        found = scipy.linalg.eigh(mat, subset_by_index=[size - k, size - 1], eigvals_only=not vectors)
    w, u = (found, None) if not vectors else found
    w = np.clip(w[::-1], 0.0, None)
    if not vectors:
        return w, None
    u = u[:, ::-1]
    real = w > max(n, dim) * np.finfo(float).eps * w[0]
    with np.errstate(invalid="ignore", divide="ignore"):
        axes = (xc.T @ u).T / np.sqrt(np.where(real, w, 1.0))[:, None] if gram_side else u.T
    return w, np.ascontiguousarray(np.where(real[:, None], axes, 0.0))


def top_eigenpairs_torch(xc: torch.Tensor, k: int, vectors: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`top_eigenpairs` in torch on ``xc``'s device (PCA where the maps are), batched over leading axes.

    ``xc`` ``[..., n, dim]`` float64; returns the ``k`` largest eigenvalues of ``Xc' Xc`` ``[..., k]`` (descending,
    clipped at 0) and, with ``vectors``, their unit eigenvectors as rows ``[..., k, dim]``, zeros where the eigenvalue
    is at the rounding level, by the same rule and from the same (smaller) side as :func:`top_eigenpairs`. The
    solver differs (``torch.linalg.eigh`` of the whole ``s x s`` matrix: on a GPU it costs milliseconds at 768,
    and there is no Lanczos there), the accuracy does not: eigenvalues to ``~eps sigma_1^2``, an axis to
    ``~eps sigma_1^2 / gap``; signs are as the solver gives them. Nothing is copied to the host (on CUDA, ``eigh``
    waits for the device once per call to check its result: a synchronisation, not a copy).
    """
    n, dim = xc.shape[-2:]
    if not 1 <= k <= min(n, dim):
        raise ValueError(f"cannot find {k} eigenpairs of a {n} x {dim} matrix")
    gram_side = n <= dim
    xt = xc.transpose(-1, -2)
    mat = xc @ xt if gram_side else xt @ xc
    if not vectors:
        return torch.linalg.eigvalsh(mat)[..., -k:].flip(-1).clamp_min(0.0), None
    w, u = torch.linalg.eigh(mat)
    w, u = w[..., -k:].flip(-1).clamp_min(0.0), u[..., -k:].flip(-1)  # [..., k], [..., s, k]
    real = w > max(n, dim) * np.finfo(float).eps * w[..., :1]
    if gram_side:
        axes = (xt @ u).transpose(-1, -2) / torch.sqrt(torch.where(real, w, 1.0))[..., None]
    else:
        axes = u.transpose(-1, -2)
    return w, torch.where(real[..., None], axes, 0.0).contiguous()
