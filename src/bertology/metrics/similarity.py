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
from collections import OrderedDict
from collections.abc import Iterator

import numpy as np
from scipy.stats import rankdata

#: Signatures kept while :func:`reused_signatures` is active (None: off), by dtype, shape and content digest.
_REUSE: OrderedDict | None = None
_REUSE_SIZE = 0


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


def _order_keys(v: np.ndarray) -> np.ndarray:
    """uint64 keys in the order of the float64 values ``v`` (the IEEE-754 sign-flip trick; -0.0 sorts just
    before +0.0, which the equality pass of :func:`average_ranks` then treats as one tie)."""
    u = np.ascontiguousarray(v, dtype=np.float64).view(np.uint64)
    return np.where(u >> np.uint64(63), ~u, u | np.uint64(1 << 63))


def average_ranks(v: np.ndarray) -> np.ndarray:
    """``scipy.stats.rankdata(v)`` ('average': ties share their mean rank), equal to the last bit, about
    twice as fast on millions of values.

    Why: the RSA Spearman signatures rank 2 M cosines per layer and model, and scipy's stable
    ``argsort`` was most of ``representation_similarity``'s time. Here one *value* sort of packed
    uint64 keys (the top ``64 - b`` bits of the order-preserving key of each value, the index in the
    low ``b = ceil(log2 n)`` bits) gives the order; the few neighbours that share a truncated key are
    re-sorted by their full value; tie groups (equal float64 values) then get ``(first + last) / 2``
    ranks, exact in float64 (integers below 2**53). NaN or more than 2**40 values: scipy.
    """
    v = np.asarray(v, dtype=np.float64).ravel()
    n = v.size
    bits = max(1, (n - 1).bit_length())
    if n == 0 or bits > 40 or np.isnan(v).any():
        return rankdata(v)
    low = np.uint64((1 << bits) - 1)
    packed = (_order_keys(v) & ~low) | np.arange(n, dtype=np.uint64)
    packed.sort()
    order = (packed & low).astype(np.intp)
    s = v[order]
    prefix = packed & ~low
    same = prefix[1:] == prefix[:-1]
    if same.any():  # runs sharing a truncated key: order them by the full value
        pos = np.flatnonzero(np.concatenate([same, [False]]) | np.concatenate([[False], same]))
        sub = np.lexsort((s[pos], prefix[pos]))
        order[pos] = order[pos][sub]
        s[pos] = s[pos][sub]
    new = np.empty(n, dtype=bool)
    new[0] = True
    np.not_equal(s[1:], s[:-1], out=new[1:])
    starts = np.flatnonzero(new)
    ends = np.append(starts[1:], n)
    ranks = np.empty(n)
    ranks[order] = np.repeat((starts + ends + 1) / 2.0, ends - starts)
    return ranks


def _zscore(v: np.ndarray) -> np.ndarray:
    v = v - v.mean()
    n = np.linalg.norm(v)
    return v / n if n > 0 else v


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
    key = None
    if _REUSE is not None:
        arr = np.ascontiguousarray(x)
        key = (arr.dtype.str, arr.shape, hashlib.blake2b(arr.view(np.uint8).data, digest_size=16).hexdigest())
        if key in _REUSE:
            _REUSE.move_to_end(key)
            return _REUSE[key]
    upper = cosine_similarity_upper(x)
    sig = {"pearson": _zscore(upper), "spearman": _zscore(average_ranks(upper))}
    if _REUSE is not None and key is not None:
        _REUSE[key] = sig
        while len(_REUSE) > _REUSE_SIZE:
            _REUSE.popitem(last=False)
    return sig


@contextlib.contextmanager
def reused_signatures(size: int) -> Iterator[None]:
    """Reuse RSA signatures of arrays seen again within the block, keeping the ``size`` most recent.

    Several tuned models compared with one base sample the same base tokens (the sample depends on
    the seed and the token positions only), so the base layers' signatures, O(n^2) each with a rank
    transform, are computed once instead of once per pair. Memory: ``size`` signatures of
    ``n (n - 1)`` float64 values each (32 MB at the default 2,000 tokens), freed when the block ends.
    """
    global _REUSE, _REUSE_SIZE
    before = (_REUSE, _REUSE_SIZE)
    _REUSE, _REUSE_SIZE = OrderedDict(), size
    try:
        yield
    finally:
        _REUSE, _REUSE_SIZE = before
