"""The compute() of representation_similarity and pca_views at BERT-base size, alone (issue 18).

No model: each analysis's accumulated state is set to seeded random vectors of BERT-base shape
(13 layers x 2 models; 2,000 sampled tokens of width 768 for representation_similarity, the default;
20 examples of 25 tokens for pca_views), anisotropic like real hidden states (a shared offset and
decaying per-dimension scales), with repeated rows so the RSA ranks have ties. Run it with a tree's
``src`` on ``PYTHONPATH``; it prints the seconds of each compute() and saves the tables (``--out``), so
two trees can be timed alternately and their numbers compared (``cpu_seconds``: the process's CPU time, all
threads, during each compute(); spin-waiting BLAS threads count there too)::

    PYTHONPATH=<tree>/src python benchmarks/analysis_compute.py --out /tmp/x/<tree>

``--only representation_similarity`` times that one; ``--trace-memory`` also records the peak of the
bytes NumPy allocates during each compute() (tracemalloc; slower, so time without it).
"""
from __future__ import annotations

import argparse
import json
import os
import time
import tracemalloc
from pathlib import Path

import numpy as np


def vectors(rng: np.random.Generator, n: int, dim: int = 768) -> np.ndarray:
    scale = np.geomspace(3.0, 0.05, dim)
    x = rng.standard_normal((n, dim)) * scale + 4.0 * rng.standard_normal(dim) * scale
    x[1::97] = x[0]  # identical tokens: ties in the cosine ranks
    return x.astype(np.float32)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--only", choices=["representation_similarity", "pca_views"], default=None)
    ap.add_argument("--trace-memory", action="store_true")
    args = ap.parse_args()
    import torch

    from bertology.analyses.pca_views import PCAViews, _Example
    from bertology.analyses.representation_similarity import RepresentationSimilarity

    rng = np.random.default_rng(0)
    n_layers = args.layers + 1
    rs = RepresentationSimilarity(args.layers)
    rs.keys = np.arange(2000, dtype=np.uint64)
    rs.ids = np.stack([np.arange(2000), np.zeros(2000, np.int64)], axis=1)
    rs.base = [vectors(rng, 2000) for _ in range(n_layers)]
    rs.tuned = [vectors(rng, 2000) for _ in range(n_layers)]
    if isinstance(getattr(rs, "device", None), torch.device):  # issue 35: the sample is torch tensors (CPU here)
        rs.keys, rs.ids = torch.arange(2000), torch.from_numpy(rs.ids)
        rs.base, rs.tuned = [torch.from_numpy(v) for v in rs.base], [torch.from_numpy(v) for v in rs.tuned]
    rs.n_seen = 12622
    pv = PCAViews(args.layers)
    for i in range(20):
        v = np.stack([np.stack([vectors(rng, 25) for _ in range(n_layers)], axis=1) for _ in range(2)], axis=1)
        pv.kept.append(_Example(np.uint64(i), i, ["t"] * 25, ["word"] * 25, np.arange(25), v))
    args.out.mkdir(parents=True, exist_ok=True)
    times, cpu, peaks = {}, {}, {}
    for a in (rs, pv):
        if args.only not in (None, a.name):
            continue
        if args.trace_memory:
            tracemalloc.start()
        t0, c0 = time.perf_counter(), time.process_time()
        res = a.compute()
        times[a.name] = time.perf_counter() - t0
        cpu[a.name] = time.process_time() - c0  # all threads' CPU time: steadier than wall time on a loaded machine
        if args.trace_memory:
            peaks[a.name] = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        res.table.to_parquet(args.out / f"{a.name}.parquet")
    out = {"seconds": times, "cpu_seconds": cpu, "torch_threads": torch.get_num_threads(), "load_average": os.getloadavg()}
    if peaks:
        out["peak_traced_bytes"] = peaks
    print(json.dumps(out))
    (args.out / "times.json").write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
