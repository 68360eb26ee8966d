"""Every task head at its recipe's defaults (issue 36): held-out scores with 95% bootstrap intervals, wall time.

Each task is one ``bertology finetune`` command with nothing but the task, the model and the data (the recipe
gives epochs, batch size, learning rates, warm-up and the parser's sizes):

* ``parsing``: UD English-EWT dev -> test (UAS/LAS of the one-root tree, and of the per-word argmax);
* ``tagging``: UD English-EWT dev -> test, UPOS;
* ``regression``: GLUE STS-B ``train.tsv``, a seeded 20 % held out (``--eval-fraction``'s default; no STS-B dev
  offline); ``--max-examples`` (default 2000) caps the pairs read, on 2 shared CPU cores;
* ``classification``: GLUE SST-2 ``train.tsv`` (a seeded, label-stratified ``--max-examples`` sample, default
  4000) -> ``dev.tsv``.

QA is not run: no SQuAD-format data is available offline. Contrastive (SimCSE) trains no task head.

    HF_HUB_OFFLINE=1 PYTHONPATH=src .venv/bin/python benchmarks/recipes.py --task parsing [--task tagging ...]

Appends to ``benchmarks/results/recipes.json`` (one record per task, the latest kept) and prints the table.
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

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "recipes.json"
DATA = Path(os.environ.get("BERTOLOGY_SHARED_DATA", "/work/shared/data"))
UD = DATA / "ud"

#: Per task: the data flags and the metrics the table shows (primary first).
TASKS = {
    "parsing": (["--data", str(UD / "en_ewt-ud-dev.conllu"), "--eval-data", str(UD / "en_ewt-ud-test.conllu")],
                ["uas", "las", "uas_argmax", "las_argmax"]),
    "tagging": (["--data", str(UD / "en_ewt-ud-dev.conllu"), "--eval-data", str(UD / "en_ewt-ud-test.conllu")],
                ["accuracy"]),
    "regression": (["--data", str(DATA / "glue/STS-B/train.tsv")], ["pearson", "spearman"]),
    "classification": (["--data", str(DATA / "glue/SST-2/train.tsv"), "--eval-data", str(DATA / "glue/SST-2/dev.tsv")],
                       ["accuracy", "macro_f1"]),
}
#: Default ``--max-examples`` per task (None: every example).
CAPS = {"regression": 2000, "classification": 4000}


def command(task: str, out: Path, cap: int | None) -> list[str]:
    """The ``bertology finetune`` command line of ``task`` at its recipe's defaults."""
    data, _ = TASKS[task]
    extra = ["--max-examples", str(cap)] if cap else []
    return ["bertology", "finetune", "--task", task, "--model", "minilm", *data, *extra, "--out", str(out),
            "--overwrite", "--no-report"]


def run(task: str, out: Path, cap: int | None) -> dict:
    """Run one task's command; its scores with intervals, settings used, steps and times from the run folder."""
    cmd = command(task, out, cap)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    t0 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "bertology", *cmd[1:]], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    wall = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(res.stdout + res.stderr)
    manifest = json.loads((out / "manifest.json").read_text())
    ci = pd.read_parquet(out / "tables" / "finetune_intervals.parquet").set_index("metric")
    result = manifest["result"]
    scores = {m: {"value": float(ci.loc[m, "value"]), "ci": [float(ci.loc[m, "ci_low"]), float(ci.loc[m, "ci_high"])]}
              for m in TASKS[task][1] if m in ci.index}
    settings = {k: v["value"] for k, v in manifest["settings"]["finetune"].items()
                if k in ("learning_rate", "head_lr", "epochs", "batch_size", "warmup_ratio", "arc_dim", "label_dim")}
    return {"task": task, "command": " ".join(cmd), "scores": scores, "n_train": result.get("split", {}).get("n_train"),
            "n_eval": int(ci["n_eval"].iloc[0]), "settings": settings, "steps": result.get("steps"),
            "train_time_s": result.get("train_time_s"), "wall_s": round(wall, 1), "warnings": manifest.get("warnings", []),
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs (shared), torch threads {os.environ.get('OMP_NUM_THREADS', 'default')}",
            "commit": commit}  # the code the run started with


def table(records: dict) -> str:
    """The markdown table of the recorded tasks."""
    lines = ["| task | held-out score (95% CI) | n eval | steps | settings | wall |", "|---|---|---|---|---|---|"]
    for task, r in records.items():
        shown = "; ".join(f"{m} {s['value']:.3f} [{s['ci'][0]:.3f}, {s['ci'][1]:.3f}]" for m, s in r["scores"].items())
        st = r["settings"]
        sizes = f", arcs {st['arc_dim']}/labels {st['label_dim']}" if st.get("arc_dim") else ""
        lines.append(f"| {task} | {shown} | {r['n_eval']} | {r['steps']} | lr {st['learning_rate']:g}, head "
                     f"{st['head_lr']:g}, batch {st['batch_size']}, {st['epochs']:g} epochs, warm-up "
                     f"{st['warmup_ratio']:g}{sizes} | {r['wall_s']:.0f} s |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--task", action="append", choices=sorted(TASKS), help="repeatable; default: every task")
    ap.add_argument("--out", default="/tmp/bertology-recipes", help="run folders go to OUT/<task>")
    ap.add_argument("--max-examples", type=int, default=None, help="override the per-task cap (regression, classification)")
    args = ap.parse_args()
    for task in args.task or sorted(TASKS):
        cap = args.max_examples if args.max_examples is not None else CAPS.get(task)
        record = run(task, Path(args.out) / task, cap)
        records = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}  # read now: other tasks may have run
        records[task] = record
        RESULTS.write_text(json.dumps(records, indent=2) + "\n")
        print(json.dumps(record, indent=2), flush=True)
    print(table(json.loads(RESULTS.read_text())))


if __name__ == "__main__":
    main()
