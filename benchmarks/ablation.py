"""The ablation sweep: cached hidden states (bertology) against the naive full re-run per ablation.

Both methods run the same units (intact, every head of every layer, every layer skipped and with all
heads uniform: 1 + 6 x 12 + 2 x 6 = 85 on MiniLM) in ``uniform`` mode over the same length-bucketed
batches (32), with the same hooks; the naive method runs a full forward of every example per
ablation, the cached one enters block ``l`` from the hidden states it keeps (DESIGN §6). Scoring and
bootstrap are left out of both clocks (``n_bootstrap=0``). The two must agree: the script reports the
largest per-example loss difference and whether every prediction is the same.

Data: the demo's held-out split of the Pang & Lee polarity sentences (``split_heldout(0.2, seed 0)``,
800 sentences the demo model was not trained on), a seeded stratified sample of ``--n`` (500).
Model: the demo's fine-tuned MiniLM (``runs/demo-model/model``, else ``/tmp/*/runs/demo-model/model``).

    BERTOLOGY_CACHE=/work/main/.cache .venv/bin/python benchmarks/ablation.py [--n 500] [--repeats 1] [--tuned DIR]

At BERT-base size (issue 18, item 3): ``--random-bert-base`` builds a random-init
``BertForSequenceClassification`` (12 x 12 heads, hidden 768, 2 labels, seed 0, the packaged MiniLM
tokenizer) and ``--data SST-2/dev.tsv`` takes the sentences and labels of a labelled file (a seeded
stratified sample of ``--n``). Besides per-example losses, the script then says whether every delta of
the ``ablation`` table (``n_bootstrap=0``) is bit-identical between the two methods.

Batched sweep (issue 35, item 3): ``--units-per-forward K`` times the cached sweep with one unit per forward
against K units per forward (``SweepPlan.units_per_forward``), interleaved over ``--repeats`` rounds (the order
alternates), and reports the ratio and how far the per-example losses and the table's deltas moved (the batched
sweep rounds differently: other matrix shapes). ``--random-small`` builds a random-init BERT of MiniLM-L6's shape
(6 x 12 heads, hidden 384, intermediate 1536, seed 0) for a quick CPU round:

    HF_HUB_OFFLINE=1 PYTHONPATH=src .venv/bin/python benchmarks/ablation.py --random-small --n 64 --units-per-forward 4 --repeats 3

Writes ``benchmarks/results/ablation.json`` and ``ablation.md`` (``ablation-units.json`` with
``--units-per-forward``, unless ``--out-name`` says otherwise).
"""
from __future__ import annotations

import argparse
import atexit
import glob
import json
import logging
import os
import platform
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import torch

from bertology.experiments.ablation import HeadScoring, SweepPlan, label_ids_for, run_ablation, sample_examples
from bertology.experiments.head_importance import gradient_pass
from bertology.experiments.scoring import classifier_batches
from bertology.assets import polarity_path
from bertology.data.encode import encode_corpus
from bertology.data.loaders import load_corpus
from bertology.demo import split_heldout
from bertology.models.loading import load_model

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def _default_tuned() -> str:
    found = sorted(glob.glob(str(ROOT / "runs/demo-model/model"))) + sorted(glob.glob("/tmp/*/runs/demo-model/model"))
    if not found:
        raise SystemExit("no fine-tuned demo model found; run `bertology demo` first or pass --tuned DIR")
    return found[0]


def _git_head() -> str | None:
    try:
        return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True).strip()
    except (OSError, subprocess.CalledProcessError):
        return None


#: ``--random-small``: MiniLM-L6's shape.
SMALL = dict(num_hidden_layers=6, hidden_size=384, num_attention_heads=12, intermediate_size=1536)


