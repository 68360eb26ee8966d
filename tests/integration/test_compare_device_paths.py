"""``compare`` with every analysis on the path it takes on a GPU, run here on the CPU (issue 35).

On a GPU each streaming analysis keeps its state on the device and computes there; on the CPU it keeps the
NumPy/Numba path. The unit tests pin each device path to the CPU one analysis by analysis; this test runs the
whole pipeline (extraction, ``update``, ``compute``, extra tables, the run folder) with every device path forced
on the CPU, as a GPU would take them, and checks the tables against the default run's. So a device path that
hands ``compute`` a tensor where a table wants an array, or loses a row, fails here without a GPU.

Tolerances, from the arithmetic: keys, counts, tokens and categories are integers or strings (exactly equal);
sums and statistics are float64 on both paths in another order (``~n eps`` relative); the PCA axes are
eigenvectors, which move by ``~eps lambda_1 / gap`` (the tiny models' clouds have gaps of a few percent of
``lambda_1``): 1e-9 relative to each column's scale covers every float column with orders to spare, and PCA's
coordinates are allowed 1e-7.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from bertology.analyses import geometry_fit, pca_views, representation_similarity
from bertology.analyses.attention_patterns import AttentionPatterns
from bertology.analyses.geometry import Geometry
from bertology.analyses.head_map import HeadMap
from bertology.analyses.pca_views import PCAViews
from bertology.analyses.relation_heads import RelationHeads
from bertology.analyses.representation_similarity import RepresentationSimilarity
from bertology.data.corpus import Corpus
from bertology.commands.compare import compare
from bertology.commands.selection import make_config
from bertology.testing import SENTENCES

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

#: Every switch that picks an analysis's device path (None: by the maps' device; True: the device path).
DEVICE_PATHS = [
    (AttentionPatterns, "on_device"), (Geometry, "on_device"), (HeadMap, "on_device"), (PCAViews, "on_device"),
    (RelationHeads, "score_on_device"), (RepresentationSimilarity, "compute_on_device"),
]
ANALYSES = ("attention_change", "attention_patterns", "attention_targets", "relation_heads",
            "representation_similarity", "head_map", "geometry", "pca_views")


def _run(planted_pair, out, corpus: Corpus) -> dict[str, pd.DataFrame]:
    base, tuned = planted_pair
    config = make_config("sentences", base=str(base), tuned=str(tuned), out=str(out), analyses=ANALYSES,
                         rsa_tokens=40, batch_size=4, view_examples=0)
    return {name: res.table for name, res in compare(config, corpus=corpus, report=False).results.items()}


def _assert_close(name: str, got: pd.DataFrame, ref: pd.DataFrame) -> None:
    assert list(got.columns) == list(ref.columns) and got.shape == ref.shape, name
    for col in ref.columns:
        a, b = got[col], ref[col]
        if pd.api.types.is_float_dtype(b):
            x, y = a.to_numpy(dtype=float), b.to_numpy(dtype=float)
            np.testing.assert_array_equal(np.isnan(x), np.isnan(y), err_msg=f"{name}.{col}: NaN on one side")
            ok = ~np.isnan(y)
            scale = max(1.0, float(np.abs(y[ok]).max())) if ok.any() else 1.0
            rtol = 1e-7 if name == "pca_views" and col in ("x", "y") else 1e-9
            np.testing.assert_allclose(x[ok], y[ok], rtol=0, atol=rtol * scale, err_msg=f"{name}.{col}")
        else:
            pd.testing.assert_series_equal(a, b, check_exact=True, obj=f"{name}.{col}")


#: Functions only the device paths call (module, name): counted, to show the forced run took those paths.
DEVICE_ONLY = [(pca_views, "leading_pca_torch"), (geometry_fit, "max_explainable_variance_torch"),
               (representation_similarity, "similarity_grids_torch"), (RelationHeads, "_count_on_device")]


def _counted(monkeypatch) -> dict[str, int]:
    calls = {name: 0 for _, name in DEVICE_ONLY}
    for owner, name in DEVICE_ONLY:
        def wrapper(*args, _f=getattr(owner, name), _name=name, **kwargs):
            calls[_name] += 1
            return _f(*args, **kwargs)

        monkeypatch.setattr(owner, name, wrapper)
    return calls


def test_compare_on_the_gpu_paths_gives_the_cpu_tables(planted_pair, tmp_path, monkeypatch):
    corpus = Corpus.from_list(SENTENCES)
    calls = _counted(monkeypatch)
    ref = _run(planted_pair, tmp_path / "cpu", corpus)
    assert set(calls.values()) == {0}  # the CPU's own paths
    for cls, switch in DEVICE_PATHS:
        monkeypatch.setattr(cls, switch, True)
    monkeypatch.setattr(RepresentationSimilarity, "host_rows", False)  # rows gathered by torch, as on a GPU
    got = _run(planted_pair, tmp_path / "gpu-paths", corpus)
    assert min(calls.values()) > 0, calls  # every device path ran
    assert set(got) == set(ref) and {"relation_heads", "attention_targets", "pca_views", "geometry_words"} <= set(ref)
    for name in sorted(ref):
        _assert_close(name, got[name], ref[name])
