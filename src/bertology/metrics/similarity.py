"""Representation similarity between two sets of vectors for the same items: CKA and RSA.

Pure functions on NumPy arrays, float64 throughout. ``X`` and ``Y`` are ``[n_items, dim]`` with rows
aligned (row i of both is the same token).

Written by hand because no maintained library offers debiased CKA or RSA on token samples with the
precision and memory profile we need: the CKA forms below work in feature space (O(n d^2)) so they
never build the n x n Gram matrices.
"""
from __future__ import annotations

import contextlib
import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial

import numba
import numpy as np
from scipy.stats import rankdata

from bertology.blas import one_blas_thread

#: Signatures kept while :func:`reused_signatures` is active (None: off), by dtype, shape and content digest.
_REUSE: OrderedDict | None = None
_REUSE_SIZE = 0
_REUSE_LOCK = threading.Lock()


def _as64(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError(f"expected a 2-D array [n_items, dim], got shape {x.shape}")
    return x


def _check_pair(x: np.ndarray, y: np.ndarray) -> None:
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"X and Y must have the same number of rows ({x.shape[0]} != {y.shape[0]})")


def center(x: np.ndarray) -> np.ndarray:
    """Subtract the column means."""
    x = _as64(x)
    return x - x.mean(axis=0, keepdims=True)


def linear_cka(x: np.ndarray, y: np.ndarray) -> float:
    """Linear CKA (Kornblith et al. 2019): ||Y'X||_F^2 / (||X'X||_F ||Y'Y||_F) on centred features."""
    x, y = center(x), center(y)
    _check_pair(x, y)
    return _cka_from_terms(_linear_hsic(x, y), _linear_hsic(x, x), _linear_hsic(y, y))


def _linear_hsic(x: np.ndarray, y: np.ndarray) -> float:
    """||Y'X||_F^2 for centred X, Y: the (unnormalised) biased linear HSIC."""
    return float(np.linalg.norm(y.T @ x, "fro") ** 2)


def _cka_from_terms(xy: float, xx: float, yy: float) -> float:
    denom = np.sqrt(xx * yy) if xx > 0 and yy > 0 else 0.0
    return float(xy / denom) if denom > 0 else float("nan")


def _hsic_unbiased_terms(x: np.ndarray, y: np.ndarray) -> float:
    """Unbiased HSIC (Song et al. 2012) with linear kernels, computed without Gram matrices.

    With K = XX', L = YY' and K~, L~ their copies with a zero diagonal:
    HSIC = [tr(K~L~) + (1'K~1)(1'L~1)/((n-1)(n-2)) - 2/(n-2) 1'K~L~1] / (n(n-3)).
    """
    n = x.shape[0]
    if n < 4:
        raise ValueError("debiased CKA needs at least 4 items")
    kx = np.einsum("ij,ij->i", x, x)  # diag(K)
    ly = np.einsum("ij,ij->i", y, y)  # diag(L)
    sx, sy = x.sum(0), y.sum(0)
    tr_kl = np.linalg.norm(y.T @ x, "fro") ** 2 - float(kx @ ly)
    k1 = x @ sx - kx  # K~ 1
    l1 = y @ sy - ly  # L~ 1
    sum_k, sum_l = float(k1.sum()), float(l1.sum())
    return (tr_kl + sum_k * sum_l / ((n - 1) * (n - 2)) - 2.0 / (n - 2) * float(k1 @ l1)) / (n * (n - 3))


def debiased_cka(x: np.ndarray, y: np.ndarray) -> float:
    """Debiased linear CKA (Nguyen et al. 2021): CKA with the unbiased HSIC estimator.

    Less inflated than linear CKA when the dimension is large relative to the number of items.
    """
    x, y = center(x), center(y)
    _check_pair(x, y)
    return _cka_from_terms(_hsic_unbiased_terms(x, y), _hsic_unbiased_terms(x, x), _hsic_unbiased_terms(y, y))


