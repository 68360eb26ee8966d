"""How often the seed-noise rule fires when nothing changed, under three nulls (simulation).

The rule: exact one-sided Mann-Whitney of the k base-vs-tuned magnitudes against the k(k-1)/2 seed-vs-seed
distances, p <= alpha. Nulls, with models as points in a ``dim``-dimensional space:

- ``exchangeable distances``: all k + k(k-1)/2 distances i.i.d. (the rule's stated null: rate = attained level);
- ``centre``: base = 0, tuned seed s = eps_s (fine-tuning moves each seed in its own random direction,
  no shared change): the base sits in the middle of the seeds, so its distances are shorter;
- ``base is another seed``: base and tuned seeds are k + 1 i.i.d. points (the base is exchangeable with them).

Run: PYTHONPATH=src python benchmarks/seed_noise_null.py [--n 20000]
"""
from __future__ import annotations

import argparse
from math import comb

import numpy as np
from scipy.stats import mannwhitneyu

from bertology.studies.noise import attained_level


def rate(bt: np.ndarray, ss: np.ndarray, alpha: float) -> float:
    p = mannwhitneyu(bt, ss, alternative="greater", method="exact", axis=1).pvalue
    return float((p <= alpha).mean())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=20000)
    parser.add_argument("--alpha", type=float, default=0.05)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    print("| k | attained level | exchangeable distances | centre, dim 1 | centre, dim 64 | base is a seed, dim 1 | base is a seed, dim 64 |")
    print("|---|---|---|---|---|---|---|")
    for k in (3, 4, 5):
        iu = np.triu_indices(k, 1)
        row = [attained_level(k, comb(k, 2), args.alpha)]
        row.append(rate(rng.random((args.n, k)), rng.random((args.n, comb(k, 2))), args.alpha))
        for dim in (1, 64):
            x = rng.standard_normal((args.n, k, dim))
            row.append(rate(np.linalg.norm(x, axis=-1), np.linalg.norm(x[:, iu[0]] - x[:, iu[1]], axis=-1), args.alpha))
        for dim in (1, 64):
            pts = rng.standard_normal((args.n, k + 1, dim))
            bt = np.linalg.norm(pts[:, 1:] - pts[:, :1], axis=-1)
            ss = np.linalg.norm(pts[:, 1:][:, iu[0]] - pts[:, 1:][:, iu[1]], axis=-1)
            row.append(rate(bt, ss, args.alpha))
        print(f"| {k} | " + " | ".join(f"{v:.4f}" for v in row) + " |")


if __name__ == "__main__":
    main()
