"""What the head map (Clark et al. 2019 §6) costs next to the forward passes, and how many examples it needs.

Runs bertology's extraction over the first ``--n`` sentences twice, interleaved over ``--repeats``
rounds: capture only (the forward passes of both models with attentions, no analysis) and
+ ``HeadMap(max_examples=n)`` (every example in the sample, so the difference is the per-example
cost of the all-pairs JS divergence). ``compute()`` (MDS) is timed separately.

Because the analysis keeps per-example sums for its sample, the run also gives, for free, the
distance matrix of any subset: ``--stability`` compares bottom-k samples of k = 25..n//2 examples
(three seeds each) with the matrix of all n examples (Pearson of the JS distances, Spearman of
``moved``, overlap of the 10 most-moved heads): the evidence for the default ``max_examples``.

    .venv/bin/python benchmarks/head_map.py [--tuned DIR] [--data CSV] [--n 400] [--repeats 2] [--stability]
        [--figure PNG]
"""
from __future__ import annotations

import argparse
import glob
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from scipy.stats import pearsonr, spearmanr

from bertology.activations.extract import run_analyses
from bertology.analyses.attention_change import AttentionChange
from bertology.analyses.head_map import HeadMap, example_keys
from bertology.assets import polarity_path
from bertology.data.encode import encode_corpus
from bertology.data.loaders import load_corpus
from bertology.metrics.head_distance import square
from bertology.models.pair import ModelPair

ROOT = Path(__file__).resolve().parents[1]


class _CaptureOnly(AttentionChange):
    """Requests attentions but does nothing with them: the cost of the forwards with capture."""

    def update(self, batch) -> None:  # noqa: D401 - intentionally empty
        return None


def _default_tuned() -> str:
    found = sorted(glob.glob(str(ROOT / "runs/demo-model/model"))) + sorted(glob.glob("/tmp/*/runs/demo-model/model"))
    return found[0] if found else "minilm"


def _stability(a: HeadMap, ks: list[int], seeds: tuple[int, ...] = (0, 1, 2)) -> list[dict]:
    """Distances from bottom-k subsets of the stored per-example sums vs those of the whole sample."""
    k_total = a.n_heads_total
    half = k_total // 2
    ref = np.sqrt(square(a.sums.sum(0) / a.rows.sum(), k_total))
    iu = np.triu_indices(k_total, 1)
    ref_moved = np.diag(ref[:half, half:])
    ref_top = set(np.argsort(-ref_moved)[:10])
    out = []
    for k in ks:
        for seed in seeds:
            sel = np.argsort(example_keys(seed, a.indices))[:k]
            d = np.sqrt(square(a.sums[sel].sum(0) / a.rows[sel].sum(), k_total))
            moved = np.diag(d[:half, half:])
            out.append({
                "k": k, "seed": seed,
                "pearson_distance": float(pearsonr(ref[iu], d[iu]).statistic),
                "max_abs_err_distance": float(np.abs(ref[iu] - d[iu]).max()),
                "spearman_moved": float(spearmanr(ref_moved, moved).statistic),
                "top10_overlap": len(ref_top & set(np.argsort(-moved)[:10])),
            })
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", default="minilm")
    ap.add_argument("--tuned", default=None, help="default: a runs/demo-model/model if one exists, else minilm")
    ap.add_argument("--data", default=str(polarity_path()))
    ap.add_argument("--n", type=int, default=400)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--stability", action="store_true")
    ap.add_argument("--figure", default=None, help="also save the head map figure (PNG) of the n examples here")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results/head_map.json"))
    args = ap.parse_args()
    args.tuned = args.tuned or _default_tuned()

    pair = ModelPair.load(args.base, args.tuned)
    corpus = load_corpus(args.data, limit=args.n)
    enc = encode_corpus(corpus, pair.tokenizer, 128, "skip")
    n = len(enc.items)
    L, H = pair.num_layers, pair.num_heads
    run_analyses(pair, encode_corpus(corpus.head(32), pair.tokenizer), [_CaptureOnly(L, H), HeadMap(L, H)],
                 batch_size=args.batch_size)  # warm-up
    times: dict[str, list[float]] = {"capture only": [], "+ head_map (all n examples)": [], "head_map compute (MDS)": []}
    last = None
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        run_analyses(pair, enc, [_CaptureOnly(L, H)], batch_size=args.batch_size)
        times["capture only"].append(time.perf_counter() - t0)
        last = HeadMap(L, H, max_examples=n)
        t0 = time.perf_counter()
        run_analyses(pair, enc, [last], batch_size=args.batch_size)
        times["+ head_map (all n examples)"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        result = last.compute()
        times["head_map compute (MDS)"].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) for k, v in times.items()}
    fwd = med["capture only"] / n
    per_ex = (med["+ head_map (all n examples)"] - med["capture only"]) / n
    print(f"{args.base} vs {args.tuned}: {n} sentences, {enc.n_tokens} tokens (mean {enc.n_tokens / n:.1f}), "
          f"K = {2 * L * H} heads, {last.n_pairs} pairs, torch threads {torch.get_num_threads()}")
    print("| step | seconds (median) | per example |\n|---|---:|---:|")
    for k, v in med.items():
        print(f"| {k} | {v:.2f} | {1000 * v / n:.2f} ms |")
    print(f"head_map update alone: {1000 * per_ex:.2f} ms/example = {per_ex / fwd:.2f}x the forward passes of "
          f"both models ({1000 * fwd:.2f} ms/example)")
    for k in (100, 200, 500, 1000):
        print(f"  max_examples={k}: {k * per_ex:.1f} s, i.e. +{100 * k * per_ex / (4000 * fwd):.0f} % on a "
              f"4,000-sentence corpus pass ({4000 * fwd:.0f} s)")
    stab = []
    if args.stability:
        ks = [k for k in (25, 50, 100, 200, 300) if k <= n // 2] or [n // 2]
        stab = _stability(last, ks)
        print(f"\nstability vs all {n} examples (mean over 3 seeds):")
        print("| k | Pearson of JS distances | max abs err | Spearman of moved | top-10 moved overlap |\n|---:|---:|---:|---:|---:|")
        for k in ks:
            rows = [r for r in stab if r["k"] == k]
            print(f"| {k} | {np.mean([r['pearson_distance'] for r in rows]):.4f} | "
                  f"{np.mean([r['max_abs_err_distance'] for r in rows]):.4f} | "
                  f"{np.mean([r['spearman_moved'] for r in rows]):.3f} | {np.mean([r['top10_overlap'] for r in rows]):.1f} |")
    if args.figure:
        from bertology.analyses.head_map import most_moved
        from bertology.viz.head_map import head_map_figure

        head_map_figure(result.table).savefig(args.figure, dpi=150)
        print("\nmost moved:\n" + most_moved(result.table, 10).to_string(index=False))
        print(f"stress {result.table.stress.iloc[0]:.3f}; figure: {args.figure}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"args": vars(args), "n_sentences": n, "n_tokens": enc.n_tokens,
                                          "times": times, "ms_per_example_forward": 1000 * fwd,
                                          "ms_per_example_head_map": 1000 * per_ex, "stability": stab}, indent=2))


if __name__ == "__main__":
    main()
