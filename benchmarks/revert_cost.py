"""Revert and transplant sweeps: hidden states reused below the first changed layer (cached) against a full forward
per unit (naive), interleaved.

Model: the packaged MiniLM (6 layers x 12 heads, hidden 384) as the base encoder; the "tuned" model is the same
checkpoint as a 2-label classifier with every weight moved (``move_every_weight``, scale 0.2, seed 2: nothing is
fine-tuned, every unit differs from the base). Data: a seeded stratified sample of ``--n`` (64) of the demo's
held-out polarity sentences, batches of 32. Units: revert's full plan (intact, 72 heads, 3 blocks x 6 layers,
embeddings: 92) and transplant's with every head (tuned, head alone, 6 x 3 blocks, 72 heads, embeddings, both
layer curves: 103 distinct models). Rounds alternate cached and naive (the order flips each round) so machine load
drifts into both; scoring and bootstrap are outside the clocks. Every round checks that the two methods' per-example
predictions and losses are equal bit for bit.

    HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 PYTHONPATH=src .venv/bin/python benchmarks/revert_cost.py [--n 64] [--rounds 3]

Writes ``benchmarks/results/revert_cost.json``.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import time
from pathlib import Path

import numpy as np
import torch

from bertology.assets import polarity_path
from bertology.data.encode import encode_corpus
from bertology.data.loaders import load_corpus
from bertology.demo import split_heldout
from bertology.experiments.ablation import HeadScoring, sample_examples
from bertology.experiments.intervention_sweep import sweep_units
from bertology.experiments.interventions import Revert
from bertology.experiments.revert_sweep import plan_revert_units
from bertology.experiments.scoring import ProgressStore, classifier_batches
from bertology.experiments.transplant_score import HEAD_ALONE_KEY, TUNED_KEY
from bertology.experiments.transplant_sweep import plan_transplant, sweep_runs
from bertology.models.loading import load_model
from bertology.testing import move_every_weight

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def _git_head() -> str | None:
    try:
        return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True).strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def _timed(sweep, method: str) -> tuple[float, ProgressStore, str]:
    """Seconds one sweep takes with ``method``, its records and the method that ran."""
    store = ProgressStore(None, "bench")
    t0 = time.perf_counter()
    ran = sweep(store, method)
    return time.perf_counter() - t0, store, ran


def _same(a: ProgressStore, b: ProgressStore) -> bool:
    return a.memory.keys() == b.memory.keys() and all(
        np.array_equal(a.get(k)[r], b.get(k)[r]) for k in a.memory for r in ("pred", "loss"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=32)
    args = ap.parse_args()
    base = load_model("minilm", kind="encoder").model
    loaded = load_model("minilm", kind="classifier", num_labels=2)
    tuned, tok = loaded.model, loaded.tokenizer
    move_every_weight(tuned.parameters(), 0.2)
    _, heldout = split_heldout(load_corpus(polarity_path()), 0.2, 0)
    sample = sample_examples(heldout, args.n, 0)
    enc = encode_corpus(sample, tok, overlong="truncate")
    names = sorted({str(ex.label) for ex in sample})  # the moved classifier knows no label names: 0, 1 by sort order
    labels = np.array([names.index(str(ex.label)) for ex in sample])
    batches = classifier_batches(tuned, enc, labels, HeadScoring.for_tokenizer(tok, batch_size=args.batch_size))
    units, _ = plan_revert_units(tuned)
    rows, _ = plan_transplant(tuned, heads=True)
    runs = {TUNED_KEY: frozenset(), HEAD_ALONE_KEY: frozenset()} | {r.key: r.parts for r in rows}
    sweeps = {
        "revert": lambda store, m: sweep_units(tuned, Revert(base), batches, store, units, method=m),
        "transplant": lambda store, m: sweep_runs(tuned, base, batches, store, runs, method=m),
    }
    times: dict[str, dict[str, list[float]]] = {s: {"cached": [], "naive": []} for s in sweeps}
    identical = {s: True for s in sweeps}
    for r in range(args.rounds):
        for name, sweep in sweeps.items():
            order = ("cached", "naive") if r % 2 == 0 else ("naive", "cached")
            out = {m: _timed(sweep, m) for m in order}
            assert out["cached"][2] == "cached"
            identical[name] &= _same(out["cached"][1], out["naive"][1])
            for m in order:
                times[name][m].append(out[m][0])
            print(f"round {r + 1} {name}: cached {out['cached'][0]:.2f}s naive {out['naive'][0]:.2f}s "
                  f"ratio {out['cached'][0] / out['naive'][0]:.3f}", flush=True)
    summary = {}
    for name in sweeps:
        ratios = [c / n for c, n in zip(times[name]["cached"], times[name]["naive"])]
        summary[name] = {"units": len(units) if name == "revert" else len(runs), "times_s": times[name],
                         "ratio_per_round": ratios, "ratio_median": statistics.median(ratios),
                         "bit_identical": identical[name]}
        print(f"{name}: cached/naive median {summary[name]['ratio_median']:.3f} "
              f"(rounds {', '.join(f'{x:.3f}' for x in ratios)}), bit-identical: {identical[name]}")
    record = {"commit": _git_head(), "machine": platform.platform(), "torch_threads": torch.get_num_threads(),
              "n_examples": int(len(batches.y_examples)), "batch_size": args.batch_size, "rounds": args.rounds,
              "model": "minilm (6 x 12, hidden 384), tuned = every weight moved (scale 0.2)", "sweeps": summary}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "revert_cost.json").write_text(json.dumps(record, indent=2))


if __name__ == "__main__":
    main()
