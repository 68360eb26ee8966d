"""Compile bertology's Numba kernels once, so that the first analysis run does not pause for it.

The kernels (:mod:`bertology.metrics.attention`, :mod:`bertology.metrics.word_argmax`,
:mod:`bertology.metrics.head_distance`, the rank sort of :mod:`bertology.metrics.similarity`) are compiled
on first use and cached on disk next to their source (or in Numba's user cache when that folder is
read-only); the first compilation takes about 10 s on 2 CPU cores. ``make setup`` runs this module
after installing; in a container image, run ``python -m bertology.warmup`` at build time.
"""
from __future__ import annotations

import time

import numpy as np
import torch


def compile_kernels() -> float:
    """Run every kernel once on a tiny float32 input (the dtype of the attention maps); seconds taken."""
    from bertology.metrics.attention import layer_statistics
    from bertology.metrics.head_distance import pairwise_js_sums
    from bertology.metrics.similarity import average_ranks
    from bertology.metrics.word_argmax import word_argmax_hits

    start = time.perf_counter()
    maps = torch.softmax(torch.randn(2, 2, 5, 5, generator=torch.Generator().manual_seed(0)), -1)
    layer_statistics(maps, maps.flip(0), torch.ones(2, 5, dtype=torch.bool))
    pairwise_js_sums(maps[0], torch.ones(5, dtype=torch.bool))
    word_argmax_hits(maps.numpy(), (np.array([[-1, 0, 1, 2, -1], [-1, 0, 0, 1, -1]]), np.array([3, 2]),
                                    np.ones((2, 3), dtype=bool)), (np.array([0, 1, 2]), np.array([0, 1]), np.array([1, 0])))
    average_ranks(np.array([0.5, -1.0, 0.5, 2.0]))
    return time.perf_counter() - start


def main() -> None:
    print(f"bertology: Numba kernels ready ({compile_kernels():.1f} s)")


if __name__ == "__main__":
    main()
