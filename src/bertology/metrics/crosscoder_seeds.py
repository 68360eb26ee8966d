"""Do tuned-only crosscoder latents recur across fine-tuning seeds? (pure maths on decoder directions).

Rule (a **task feature**): a tuned-only latent of seed ``s`` (its tuned-side decoder direction ``u``, unit length)
*recurs* in another seed ``t`` when its **best-match cosine** ``max_v <u, v>`` over the tuned-only directions ``v``
of ``t``'s crosscoder (same task, same layer) is at least ``threshold``; it is a task feature when it recurs in at
least ``m`` of the other seeds. Best match, not a one-to-one (Hungarian) assignment: a feature one seed's dictionary
holds as one latent another may split into two (feature splitting), and the question is whether the direction is
there at all, not how the dictionaries pair up. The cosine is signed: decoder directions are written by
non-negative activations, so ``-u`` is another feature.

The **threshold comes from a null**: the same best-match cosine of one random unit direction against ``n`` random
unit directions in ``dim`` dimensions (the other seed's count and the model's width), drawn ``draws`` times; the
threshold is the ``1 - alpha`` quantile of that distribution. On the null a single comparison exceeds it with
probability about ``alpha``, so a latent recurring in ``m`` seeds by chance has probability at most about ``alpha``
(at most ``alpha ** m`` for independent seeds).
"""
from __future__ import annotations

import numpy as np

ALPHA = 0.05
DRAWS = 2000


def unit_rows(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (a zero row stays zero)."""
    x = np.asarray(x, dtype=np.float64)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return np.divide(x, norms, out=np.zeros_like(x), where=norms > 0)


def best_match_cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``[n_a, d]``, ``[n_b, d]`` -> ``[n_a]``: each row of ``a``'s largest cosine with a row of ``b`` (NaN if b is empty)."""
    a, b = unit_rows(a), unit_rows(b)
    if len(b) == 0:
        return np.full(len(a), np.nan)
    return (a @ b.T).max(axis=1)


def random_directions(n: int, dim: int, rng: np.random.Generator) -> np.ndarray:
    """``n`` directions uniform on the unit sphere of ``R^dim`` (normalised Gaussians)."""
    return unit_rows(rng.standard_normal((n, dim)))


def null_threshold(n: int, dim: int, *, alpha: float = ALPHA, draws: int = DRAWS, seed: int = 0) -> float:
    """The ``1 - alpha`` quantile of the best-match cosine of a random unit direction against ``n`` random ones."""
    if n <= 0:
        return float("nan")
    rng = np.random.default_rng(seed)
    one = random_directions(draws, dim, rng)
    other = random_directions(n, dim, rng)
    return float(np.quantile(best_match_cosines(one, other), 1.0 - alpha))


def recurrence(directions: dict[int, np.ndarray], *, alpha: float = ALPHA, draws: int = DRAWS,
               seed: int = 0) -> dict[int, dict]:
    """Per seed: ``best`` ``{other seed: [n] best-match cosines}``, ``thresholds`` ``{other seed: null threshold}``
    and ``recurs_in`` (``[n]`` how many other seeds each latent recurs in). ``directions``: seed -> ``[n, dim]``."""
    out: dict[int, dict] = {}
    for s, mine in directions.items():
        best, thresholds = {}, {}
        recurs = np.zeros(len(mine), dtype=np.int64)
        for t, theirs in directions.items():
            if t == s:
                continue
            best[t] = best_match_cosines(mine, theirs)
            thresholds[t] = null_threshold(len(theirs), np.shape(mine)[1], alpha=alpha, draws=draws, seed=seed)
            recurs += np.nan_to_num(best[t], nan=-np.inf) >= thresholds[t]
        out[s] = {"best": best, "thresholds": thresholds, "recurs_in": recurs}
    return out
