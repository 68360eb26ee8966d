"""Why the RSA cosines are read off the unit-row product ``Xn Xn'`` and ``K = X X'`` derived from it (issue 18).

Cosines computed the other way, ``K_ij / (|x_i| |x_j|)`` from ``x @ x.T``, are not the same bits: this counts
how many differ, by how much, and how many Spearman ranks move, on three layers of
``analysis_compute.vectors()`` (2,000 tokens x 768, anisotropic, repeated rows)::

    PYTHONPATH=src python benchmarks/cosine_route.py
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from analysis_compute import vectors  # noqa: E402

from bertology.metrics.similarity import average_ranks, strict_upper  # noqa: E402


def main() -> None:
    rng = np.random.default_rng(0)
    for layer in range(3):
        x = vectors(rng, 2000).astype(np.float64)
        norms = np.linalg.norm(x, axis=1, keepdims=True)
        xn = x / norms
        unit = strict_upper(xn @ xn.T)
        scaled = strict_upper(x @ x.T / norms / norms.T)
        diff = np.abs(unit - scaled)
        ra, rb = average_ranks(unit), average_ranks(scaled)
        print(f"layer {layer}: cosines differing {np.mean(unit != scaled):.3f}, max |diff| {diff.max():.2e} "
              f"({diff.max() / np.spacing(1.0):.1f} ulp of 1), ranks changed {(ra != rb).sum()} of {unit.size}, "
              f"max |rank change| {np.abs(ra - rb).max()}")


if __name__ == "__main__":
    main()
