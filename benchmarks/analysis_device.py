"""CPU cost of representation_similarity and attention_change, old tree vs this one, interleaved in one process (issue 35).

No model: BERT-base-shaped batches (13 hidden states of width 768, 12 layers x 12 heads of softmaxed maps,
``--batch`` sentences of 20..``--length`` tokens) are made once from a seed and fed, in alternating order
each round, to the analyses of this tree and to the same files of ``--old`` (a git ref, read with
``git show``; they import the rest of bertology from this tree, which they share unchanged). The shared
layer statistics are computed before the clock starts (both trees read the same cache). Prints per round
the seconds of the updates (``--batches`` batches) and of representation_similarity's compute(), the
new/old ratios (median over rounds), and checks that the tables are equal::

    PYTHONPATH=src python benchmarks/analysis_device.py --old main --rounds 3

``--geometry`` times the geometry analysis instead (updates, then compute() and the word table), its items given
token ids, word ids and special tokens (1..3 pieces a word, a vocabulary of 2,000 ids, so words repeat), and once
more with the device path forced on the CPU (``on_device=True``, the path a GPU takes; informative: the CPU keeps
NumPy), and compute() + word table of one state on the NumPy path and the torch path (the GPU's compute, tensors on
the CPU), interleaved::

    PYTHONPATH=src python benchmarks/analysis_device.py --old main --rounds 3 --geometry

``--pca`` times pca_views (``--pca-examples`` sampled examples, 13 layers, both fits): updates and compute() of
``--old``'s pca_views.py vs this tree, interleaved, tables checked exactly equal; then, on the same kept sample,
compute() on the NumPy path vs the torch path (the path a GPU takes, tensors on the CPU), interleaved, with the
largest coordinate and ratio differences::

    PYTHONPATH=src python benchmarks/analysis_device.py --old main --rounds 3 --pca

``--attention`` times attention_patterns and attention_targets (token categories; no word annotations) on the same
batches, their items given token ids whose every 25th is punctuation, [CLS] and [SEP] (the key masks now come from
the items)::

    PYTHONPATH=src python benchmarks/analysis_device.py --old main --rounds 5 --attention

``--torch-compute`` also times one sample's grids on the NumPy path and on the torch path on the CPU (the path
a GPU takes), once each (``--rounds 0``: only that).
"""
from __future__ import annotations

import argparse
import copy
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import torch

from bertology.activations.batch import PairBatch
from bertology.analyses.attention_change import AttentionChange
from bertology.analyses.attention_patterns import AttentionPatterns
from bertology.analyses.attention_targets import AttentionTargets
from bertology.analyses.geometry import Geometry
from bertology.analyses.pca_views import PCAViews
from bertology.analyses.representation_similarity import RepresentationSimilarity
from bertology.models.hooks import Captured

FILES = {"rs": "src/bertology/analyses/representation_similarity.py", "ac": "src/bertology/analyses/attention_change.py",
         "geo": "src/bertology/analyses/geometry.py", "pca": "src/bertology/analyses/pca_views.py",
         "ap": "src/bertology/analyses/attention_patterns.py", "at": "src/bertology/analyses/attention_targets.py"}


