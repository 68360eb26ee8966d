"""CKA and RSA: properties, and agreement with slow textbook computations."""
import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import pearsonr, spearmanr

from bertology.metrics.similarity import cosine_similarity_upper, debiased_cka, linear_cka, rsa


def _rand(n, d, seed):
    return np.random.default_rng(seed).normal(size=(n, d))


def slow_linear_cka(x, y):
    """Kornblith et al. eq. via Gram matrices and the centering matrix H."""
    n = x.shape[0]
    h = np.eye(n) - np.ones((n, n)) / n
    k, l = h @ (x @ x.T) @ h, h @ (y @ y.T) @ h
    return np.sum(k * l) / np.sqrt(np.sum(k * k) * np.sum(l * l))


def slow_unbiased_hsic(k, l):
    """Song et al. 2012 U-statistic: average over ordered 4-tuples of distinct indices."""
    n = k.shape[0]
    total, count = 0.0, 0
    for i, j, q, r in itertools.permutations(range(n), 4):
        total += k[i, j] * l[i, j] + k[i, j] * l[q, r] - 2 * k[i, j] * l[i, q]
        count += 1
    return total / count


def slow_debiased_cka(x, y):
    k, l = x @ x.T, y @ y.T
    return slow_unbiased_hsic(k, l) / np.sqrt(slow_unbiased_hsic(k, k) * slow_unbiased_hsic(l, l))


def test_linear_cka_matches_gram_formula():
    x, y = _rand(30, 5, 0), _rand(30, 7, 1)
    assert linear_cka(x, y) == pytest.approx(slow_linear_cka(x, y), rel=1e-10)


def test_debiased_cka_matches_u_statistic():
    x = _rand(7, 3, 2)
    y = x @ _rand(3, 4, 3) + 0.5 * _rand(7, 4, 4)
    assert debiased_cka(x, y) == pytest.approx(slow_debiased_cka(x, y), rel=1e-9)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(6, 40), d=st.integers(1, 12))
def test_cka_of_a_representation_with_itself_is_one(seed, n, d):
    x = _rand(n, d, seed)
    assert linear_cka(x, x) == pytest.approx(1.0, abs=1e-10)
    assert debiased_cka(x, x) == pytest.approx(1.0, abs=1e-10)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), scale=st.floats(0.01, 100.0))
def test_cka_invariant_to_rotation_isotropic_scaling_and_shift(seed, scale):
    x, y = _rand(25, 6, seed), _rand(25, 4, seed + 1)
    q, _ = np.linalg.qr(np.random.default_rng(seed).normal(size=(6, 6)))
    x2 = scale * x @ q + 3.0
    assert linear_cka(x2, y) == pytest.approx(linear_cka(x, y), rel=1e-8)
    assert debiased_cka(x2, y) == pytest.approx(debiased_cka(x, y), rel=1e-7, abs=1e-9)


def test_cka_is_low_for_independent_data_and_debiased_is_lower():
    x, y = _rand(200, 50, 5), _rand(200, 50, 6)
    assert abs(debiased_cka(x, y)) < 0.05
    assert linear_cka(x, y) > debiased_cka(x, y)  # the bias debiasing removes


def test_rsa_matches_scipy_on_the_upper_triangle():
    x, y = _rand(20, 6, 7), _rand(20, 9, 8)
    xn = x / np.linalg.norm(x, axis=1, keepdims=True)
    yn = y / np.linalg.norm(y, axis=1, keepdims=True)
    iu = np.triu_indices(20, k=1)
    a, b = (xn @ xn.T)[iu], (yn @ yn.T)[iu]
    assert np.allclose(cosine_similarity_upper(x), a)
    assert rsa(x, y, "pearson") == pytest.approx(pearsonr(a, b)[0], rel=1e-10)
    assert rsa(x, y, "spearman") == pytest.approx(spearmanr(a, b)[0], rel=1e-10)


def test_rsa_identity_and_rotation():
    x = _rand(15, 5, 9)
    q, _ = np.linalg.qr(_rand(5, 5, 10))
    assert rsa(x, x) == pytest.approx(1.0)
    assert rsa(x, x @ q, "spearman") == pytest.approx(1.0)


def test_mismatched_rows_raise():
    with pytest.raises(ValueError):
        linear_cka(_rand(5, 2, 0), _rand(6, 2, 0))


