"""STS-B regression on MiniLM (issue 15): fine-tune, held-out Pearson, and the ablation sweep's cost.

1. Fine-tune: a seeded sample of ``--n-train`` (2,000) pairs of GLUE STS-B ``train.tsv`` for one
   epoch (``bertology finetune --task auto`` chooses regression from the decimal scores), evaluated on
   ``--n-eval`` (500) other pairs of the same file (``--eval-data``): Pearson, Spearman, MSE.
2. The ablation sweep's time per unit (intact, every head, every layer skipped / all heads uniform:
   85 units on MiniLM) for the regressor against a classifier with the same encoder (a fresh 2-label
   head on the same weights; labels = score > 2.5) on the same ``--n-ablate`` pairs (same tokens),
   the two run alternately ``--rounds`` times in one process; ``n_bootstrap=0`` (scoring left out of
   the clock). Target (issue 15): the regressor within 1.2x of the classifier.

    .venv/bin/python benchmarks/stsb_regression.py [--stsb ../shared/data/glue/STS-B/train.tsv] [--out /tmp/stsb]

Writes ``benchmarks/results/stsb_regression.json``.
"""
from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

ROOT = Path(__file__).resolve().parents[1]


def _split(stsb: Path, out: Path, n_train: int, n_eval: int, seed: int) -> tuple[Path, Path]:
    """Two disjoint seeded samples of the STS-B file, written in its own layout."""
    df = pd.read_csv(stsb, sep="\t", quoting=3, dtype=str, keep_default_na=False)
    order = np.random.default_rng(seed).permutation(len(df))
    train, held = df.iloc[order[:n_train]], df.iloc[order[n_train:n_train + n_eval]]
    out.mkdir(parents=True, exist_ok=True)
    paths = out / "train.tsv", out / "eval.tsv"
    for part, path in zip((train, held), paths):
        part.to_csv(path, sep="\t", index=False, quoting=3)
    return paths


def _sweep_seconds(model, encoded, targets, batch_size: int) -> float:
    from bertology.experiments.ablation import HeadScoring, run_ablation

    t0 = time.perf_counter()
    run_ablation(model, encoded, targets, HeadScoring(batch_size=batch_size), n_bootstrap=0)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--stsb", default=str(ROOT.parent / "shared/data/glue/STS-B/train.tsv"))
    ap.add_argument("--out", default="/tmp/stsb_regression")
    ap.add_argument("--n-train", type=int, default=2000)
    ap.add_argument("--n-eval", type=int, default=500)
    ap.add_argument("--n-ablate", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=2, help="interleaved sweep rounds (0: fine-tune only)")
    ap.add_argument("--epochs", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sweep-only", action="store_true", help="reuse the fine-tuned model in --out/run (no training)")
    args = ap.parse_args()

    from bertology.config import DataConfig, FinetuneConfig
    from bertology.data.loaders import load_corpus
    from bertology.training.run import finetune_to_dir

    out = Path(args.out)
    train_path, eval_path = _split(Path(args.stsb), out / "data", args.n_train, args.n_eval, args.seed)
    config = FinetuneConfig(model="minilm", out=str(out / "run"), epochs=args.epochs, seed=args.seed,
                            data=DataConfig(max_examples=None, overlong="truncate"))
    if args.sweep_only:
        result = _sweep_ratio(out / "run" / "model", eval_path, args)
        print(json.dumps(result, indent=2))
        (ROOT / "benchmarks" / "results" / "stsb_regression_sweep.json").write_text(json.dumps(result, indent=2))
        return
    t0 = time.perf_counter()
    run = finetune_to_dir(config, load_corpus(str(train_path)), load_corpus(str(eval_path)), overwrite=True, retrain=True)
    finetune_s = time.perf_counter() - t0
    metrics = {k: v for k, v in run.metrics.items() if not isinstance(v, dict)}
    print(f"fine-tuned in {finetune_s:.0f} s: {metrics}")

    result = {"n_train": args.n_train, "n_eval": args.n_eval, "epochs": args.epochs, "finetune_s": round(finetune_s, 1),
              "eval": metrics, "head_bias_start": run_summary_bias(run.out), "torch": torch.__version__,
              "threads": torch.get_num_threads(), "machine": platform.machine()}
    if args.rounds > 0:
        result.update(_sweep_ratio(run.model_dir, eval_path, args))
    print(json.dumps(result, indent=2))
    results = ROOT / "benchmarks" / "results"
    results.mkdir(exist_ok=True)
    (results / "stsb_regression.json").write_text(json.dumps(result, indent=2))


def run_summary_bias(run_dir: Path) -> float | None:
    """The fresh head's starting bias the run recorded (the mean of its training scores)."""
    manifest = json.loads((Path(run_dir) / "manifest.json").read_text())
    return manifest.get("result", {}).get("head_bias_start")


def _sweep_ratio(model_dir: Path, eval_path: Path, args) -> dict:
    """Sweep seconds of the regressor and of a classifier with the same encoder, interleaved."""
    from transformers import AutoModelForSequenceClassification

    from bertology.data.encode import encode_corpus
    from bertology.data.loaders import load_corpus
    from bertology.models.loading import load_model
    from bertology.tasks.catalog import get_task

    reg = load_model(str(model_dir)).model.eval()
    clf = AutoModelForSequenceClassification.from_pretrained(
        model_dir, num_labels=2, problem_type="single_label_classification", ignore_mismatched_sizes=True,
        attn_implementation="eager").eval()
    corpus = load_corpus(str(eval_path)).subset(list(range(args.n_ablate)))
    tokenizer = load_model(str(model_dir)).tokenizer
    encoded = encode_corpus(corpus, tokenizer, 128, overlong="truncate")
    y_reg = get_task("regression").targets(corpus, reg)
    y_clf = (y_reg > 2.5).astype(np.int64)
    times: dict[str, list[float]] = {"regression": [], "classification": []}
    for _ in range(args.rounds):  # interleaved: the shared machine drifts between runs
        times["regression"].append(_sweep_seconds(reg, encoded, y_reg, 32))
        times["classification"].append(_sweep_seconds(clf, encoded, y_clf, 32))
    ratio = float(np.median(times["regression"]) / np.median(times["classification"]))
    return {"n_ablate": args.n_ablate, "sweep_s": times, "sweep_ratio_regression_to_classification": ratio}


if __name__ == "__main__":
    main()
