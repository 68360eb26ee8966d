"""How much one weight matrix changed: relative Frobenius change, the difference's spectrum, intruder dimensions.

Pure functions on two tensors of one shape (the base's and the tuned model's weight), no model code:

- **relative change** ``||W_t - W_b||_F / ||W_b||_F`` (None when the base is all zeros);
- **stable rank** of the difference ``D = W_t - W_b``: ``||D||_F^2 / ||D||_2^2`` (between 1 for a rank-one
  change and ``rank(D)`` for a change spread evenly over its directions; None when ``D`` is zero), and ``D``'s
  leading singular values;
- **intruder dimensions** (Shuttleworth et al. 2024, "LoRA vs Full Fine-tuning: An Illusion of Equivalence"): a
  left singular vector ``y_j`` of ``W_t`` is an intruder when ``max_i |cos(y_j, x_i)| < epsilon`` over every left
  singular vector ``x_i`` of ``W_b``; counted among ``W_t``'s top ``k`` by singular value.

Precision: the norms are float64 sums; the SVDs run in float32 (weights are stored in float32 or narrower, so
the difference of two of them is exact in float32 up to one rounding, and a float32 SVD's singular values
carry an absolute error of about 1e-7 x ||D||_2, far below the leading values reported; float64 would
double the time of the largest SVDs, the word embeddings', for digits nobody reads).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["MatrixChange", "intruder_alignment", "left_singular_vectors", "matrix_change", "relative_change",
           "singular_values", "stable_rank"]


@dataclass(frozen=True)
class MatrixChange:
    """One unit's numbers (None where a number does not exist: a vector has no spectrum, a zero base no ratio)."""

    relative_change: float | None
    delta_norm: float
    base_norm: float
    stable_rank: float | None = None
    singular_values: tuple[float, ...] = ()
    intruders: int | None = None
    top_k: int | None = None
    alignment_min: float | None = None


def relative_change(base: torch.Tensor, tuned: torch.Tensor) -> tuple[float | None, float, float]:
    """``(||T - B||_F / ||B||_F, ||T - B||_F, ||B||_F)`` in float64; the ratio is None when ``B`` is zero."""
    b, t = base.detach().to(torch.float64), tuned.detach().to(torch.float64)
    delta, norm = float(torch.linalg.vector_norm(t - b)), float(torch.linalg.vector_norm(b))
    return (delta / norm if norm > 0 else None), delta, norm


def stable_rank(singular_values: torch.Tensor) -> float | None:
    """``sum(s^2) / max(s)^2``: the stable rank of a matrix with these singular values (None for a zero matrix)."""
    s = singular_values.detach().to(torch.float64)
    top = float(s.max()) if s.numel() else 0.0
    return float((s**2).sum()) / top**2 if top > 0 else None


def intruder_alignment(base: torch.Tensor, tuned: torch.Tensor, k: int) -> torch.Tensor:
    """For each of ``tuned``'s top ``k`` left singular vectors, its largest ``|cos|`` with any of ``base``'s.

    Left singular vectors (columns of ``U``) of the weights as stored (``[out, in]`` for a Linear), as PEFT's
    ``reduce_intruder_dimension`` and a public script for the paper's experiments compare them; unit vectors,
    so ``|U_t^T U_b|`` is the cosine.
    Returns ``min(k, min(shape))`` values, in the order of ``tuned``'s singular values.
    """
    u_b = left_singular_vectors(base)
    u_t = left_singular_vectors(tuned)[:, :k]
    return (u_t.T @ u_b).abs().amax(dim=1)


def _tall(w: torch.Tensor) -> torch.Tensor:
    """``w`` in float32, transposed when it has fewer rows than columns (a view, no copy)."""
    w = w.detach().float()
    return w.T if w.shape[0] < w.shape[1] else w


def left_singular_vectors(w: torch.Tensor) -> torch.Tensor:
    """``U`` of the thin SVD of ``w`` (float32), by singular value; a wide matrix goes through its transpose
    (``U`` of ``w`` is ``V`` of ``w.T``), which LAPACK finishes 2-3 times faster (measured at 768 x 3072)."""
    if w.shape[0] < w.shape[1]:
        return torch.linalg.svd(w.detach().float().T, full_matrices=False).Vh.T
    return torch.linalg.svd(w.detach().float(), full_matrices=False).U


def singular_values(w: torch.Tensor) -> torch.Tensor:
    """Singular values of ``w`` in float32, largest first (through the tall orientation, as above)."""
    return torch.linalg.svdvals(_tall(w))


def matrix_change(base: torch.Tensor, tuned: torch.Tensor, *, n_singular: int = 3, k: int = 10,
                  epsilon: float = 0.5) -> MatrixChange:
    """Every number of one unit: the relative change; for a matrix also the difference's stable rank and leading
    ``n_singular`` singular values, and the intruder count among ``tuned``'s top ``k`` (threshold ``epsilon``)."""
    if base.shape != tuned.shape:
        raise ValueError(f"shapes differ: {tuple(base.shape)} vs {tuple(tuned.shape)}")
    ratio, delta_norm, base_norm = relative_change(base, tuned)
    if base.ndim != 2:
        return MatrixChange(ratio, delta_norm, base_norm)
    s = singular_values(tuned.detach().float() - base.detach().float())
    align = intruder_alignment(base, tuned, k)
    return MatrixChange(
        ratio, delta_norm, base_norm, stable_rank(s) if delta_norm > 0 else None,
        tuple(float(v) for v in s[:n_singular]), int((align < epsilon).sum()), int(align.numel()),
        float(align.min()) if align.numel() else None,
    )