def test_cka_grid_equals_pairwise_calls():
    from bertology.metrics.similarity import cka_grid

    # Gram inner products instead of feature-space products: the same sums in another order, so 1e-12
    # (relative; debiased CKA near 0 absolute); several row blocks, the last one short (n = 45, block 16)
    xs = [_rand(45, 4, s) for s in range(3)] + [_rand(45, 4, 7) + 100.0]  # a far offset: centring matters
    ys = [_rand(45, 6, s + 10) for s in range(2)] + [xs[0] @ _rand(4, 6, 20)]
    for block in (16, 128):
        grid = cka_grid(xs, ys, block=block)
        for i, x in enumerate(xs):
            for j, y in enumerate(ys):
                assert grid["cka_linear"][i, j] == pytest.approx(linear_cka(x, y), rel=1e-12)
                assert grid["cka_debiased"][i, j] == pytest.approx(debiased_cka(x, y), rel=1e-12, abs=1e-13)


def test_average_ranks_equal_scipy_to_the_last_bit():
    """The packed-key sort gives scipy's 'average' ranks exactly: ties (repeated tokens give identical
    cosines), -0.0 beside +0.0, neighbours one ulp apart (they share the truncated key), tiny values."""
    from scipy.stats import rankdata

    from bertology.metrics.similarity import average_ranks, cosine_similarity_upper

    rng = np.random.default_rng(3)
    x = rng.standard_normal((300, 16))
    x[5] = x[7] = x[9]  # identical rows: whole tie groups in the upper triangle
    x[11] = -x[3]
    cases = [cosine_similarity_upper(x),
             np.concatenate([np.round(rng.standard_normal(5000), 2), np.zeros(7), -np.zeros(5)]),
             0.5 + np.arange(3000) * np.spacing(0.5) * rng.integers(0, 3, 3000),
             rng.standard_normal(999) * 1e-300, np.array([2.0]), np.array([1.0, np.nan, 0.0])]
    for v in cases:
        rng.shuffle(v)
        np.testing.assert_array_equal(average_ranks(v), rankdata(v))
    assert average_ranks(np.zeros(0)).shape == (0,)


def test_reused_signatures_compute_an_array_once_and_keep_the_most_recent(monkeypatch):
    import bertology.metrics.similarity as sim

    calls = []
    real = sim.cosine_similarity_upper
    monkeypatch.setattr(sim, "cosine_similarity_upper", lambda x: calls.append(1) or real(x))
    rng = np.random.default_rng(0)
    a, b, c = (rng.normal(size=(12, 5)).astype(np.float32) for _ in range(3))
    fresh = sim.rsa_signatures(a)
    with sim.reused_signatures(2):
        first = sim.rsa_signatures(a)
        again = sim.rsa_signatures(a.copy())  # same bytes, another array: reused
        assert again is first and len(calls) == 2
        sim.rsa_signatures(b)
        sim.rsa_signatures(c)  # evicts a (the least recently used of a, b)
        sim.rsa_signatures(a)
        assert len(calls) == 5
    assert all(np.array_equal(first[k], fresh[k]) for k in ("pearson", "spearman"))
    sim.rsa_signatures(a)
    assert len(calls) == 6  # outside the block nothing is kept


def _anisotropic(rng, n, d, offset=10.0, zero_row=False):
    """Rows with a shared mean ``offset`` times the spread's norm and decaying per-dimension scales (like BERT's
    hidden states), repeated rows (ties among the cosines) and optionally a zero row."""
    scale = np.geomspace(3.0, 0.05, d)
    mean = rng.standard_normal(d)
    mean *= offset * np.linalg.norm(scale) / np.linalg.norm(mean)
    x = rng.standard_normal((n, d)) * scale + mean
    x[1::17] = x[0]
    if zero_row:
        x[5] = 0.0
    return x.astype(np.float32)


@pytest.mark.parametrize("workers", [1, 2])
def test_similarity_grids_equal_the_separate_rsa_and_cka(workers):
    """One Gram matrix per layer: the RSA values are rsa_signatures' dot products to the last bit (the cosines are
    the same product), CKA is cka_grid's within 1e-10 relative. The centring now happens on K = X X', whose
    entries carry rounding of ~eps sqrt(d) |mean|^2 where the centred entries are ~spread^2: a mean 10x the
    spread costs ~100x, 1e-13 relative here, so 1e-10 leaves three orders of margin."""
    from bertology.metrics.similarity import cka_grid, rsa_signatures, similarity_grids

    rng = np.random.default_rng(11)
    xs = [_anisotropic(rng, 120, 24) for _ in range(3)]
    ys = [_anisotropic(rng, 120, 32, zero_row=True), xs[0] * 3.0 + 1.0, xs[1] @ rng.standard_normal((24, 24)).astype(np.float32)]
    centred = [x.astype(float) - x.astype(float).mean(0) for x in xs]
    assert np.linalg.norm(xs[2].astype(float).mean(0)) > 9 * np.sqrt((centred[2] ** 2).sum(1).mean())
    grids = similarity_grids(xs, ys, workers=workers)
    sx, sy = [rsa_signatures(x) for x in xs], [rsa_signatures(y) for y in ys]
    for kind in ("pearson", "spearman"):
        want = np.array([[float(a[kind] @ b[kind]) for b in sy] for a in sx])
        np.testing.assert_array_equal(grids[f"rsa_{kind}"], want)
    ref = cka_grid(xs, ys)
    for metric in ("cka_linear", "cka_debiased"):
        assert grids[metric].shape == (3, 3)
        np.testing.assert_allclose(grids[metric], ref[metric], rtol=1e-10, atol=0)
    np.testing.assert_allclose(grids["cka_linear"][0, 1], 1.0, rtol=1e-12)  # a shift and a scale: CKA 1
    for i, x in enumerate(xs):  # and the textbook pairwise functions (feature space, another route)
        for j, y in enumerate(ys):
            assert grids["cka_linear"][i, j] == pytest.approx(linear_cka(x, y), rel=1e-10)
            assert grids["cka_debiased"][i, j] == pytest.approx(debiased_cka(x, y), rel=1e-10)


