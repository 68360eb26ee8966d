"""Tagging on MiniLM (issue 15, item 2): UPOS accuracy on UD EWT test after training on EWT dev, and the
ablation sweep's time per head for the tagger against a sequence classifier on the same tokens.

1. Fine-tune: ``bertology finetune --model minilm --data en_ewt-ud-dev.conllu --eval-data en_ewt-ud-test.conllu
   --task tagging --tag-column upos`` (``--epochs``, ``--lr``, ``--batch-size`` below), through the CLI, timed.
2. Sweep: a seeded sample of ``--n`` EWT test sentences; the tuned tagger and MiniLM with a fresh two-label
   sequence head (timing only: its labels are random) are swept with the cached method over the same
   encoded sentences (same tokens, same length buckets, batch 32), ``uniform`` mode, every head of every
   layer (intact + 72 units, no layer units), ``n_bootstrap=0``. Time per head = sweep seconds / 72. The
   classifier takes the first-token shortcut in the last block; a tagger cannot (its logits are per token).

    PYTHONPATH=src HF_HUB_OFFLINE=1 /work/main/.venv/bin/python benchmarks/tagging.py [--epochs 1] [--n 300]

Writes ``benchmarks/results/tagging.json``.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
UD = Path(os.environ.get("BERTOLOGY_UD", "/work/shared/data/ud"))


def finetune(out: Path, args) -> dict:
    cmd = [sys.executable, "-m", "bertology", "finetune", "--model", "minilm", "--data", str(UD / "en_ewt-ud-dev.conllu"),
           "--eval-data", str(UD / "en_ewt-ud-test.conllu"), "--task", "tagging", "--tag-column", "upos",
           "--epochs", str(args.epochs), "--lr", str(args.lr), "--batch-size", "32", "--out", str(out),
           "--overwrite", "--no-report"]
    t0 = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    wall = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(res.stdout + res.stderr)
    manifest = json.loads((out / "manifest.json").read_text())
    return {"command": " ".join(cmd[1:]), "wall_s": round(wall, 1), "metrics": manifest["metrics"],
            "steps": manifest["result"]["steps"], "words": manifest["result"]["words"],
            "train_time_s": manifest["result"]["train_time_s"]}


def sweep_times(tagger_dir: Path | None, args) -> dict:
    from transformers import AutoModelForSequenceClassification

    from bertology.data.encode import encode_corpus
    from bertology.data.loaders import load_corpus
    from bertology.experiments.ablation import HeadScoring, SweepPlan, run_ablation
    from bertology.models.loading import load_model
    from bertology.tasks.catalog import task_of_model

    corpus = load_corpus(UD / "en_ewt-ud-test.conllu")
    rng = np.random.default_rng(0)
    corpus = corpus.subset(sorted(rng.choice(len(corpus), size=args.n, replace=False).tolist()))
    if tagger_dir is None:  # timing only: MiniLM with a fresh UPOS head (the cost does not depend on the weights)
        from transformers import AutoModelForTokenClassification

        tags = sorted({t for ex in corpus for t in ex.upos})
        tagger = load_model("minilm")
        torch.manual_seed(0)
        tagger.model = AutoModelForTokenClassification.from_pretrained(
            tagger.path, num_labels=len(tags), id2label=dict(enumerate(tags)), label2id={t: i for i, t in enumerate(tags)},
            attn_implementation="eager").eval()
        tagger.model.config.bertology_tag_field = "upos"
    else:
        tagger = load_model(tagger_dir)
    enc = encode_corpus(corpus, tagger.tokenizer, 128, overlong="truncate")
    y_tag = task_of_model(tagger.model).targets(corpus, tagger.model)
    torch.manual_seed(0)
    clf = AutoModelForSequenceClassification.from_pretrained(load_model("minilm").path, num_labels=2,
                                                             attn_implementation="eager").eval()
    y_clf = rng.integers(0, 2, size=len(corpus))
    scoring = HeadScoring.for_tokenizer(tagger.tokenizer, batch_size=32)
    out = {"n_sentences": len(corpus), "n_tokens": enc.n_tokens, "torch_threads": torch.get_num_threads()}
    print(f"sweeping {len(corpus)} sentences, {enc.n_tokens} tokens", flush=True)
    for rep in range(args.repeats):
        for name, model, y in (("classifier", clf, y_clf), ("tagger", tagger.model, y_tag)):
            res = run_ablation(model, enc, y, scoring, n_bootstrap=0, sweep=SweepPlan(layer_modes=()))
            n_heads = len(res.units) - 1
            out.setdefault(name, []).append({"sweep_s": round(res.timing["sweep_s"], 2), "per_head_s": res.timing["sweep_s"] / n_heads,
                                             "scoring_s": round(res.timing["scoring_s"], 3), "n_heads": n_heads})
    best = {k: min(r["per_head_s"] for r in out[k]) for k in ("classifier", "tagger")}
    out["per_head_s_best"] = best
    out["ratio_tagger_over_classifier"] = best["tagger"] / best["classifier"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=float, default=1.0)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("/tmp/bertology-bench-tagging"))
    ap.add_argument("--skip-finetune", action="store_true")
    ap.add_argument("--fresh-tagger", action="store_true", help="time a fresh UPOS head on MiniLM, not the trained tagger")
    args = ap.parse_args()
    record: dict = {"machine": platform.platform(), "cpus": os.cpu_count(), "torch": torch.__version__,
                    "git": subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                          cwd=ROOT).stdout.strip()}
    previous = RESULTS / "tagging.json"
    if args.skip_finetune and previous.exists():  # keep the fine-tuning numbers of an earlier run
        record["finetune"] = json.loads(previous.read_text()).get("finetune")
    if not args.skip_finetune:
        record["finetune"] = finetune(args.out, args)
        print(json.dumps(record["finetune"], indent=1), flush=True)
    record["sweep"] = sweep_times(None if args.fresh_tagger else args.out / "model", args)
    record["sweep"]["tagger_model"] = "fresh UPOS head on MiniLM" if args.fresh_tagger else str(args.out / "model")
    print(json.dumps(record["sweep"], indent=1), flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "tagging.json").write_text(json.dumps(record, indent=1, default=float))


if __name__ == "__main__":
    main()
