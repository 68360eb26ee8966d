"""Token probes with control tasks and MDL on UD English-EWT: base, tuned and random-init MiniLM, every layer.

    HF_HUB_OFFLINE=1 OMP_NUM_THREADS=2 PYTHONPATH=src .venv/bin/python benchmarks/token_probe.py \
        --tuned runs/demo-model/model [--tasks upos] [--max-train-words 10000] [--ud ../shared/data/ud] [--erase upos]

Trains on EWT dev, scores on EWT test (as the structural-probe benchmarks do), one feature pass per model and
split shared by every task, control and MDL. Prints the table (accuracy with its interval, control accuracy,
selectivity, MDL compression by layer) and the timings; the raw table goes to benchmarks/results/token_probe.json.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", default="minilm")
    parser.add_argument("--tuned", default=None, help="A fine-tuned model folder (e.g. the demo's runs/demo-model/model)")
    parser.add_argument("--tasks", default="upos")
    parser.add_argument("--max-train-words", type=int, default=0)
    parser.add_argument("--no-mdl", action="store_true")
    parser.add_argument("--erase", default=None, help="Also LEACE-erase these tasks at each layer and probe again")
    parser.add_argument("--ud", type=Path, default=Path("../shared/data/ud"))
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/token_probe.json"))
    args = parser.parse_args()

    from bertology.data.loaders import load_corpus
    from bertology.experiments.probe import random_init_model
    from bertology.experiments.ablation_table import Bootstrap
    from bertology.experiments.token_probe import TokenProbeSettings, summary_lines, token_probes
    from bertology.models.loading import load_model

    t0 = time.perf_counter()
    models = {"base": load_model(args.base, kind="auto")}
    if args.tuned:
        models["tuned"] = load_model(args.tuned, kind="auto")
    models["random"] = random_init_model(models["base"], seed=0)
    train = load_corpus(str(args.ud / "en_ewt-ud-dev.conllu"), name="train")
    test = load_corpus(str(args.ud / "en_ewt-ud-test.conllu"), name="test")
    settings = TokenProbeSettings(tasks=args.tasks, mdl=not args.no_mdl, max_train_words=args.max_train_words,
                                  erase=args.erase)
    table, params = token_probes(models, train, test, settings, bootstrap=Bootstrap(n=1000, seed=0),
                                 on_progress=lambda stage, done, total: None)
    wall = time.perf_counter() - t0
    cols = ["probe_task", "model", "layer", "accuracy", "accuracy_ci_low", "accuracy_ci_high", "control_accuracy",
            "selectivity", "selectivity_ci_low", "selectivity_ci_high", "majority_rate", "compression",
            "control_compression"] + (["erased_accuracy"] if args.erase else [])
    print(table[cols].round(3).to_string(index=False))
    print("\n".join(summary_lines(table)))
    print(json.dumps({"timings_s": params["timings_s"], "wall_s": round(wall, 1), "data": params["data"],
                      "not_converged": params["not_converged"]}, default=str))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"params": params, "rows": table.to_dict("records")}, default=str, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