def cka_grid(xs: list[np.ndarray], ys: list[np.ndarray], block: int = 128) -> dict[str, np.ndarray]:
    """Linear and debiased CKA for every pair (xs[i], ys[j]), from the inner products of Gram matrices.

    Every term of both estimators is a function of ``<K_a, K_b> = ||Xc_b' Xc_a||_F^2`` (``K = Xc Xc'``)
    and of O(n d) vectors (the diagonal of ``K``, ``K 1``). The feature-space form computes a
    ``d x d`` product per pair and estimator, ``2 P n d^2`` flops for ``P`` pairs (13 x 13 layers of
    BERT-base on 2,000 tokens: 800 Gflop); here each layer's Gram matrix is built once, a block of
    ``block`` rows at a time (memory ``L x block x n``, not ``L x n x n``), and all the inner products of
    one block are one matrix product: ``L n^2 d`` flops (160 Gflop). Same values to rounding as
    :func:`linear_cka` and :func:`debiased_cka` (tested to 1e-12).
    """
    mats = [center(x) for x in [*xs, *ys]]
    n = mats[0].shape[0]
    for m in mats[1:]:
        _check_pair(mats[0], m)
    if n < 4:
        raise ValueError("debiased CKA needs at least 4 items")
    inner = np.zeros((len(mats), len(mats)))  # <K_a, K_b>
    for start in range(0, n, block):
        rows = np.stack([(m[start:start + block] @ m.T).ravel() for m in mats])  # [L, block * n]
        inner += rows @ rows.T
    diag = np.stack([np.einsum("ij,ij->i", m, m) for m in mats])  # diag(K_a): [L, n]
    k1 = np.stack([m @ m.sum(0) for m in mats]) - diag  # K~_a 1 (zero diagonal)
    sums = k1.sum(1)
    # unbiased HSIC (Song et al. 2012) of every pair, as in _hsic_unbiased_terms
    hsic = (inner - diag @ diag.T + np.outer(sums, sums) / ((n - 1) * (n - 2)) - 2.0 / (n - 2) * (k1 @ k1.T)) / (n * (n - 3))
    nx = len(xs)
    lin = np.empty((nx, len(ys)))
    deb = np.empty((nx, len(ys)))
    for i in range(nx):
        for j in range(len(ys)):
            b = nx + j
            lin[i, j] = _cka_from_terms(inner[i, b], inner[i, i], inner[b, b])
            deb[i, j] = _cka_from_terms(hsic[i, b], hsic[i, i], hsic[b, b])
    return {"cka_linear": lin, "cka_debiased": deb}


def cosine_similarity_upper(x: np.ndarray) -> np.ndarray:
    """Upper triangle (k=1) of the items' cosine-similarity matrix, as a flat vector (Merchant et al.)."""
    x = _as64(x)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    xn = x / np.where(norms > 0, norms, 1.0)
    sim = xn @ xn.T
    iu = np.triu_indices(x.shape[0], k=1)
    return sim[iu]


_SIGN = np.uint64(1 << 63)


@numba.njit(cache=True, nogil=True)
def _packed_keys(v, low):
    """uint64 keys in the order of the float64 values ``v``, their lowest bits (``low``, a mask) replaced by the index.

    The order-preserving key is the IEEE-754 sign-flip trick: a negative value's bits inverted, a positive one's
    sign bit set, as ``u ^ ((u >> 63 arithmetic) | 1 << 63)``; -0.0 gets the key just below +0.0's
    (:func:`average_ranks` then ties the two). One pass and one new array, where NumPy needed five passes and two
    (16 MB each at RSA's 2 M values).
    """
    n = v.size
    out = np.empty(n, np.uint64)
    u = v.view(np.int64)
    sign = np.int64(-9223372036854775808)  # 1 << 63 as int64
    for i in range(n):
        x = u[i]
        out[i] = (np.uint64(x ^ ((x >> 63) | sign)) & ~low) | np.uint64(i)
    return out


@numba.njit(cache=True, nogil=True)
def _ranks_from_order(order):
    """``ranks[order[p]] = p + 1`` for every sorted position ``p``: the ranks without ties, in one scattered pass."""
    ranks = np.empty(order.size)
    for p in range(order.size):
        ranks[order[p]] = p + 1.0
    return ranks


#: Digit width of :func:`_sort_above`'s passes: 2,048 counters per pass stay in the L1 cache.
_RADIX_BITS = 11


