"""Representation geometry (Ethayarajh 2019) of MiniLM before and after polarity fine-tuning.

Runs :class:`bertology.analyses.geometry.Geometry` (defaults: 1,000 baseline pairs chained over one
random token per sentence, words in >= 5 sentences, <= 10 contexts per word, <= 500 words, no
[CLS]/[SEP], centred MEV, seed 0) and :class:`~bertology.analyses.pca_views.PCAViews` (20 sampled
examples) in one extraction pass over both models, and reports the per-layer profile next to
Ethayarajh's BERT-base anisotropy numbers (PAPERS.md). Base: the built-in ``minilm``
(all-MiniLM-L6-v2, itself a sentence-embedding fine-tune, not a raw MLM checkpoint); tuned: the
polarity classifier fine-tuned from it (``/work/assets/minilm-polarity``).

    BERTOLOGY_CACHE=/work/main/.cache OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python benchmarks/geometry.py \
        [--data /work/shared/data/glue/SST-2/dev.tsv] [--limit N] [--tuned DIR] [--tag NAME]

Writes ``benchmarks/results/geometry{.TAG}.json`` and ``.md`` and the figures ``geometry{.TAG}.svg``
and ``geometry{.TAG}.pca.svg``.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from bertology.activations.extract import iter_pair_batches
from bertology.analyses.geometry import Geometry
from bertology.analyses.pca_views import PCAViews
from bertology.data.encode import encode_corpus
from bertology.data.loaders import load_corpus
from bertology.models.pair import ModelPair
from bertology.viz.figures import figure_to_svg
from bertology.viz.geometry import geometry_figure, pca_grid

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
#: Ethayarajh (2019), BERT-base-cased, anisotropy baseline by layer 0..12 (PAPERS.md).
ETHAYARAJH_BERT = [0.105, 0.168, 0.219, 0.245, 0.327, 0.377, 0.420, 0.398, 0.399, 0.484, 0.561, 0.675, 0.477]


def _git_head() -> str | None:
    try:
        return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True).strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def _fmt(v: float) -> str:
    return "" if v != v else f"{v:.3f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default="/work/shared/data/glue/SST-2/dev.tsv")
    ap.add_argument("--limit", type=int, default=None)
    ap.add_argument("--tuned", default="/work/assets/minilm-polarity")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tag", default="")
    args = ap.parse_args()

    pair = ModelPair.load("minilm", args.tuned)
    corpus = load_corpus(args.data, limit=args.limit)
    encoded = encode_corpus(corpus, pair.tokenizer)
    geo = Geometry(pair.num_layers, tokenizer=pair.tokenizer, seed=args.seed)
    views = PCAViews(pair.num_layers, tokenizer=pair.tokenizer, corpus=corpus, examples=20, seed=args.seed)

    t_forward = t_geo = t_views = 0.0
    peak_words = peak_bytes = 0
    t0 = time.perf_counter()
    batches = iter_pair_batches(pair, encoded, batch_size=args.batch_size, requires=geo.requires)
    while True:
        t = time.perf_counter()
        batch = next(batches, None)
        t_forward += time.perf_counter() - t
        if batch is None:
            break
        t = time.perf_counter()
        geo.update(batch)
        t_geo += time.perf_counter() - t
        t = time.perf_counter()
        views.update(batch)
        t_views += time.perf_counter() - t
        stored = sum(w.vectors.nbytes for w in geo.words.values() if w.vectors is not None)
        peak_words, peak_bytes = max(peak_words, len(geo.words)), max(peak_bytes, stored)
    t = time.perf_counter()
    result = geo.compute()
    words = geo.word_table().table
    t_compute = time.perf_counter() - t
    t = time.perf_counter()
    pca = views.compute()
    t_pca = time.perf_counter() - t
    total = time.perf_counter() - t0
    table = result.table

    tag = f".{args.tag}" if args.tag else ""
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"geometry{tag}.svg").write_text(
        figure_to_svg(geometry_figure(table, title="MiniLM vs polarity fine-tune: geometry per layer")), encoding="utf-8")
    (RESULTS / f"geometry{tag}.pca.svg").write_text(
        figure_to_svg(pca_grid(pca.table, fit="shared", color_by="category", layers=[0, 3, 6])), encoding="utf-8")

    pivot = table.pivot_table(index=["metric", "layer"], columns="model", values="value")
    last = pair.num_layers
    ws = words[words.layer == last].pivot_table(index="word", columns="model", values="self_similarity")
    ws["change"] = ws["tuned"] - ws["base"]
    out = {
        "what": "Geometry (Ethayarajh 2019) of minilm vs its polarity fine-tune",
        "command": "BERTOLOGY_CACHE=/work/main/.cache OMP_NUM_THREADS=1 nice -n 10 .venv/bin/python benchmarks/geometry.py "
                   + " ".join(f"--{k.replace('_', '-')} {v}" for k, v in vars(args).items() if v not in (None, "")),
        "git": _git_head(),
        "data": {"path": args.data, **encoded.describe()},
        "models": {"base": "minilm", "tuned": args.tuned},
        "params": result.params,
        "n": {m: int(table[(table.metric == m)].n.iloc[0]) for m in ("anisotropy", "self_similarity", "intra_similarity")},
        "values": {metric: {model: [round(float(pivot.loc[(metric, l), model]), 4) for l in range(last + 1)]
                            for model in ("base", "tuned")} for metric in pivot.index.get_level_values(0).unique()},
        "ethayarajh_bert_base_anisotropy": ETHAYARAJH_BERT,
        "words_last_layer": {
            "most_context_specific_base": ws.sort_values("base").head(10)["base"].round(3).to_dict(),
            "largest_drop_in_self_similarity": ws.sort_values("change").head(10)["change"].round(3).to_dict(),
        },
        "seconds": {"total": round(total, 2), "forward_both_models": round(t_forward, 2), "geometry_update": round(t_geo, 2),
                    "geometry_compute": round(t_compute, 2), "pca_views_update": round(t_views, 2),
                    "pca_views_compute": round(t_pca, 2)},
        "memory": {"peak_words_stored": peak_words, "peak_word_vector_bytes": peak_bytes,
                   "baseline_bytes": int(geo.base_vectors.nbytes)},
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "torch": torch.__version__,
                    "threads": torch.get_num_threads()},
    }
    (RESULTS / f"geometry{tag}.json").write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")

    md = [f"# Geometry per layer: minilm vs {Path(args.tuned).name}", "",
          f"Data: `{args.data}` ({encoded.describe()['n_kept']} examples, {encoded.n_tokens} tokens). "
          f"Command: `{out['command']}` (git {out['git']}).", "",
          f"Samples: anisotropy over {out['n']['anisotropy']} cross-sentence pairs (one token per sampled sentence, "
          f"chained), {out['n']['self_similarity']} words seen in >= {geo.min_contexts} sentences (<= {geo.max_contexts} "
          f"contexts each), {out['n']['intra_similarity']} sentences; no [CLS]/[SEP]; MEV centred; seed {args.seed}.", ""]
    metrics = ["anisotropy", "self_similarity", "intra_similarity", "mev", "mev_baseline",
               "self_similarity_adjusted", "intra_similarity_adjusted", "mev_adjusted"]
    md += ["| layer | " + " | ".join(f"{m} base | {m} tuned" for m in metrics[:4]) + " |",
           "|---" * (1 + 2 * 4) + "|"]
    for l in range(last + 1):
        md.append(f"| {l} | " + " | ".join(f"{_fmt(pivot.loc[(m, l), 'base'])} | {_fmt(pivot.loc[(m, l), 'tuned'])}"
                                           for m in metrics[:4]) + " |")
    md += ["", "| layer | " + " | ".join(f"{m} base | {m} tuned" for m in metrics[4:]) + " |",
           "|---" * (1 + 2 * 4) + "|"]
    for l in range(last + 1):
        md.append(f"| {l} | " + " | ".join(f"{_fmt(pivot.loc[(m, l), 'base'])} | {_fmt(pivot.loc[(m, l), 'tuned'])}"
                                           for m in metrics[4:]) + " |")
    aniso = {m: np.array(out["values"]["anisotropy"][m]) for m in ("base", "tuned")}
    bert = np.array(ETHAYARAJH_BERT)

    def profile(v: np.ndarray, name: str) -> str:
        peak = int(np.argmax(v))
        return (f"{name}: from {v[0]:.3f} (layer 0) to a peak of {v[peak]:.3f} at layer {peak} of {len(v) - 1}, "
                f"last layer {v[-1]:.3f} ({v[-1] / v[peak]:.2f} x the peak)")

    md += ["", "Ethayarajh (2019) BERT-base-cased anisotropy, layers 0..12: "
           + ", ".join(f"{v:.3f}" for v in ETHAYARAJH_BERT) + ".", "",
           "Anisotropy profiles: " + "; ".join([profile(bert, "BERT-base (paper)"), profile(aniso["base"], "minilm"),
                                                 profile(aniso["tuned"], Path(args.tuned).name)]) + ".", "",
           f"Words with the lowest self-similarity in base layer {last}: "
           + ", ".join(f"{w} ({v:.2f})" for w, v in out["words_last_layer"]["most_context_specific_base"].items()) + ".",
           f"Largest drop in self-similarity at layer {last} (tuned - base): "
           + ", ".join(f"{w} ({v:+.2f})" for w, v in out["words_last_layer"]["largest_drop_in_self_similarity"].items()) + ".",
           "", f"Time: {out['seconds']} (s); memory: {out['memory']} (bytes). Machine: {os.cpu_count()} CPUs, "
           f"torch {torch.__version__}, {torch.get_num_threads()} threads, shared with other jobs.", ""]
    (RESULTS / f"geometry{tag}.md").write_text("\n".join(md) + "\n", encoding="utf-8")
    print(json.dumps({k: out[k] for k in ("n", "seconds", "memory")}))
    print(pd.DataFrame(out["values"]["anisotropy"]).round(3).to_string())


if __name__ == "__main__":
    main()