def old_module(ref: str, key: str, folder: Path):
    """The analysis module at git ``ref``, imported under a private name."""
    path = folder / f"old_{key}.py"
    path.write_text(subprocess.run(["git", "show", f"{ref}:{FILES[key]}"], check=True, capture_output=True, text=True).stdout)
    spec = importlib.util.spec_from_file_location(f"_old_{key}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def make_batches(n_distinct: int, n: int, size: int, length: int, layers: int = 12, heads: int = 12,
                 hidden: int = 768) -> list[PairBatch]:
    """``n`` batches cycling over ``n_distinct`` sets of seeded tensors, each with its own example indices."""
    g = torch.Generator().manual_seed(0)
    sets = []
    for _ in range(n_distinct):
        lengths = torch.randint(20, length + 1, (size,), generator=g)
        t = int(lengths.max())
        mask = torch.arange(t)[None, :] < lengths[:, None]
        content = mask.clone()
        content[:, 0] = False
        content[torch.arange(size), lengths - 1] = False
        caps = []
        for _model in range(2):
            hs = [torch.randn(size, t, hidden, generator=g) for _ in range(layers + 1)]
            att = [None] + [torch.softmax(torch.randn(size, heads, t, t, generator=g) + (~mask[:, None, None, :]) * -1e9, -1)
                            for _ in range(layers)]
            caps.append(Captured(hs, att))
        sets.append((mask, content, lengths, caps, {}))
    out = []
    for i in range(n):
        mask, content, lengths, caps, cache = sets[i % n_distinct]
        items = [SimpleNamespace(index=i * size + j) for j in range(size)]
        out.append(PairBatch(items, torch.zeros_like(mask, dtype=torch.long), mask, content, lengths, caps[0], caps[1], cache))
    for b in out[:n_distinct]:
        for layer in range(1, layers + 1):
            b.layer_stats(layer)  # shared by both trees' attention_change: outside the clock
    return out


def with_words(batches: list[PairBatch], vocab: int = 2000, seed: int = 1) -> list[PairBatch]:
    """The batches with items geometry can read: token ids, word ids (1..3 pieces a word), special [CLS]/[SEP]."""
    rng = np.random.default_rng(seed)
    out = []
    for b in batches:
        items = []
        for it, n in zip(b.items, b.lengths.tolist()):
            sizes = rng.integers(1, 4, n)
            wid = np.repeat(np.arange(n), sizes)[: n - 2]
            word_ids = np.concatenate([[-1], wid, [-1]]).astype(np.int64)
            ids = rng.integers(10, vocab, n)  # a word's pieces: one id per (word, piece) below, so forms repeat
            ids[1:-1] = 10 + (rng.zipf(1.3, int(wid.max()) + 1)[wid] * 7 + np.arange(n - 2) - np.searchsorted(wid, wid)) % vocab
            special = word_ids < 0
            items.append(SimpleNamespace(index=it.index, input_ids=ids, word_ids=word_ids, special=special,
                                         segment=np.where(special, -1, 0)))
        out.append(PairBatch(items, b.input_ids, b.mask, b.content, b.lengths, b.base, b.tuned, b._cache))
    return out


class StubTokenizer:
    """Token strings for :func:`with_tokens`' ids: 1 is [CLS], 2 is [SEP], every 25th id a full stop."""

    cls_token_id, sep_token_id = 1, 2

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str]:
        return ["[CLS]" if i == 1 else "[SEP]" if i == 2 else "." if i % 25 == 0 else f"w{i}" for i in ids]


def with_tokens(batches: list[PairBatch]) -> list[PairBatch]:
    """:func:`with_words`' batches with [CLS]/[SEP] ids at the ends and ``input_ids`` built from the items."""
    out = []
    for b in with_words(batches):
        ids = torch.zeros_like(b.mask, dtype=torch.long)
        items = []
        for row, it in enumerate(b.items):
            tok_ids = it.input_ids.copy()
            tok_ids[0], tok_ids[-1] = 1, 2
            items.append(_Item(**{**vars(it), "input_ids": tok_ids}))
            ids[row, : len(tok_ids)] = torch.from_numpy(tok_ids)
        out.append(PairBatch(items, ids, b.mask, b.content, b.lengths, b.base, b.tuned, b._cache))
    return out


class _Item(SimpleNamespace):
    """An item with a length (the host-side masks count tokens with ``len``)."""

    def __len__(self) -> int:
        return len(self.input_ids)


def run_attention(classes: tuple, batches: list[PairBatch], layers: int) -> tuple[float, float, list[pd.DataFrame]]:
    """Seconds of every update of attention_patterns and attention_targets, of their compute(), and both tables."""
    tok = StubTokenizer()
    made = [classes[0](tok, layers, 12), classes[1](None, tok, layers, 12, word_level=False)]
    t0 = time.perf_counter()
    with torch.inference_mode():
        for b in batches:
            b._cache.pop(("host_tokens",), None)  # built per batch in a run: inside the clock
            for a in made:
                a.update(b)
    t1 = time.perf_counter()
    tables = [a.compute().table for a in made]
    return t1 - t0, time.perf_counter() - t1, tables


