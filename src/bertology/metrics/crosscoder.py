"""Crosscoder read-outs: relative decoder norms, latent kinds, Latent Scaling (pure maths on arrays).

* **relative norm** (Lindsey et al. 2024): ``||d_tuned|| / (||d_base|| + ||d_tuned||)`` of a latent's two decoder
  vectors: about 0.5 for a latent both models use, near 1 for one only the tuned model writes, near 0 for base only;
* **kind**: ``tuned_only`` when the relative norm is at least ``threshold``, ``base_only`` when at most
  ``1 - threshold``, else ``shared``;
* **Latent Scaling** (Minder et al. 2025, "Robustly identifying concepts introduced during chat fine-tuning using
  crosscoders"): for latent ``j`` with tuned decoder vector ``d`` and activation ``f_j``, the least-squares scale
  ``beta = sum_i f_ij <d, y_i> / (||d||^2 sum_i f_ij^2)`` with which ``f_j d`` explains a target ``y``. Targets: a
  model's **reconstruction** ``y = x_hat`` (the crosscoder's full output for that model) and its **error** with the
  latent's own part put back, ``y = x - (x_hat - f_j d_model_j)``. The ratios ``nu_r = beta_r(base) / beta_r(tuned)``
  and ``nu_eps = beta_eps(base) / beta_eps(tuned)``: a latent the base model carries as well (its activation
  explained by other latents: latent decoupling; or left in the base error: complete shrinkage) has a ratio near 1;
  a latent truly specific to the tuned model has both near 0.
"""
from __future__ import annotations

import numpy as np

KINDS = ("shared", "base_only", "tuned_only")


def relative_norm(norms: np.ndarray) -> np.ndarray:
    """``[m, 2]`` decoder norms (base, tuned) -> ``[m]`` tuned / (base + tuned); NaN where both are 0."""
    norms = np.asarray(norms, dtype=np.float64)
    total = norms.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, norms[:, 1] / total, np.nan)


def latent_kinds(rel: np.ndarray, threshold: float) -> np.ndarray:
    """Each latent's kind from its relative norm: tuned_only (>= threshold), base_only (<= 1 - threshold), shared."""
    rel = np.asarray(rel, dtype=np.float64)
    out = np.full(rel.shape, "shared", dtype=object)
    out[rel >= threshold] = "tuned_only"
    out[rel <= 1.0 - threshold] = "base_only"
    return out


def decoder_cosine(decoders: np.ndarray) -> np.ndarray:
    """``[m, 2, d]`` decoder vectors -> ``[m]`` cosine of each latent's base and tuned vectors (NaN for a zero one)."""
    dec = np.asarray(decoders, dtype=np.float64)
    num = (dec[:, 0] * dec[:, 1]).sum(axis=1)
    den = np.linalg.norm(dec[:, 0], axis=1) * np.linalg.norm(dec[:, 1], axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / den, np.nan)


def scaling_beta(numerator: np.ndarray, sum_f2: np.ndarray, direction_norm2: np.ndarray) -> np.ndarray:
    """Latent Scaling's closed form ``sum f <d, y> / (||d||^2 sum f^2)``; NaN for a latent that never fired."""
    den = np.asarray(direction_norm2, dtype=np.float64) * np.asarray(sum_f2, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, np.asarray(numerator, dtype=np.float64) / den, np.nan)


def scaling_ratio(base_beta: np.ndarray, tuned_beta: np.ndarray) -> np.ndarray:
    """``nu = beta(base) / beta(tuned)``; NaN where the tuned model's beta is 0 or unknown."""
    base_beta, tuned_beta = np.asarray(base_beta, dtype=np.float64), np.asarray(tuned_beta, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(tuned_beta != 0, base_beta / tuned_beta, np.nan)


def tuned_only_verdict(kind: np.ndarray, nu_error: np.ndarray, nu_reconstruction: np.ndarray,
                       nu_max: float) -> np.ndarray:
    """A latent is called tuned-only only when its decoder says so (kind ``tuned_only``) **and** the base model's
    activation does not carry it: both Latent Scaling ratios below ``nu_max``. Object array: True/False for the
    tuned_only latents, None for the others (the rule does not apply); a latent whose ratios are unknown (never
    fired) is not called tuned-only."""
    kind = np.asarray(kind, dtype=object)
    ok = (np.nan_to_num(nu_error, nan=np.inf) < nu_max) & (np.nan_to_num(nu_reconstruction, nan=np.inf) < nu_max)
    out = np.full(kind.shape, None, dtype=object)
    tuned = kind == "tuned_only"
    out[tuned] = ok[tuned]
    return out


def fraction_of_variance_explained(sse: float, sum_sq: float, sum_x: np.ndarray, n: int) -> float:
    """``1 - SSE / total variance``; total variance ``sum ||x||^2 - ||sum x||^2 / n`` over ``n`` vectors."""
    total = float(sum_sq) - float(np.dot(sum_x, sum_x)) / max(int(n), 1)
    return float(1.0 - sse / total) if total > 0 else float("nan")
