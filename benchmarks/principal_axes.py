"""Leading principal axes by Lanczos vs the dense eigensolver, at BERT-base sizes (issue 18).

``pca_views``' 39 fits (13 layers x per-model and shared: ~460 and ~920 tokens x 768) and ``geometry``'s MEV
baseline (2 models x 13 layers, 500 tokens x 768 each) on seeded anisotropic clouds shaped like BERT's hidden
states (a common mean 10x the spread, a decaying spectrum). Both routes of
:func:`bertology.metrics.principal.top_eigenpairs` alternately, on one BLAS thread as ``compare`` runs them
(the dense one by raising ``DENSE_UP_TO``), with the largest difference of their results::

    PYTHONPATH=src python benchmarks/principal_axes.py --rounds 5
"""
from __future__ import annotations

import argparse
import time

import numpy as np
from threadpoolctl import threadpool_limits

import bertology.metrics.geometry as geometry
import bertology.metrics.principal as principal
from bertology.analyses.pca_views import leading_pca
from bertology.metrics.geometry import max_explainable_variance


def cloud(rng: np.random.Generator, n: int, dim: int = 768) -> np.ndarray:
    """Anisotropic float32-valued tokens: mean 10x the spread, spectrum decaying as 1 / (i + 1)."""
    spread = 1.0 / np.sqrt(np.arange(1, dim + 1))
    mean = 10.0 * rng.standard_normal(dim) * spread.mean()
    return (rng.standard_normal((n, dim)) * spread + mean).astype(np.float32).astype(np.float64)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    fits = []
    for _ in range(13):
        a, b = cloud(rng, 460), cloud(rng, 460)
        fits += [a, b, np.concatenate([a, b])]
    stacks = np.stack([np.stack([cloud(rng, 500) for _ in range(13)]) for _ in range(2)])  # [2, 13, 500, 768]

    def run() -> tuple[float, float, list, np.ndarray]:
        t = time.perf_counter()
        pca = [leading_pca(x) for x in fits]
        t_pca = time.perf_counter() - t
        t = time.perf_counter()
        mev = max_explainable_variance(stacks)
        return t_pca, time.perf_counter() - t, pca, mev

    times: dict[str, list[tuple[float, float]]] = {"lanczos": [], "dense": []}
    results = {}
    with threadpool_limits(1, user_api="blas"):
        for r in range(args.rounds + 1):  # the first round warms up
            for route in ("lanczos", "dense") if r % 2 == 0 else ("dense", "lanczos"):
                limit = principal.DENSE_UP_TO if route == "lanczos" else 10**9
                saved = principal.DENSE_UP_TO, geometry.DENSE_UP_TO
                principal.DENSE_UP_TO = geometry.DENSE_UP_TO = limit
                try:
                    t_pca, t_mev, pca, mev = run()
                finally:
                    principal.DENSE_UP_TO, geometry.DENSE_UP_TO = saved
                if r:
                    times[route].append((t_pca, t_mev))
                    print(f"round {r} {route}: pca_views fits {t_pca:.3f} s, MEV baseline {t_mev:.3f} s", flush=True)
                results[route] = (pca, mev)
    for i, what in enumerate(("pca_views fits (39)", "MEV baseline (26 stacks)")):
        lan = float(np.median([t[i] for t in times["lanczos"]]))
        den = float(np.median([t[i] for t in times["dense"]]))
        print(f"{what}: dense {den:.3f} s, Lanczos {lan:.3f} s (medians), Lanczos/dense {lan / den:.2f}")
    (pl, ml), (pd_, md) = results["lanczos"], results["dense"]
    axes = max(float(np.abs(a[1] - b[1]).max()) for a, b in zip(pl, pd_))
    ratios = max(float(np.abs(a[2] - b[2]).max()) for a, b in zip(pl, pd_))
    print(f"largest difference: PCA axes {axes:.1e}, explained-variance ratios {ratios:.1e}, "
          f"MEV {float(np.abs(ml - md).max()):.1e}")


if __name__ == "__main__":
    main()