def run_geometry(cls, batches: list[PairBatch], layers: int, on_device: bool | None = None) -> tuple[float, float, list[pd.DataFrame]]:
    """Seconds of every update, seconds of compute() and the word table, and both tables."""
    g = cls(layers, n_pairs=1000, seed=0)
    g.on_device = on_device
    t0 = time.perf_counter()
    with torch.inference_mode():
        for b in batches:
            g.update(b)
    t1 = time.perf_counter()
    tables = [g.compute().table, g.word_table().table]
    return t1 - t0, time.perf_counter() - t1, tables


def run(classes: tuple, batches: list[PairBatch], layers: int) -> tuple[float, float, list[pd.DataFrame]]:
    """Seconds of every update, seconds of representation_similarity's compute, and both tables."""
    ac, rs = classes[0](layers, 12), classes[1](layers, 2000, 0)
    t0 = time.perf_counter()
    with torch.inference_mode():
        for b in batches:
            ac.update(b)
            rs.update(b)
    t1 = time.perf_counter()
    rs_table = rs.compute().table
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, [ac.compute().table, rs_table]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", default="main")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batches", type=int, default=40)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--length", type=int, default=48)
    ap.add_argument("--torch-compute", action="store_true")
    ap.add_argument("--geometry", action="store_true")
    ap.add_argument("--pca", action="store_true")
    ap.add_argument("--pca-examples", type=int, default=20)
    ap.add_argument("--attention", action="store_true")
    args = ap.parse_args()
    layers = 12
    if args.pca:
        return main_pca(args, layers)
    if args.geometry:
        return main_geometry(args, layers)
    if args.attention:
        return main_attention(args, layers)
    with tempfile.TemporaryDirectory() as tmp:
        old = (old_module(args.old, "ac", Path(tmp)).AttentionChange, old_module(args.old, "rs", Path(tmp)).RepresentationSimilarity)
    new = (AttentionChange, RepresentationSimilarity)
    batches = make_batches(4, args.batches, args.batch, args.length)
    times: dict[str, list] = {"old": [], "new": []}
    tables = {}
    for r in range(args.rounds):  # --rounds 0: only --torch-compute
        for tree in (("old", "new") if r % 2 == 0 else ("new", "old")):
            up, comp, tabs = run(old if tree == "old" else new, batches, layers)
            times[tree].append((up, comp))
            tables[tree] = tabs
            print(f"round {r} {tree}: update {up:.3f} s, rs compute {comp:.3f} s", flush=True)
    out = {"torch_threads": torch.get_num_threads(), "batches": args.batches, "batch": args.batch}
    if args.rounds:
        for a, b in zip(tables["new"], tables["old"]):
            pd.testing.assert_frame_equal(a, b, check_exact=True)
        med = {t: [statistics.median(x[i] for x in v) for i in range(2)] for t, v in times.items()}
        out.update({"median_seconds": med, "tables_equal": "exactly",
                    "ratio_new_over_old": {"update": med["new"][0] / med["old"][0], "rs_compute": med["new"][1] / med["old"][1]}})
    if args.torch_compute:  # the same sample's grids on both paths, alternately
        rs = RepresentationSimilarity(layers, 2000, 0)
        with torch.inference_mode():
            for b in batches:
                rs.update(b)
        secs: dict[bool, float] = {}
        grids = {}
        for on_device in (False, True):
            rs.compute_on_device = on_device
            t0 = time.perf_counter()
            grids[on_device] = rs._grids()
            secs[on_device] = time.perf_counter() - t0
        out["rs_compute_seconds_numpy_vs_torch_on_cpu"] = [secs[False], secs[True]]
        out["torch_path_max_abs_diff"] = max(float(np.abs(grids[True][k] - grids[False][k]).max()) for k in grids[False])
    print(json.dumps(out))


