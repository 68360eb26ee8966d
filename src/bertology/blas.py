"""How many threads NumPy's and SciPy's BLAS (OpenBLAS, MKL) may use while bertology does its own arithmetic.

Why one: the analyses' products are small (a sentence's words, one layer's 2,000-token Gram matrix, a
768 x 768 eigensolve) and run beside other threads: torch's, Numba's, other analyses'. A threaded BLAS
then hands half of each small product to a partner thread that is busy or descheduled and waits for it,
and its idle threads spin on the cores the forward passes need. Measured on 2 shared cores at BERT-base
size (``benchmarks/analysis_replay.py``): the streamed analyses' updates 10.7 -> 9.9 s per 500 sentences,
PCA's 39 fits 1.6-57 s -> 1.0 s, 13 RSA dot products ~100 -> 12 ms. Torch's own BLAS (MKL linked into
libtorch) is not affected: only the libraries :mod:`threadpoolctl` finds loaded.

Results do not depend on it for matrix products (each output element is summed by one thread); dot
products and matrix-vector products split a sum between threads, so their last bits follow the thread
count. ``compare``'s streaming pass and its analyses' ``compute()`` run inside :func:`one_blas_thread`
(as do PCA's and geometry's fits wherever they are called), so their numbers do not follow the machine's
core count.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

from threadpoolctl import threadpool_limits


@contextlib.contextmanager
def one_blas_thread() -> Iterator[None]:
    """NumPy's and SciPy's BLAS on one thread inside the block, the previous limits restored after.

    The limit is process-wide. Nested blocks (in any thread) are safe as long as an outer block holds for
    the whole time threads enter and leave inner ones: each restores the limit it found, which is 1.
    """
    with threadpool_limits(limits=1, user_api="blas"):
        yield