def test_similarity_grids_reuse_a_layer_seen_before_and_check_shapes(monkeypatch):
    import bertology.metrics.similarity as sim

    calls = []
    real = sim.layer_terms
    monkeypatch.setattr(sim, "layer_terms", lambda x, **kw: calls.append(1) or real(x, **kw))
    rng = np.random.default_rng(2)
    xs = [_anisotropic(rng, 30, 8) for _ in range(2)]
    ys = [xs[0].copy(), _anisotropic(rng, 30, 8)]  # the first tuned layer has the base's bytes
    fresh = sim.similarity_grids(xs, ys)
    assert len(calls) == 4
    with sim.reused_signatures(4):
        again = sim.similarity_grids(xs, ys)
    assert len(calls) == 4 + 3
    for metric, grid in fresh.items():
        np.testing.assert_array_equal(grid, again[metric])
    with pytest.raises(ValueError, match="every layer"):
        sim.similarity_grids(xs, [xs[0][:20]])
    with pytest.raises(ValueError, match="at least 4"):
        sim.similarity_grids([xs[0][:3]], [xs[1][:3]])


def _long_double_cka(x, y):
    """Linear and debiased CKA in long double (x87 80-bit where NumPy has it) from the textbook centred Grams."""
    x, y = (np.asarray(m, dtype=np.longdouble) for m in (x, y))
    n = x.shape[0]
    k, l = ((m - m.mean(0)) @ (m - m.mean(0)).T for m in (x, y))

    def hsic(a, b):
        da, db = np.diag(a).copy(), np.diag(b).copy()  # K~ 1 = Kc 1 - diag(Kc) = -diag(Kc)
        return (np.sum(a * b) - (1 + 2 / (n - 2)) * (da @ db) + da.sum() * db.sum() / ((n - 1) * (n - 2))) / (n * (n - 3))

    lin = np.sum(k * l) / np.sqrt(np.sum(k * k) * np.sum(l * l))
    return float(lin), float(hsic(k, l) / np.sqrt(hsic(k, k) * hsic(l, l)))


@pytest.mark.parametrize("offset", [10.0, 30.0])
def test_similarity_grids_cka_is_accurate_on_anisotropic_data(offset):
    """Centring K = X X' instead of X loses ~|mean|^2 / spread^2 ulps (measured 2e-13 linear, 6e-13 debiased at
    a mean 30x the spread, against 3e-15 for cka_grid): still far inside 1e-10 of a long-double computation."""
    from bertology.metrics.similarity import similarity_grids

    rng = np.random.default_rng(5)
    xs = [_anisotropic(rng, 300, 64, offset) for _ in range(2)]
    ys = [_anisotropic(rng, 300, 64, offset), xs[0] @ rng.standard_normal((64, 64)).astype(np.float32) + xs[1]]
    grids = similarity_grids(xs, ys, workers=2)
    for i, x in enumerate(xs):
        for j, y in enumerate(ys):
            lin, deb = _long_double_cka(x, y)
            assert grids["cka_linear"][i, j] == pytest.approx(lin, rel=1e-10)
            assert grids["cka_debiased"][i, j] == pytest.approx(deb, rel=1e-10)