def _random_bert_base(tokenizer: str | None = None, labels: list[str] | None = None, **size) -> str:
    """A random-init BERT-base sentence classifier (``labels``, default 0/1; seed 0) with the packaged tokenizer, in a
    temp folder; ``size`` overrides BERT-base's shape (e.g. :data:`SMALL`)."""
    import tempfile

    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from bertology.models.loading import builtin_model_path

    scratch = Path(tempfile.mkdtemp())
    atexit.register(shutil.rmtree, scratch, ignore_errors=True)  # the models and runs are GBs
    folder = scratch / "bert-base-random"
    tok = AutoTokenizer.from_pretrained(tokenizer or builtin_model_path("minilm"))
    labels = labels or ["0", "1"]
    cfg = BertConfig(vocab_size=len(tok), num_labels=len(labels), id2label=dict(enumerate(labels)),
                     label2id={name: i for i, name in enumerate(labels)}, **size)
    torch.manual_seed(0)
    BertForSequenceClassification(cfg).eval().save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


def _sync(device: str) -> None:
    """Wait for queued GPU work so the clock stops at the end of it."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def compare_units(args, loaded, enc, y, kw: dict, tuned: str, load_before: float) -> None:
    """``--units-per-forward K``: the cached sweep with 1 and with K units per forward, interleaved; time ratio and
    how far the numbers moved."""
    k = args.units_per_forward
    arms = {"K=1": SweepPlan(units_per_forward=1), f"K={k}": SweepPlan(units_per_forward=k)}
    times: dict[str, list[float]] = {name: [] for name in arms}
    cpu: dict[str, list[float]] = {name: [] for name in arms}  # this process's CPU seconds: less moved by other load
    results = {}
    for r in range(args.repeats):
        for name in arms if r % 2 == 0 else reversed(arms):
            t, c = time.perf_counter(), time.process_time()
            results[name] = run_ablation(loaded.model, enc, y, **kw, sweep=arms[name])
            _sync(args.device)
            times[name].append(time.perf_counter() - t)
            cpu[name].append(time.process_time() - c)
            print(f"round {r + 1}: {name} {times[name][-1]:.2f} s wall, {cpu[name][-1]:.2f} s CPU", flush=True)
    a, b = results["K=1"], results[f"K={k}"]
    max_diff = max(float(np.abs(a.per_example[u]["loss"] - b.per_example[u]["loss"]).max()) for u in a.per_example)
    same = all(bool((a.per_example[u]["pred"] == b.per_example[u]["pred"]).all()) for u in a.per_example)
    max_delta_diff = float(np.nanmax(np.abs(a.table["delta"].to_numpy() - b.table["delta"].to_numpy())))
    one, many = float(np.median(times["K=1"])), float(np.median(times[f"K={k}"]))
    cpu_one, cpu_many = float(np.median(cpu["K=1"])), float(np.median(cpu[f"K={k}"]))
    out = {
        "benchmark": f"ablation sweep: cached, 1 vs {k} units per forward",
        "git_head": _git_head(),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "torch": torch.__version__,
                    "threads": torch.get_num_threads(), "device": args.device,
                    "gpu": torch.cuda.get_device_name() if torch.device(args.device).type == "cuda" else None,
                    "load_average_before": round(load_before, 2), "load_average_after": round(os.getloadavg()[0], 2)},
        "model": tuned, "mode": args.mode, "n_sentences": len(enc.items), "n_tokens": enc.n_tokens,
        "n_units": len(b.units), "batch_size": args.batch_size, "units_per_forward": k,
        "seconds": times, "median_s": {"K=1": round(one, 3), f"K={k}": round(many, 3)},
        f"ratio_K{k}_over_K1": round(many / one, 3),
        "cpu_seconds": cpu, "median_cpu_s": {"K=1": round(cpu_one, 3), f"K={k}": round(cpu_many, 3)},
        f"cpu_ratio_K{k}_over_K1": round(cpu_many / cpu_one, 3),
        "max_abs_loss_difference": max_diff, "identical_predictions": same, "max_abs_delta_difference": max_delta_diff,
    }
    print(json.dumps(out["median_s"]), f"ratio K={k} / K=1 {many / one:.3f} (CPU time {cpu_many / cpu_one:.3f}); "
          f"max |Δloss| {max_diff:.2e}; "
          f"identical predictions {same}; max |Δdelta| {max_delta_diff:.1e}", flush=True)
    if not args.no_save:
        args.out_dir.mkdir(parents=True, exist_ok=True)
        name = args.out_name if args.out_name != "ablation" else "ablation-units"
        (args.out_dir / f"{name}.json").write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=500)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--tuned", default=None)
    ap.add_argument("--mode", default="uniform")
    ap.add_argument("--no-save", action="store_true")
    ap.add_argument("--data", default=None, help="A labelled file (e.g. SST-2 dev.tsv) instead of the demo's held-out split.")
    ap.add_argument("--random-bert-base", action="store_true", help="A random-init BERT-base classifier instead of --tuned.")
    ap.add_argument("--random-small", action="store_true",
                    help="A random-init BERT of MiniLM-L6's shape (6 x 12 heads, hidden 384) instead of --tuned.")
    ap.add_argument("--units-per-forward", type=int, default=None, metavar="K",
                    help="Time the cached sweep with 1 and with K units per forward (interleaved) instead of cached vs naive.")
    ap.add_argument("--out-name", default="ablation", help="Results file stem under benchmarks/results.")
    ap.add_argument("--tokenizer", default=None, help="Tokenizer folder for --random-bert-base (default: the packaged MiniLM's).")
    ap.add_argument("--device", default="cpu", help="Where both sweeps run (cpu, cuda).")
    ap.add_argument("--out-dir", type=Path, default=RESULTS, help="Folder for the results files.")
    args = ap.parse_args()

    if args.data:
        sample = sample_examples(load_corpus(args.data), args.n, 0)
    else:
        _, heldout = split_heldout(load_corpus(polarity_path()), 0.2, 0)
        sample = sample_examples(heldout, args.n, 0)
    if args.random_bert_base or args.random_small:
        labels = sorted({str(ex.label) for ex in sample})  # the data's label names (SST-2: 0/1, polarity: -1/1)
        tuned = _random_bert_base(args.tokenizer, labels, **(SMALL if args.random_small else {}))
    else:
        tuned = args.tuned or _default_tuned()
    loaded = load_model(tuned)
    enc = encode_corpus(sample, loaded.tokenizer, overlong="truncate")
    y = label_ids_for(sample, loaded.model)
    kw = dict(scoring=HeadScoring(mode=args.mode, batch_size=args.batch_size, pad_id=loaded.tokenizer.pad_token_id or 0,
                                      device=args.device),
              n_bootstrap=0)
    load_before = os.getloadavg()[0]
    print(f"model {tuned}; {len(enc.items)} sentences, {enc.n_tokens} tokens; torch threads {torch.get_num_threads()}; "
          f"load average {load_before:.2f}", flush=True)

    # warm-up (allocator, lazy init): one small sweep of one layer each way; its verdicts on 32 sentences (e.g.
    # "not above chance") are not about the measured run, so they are not logged
    small = encode_corpus(sample.head(32), loaded.tokenizer, overlong="truncate")
    logging.disable(logging.WARNING)
    try:
        for method in ("cached", "naive"):
            run_ablation(loaded.model, small, y, **kw, sweep=SweepPlan(method=method, layers=[6],
                                                                     units_per_forward=args.units_per_forward or 1))
    finally:
        logging.disable(logging.NOTSET)
    if args.units_per_forward:
        compare_units(args, loaded, enc, y, kw, tuned, load_before)
        return

    times: dict[str, list[float]] = {"cached": [], "naive": []}
    results = {}
    for r in range(args.repeats):
        for method in ("cached", "naive") if r % 2 == 0 else ("naive", "cached"):
            t = time.perf_counter()
            results[method] = run_ablation(loaded.model, enc, y, **kw, sweep=SweepPlan(method=method))
            _sync(args.device)
            times[method].append(time.perf_counter() - t)
            print(f"round {r + 1}: {method} {times[method][-1]:.1f} s", flush=True)
    a, b = results["naive"], results["cached"]
    max_diff = max(float(np.abs(a.per_example[k]["loss"] - b.per_example[k]["loss"]).max()) for k in a.per_example)
    same = all(bool((a.per_example[k]["pred"] == b.per_example[k]["pred"]).all()) for k in a.per_example)
    losses_identical = all(np.array_equal(a.per_example[k]["loss"], b.per_example[k]["loss"]) for k in a.per_example)
    keys = ["target", "layer", "head", "layer_mode", "metric"]
    ta, tb = a.table.sort_values(keys), b.table.sort_values(keys)
    delta_a, delta_b = ta["delta"].to_numpy(), tb["delta"].to_numpy()
    deltas_identical = bool(np.array_equal(delta_a, delta_b, equal_nan=True))
    max_delta_diff = float(np.nanmax(np.abs(delta_a - delta_b))) if len(delta_a) else 0.0
    cached, naive = float(np.median(times["cached"])), float(np.median(times["naive"]))

    # head importance (Michel et al.): one forward + backward per batch with per-example gates, against
    # the plain forward of the same batches (gradients=False)
    batches = classifier_batches(loaded.model, enc, y, kw["scoring"])
    hi_s: dict[str, float] = {}
    for what, grads in (("forward", False), ("importance", True)):
        t = time.perf_counter()
        gradient_pass(loaded.model, batches, mode=args.mode, gradients=grads)
        _sync(args.device)
        hi_s[what] = time.perf_counter() - t
    print(f"head importance {hi_s['importance']:.1f} s (one forward+backward per batch); "
          f"plain forward {hi_s['forward']:.1f} s", flush=True)
    ratio = cached / naive
    intact = b.table[(b.table.target == "intact")].set_index("metric")["value"]
    out = {
        "benchmark": "ablation sweep: cached vs naive",
        "git_head": _git_head(),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count(), "torch": torch.__version__,
                    "threads": torch.get_num_threads(), "device": args.device,
                    "gpu": torch.cuda.get_device_name() if torch.device(args.device).type == "cuda" else None,
                    "load_average_before": round(load_before, 2),
                    "load_average_after": round(os.getloadavg()[0], 2)},
        "model": tuned,
        "mode": args.mode,
        "n_sentences": len(enc.items),
        "n_tokens": enc.n_tokens,
        "n_units": len(b.units),
        "batch_size": args.batch_size,
        "seconds": {"cached": times["cached"], "naive": times["naive"]},
        "median_s": {"cached": round(cached, 2), "naive": round(naive, 2)},
        "ratio_cached_over_naive": round(ratio, 3),
        "target_ratio": 0.6,
        "max_abs_loss_difference": max_diff,
        "identical_predictions": same,
        "identical_losses": losses_identical,
        "identical_deltas": deltas_identical,
        "max_abs_delta_difference": max_delta_diff,
        "first_token_shortcut_batches": b.params.get("first_token_shortcut_batches"),
        "head_importance_s": round(hi_s["importance"], 2),
        "forward_s": round(hi_s["forward"], 2),
        "data": args.data or "polarity held-out",
        "intact": {k: float(v) for k, v in intact.items()},
    }
    print(json.dumps(out["median_s"]), f"ratio {ratio:.3f} (target <= 0.6); max |Δloss| {max_diff:.2e}; "
          f"identical predictions {same}; losses bit-identical {losses_identical}; deltas bit-identical "
          f"{deltas_identical} (max |Δdelta| {max_delta_diff:.1e}); first-token shortcut on "
          f"{b.params.get('first_token_shortcut_batches')} batches", flush=True)
    if not args.no_save:
        args.out_dir.mkdir(parents=True, exist_ok=True)
        (args.out_dir / f"{args.out_name}.json").write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
        md = [
            "| method | sentences | tokens | ablations | seconds | ratio |",
            "|---|---:|---:|---:|---:|---:|",
            f"| naive: full forward per ablation | {len(enc.items)} | {enc.n_tokens} | {len(b.units)} | {naive:.1f} | 1.00 |",
            f"| bertology cached sweep | {len(enc.items)} | {enc.n_tokens} | {len(b.units)} | {cached:.1f} | **{ratio:.2f}** |",
            "",
            f"max |Δ per-example loss| cached vs naive: {max_diff:.1e}; identical predictions: {same}. "
            f"Machine: {os.cpu_count()} CPUs, torch {torch.__version__}, {torch.get_num_threads()} threads, "
            f"load average {load_before:.2f} before. Commit {out['git_head']}.",
            "",
            f"head importance (one forward + backward per batch): {hi_s['importance']:.1f} s; "
            f"the plain forward of the same batches: {hi_s['forward']:.1f} s.",
        ]
        (args.out_dir / f"{args.out_name}.md").write_text("\n".join(md) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
