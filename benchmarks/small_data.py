"""Does the classification recipe train past the majority rate on a few hundred examples? And what does?

    python benchmarks/small_data.py [--sizes 200,400] [--seeds 0,1] [--epochs 2,10] [--out runs/bench-small]

Fine-tunes the packaged ``minilm`` on seeded, label-stratified samples of Pang & Lee's sentence polarity
(offline, balanced: majority rate 0.5), at the classification recipe's learning rate and batch (5e-5, 32) for
each number of epochs given, and scores every run on the same 1,000 held-out sentences. Prints one row per run:
examples, epochs, optimizer steps, held-out accuracy with its 95% interval, whether bertology called the model
degenerate (one class), and the run's wall time. The numbers behind the small-data rule of
``bertology.training.recipes`` and docs/results/recipes.md. Minutes per run on 2 CPU cores.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import pandas as pd


def split(n_train: int, seed: int, folder: Path) -> tuple[Path, Path]:
    """A stratified training sample of ``n_train`` and a fixed 1,000-sentence held-out set (disjoint)."""
    from bertology.assets import fetch_polarity

    data = pd.read_csv(fetch_polarity())
    heldout = data.groupby("label", group_keys=False).sample(n=500, random_state=12345)
    rest = data.drop(heldout.index)
    train = rest.groupby("label", group_keys=False).sample(n=n_train // 2, random_state=seed)
    folder.mkdir(parents=True, exist_ok=True)
    train_path, heldout_path = folder / f"train-{n_train}-s{seed}.csv", folder / "heldout.csv"
    train.to_csv(train_path, index=False)
    heldout.to_csv(heldout_path, index=False)
    return train_path, heldout_path


def one_run(n_train: int, epochs: float, seed: int, out: Path) -> dict:
    """Fine-tune at the recipe's rate and batch for ``epochs``; the held-out figures and the run's warnings."""
    import bertology as bt

    train, heldout = split(n_train, seed, out / "data")
    run_dir = out / f"n{n_train}-e{epochs:g}-s{seed}"
    t0 = time.perf_counter()
    bt.finetune("minilm", train, eval_data=heldout, epochs=epochs, seed=seed, max_length=64, out=run_dir,
                report=False)
    wall = time.perf_counter() - t0
    manifest = json.loads((run_dir / "manifest.json").read_text())
    summary = manifest["summary"]
    ci = summary.get("intervals", {}).get("accuracy")
    warnings = manifest.get("model_warnings", [])
    return {"n_train": n_train, "epochs": epochs, "seed": seed, "steps": summary.get("steps"),
            "accuracy": round(summary["metrics"]["accuracy"], 3), "ci": ci and [round(x, 3) for x in ci],
            "loss": round(summary["metrics"]["loss"], 3),
            "degenerate": any("one class" in w or "beat chance" in w for w in warnings),
            "under_trained": any("under-trained" in w for w in warnings), "wall_s": round(wall, 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="200,400")
    parser.add_argument("--seeds", default="0,1")
    parser.add_argument("--epochs", default="2,10")
    parser.add_argument("--out", type=Path, default=Path("runs/bench-small"))
    args = parser.parse_args()
    rows = []
    for n in map(int, args.sizes.split(",")):
        for seed in map(int, args.seeds.split(",")):
            for epochs in map(float, args.epochs.split(",")):  # interleaved: the machine's drift hits both alike
                row = one_run(n, epochs, seed, args.out)
                rows.append(row)
                print(json.dumps(row), flush=True)
    table = pd.DataFrame(rows)
    print(table.to_string(index=False))
    print(table.groupby(["n_train", "epochs"])[["accuracy", "wall_s"]].mean().to_string())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
