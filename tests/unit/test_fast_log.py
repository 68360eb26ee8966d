"""The vectorisable float32 log of the Numba kernels against the correctly rounded log."""
import numpy as np

from bertology.metrics.fast_log import log32_array


def test_log32_is_within_one_ulp_over_every_binade_of_normal_floats():
    rng = np.random.default_rng(0)
    exponents = np.repeat(np.arange(1, 255, dtype=np.uint32), 500)  # every normal binade
    mantissas = rng.integers(0, 1 << 23, size=exponents.size, dtype=np.uint32)
    x = ((exponents << 23) | mantissas).view(np.float32)
    edges = [np.finfo(np.float32).tiny, 0.5, 1.0, 2.0, np.finfo(np.float32).max,
             np.nextafter(np.float32(np.sqrt(0.5)), np.float32(0)), np.float32(np.sqrt(0.5)),
             np.nextafter(np.float32(1), np.float32(0)), np.nextafter(np.float32(1), np.float32(2))]
    x = np.concatenate([x, np.array(edges, dtype=np.float32)])
    exact = np.log(x.astype(np.float64))
    ulp = np.spacing(np.abs(exact).astype(np.float32)).astype(np.float64)
    err = np.abs(log32_array(x).astype(np.float64) - exact) / ulp
    assert err.max() <= 1.0  # Cephes logf: 0.75 ulp on this sample
    assert log32_array(np.array([1.0], dtype=np.float32))[0] == 0.0