def _sort_above(keys: np.ndarray, low_bits: int) -> None:
    """Sort uint64 keys in place by their bits above the lowest ``low_bits``, stably (equal high bits keep
    their order). Keys whose low bits ascend in input order and are distinct (``average_ranks``' packed
    index) come out fully sorted: the one order of distinct keys, whatever the sort.

    Why hand-written: NumPy has no radix sort for 64-bit keys (its ``sort`` takes ~110 ms on 2 M keys, torch's
    65-80 ms on one thread); a least-significant-digit radix sort of the ``64 - low_bits`` high bits in
    11-bit digits (4 passes at 2 M values; a digit all keys share is skipped) takes 36-51 ms. It releases the
    GIL, so RSA's worker threads rank layers in parallel.
    """
    if keys.size > 1:
        _radix_sort_kernel(keys, np.empty_like(keys), int(low_bits))


@numba.njit(cache=True, nogil=True)
def _radix_sort_kernel(keys, buf, shift0):
    """LSD radix sort of ``keys`` by bits ``shift0..63`` (stable), ``buf`` the scratch array of the same size."""
    n = keys.size
    radix = 1 << _RADIX_BITS
    passes = (64 - shift0 + _RADIX_BITS - 1) // _RADIX_BITS
    mask = np.uint64(radix - 1)
    counts = np.zeros((passes, radix), np.int64)
    for i in range(n):  # every pass's histogram in one read
        k = keys[i]
        for p in range(passes):
            counts[p, np.int64((k >> np.uint64(shift0 + _RADIX_BITS * p)) & mask)] += 1
    src, dst = keys, buf
    moved = False
    for p in range(passes):
        c = counts[p]
        if c.max() == n:  # every key has this digit: the pass would not move anything
            continue
        total = 0
        for d in range(radix):  # exclusive prefix sums: where each digit's keys start
            t = c[d]
            c[d] = total
            total += t
        shift = np.uint64(shift0 + _RADIX_BITS * p)
        for i in range(n):
            k = src[i]
            d = np.int64((k >> shift) & mask)
            dst[c[d]] = k
            c[d] += 1
        src, dst = dst, src
        moved = not moved
    if moved:  # the sorted keys are in buf
        keys[:] = src


def average_ranks(v: np.ndarray) -> np.ndarray:
    """``scipy.stats.rankdata(v)`` ('average': ties share their mean rank), equal to the last bit, about
    three times as fast on millions of values.

    Why: the RSA Spearman signatures rank 2 M cosines per layer and model, and scipy's stable
    ``argsort`` was most of ``representation_similarity``'s time. Here one *value* sort of packed
    uint64 keys (the top ``64 - b`` bits of the order-preserving key of each value, the index in the
    low ``b = ceil(log2 n)`` bits) gives the order. Neighbours with different truncated keys differ in
    value, so only the few runs that share one are looked at by value (:func:`_tied_positions`): re-sorted
    by their full value, and their equal neighbours found. Sorted position ``p`` gets rank ``p + 1``, a tie
    group (equal float64 values) ``(first + last) / 2``, exact in float64 (integers below 2**53). NaN or
    more than 2**40 values: scipy.
    """
    v = np.asarray(v, dtype=np.float64).ravel()
    n = v.size
    bits = max(1, (n - 1).bit_length())
    if n == 0 or bits > 40 or np.isnan(v).any():
        return rankdata(v)
    low = np.uint64((1 << bits) - 1)
    # in place where possible: at 2 M values each temporary is 16 MB, and layers are ranked in parallel
    packed = _packed_keys(np.ascontiguousarray(v), low)
    _sort_above(packed, bits)
    order = (packed & low).view(np.intp)  # indices < 2**40: the same bits as int64
    prefix = packed
    prefix &= ~low
    later = _tied_positions(v, order, prefix)  # sorted positions equal in value to the one before
    del packed, prefix
    ranks = _ranks_from_order(order)  # p + 1: the mean rank of a group of one
    if later.size:
        members, firsts = _with_previous(later)  # every tied position (groups are contiguous), and group starts
        counts = np.diff(firsts, append=members.size)  # tie group sizes
        # first + end = 2 first + count; the mean 1-based rank is (first + end + 1) / 2, exact
        mid = (2 * members[firsts] + counts).astype(np.float64)
        mid += 1.0
        mid /= 2.0
        ranks[order[members]] = np.repeat(mid, counts)
    return ranks


