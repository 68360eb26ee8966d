"""Bootstrap resamples as example weights: the one source of every paired-bootstrap interval.

A resample of ``n`` examples drawn with replacement is the same as multinomial counts over the
examples; a weighted statistic under those counts equals the statistic of the repeated sample. The
ablation sweep (deltas of many units on shared resamples) and the fine-tuning lab's final metrics use
the same counts, so an interval means the same thing everywhere.
"""
from __future__ import annotations

import numpy as np


def bootstrap_counts(n: int, n_bootstrap: int, seed: int) -> np.ndarray:
    """``[n_bootstrap, n]`` multinomial counts: how often each example is drawn in each resample."""
    rng = np.random.default_rng(seed)
    return rng.multinomial(n, np.full(n, 1.0 / n), size=n_bootstrap).astype(np.float32)


def percentile_interval(samples: np.ndarray, level: float = 0.95) -> tuple[float, float]:
    """The percentile interval of bootstrap ``samples`` (NaNs, e.g. an undefined correlation, are left out)."""
    s = np.asarray(samples, dtype=np.float64)
    s = s[np.isfinite(s)]
    if s.size == 0:
        return float("nan"), float("nan")
    tail = 100 * (1 - level) / 2
    return float(np.percentile(s, tail)), float(np.percentile(s, 100 - tail))
