"""Minimum description length of labels given representations: Voita & Titov 2020's online code.

The labels ``y`` of ``N`` examples are sent block by block. The first block (``t_1`` examples) costs
``t_1 log2 K`` bits (the uniform code over ``K`` labels); every later block ``(t_i, t_{i+1}]`` costs
``-sum log2 p(y | x)`` under a probe trained on the first ``t_i`` examples. The online codelength is the sum;
compression is ``N log2 K`` (the uniform code of every label) divided by it. A representation from which
the labels are easy to learn compresses them more: unlike a probe's accuracy, the codelength also counts how
much data the probe needed to get there.

Written by hand because no maintained library implements the online code; the probe (``fit_predict``) is
the caller's (scikit-learn's logistic regression in :mod:`bertology.experiments.token_probe`).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

#: The block ends of Voita & Titov 2020 (section 3.2), in percent of the data.
BLOCK_PERCENTS = (0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 6.25, 12.5, 25.0, 50.0, 100.0)

#: ``fit_predict(x_train, y_train, x_eval, K) -> [len(x_eval), K]`` probabilities over the label ids 0..K-1.
FitPredict = Callable[[np.ndarray, np.ndarray, np.ndarray, int], np.ndarray]

#: The probability a probe may give a label at least (a label it has never seen would cost infinite bits).
MIN_PROBABILITY = 1e-12


def block_ends(n: int, percents: Sequence[float] = BLOCK_PERCENTS) -> list[int]:
    """The example counts ``t_1 < t_2 < ... < t_S = n`` at the block ends: each percent of ``n``, rounded down,
    at least 1, duplicates dropped (on small data the first blocks are empty and merge)."""
    if n < 1:
        raise ValueError("the online code needs at least one example")
    ends = sorted({max(1, min(n, int(n * p / 100.0))) for p in percents} | {n})
    return ends


def uniform_codelength(n: int, n_labels: int) -> float:
    """``n log2 K`` bits: every label sent with the uniform code over ``K`` labels."""
    return float(n) * math.log2(n_labels) if n_labels > 1 else 0.0


def online_codelength(x: np.ndarray, y: np.ndarray, n_labels: int, fit_predict: FitPredict,
                      percents: Sequence[float] = BLOCK_PERCENTS) -> dict:
    """The online code of labels ``y`` (ids 0..K-1) given features ``x``, in the order given (shuffle first).

    Returns ``bits`` (the online codelength), ``uniform_bits`` (``N log2 K``), ``compression`` (their ratio) and
    ``blocks`` (each block's end and bits). A block whose training part holds one label only is coded with
    that label's share (no classifier can be fitted on one class).
    """
    n = len(y)
    ends = block_ends(n, percents)
    first = ends[0]
    blocks = [{"end": first, "bits": uniform_codelength(first, n_labels)}]
    for start, end in zip(ends[:-1], ends[1:]):
        proba = _block_probabilities(x[:start], y[:start], x[start:end], n_labels, fit_predict)
        p = np.clip(proba[np.arange(end - start), y[start:end]], MIN_PROBABILITY, 1.0)
        blocks.append({"end": end, "bits": float(-np.log2(p).sum())})
    bits = float(sum(b["bits"] for b in blocks))
    uniform = uniform_codelength(n, n_labels)
    return {"bits": bits, "uniform_bits": uniform, "compression": uniform / bits if bits > 0 else float("inf"),
            "blocks": blocks}


def _block_probabilities(x_train: np.ndarray, y_train: np.ndarray, x_eval: np.ndarray, n_labels: int,
                         fit_predict: FitPredict) -> np.ndarray:
    """``[len(x_eval), K]`` probabilities of a probe trained on the block's past; one label seen: a point mass
    smoothed like a count (add-one over the K labels), since no classifier fits one class."""
    seen = np.unique(y_train)
    if seen.size == 1:
        counts = np.ones(n_labels)
        counts[seen[0]] += len(y_train)
        return np.tile(counts / counts.sum(), (len(x_eval), 1))
    return fit_predict(x_train, y_train, x_eval, n_labels)
