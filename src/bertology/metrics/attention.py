"""Comparisons of attention maps: cosine of flattened maps and Jensen-Shannon divergence of rows.

Torch functions over batched maps ``[..., q, k]`` (so they run on the extraction batch without a
copy) with a NumPy reference for tests. Rows are attention distributions over keys.
"""
from __future__ import annotations

import math

import numpy as np
import torch


def map_cosine(a: torch.Tensor, b: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """Cosine similarity of the flattened ``[q, k]`` maps (Kovaleva et al. 2019), over leading dims."""
    a = a.flatten(-2).double()
    b = b.flatten(-2).double()
    num = (a * b).sum(-1)
    den = a.norm(dim=-1) * b.norm(dim=-1)
    return num / den.clamp_min(eps)


def js_divergence(p: torch.Tensor, q: torch.Tensor, base: float = 2.0) -> torch.Tensor:
    """Jensen-Shannon divergence between distributions along the last dim (0 = equal, 1 = disjoint in base 2)."""
    p = p.double()
    q = q.double()
    m = 0.5 * (p + q)
    # xlogy gives 0*log(0) = 0; entries where m == 0 have p == q == 0.
    kl_pm = (torch.xlogy(p, p) - torch.xlogy(p, m)).sum(-1)
    kl_qm = (torch.xlogy(q, q) - torch.xlogy(q, m)).sum(-1)
    js = 0.5 * (kl_pm + kl_qm) / math.log(base)
    return js.clamp_min(0.0)


def js_divergence_np(p: np.ndarray, q: np.ndarray, base: float = 2.0) -> float:
    """Reference JS divergence of two 1-D distributions via scipy's Jensen-Shannon distance."""
    from scipy.spatial.distance import jensenshannon

    return float(jensenshannon(p, q, base=base) ** 2)