def test_average_ranks_ties_found_by_value_only_inside_shared_keys_and_across_signed_zeros():
    """Ties are looked for by value only where neighbours share a truncated key (and at -0.0 | +0.0, whose keys
    differ): scipy's ranks to the last bit on cases built to break that shortcut, at several sizes (so several
    truncations): runs of ulp-close values, subnormals beside both zeros, a -0.0 group next to a +0.0 group,
    -0.0 with no +0.0 (no false tie), many ties among rounded values."""
    from scipy.stats import rankdata

    from bertology.metrics.similarity import average_ranks

    rng = np.random.default_rng(8)
    tiny = np.array([5e-324, -5e-324, 1e-310, -1e-310])
    near = 0.25 + np.arange(40) * np.spacing(0.25)
    cases = [np.concatenate([np.repeat([-0.0], 3), np.zeros(2), tiny, near, near[::3], rng.standard_normal(50)]),
             np.concatenate([np.repeat([-0.0], 4), tiny[1:2], np.full(3, 1e-300), rng.standard_normal(20)]),
             np.concatenate([np.zeros(5), tiny[:1], -near]), np.array([-0.0, 0.0]), np.array([0.0, -0.0, 0.0]),
             np.round(rng.standard_normal(200_000), 3),
             np.concatenate([rng.standard_normal(70_000), np.repeat(-0.0, 9), np.zeros(4)])]
    for v in cases:
        v = v.copy()
        rng.shuffle(v)
        np.testing.assert_array_equal(average_ranks(v), rankdata(v))


def test_strict_upper_is_the_row_major_upper_triangle():
    from bertology.metrics.similarity import strict_upper

    for n in (0, 1, 2, 7):
        a = np.arange(n * n, dtype=float).reshape(n, n)
        np.testing.assert_array_equal(strict_upper(a), a[np.triu_indices(n, 1)])


def test_similarity_grids_match_scipy_with_blas_on_one_thread_in_the_workers(monkeypatch):
    """With several workers the grids run on one BLAS thread each (restored after): RSA against scipy's pearsonr and
    spearmanr of the upper triangles. Tolerance: each value is a dot product of two unit vectors of m = n (n - 1) / 2
    entries, whose rounding is at most m eps in any summation order (scipy's too), so 2 m eps (3.2e-12 here)."""
    from threadpoolctl import threadpool_info, threadpool_limits

    import bertology.metrics.similarity as sim

    def blas_threads():
        return {lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"}

    seen = []
    real = sim.layer_terms
    monkeypatch.setattr(sim, "layer_terms", lambda x: seen.append(blas_threads()) or real(x))
    rng = np.random.default_rng(12)
    xs = [_anisotropic(rng, 120, 24) for _ in range(2)]
    ys = [_anisotropic(rng, 120, 16), xs[1] @ rng.standard_normal((24, 24)).astype(np.float32)]
    with threadpool_limits(2, user_api="blas"):
        grids = sim.similarity_grids(xs, ys, workers=2)
        assert blas_threads() == {2}
    assert seen == [{1}] * 4
    tol = 2 * (120 * 119 // 2) * np.finfo(float).eps
    for i, x in enumerate(xs):
        for j, y in enumerate(ys):
            a, b = sim.cosine_similarity_upper(x), sim.cosine_similarity_upper(y)
            assert grids["rsa_pearson"][i, j] == pytest.approx(pearsonr(a, b)[0], rel=0, abs=tol)
            assert grids["rsa_spearman"][i, j] == pytest.approx(spearmanr(a, b)[0], rel=0, abs=tol)


def test_with_previous_is_the_union_with_p_minus_1_and_the_chain_starts():
    from bertology.metrics.similarity import _with_previous

    rng = np.random.default_rng(1)
    for p in (np.array([1, 2, 3, 7, 9, 10], dtype=np.intp), np.unique(rng.integers(1, 400, 250)), np.array([5])):
        union, starts = _with_previous(p)
        np.testing.assert_array_equal(union, np.union1d(p - 1, p))
        np.testing.assert_array_equal(starts, np.flatnonzero(~np.isin(union, p)))


@pytest.mark.parametrize("n", [0, 1, 2, 3, 2049, 50_000])
def test_radix_sort_of_the_high_bits_equals_numpys_sort(n):
    """_sort_above (average_ranks' sort): any uint64 keys sorted as np.sort does with low_bits=0 (the top and the
    bottom of the range included); with low_bits=b, equal high bits keep their input order (stable), so keys
    whose low bits ascend come out fully sorted, as average_ranks packs them (many equal high parts here)."""
    from bertology.metrics.similarity import _sort_above

    rng = np.random.default_rng(n)
    keys = rng.integers(0, 2**64 - 1, n, dtype=np.uint64, endpoint=True)
    keys[: min(n, 2)] = [2**64 - 1, 0][: min(n, 2)]
    full = keys.copy()
    _sort_above(full, 0)
    np.testing.assert_array_equal(full, np.sort(keys))
    b = max(1, (n - 1).bit_length())
    packed = (rng.integers(0, 5, n, dtype=np.uint64) << np.uint64(60)) | np.arange(n, dtype=np.uint64)
    stable = packed.copy()
    _sort_above(stable, b)
    np.testing.assert_array_equal(stable, np.sort(packed))
    shared = np.full(n, 7 << 40, dtype=np.uint64) | rng.permutation(n).astype(np.uint64)  # one digit all share
    out = shared.copy()
    _sort_above(out, 0)
    np.testing.assert_array_equal(out, np.sort(shared))