def _tied_positions(v: np.ndarray, order: np.ndarray, prefix: np.ndarray) -> np.ndarray:
    """Sorted positions ``p`` (ascending) whose value equals the one at ``p - 1``; ``order`` is fixed in place.

    ``order`` sorts ``v`` by the truncated key ``prefix`` (sorted) only; runs that share a prefix are put in
    the order of their full values here (reading ``v`` at those positions only, a few percent of ``n``).
    Equal values share a prefix, except -0.0 and +0.0 (keys next to each other): that boundary is added.
    """
    same = np.flatnonzero(prefix[1:] == prefix[:-1])  # p - 1 for each p in a run after its first
    later = np.zeros(0, dtype=np.intp)
    if same.size:
        pos = _with_previous(same + 1)[0]  # the runs' positions
        s = v[order[pos]]
        # within each run by the full value, ties in index order: as lexsort((s, prefix[pos])), since values in
        # different runs are already in value order (the one equal pair, -0.0 before +0.0, kept by stability)
        sub = np.argsort(s, kind="stable")
        order[pos] = order[pos][sub]
        s = s[sub]
        at = np.searchsorted(pos, same)  # p - 1 sits at pos[at], p at pos[at + 1]
        later = same[s[at] == s[at + 1]] + 1
    zero = int(np.searchsorted(prefix, _SIGN))  # the first key at or above +0.0's
    if 0 < zero < v.size and v[order[zero]] == 0.0 and v[order[zero - 1]] == 0.0:  # -0.0 then +0.0
        later = np.union1d(later, [zero])
    return later


