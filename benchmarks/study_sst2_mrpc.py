"""A study end to end (issue 16): minilm fine-tuned on SST-2 and MRPC x 3 seeds, compared with the base and seed vs seed.

Samples (seeded) ``--n-eval`` rows of each GLUE dev file as held-out data, ``--n-compare`` SST-2 dev
sentences as the shared comparison corpus and as many MRPC dev sentences as the out-of-domain corpus,
writes ``STUDY/../study.toml`` (400 training examples per task, 1 epoch) and runs it with the chosen
executor, twice: the first run does all 11 jobs (6 fine-tunes, 1 comparison of the base with the 6
models, 4 seed comparisons holding the 3 seed pairs of each task); the second must find everything cached.

    PYTHONPATH=src .venv/bin/python benchmarks/study_sst2_mrpc.py [--glue /work/shared/data/glue] [--out /tmp/study-bench] [--executor local|ray]

Writes ``benchmarks/results/study_sst2_mrpc.json``.
"""
from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
SPEC = """base = "minilm"
seeds = [0, 1, 2]
out = "study"

[lab]
epochs = 1
max_examples = {n_train}
batch_size = 16
lr = 5e-5
max_length = 128

[[task]]
name = "sst2"
type = "classification"
data = "{glue}/SST-2/train.tsv"
eval_data = "sst2_dev.tsv"

[[task]]
name = "mrpc"
type = "classification"
data = "{glue}/MRPC/train.tsv"
eval_data = "mrpc_dev.tsv"

[compare]
data = "shared.txt"
ood_data = "ood.txt"
analyses = ["attention_change", "representation_similarity"]
max_examples = {n_compare}
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--glue", type=Path, default=Path("/work/shared/data/glue"))
    ap.add_argument("--out", type=Path, default=Path("/tmp/study-bench"))
    ap.add_argument("--n-train", type=int, default=400)
    ap.add_argument("--n-eval", type=int, default=200)
    ap.add_argument("--n-compare", type=int, default=200)
    ap.add_argument("--executor", default="local")
    args = ap.parse_args()
    from bertology.studies.executors import make_executor
    from bertology.studies.runner import run_study

    glue = args.glue.resolve()
    args.out.mkdir(parents=True, exist_ok=True)
    sst_dev = pd.read_csv(glue / "SST-2/dev.tsv", sep="\t", quoting=3, encoding="utf-8-sig")
    mrpc_dev = pd.read_csv(glue / "MRPC/dev.tsv", sep="\t", quoting=3, encoding="utf-8-sig")
    sst_dev.sample(args.n_eval, random_state=0).to_csv(args.out / "sst2_dev.tsv", sep="\t", index=False)
    mrpc_dev.sample(args.n_eval, random_state=0).to_csv(args.out / "mrpc_dev.tsv", sep="\t", index=False)
    shared = sst_dev.drop(sst_dev.sample(args.n_eval, random_state=0).index).sample(args.n_compare, random_state=1)
    (args.out / "shared.txt").write_text("\n".join(shared["sentence"].str.strip()) + "\n")
    ood = mrpc_dev["#1 String"].sample(args.n_compare, random_state=1)
    (args.out / "ood.txt").write_text("\n".join(ood.str.strip()) + "\n")
    spec = args.out / "study.toml"
    spec.write_text(SPEC.format(glue=glue, n_train=args.n_train, n_compare=args.n_compare))

    timings = []
    for attempt in ("first", "rerun"):
        executor = make_executor(args.executor, progress=False)
        t0 = time.perf_counter()
        try:
            result = run_study(spec, overwrite=attempt == "first", executor=executor)
        finally:
            executor.close()
        wall = time.perf_counter() - t0
        timings.append({"run": attempt, "wall_s": round(wall, 1), "jobs": [j.to_dict() for j in result.jobs]})
        print(attempt, f"{wall:.1f} s", {j.id: (j.status, j.wall_time_s) for j in result.jobs}, flush=True)
    metrics = {}
    for task in ("sst2", "mrpc"):
        for seed in (0, 1, 2):
            m = json.loads((result.out / "finetune" / task / f"s{seed}" / "manifest.json").read_text())["metrics"]
            metrics[f"{task}/s{seed}"] = {k: m[k] for k in ("accuracy", "macro_f1")}
    print(json.dumps(metrics, indent=1))
    record = {"executor": args.executor, "n_train": args.n_train, "n_eval": args.n_eval, "n_compare": args.n_compare,
              "machine": platform.platform(), "timings": timings, "heldout": metrics, "tables": sorted(result.tables)}
    path = ROOT / "benchmarks" / "results" / "study_sst2_mrpc.json"
    path.write_text(json.dumps(record, indent=2))
    print("wrote", path)


if __name__ == "__main__":
    main()