def main_attention(args, layers: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        old = (old_module(args.old, "ap", Path(tmp)).AttentionPatterns, old_module(args.old, "at", Path(tmp)).AttentionTargets)
    new = (AttentionPatterns, AttentionTargets)
    batches = with_tokens(make_batches(4, args.batches, args.batch, args.length))
    times: dict[str, list] = {"old": [], "new": []}
    tables = {}
    for r in range(args.rounds):
        for tree in (("old", "new") if r % 2 == 0 else ("new", "old")):
            up, comp, tabs = run_attention(old if tree == "old" else new, batches, layers)
            times[tree].append((up, comp))
            tables[tree] = tabs
            print(f"round {r} {tree}: update {up:.3f} s, compute {comp:.3f} s", flush=True)
    for a, b in zip(tables["new"], tables["old"]):
        pd.testing.assert_frame_equal(a, b, check_exact=True)
    assert (tables["old"][1].query("target == 'punct'")["n"] > 0).all()  # punctuation keys were found
    med = {t: [statistics.median(x[i] for x in v) for i in range(2)] for t, v in times.items()}
    ratios = [n[0] / o[0] for n, o in zip(times["new"], times["old"])]
    print(json.dumps({"torch_threads": torch.get_num_threads(), "batches": args.batches, "batch": args.batch,
                      "median_seconds": med, "tables_equal": "exactly",
                      "ratio_new_over_old": {"update": med["new"][0] / med["old"][0], "compute": med["new"][1] / med["old"][1],
                                             "update_per_round_median": statistics.median(ratios)}}))


def main_geometry(args, layers: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        old = old_module(args.old, "geo", Path(tmp)).Geometry
    batches = with_words(make_batches(4, args.batches, args.batch, args.length))
    times: dict[str, list] = {"old": [], "new": []}
    tables = {}
    for r in range(args.rounds):
        for tree in (("old", "new") if r % 2 == 0 else ("new", "old")):
            up, comp, tabs = run_geometry(old if tree == "old" else Geometry, batches, layers)
            times[tree].append((up, comp))
            tables[tree] = tabs
            print(f"round {r} {tree}: update {up:.3f} s, compute {comp:.3f} s", flush=True)
    for a, b in zip(tables["new"], tables["old"]):
        pd.testing.assert_frame_equal(a, b, check_exact=True)
    med = {t: [statistics.median(x[i] for x in v) for i in range(2)] for t, v in times.items()}
    up, comp, dev_tables = run_geometry(Geometry, batches, layers, on_device=True)
    diff = float(np.nanmax(np.abs(dev_tables[0]["value"].to_numpy() - tables["old"][0]["value"].to_numpy())))
    # the same state, compute() + word table on the NumPy path and on the torch path (tensors on the CPU), alternately
    host = Geometry(layers, n_pairs=1000, seed=0)
    with torch.inference_mode():
        for b in batches:
            host.update(b)
    dev = copy.deepcopy(host)
    dev.base_vectors = torch.from_numpy(dev.base_vectors)
    dev.intra_sum, dev.intra_sq = torch.from_numpy(dev.intra_sum), torch.from_numpy(dev.intra_sq)
    for w in dev.words.values():
        w.vectors = None if w.vectors is None else torch.from_numpy(w.vectors)
    secs: dict[str, list] = {"numpy": [], "torch": []}
    for r in range(max(args.rounds, 1)):
        for path in (("numpy", "torch") if r % 2 == 0 else ("torch", "numpy")):
            g = host if path == "numpy" else dev
            g._finished.clear()
            t0 = time.perf_counter()
            g.compute(), g.word_table()
            secs[path].append(time.perf_counter() - t0)
    cmp = {p: statistics.median(v) for p, v in secs.items()}
    print(json.dumps({"torch_threads": torch.get_num_threads(), "batches": args.batches, "batch": args.batch,
                      "words": len(tables["old"][1]) // (2 * (layers + 1)), "median_seconds": med, "tables_equal": "exactly",
                      "ratio_new_over_old": {"update": med["new"][0] / med["old"][0], "compute": med["new"][1] / med["old"][1],
                                             "update_plus_compute": sum(med["new"]) / sum(med["old"])},
                      "device_path_on_cpu_seconds": [up, comp], "device_path_max_abs_value_diff": diff,
                      "compute_seconds_numpy_vs_torch_on_cpu": [cmp["numpy"], cmp["torch"]],
                      "torch_over_numpy": cmp["torch"] / cmp["numpy"]}))


def run_pca(cls, batches: list[PairBatch], layers: int, n_examples: int) -> tuple[float, float, pd.DataFrame, object]:
    """Seconds of every update and of compute(), the table, and the analysis (its kept sample)."""
    a = cls(layers, examples=n_examples, seed=0)
    t0 = time.perf_counter()
    with torch.inference_mode():
        for b in batches:
            a.update(b)
    t1 = time.perf_counter()
    table = a.compute().table
    return t1 - t0, time.perf_counter() - t1, table, a


def main_pca(args, layers: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        old = old_module(args.old, "pca", Path(tmp)).PCAViews
    batches = with_words(make_batches(4, args.batches, args.batch, args.length))
    times: dict[str, list] = {"old": [], "new": []}
    tables = {}
    for r in range(args.rounds):
        for tree in (("old", "new") if r % 2 == 0 else ("new", "old")):
            up, comp, tables[tree], _ = run_pca(old if tree == "old" else PCAViews, batches, layers, args.pca_examples)
            times[tree].append((up, comp))
            print(f"round {r} {tree}: update {up:.3f} s, compute {comp:.3f} s", flush=True)
    out = {"torch_threads": torch.get_num_threads(), "batches": args.batches, "batch": args.batch}
    if args.rounds:
        pd.testing.assert_frame_equal(tables["new"], tables["old"], check_exact=True)
        med = {t: [statistics.median(x[i] for x in v) for i in range(2)] for t, v in times.items()}
        out.update({"median_seconds": med, "tables_equal": "exactly",
                    "ratio_new_over_old": {"update": med["new"][0] / med["old"][0], "compute": med["new"][1] / med["old"][1]}})
    # the same sample, compute() on the NumPy path and on the torch path (tensors on the CPU), alternately
    host = run_pca(PCAViews, batches, layers, args.pca_examples)[3]
    dev = PCAViews(layers, examples=args.pca_examples, seed=0)
    dev.kept = [type(e)(e.key, e.index, e.tokens, e.categories, e.positions, torch.from_numpy(e.vectors)) for e in host.kept]
    dev.n_seen = host.n_seen
    secs: dict[str, list] = {"numpy": [], "torch": []}
    result = {}
    for r in range(max(args.rounds, 1)):
        for path in (("numpy", "torch") if r % 2 == 0 else ("torch", "numpy")):
            t0 = time.perf_counter()
            result[path] = (host if path == "numpy" else dev).compute().table
            secs[path].append(time.perf_counter() - t0)
    a, b = result["torch"], result["numpy"]
    n_tokens = int(b.n_tokens.iloc[0])
    out.update({"pca_tokens": n_tokens, "compute_seconds_numpy_vs_torch_on_cpu": [statistics.median(secs["numpy"]),
                                                                                  statistics.median(secs["torch"])],
                "torch_over_numpy": statistics.median(secs["torch"]) / statistics.median(secs["numpy"]),
                "torch_path_max_abs_xy_diff": float(np.abs(a[["x", "y"]].to_numpy() - b[["x", "y"]].to_numpy()).max()),
                "max_abs_xy": float(np.abs(b[["x", "y"]].to_numpy()).max()),
                "torch_path_max_abs_ratio_diff": float(np.abs(a.explained_variance_x - b.explained_variance_x).max())})
    print(json.dumps(out))


if __name__ == "__main__":
    main()