def _with_previous(p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For ascending distinct positions ``p``: the ascending union of ``p - 1`` and ``p``, and the indices in it of
    the ``p - 1`` not in ``p`` (where each chain of consecutive positions starts). In O(len(p)), without a sort:
    interleaved, ``p0 - 1, p0, p1 - 1, p1, ...`` only repeats where ``p1 - 1 == p0``."""
    both = np.empty(2 * p.size, dtype=p.dtype)
    both[0::2] = p - 1
    both[1::2] = p
    keep = np.ones(both.size, dtype=bool)
    np.not_equal(both[2::2], both[1:-1:2], out=keep[2::2])
    at = np.cumsum(keep) - 1  # index in the union of each kept entry
    return both[keep], at[0::2][keep[0::2]]


def _zscore(v: np.ndarray, in_place: bool = False) -> np.ndarray:
    """``v`` centred and scaled to unit length (so a dot product of two is their Pearson correlation); with
    ``in_place`` it overwrites ``v`` (the same bits, without a second 16 MB vector at RSA's sizes)."""
    if in_place:
        v -= v.mean()
    else:
        v = v - v.mean()
    n = np.linalg.norm(v)
    if n > 0:
        v /= n  # in place: the same values as v / n, without a second copy
    return v


def rsa(x: np.ndarray, y: np.ndarray, method: str = "pearson") -> float:
    """RSA: correlation of the upper triangles of the two cosine-similarity matrices."""
    _check_pair(_as64(x), _as64(y))
    a, b = cosine_similarity_upper(x), cosine_similarity_upper(y)
    if method == "spearman":
        a, b = average_ranks(a), average_ranks(b)
    elif method != "pearson":
        raise ValueError(f"method must be 'pearson' or 'spearman', not {method!r}")
    return float(_zscore(a) @ _zscore(b))


def rsa_signatures(x: np.ndarray) -> dict[str, np.ndarray]:
    """Normalised similarity vectors of one layer, so a layer x layer RSA grid is just dot products.

    Inside :func:`reused_signatures`, an array seen before (same dtype, shape and bytes) gets the
    signatures computed then: the very same arrays, so the numbers do not change.
    """
    return _reused("signatures", x, _signatures)


def _signatures(x: np.ndarray) -> dict[str, np.ndarray]:
    upper = cosine_similarity_upper(x)
    return {"pearson": _zscore(upper), "spearman": _zscore(average_ranks(upper))}


def _reused(kind: str, x: np.ndarray, make: Callable[[np.ndarray], object]):
    """``make(x)``, or inside :func:`reused_signatures` the object made before for the same ``kind`` and bytes."""
    cache = _REUSE
    if cache is None:
        return make(x)
    arr = np.ascontiguousarray(x)
    key = (kind, arr.dtype.str, arr.shape, hashlib.blake2b(arr.view(np.uint8).data, digest_size=16).hexdigest())
    with _REUSE_LOCK:  # layers are made in threads: a lookup must not race an eviction
        if key in cache:
            cache.move_to_end(key)
            return cache[key]
    made = make(x)
    with _REUSE_LOCK:
        cache[key] = made
        while len(cache) > _REUSE_SIZE:
            cache.popitem(last=False)
    return made


@contextlib.contextmanager
def reused_signatures(size: int) -> Iterator[None]:
    """Reuse RSA signatures (and :func:`layer_terms`) of arrays seen again within the block, keeping the ``size`` most recent.

    Several tuned models compared with one base sample the same base tokens (the sample depends on
    the seed and the token positions only), so the base layers' signatures, O(n^2) each with a rank
    transform, are computed once instead of once per pair. Memory: ``size`` entries of ``n (n - 1)``
    float64 values each for :func:`rsa_signatures` (32 MB at the default 2,000 tokens), ``3 n (n - 1) / 2``
    for :func:`layer_terms` (48 MB), freed when the block ends.
    """
    global _REUSE, _REUSE_SIZE
    before = (_REUSE, _REUSE_SIZE)
    _REUSE, _REUSE_SIZE = OrderedDict(), size
    try:
        yield
    finally:
        _REUSE, _REUSE_SIZE = before


@dataclass(frozen=True)
class LayerTerms:
    """What the RSA and CKA grids need of one layer's ``[n, dim]`` vectors, all read off one Gram matrix.

    ``signatures`` are :func:`rsa_signatures`'s (the same bits); ``centred_upper`` and ``centred_diag`` are
    the strict upper triangle (row-major, as ``np.triu_indices(n, 1)``) and the diagonal of the centred
    Gram matrix ``Kc = H X X' H``. Memory: ``3 x 8 n (n - 1) / 2 + 8 n`` bytes (48 MB at 2,000 tokens).
    """

    signatures: dict[str, np.ndarray]
    centred_upper: np.ndarray
    centred_diag: np.ndarray

    def centred_inner(self, other: "LayerTerms") -> float:
        """``<Kc_a, Kc_b>`` (Frobenius), from the two triangles and the diagonals of the symmetric matrices."""
        return float(2.0 * (self.centred_upper @ other.centred_upper) + self.centred_diag @ other.centred_diag)


def strict_upper(a: np.ndarray) -> np.ndarray:
    """The strict upper triangle of a square matrix, row-major (``a[np.triu_indices(n, 1)]``), by row slices.

    Why not ``np.take`` with flat indices: the same speed (~3 ms at n = 2,000), but that needs
    ``8 n (n - 1) / 2`` bytes of indices (16 MB) built first; the rows' tails are contiguous views.
    """
    n = a.shape[0]
    if n < 2:
        return np.empty(0, dtype=a.dtype)
    return np.concatenate([a[i, i + 1:] for i in range(n - 1)])


def layer_terms(x: np.ndarray) -> LayerTerms:
    """RSA signatures and the centred Gram matrix of one layer from its one ``n x n`` product.

    Why: :func:`rsa_signatures` builds the cosine matrix ``C = Xn Xn'`` (unit rows) and :func:`cka_grid`
    the centred Gram ``Xc Xc'``; both are functions of ``K = X X'``, so one product (``xn @ xn.T``: NumPy
    calls syrk, ``n^2 d`` flops) serves both. The cosines are ``C`` itself, so the signatures are
    :func:`rsa_signatures`'s to the last bit; ``K = C_ij |x_i| |x_j|`` (zero rows give zero rows), centred
    on both sides in O(n^2): ``Kc = K - r 1' - 1 r' + mean(r)``, ``r`` the row means. Accuracy: each
    entry of ``C`` is within a few ``eps sqrt(d)`` of the exact cosine, so ``K`` is within
    ``~eps sqrt(d) |x_i| |x_j|``, and ``Kc`` (entries of the size of the spread ``s^2``) carries that
    absolute error: ``eps sqrt(d) (|mean|^2 + s^2) / s^2`` relative, about 1e-13 for data whose mean is
    10x its spread (BERT's hidden states are anisotropic like that). Memory in flight: the ``8 n^2`` Gram
    matrix, then the three ``8 n (n - 1) / 2`` vectors and the rank transform's temporaries (the Gram matrix
    freed before it starts).
    """
    x = _as64(x)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    xn = x / np.where(norms > 0, norms, 1.0)
    gram = xn @ xn.T  # the cosines, exactly as cosine_similarity_upper
    del x, xn
    cos = strict_upper(gram)
    gram *= norms  # K = X X', in place
    gram *= norms.T
    means = gram.mean(axis=1)
    gram -= means[:, None]
    gram -= means[None, :]
    gram += means.mean()
    centred, diag = strict_upper(gram), gram.diagonal().copy()
    del gram
    spearman = _zscore(average_ranks(cos), in_place=True)  # ranks the raw cosines: before they are z-scored in place
    return LayerTerms({"pearson": _zscore(cos, in_place=True), "spearman": spearman}, centred, diag)


def similarity_grids(xs: Sequence[np.ndarray], ys: Sequence[np.ndarray], workers: int = 1) -> dict[str, np.ndarray]:
    """RSA (Pearson, Spearman) and CKA (linear, debiased) of every pair ``(xs[i], ys[j])``: ``[len(xs), len(ys)]`` each.

    Each layer's Gram matrix is built once (:func:`layer_terms`), ``workers`` layers at a time in threads
    (NumPy's products, sorts and dot products release the GIL), with BLAS on one thread while ``workers > 1``
    (:func:`bertology.blas.one_blas_thread`: each worker's products asking BLAS for threads of their own put
    ``workers x cores`` threads on the cores, and OpenBLAS's threaded ``ddot`` then mostly waits: 13 dot
    products of 2 M values took ~100 ms with two BLAS threads against ~12 ms with one on 2 shared cores). The
    RSA values are :func:`rsa_signatures`' dot products, bit for bit on the same BLAS thread count (another
    count sums a dot product in another order: within ``m eps`` of each other); CKA is :func:`cka_grid`'s
    formulas on the same ``<Kc_a, Kc_b>``, ``diag(Kc)`` and ``K~ 1 = -diag(Kc)`` (``Kc 1 = 0`` exactly), equal
    to rounding (tested to 1e-10 relative on data with a mean 10x its spread).
    Inside :func:`reused_signatures` a layer seen before is not recomputed. The device path (GPU) is
    :func:`bertology.metrics.similarity_torch.similarity_grids_torch`, the same steps in torch; a test pins the two
    together (``tests/unit/test_similarity_torch.py``).

    Memory (``m = n (n - 1) / 2``): every ``xs`` layer's two signatures and centred triangle are kept
    (``24 len(xs) m`` bytes: 624 MB at 13 layers and 2,000 tokens, the old signatures' 416 MB plus the
    triangles), each ``ys`` layer is reduced to its row of dot products by the worker that made it, so
    only ``workers`` are in flight (each ``8 n^2`` of Gram matrix, then ``24 m`` plus the rank transform's
    temporaries, ~4 x ``8 m``). Measured (tracemalloc, ``benchmarks/analysis_compute.py --trace-memory``)
    at 13 + 13 layers, 2,000 tokens, 2 workers: 785-802 MB at the peak over three runs (the workers' timing
    decides which temporaries overlap); 865-881 MB before :func:`strict_upper` and :func:`_tied_positions`
    dropped the 16 MB flat index and the full-length gathers; 824 MB for the separate RSA signatures and
    :func:`cka_grid`. Inside :func:`reused_signatures` the cached terms are kept as well (48 MB per layer).
    """
    n = xs[0].shape[0] if len(xs) else 0
    for mat in [*xs, *ys]:
        if mat.ndim != 2 or mat.shape[0] != n:
            raise ValueError(f"every layer must be [{n}, dim], got shape {mat.shape}")
    if n < 4:
        raise ValueError("debiased CKA needs at least 4 items")
    terms = partial(_reused, "terms", make=layer_terms)
    nx, ny = len(xs), len(ys)
    sig_x: list[dict[str, np.ndarray]] = []
    centred_x = np.empty((nx, n * (n - 1) // 2))
    diag_x = np.empty((nx, n))
    workers = max(1, workers)

    def against_base(y: np.ndarray) -> tuple[list[float], list[float], np.ndarray, float, np.ndarray]:
        """One ``ys`` layer's RSA dot products with every base layer (as rsa_signatures' grid did), and its CKA terms."""
        t = terms(y)
        pearson = [float(b["pearson"] @ t.signatures["pearson"]) for b in sig_x]
        spearman = [float(b["spearman"] @ t.signatures["spearman"]) for b in sig_x]
        inner = 2.0 * (centred_x @ t.centred_upper) + diag_x @ t.centred_diag  # <Kc_a, Kc_b>
        return pearson, spearman, inner, t.centred_inner(t), t.centred_diag

    blas = one_blas_thread() if workers > 1 else contextlib.nullcontext()
    with blas, ThreadPoolExecutor(max_workers=workers) as pool:
        for i, b in enumerate(pool.map(terms, xs)):
            sig_x.append(b.signatures)
            centred_x[i], diag_x[i] = b.centred_upper, b.centred_diag
        own_x = np.array([2.0 * (c @ c) + d @ d for c, d in zip(centred_x, diag_x)])
        cols = list(pool.map(against_base, ys))
    del sig_x, centred_x
    grid = {name: np.array([c[k] for c in cols]).T.reshape(nx, ny) for k, name in
            ((0, "rsa_pearson"), (1, "rsa_spearman"), (2, "inner"))}
    own_y = np.array([c[3] for c in cols])
    diag_y = np.stack([c[4] for c in cols]) if cols else np.empty((0, n))
    cka = _cka_from_gram_terms(grid.pop("inner"), own_x, own_y, diag_x, diag_y)
    return {**grid, **cka}


def _cka_from_gram_terms(inner: np.ndarray, own_x: np.ndarray, own_y: np.ndarray,
                         diag_x: np.ndarray, diag_y: np.ndarray) -> dict[str, np.ndarray]:
    """Linear and debiased CKA grids from ``<Kc_a, Kc_b>``, each layer's ``<Kc, Kc>`` and ``diag(Kc)``.

    :func:`cka_grid`'s unbiased HSIC with ``K~ 1 = Kc 1 - diag(Kc) = -diag(Kc)``:
    ``[<Kc_a, Kc_b> - (1 + 2/(n-2)) d_a.d_b + tr_a tr_b / ((n-1)(n-2))] / (n(n-3))``.
    """
    n = diag_x.shape[1]

    def hsic(ab: np.ndarray, da: np.ndarray, db: np.ndarray) -> np.ndarray:
        dd = da @ db.T
        ta, tb = da.sum(1), db.sum(1)
        return (ab - dd + np.outer(ta, tb) / ((n - 1) * (n - 2)) - 2.0 / (n - 2) * dd) / (n * (n - 3))

    h_xy = hsic(inner, diag_x, diag_y)
    h_x = np.diag(hsic(np.diag(own_x), diag_x, diag_x))
    h_y = np.diag(hsic(np.diag(own_y), diag_y, diag_y))
    lin = np.empty_like(inner)
    deb = np.empty_like(inner)
    for i in range(inner.shape[0]):
        for j in range(inner.shape[1]):
            lin[i, j] = _cka_from_terms(inner[i, j], own_x[i], own_y[j])
            deb[i, j] = _cka_from_terms(h_xy[i, j], h_x[i], h_y[j])
    return {"cka_linear": lin, "cka_debiased": deb}
