"""The ABSA study on MiniLM, CPU: QA-M fine-tune on a sample of SemEval-2014 restaurants, then the task heads.

Writes a JSON summary (held-out category-level accuracy beside the majority class, the top heads per
relation for base and tuned with every baseline, the top no-op heads, wall time) and prints it.

    PYTHONPATH=src python benchmarks/absa.py --data ../shared/data/absa/Restaurants_Train_v2.xml \
        --max-sentences 600 --out /tmp/absa-bench --json benchmarks/results/absa.json
"""
from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from pathlib import Path

from bertology.analyses.absa_heads import top_heads
from bertology.commands.absa import AbsaConfig, run_absa


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", default="/tmp/absa-bench")
    ap.add_argument("--max-sentences", type=int, default=600)
    ap.add_argument("--epochs", type=float, default=1.0)
    ap.add_argument("--analysis-pairs", type=int, default=0)
    ap.add_argument("--learning-rate", type=float, default=5e-5)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--max-length", type=int, default=128)
    ap.add_argument("--style", default="qa_m")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    t0 = time.perf_counter()
    run = run_absa(AbsaConfig(data=args.data, out=args.out, max_sentences=args.max_sentences, epochs=args.epochs,
                              analysis_pairs=args.analysis_pairs or None, learning_rate=args.learning_rate,
                              batch_size=args.batch_size, max_length=args.max_length, style=args.style), overwrite=True)
    wall = time.perf_counter() - t0
    heads = run.tables["absa_heads"]
    best = top_heads(heads, 3)
    cols = ["model", "relation", "layer", "head", "direction", "accuracy", "baseline_accuracy", "position_accuracy",
            "chance", "best_baseline", "n"]
    sep = run.tables["absa_sep_share"].sort_values("difference", ascending=False)
    manifest = json.loads((run.out / "manifest.json").read_text())
    labels = Counter(manifest["absa"]["held_out"]["labels"])
    out = {
        "wall_s": round(wall, 1),
        "args": vars(args),
        "held_out": run.counts["held_out"],
        "train": run.counts["train"],
        "metrics": {k: v for k, v in run.metrics.items() if isinstance(v, (int, float))},
        "majority_class_rate": max(labels.values()) / sum(labels.values()),
        "top_heads": best[cols].round(4).to_dict("records"),
        "top_noop_heads": {m: sep[sep.model == m].head(3)[["layer", "head", "sep_absent", "sep_present", "difference"]]
                           .round(4).to_dict("records") for m in ("base", "tuned")},
        "report": str(run.report),
    }
    text = json.dumps(out, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text + "\n")


if __name__ == "__main__":
    main()
