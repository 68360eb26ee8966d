"""The fine-tuning lab on MiniLM: layer removal, partial freezing, biased data and SimCSE, with wall times.

Every run is a ``bertology finetune`` command (recorded verbatim in the results) run in a subprocess
under ``nice -n 10`` with 1 torch thread (``OMP_NUM_THREADS=1``: on the busy shared 2-core machine one
MiniLM train step, batch 32 x 50 tokens, took 4.0-6.5 s with 1 thread and 10.7-13.8 s with 2), into
``--work`` (default ``/tmp/finetune_lab``). Runs:

* **SST-2**: a seeded, label-stratified sample of 2,000 sentences of GLUE ``train.tsv`` (``--max-examples``),
  evaluated on all 872 of ``dev.tsv``: full model, ``--drop-layers 6`` (MiniLM's last layer) and
  ``--freeze-layers 4``.
* **SNLI**: a seeded stratified 3,000-pair sample of ``snli/dev.tsv`` as training, a seeded 1,000-pair
  sample of ``snli/test.tsv`` as evaluation (written to ``--work``): full, ``--drop-layers 6``,
  ``--freeze-layers 4``, and the biased-data run ``--exclude-words women,woman,girl,girls,mother,wife,female``
  with its eval slices (the full run reports the same slices through ``--eval-slices``: it is
  trained with no exclusion, so the two runs' slice accuracies are directly comparable).
* **SimCSE**: unsupervised contrastive training on 1,000 SNLI premises (distinct, seeded sample of
  ``snli/dev.tsv``) with [CLS] pooling and with mean pooling (MiniLM's own), and supervised training on
  the triplets of 500 seeded SNLI-dev premises (entailment positive, contradiction hard negative, mean
  pooling); anisotropy per layer before and after (500 sentences, 2,000 random token pairs from
  different sentences, ``bertology.metrics.geometry.mean_pair_cosine``), and Spearman on an STS-format
  *proxy* built from SNLI test pairs (score 2 entailment / 1 neutral / 0 contradiction): the real STS-B is
  not available offline here, so the number is graded-NLI relatedness, not STS-B.

All runs: 1 epoch, max length 64, batch 32, lr 1e-4 (classification: with 5e-5 and 2,000 SNLI pairs the
loss only fell from 1.098 to 1.078, accuracy 53%) / 3e-5 (SimCSE, batch 64), seed 0.
The sizes are what fits a ~40-minute budget on 2 CPU cores shared with other jobs (a 4,000-sentence
SST-2 epoch took over 11 minutes there); timings are noisy for the same reason, so the load average
before and after each run is recorded next to it.

    BERTOLOGY_CACHE=/work/main/.cache .venv/bin/python benchmarks/finetune_lab.py [--only sst2,snli,control,simcse,timing]

Writes ``benchmarks/results/finetune_lab.json`` and ``finetune_lab.md``. Runs already finished in
``--work`` are reused (the CLI reuses an identical run), so the script can be stopped and restarted.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
DATA = Path("/work/shared/data")
BIAS_WORDS = "women,woman,girl,girls,mother,wife,female"
COMMON = ["--epochs", "1", "--max-length", "64", "--batch-size", "32", "--lr", "1e-4", "--seed", "0"]


def bertology() -> str:
    exe = Path(sys.executable).with_name("bertology")
    return str(exe) if exe.exists() else "bertology"


def loadavg() -> float:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:  # pragma: no cover
        return float("nan")


def run(name: str, args: list[str], work: Path) -> dict:
    out = work / name
    cmd = ["nice", "-n", "10", bertology(), "finetune", *args, "--out", str(out)]
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    shown = " ".join(shlex.quote(c) for c in cmd)
    print(f"[{time.strftime('%H:%M:%S')}] {name}: {shown}", flush=True)
    load0 = loadavg()
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0:
        print(proc.stdout[-3000:], proc.stderr[-3000:], sep="\n")
        raise SystemExit(f"{name} failed with exit status {proc.returncode}")
    manifest = json.loads((out / "manifest.json").read_text())
    s = manifest.get("summary", {})
    rec = {
        "name": name,
        "command": shown,
        "process_wall_s": round(elapsed, 1),
        "load_average_1min_before": load0,
        "load_average_1min_after": loadavg(),
        "n_train": s.get("n_train"),
        "n_eval": s.get("n_eval"),
        "metrics": s.get("metrics"),
        "slices": s.get("slices"),
        "excluded_words": s.get("excluded_words"),
        "train_time_s": s.get("train_time_s"),
        "wall_time_s": s.get("wall_time_s"),
        "steps": s.get("steps"),
        "layers": manifest.get("result", {}).get("layers"),
        "parameters": (manifest.get("result", {}).get("frozen") or {}).get("parameters"),
        "stdout": proc.stdout.strip().splitlines()[-8:],
    }
    if (out / "tables" / "anisotropy.parquet").exists():
        rec["anisotropy"] = pd.read_parquet(out / "tables" / "anisotropy.parquet").to_dict("records")
    table = pd.read_parquet(out / "tables" / "finetune.parquet")
    rec["eval_step0"] = (
        table.query("split != 'train' and step == 0").drop(columns=["epoch"]).to_dict("records")
    )
    print(f"    -> {rec['metrics']} train {rec['train_time_s']} s, wall {rec['wall_time_s']} s", flush=True)
    return rec


def snli_files(work: Path) -> tuple[Path, Path]:
    """Seeded sample: 1,000 pairs of SNLI test as the eval file."""
    test = pd.read_csv(DATA / "snli" / "test.tsv", sep="\t", quoting=3, keep_default_na=False)
    test = test[test["label"].isin(["entailment", "neutral", "contradiction"])]
    ev = test.sample(n=1000, random_state=0).sort_index()
    path = work / "data" / "snli_test_1000.tsv"
    path.parent.mkdir(parents=True, exist_ok=True)
    ev.to_csv(path, sep="\t", index=False, quoting=3)
    return DATA / "snli" / "dev.tsv", path


def simcse_files(work: Path) -> tuple[Path, Path]:
    dev = pd.read_csv(DATA / "snli" / "dev.tsv", sep="\t", quoting=3, keep_default_na=False)
    premises = pd.Series(dev["premise"].unique())
    sample = premises.sample(n=1000, random_state=0)
    txt = work / "data" / "snli_premises_1000.txt"
    txt.parent.mkdir(parents=True, exist_ok=True)
    txt.write_text("\n".join(s.strip() for s in sample) + "\n", encoding="utf-8")
    test = pd.read_csv(DATA / "snli" / "test.tsv", sep="\t", quoting=3, keep_default_na=False)
    test = test[test["label"].isin(["entailment", "neutral", "contradiction"])].sample(n=1000, random_state=1)
    sts = pd.DataFrame({
        "sentence1": test["premise"], "sentence2": test["hypothesis"],
        "score": test["label"].map({"entailment": 2.0, "neutral": 1.0, "contradiction": 0.0}),
    })
    sts_path = work / "data" / "sts_proxy_snli_test_1000.tsv"
    sts.to_csv(sts_path, sep="\t", index=False, quoting=3)
    # supervised: every pair of 500 seeded premises of SNLI dev (each has an entailment and a contradiction)
    chosen = set(premises.sample(n=500, random_state=2))
    nli = dev[dev["premise"].isin(chosen)]
    nli_path = work / "data" / "snli_dev_500_premises.tsv"
    nli.to_csv(nli_path, sep="\t", index=False, quoting=3)
    return txt, sts_path, nli_path


def step_timing(rounds: int = 7, steps: int = 4, batch: int = 32) -> dict:
    """Seconds per training step of the full model, --drop-layers 6 and --freeze-layers 4, interleaved in one
    process (1 thread) on the same batch of SNLI pairs, so machine load hits the three alike. Median of the
    per-round means; the first step of each variant is a warm-up."""
    import statistics

    import torch

    from bertology.models.loading import load_model
    from bertology.training.surgery import drop_layers, freeze

    torch.set_num_threads(1)
    dev = pd.read_csv(DATA / "snli" / "dev.tsv", sep="\t", quoting=3, keep_default_na=False).sample(n=batch, random_state=0)
    variants = {}
    for name in ("full", "drop6", "freeze4"):
        loaded = load_model("minilm", kind="classifier", num_labels=3)
        m = loaded.model
        if name == "drop6":
            drop_layers(m, [6])
        if name == "freeze4":
            freeze(m, 4)
        m.train()
        opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-5)
        enc = loaded.tokenizer(list(dev["premise"]), list(dev["hypothesis"]), padding=True, truncation=True,
                               max_length=64, return_tensors="pt")
        variants[name] = (m, opt, enc)
    labels = torch.zeros(batch, dtype=torch.long)

    def one(name: str) -> float:
        m, opt, enc = variants[name]
        t = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(m(**enc).logits, labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return time.perf_counter() - t

    for name in variants:
        one(name)  # warm-up
    per_round: dict[str, list[float]] = {k: [] for k in variants}
    for _ in range(rounds):
        for name in variants:
            per_round[name].append(statistics.mean(one(name) for _ in range(steps)))
    med = {k: statistics.median(v) for k, v in per_round.items()}
    out = {"seconds_per_step": {k: round(v, 3) for k, v in med.items()},
           "ratio_to_full": {k: round(v / med["full"], 3) for k, v in med.items()},
           "batch": batch, "tokens_per_row": int(variants["full"][2]["input_ids"].shape[1]), "rounds": rounds,
           "steps_per_round": steps, "threads": 1, "load_average_1min": loadavg()}
    print("step timing:", out, flush=True)
    return out


def track_demo(work: Path) -> dict:
    """Checkpoints every 5 steps of a small SST-2 run, then ``bertology track`` on 100 dev sentences:
    linear CKA between the base and each checkpoint at the same layer."""
    rec = run("track_demo", ["--data", str(DATA / "glue/SST-2/train.tsv"), "--eval-data", str(DATA / "glue/SST-2/dev.tsv"),
                             "--max-examples", "480", *COMMON, "--save-every", "5"], work)
    cmd = ["nice", "-n", "10", bertology(), "track", str(work / "track_demo"), "--data", str(DATA / "glue/SST-2/dev.tsv"),
           "--max-examples", "100"]
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        print(proc.stdout[-3000:], proc.stderr[-3000:], sep="\n")
        raise SystemExit("track failed")
    rs = pd.read_parquet(work / "track_demo" / "tables" / "track_representation_similarity.parquet")
    diag = rs.query("layer_base == layer_tuned and metric == 'cka_linear'")
    cka = diag.pivot_table(index="step", columns="layer_base", values="value")
    return {"finetune_command": rec["command"], "command": " ".join(shlex.quote(c) for c in cmd),
            "track_wall_s": round(time.perf_counter() - t0, 1),
            "track_reused_compare_runs": "reused" in proc.stderr + proc.stdout,
            "cka_linear_same_layer": {int(step): {int(k): round(float(v), 4) for k, v in row.items()} for step, row in cka.iterrows()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", type=Path, default=Path("/tmp/finetune_lab"))
    ap.add_argument("--only", default="sst2,snli,control,simcse,timing,track")
    args = ap.parse_args()
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    parts = set(args.only.split(","))
    results_path = RESULTS / "finetune_lab.json"
    previous = json.loads(results_path.read_text()) if results_path.exists() else {}
    runs: dict[str, dict] = {k: v for k, v in previous.get("runs", {}).items() if k != "track_demo"}

    if "sst2" in parts:
        sst = ["--data", str(DATA / "glue/SST-2/train.tsv"), "--eval-data", str(DATA / "glue/SST-2/dev.tsv"),
               "--max-examples", "2000", *COMMON]
        for name, extra in (("sst2_full", []), ("sst2_drop6", ["--drop-layers", "6"]), ("sst2_freeze4", ["--freeze-layers", "4"])):
            runs[name] = run(name, [*sst, *extra], work)
    if "snli" in parts:
        train, ev = snli_files(work)
        snli = ["--data", str(train), "--eval-data", str(ev), "--max-examples", "3000", *COMMON]
        for name, extra in (
            ("snli_full", ["--eval-slices", BIAS_WORDS]),
            ("snli_drop6", ["--drop-layers", "6"]),
            ("snli_freeze4", ["--freeze-layers", "4"]),
            ("snli_biased", ["--exclude-words", BIAS_WORDS]),
        ):
            runs[name] = run(name, [*snli, *extra], work)
    if "control" in parts:
        # same-size control of the biased run: as many training pairs as the biased run kept, drawn at random
        train, ev = snli_files(work)
        kept = runs["snli_biased"]["n_train"]
        runs["snli_size_control"] = run("snli_size_control", [
            "--data", str(train), "--eval-data", str(ev), "--max-examples", str(kept), *COMMON, "--eval-slices", BIAS_WORDS,
        ], work)
    timing = step_timing() if "timing" in parts else previous.get("step_timing")
    trajectory = track_demo(work) if "track" in parts else previous.get("track")
    if "simcse" in parts:
        txt, sts, nli = simcse_files(work)
        simcse = ["--objective", "contrastive", "--sts-data", str(sts), "--lr", "3e-5", "--batch-size", "64",
                  "--epochs", "1", "--max-length", "64", "--seed", "0", "--anisotropy-sentences", "500"]
        runs["simcse_unsup"] = run("simcse_unsup", ["--contrastive", "unsupervised", "--data", str(txt), *simcse], work)
        runs["simcse_unsup_mean"] = run(
            "simcse_unsup_mean", ["--contrastive", "unsupervised", "--pooling", "mean", "--data", str(txt), *simcse], work)
        runs["simcse_sup_mean"] = run(
            "simcse_sup_mean", ["--contrastive", "supervised", "--pooling", "mean", "--data", str(nli), *simcse], work)

    meta = {
        "machine": {"platform": platform.platform(), "processor": platform.processor(), "cpus": os.cpu_count(),
                    "note": "2 CPU cores shared with other jobs, 1 torch thread per run; the load average is recorded per run"},
        "model": "minilm (all-MiniLM-L6-v2: 6 layers, 12 heads, hidden 384)",
        "runs": runs,
        "step_timing": timing,
        "track": trajectory,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    results_path.write_text(json.dumps(meta, indent=2, default=str))
    (RESULTS / "finetune_lab.md").write_text(markdown(meta))
    print(f"wrote {results_path} and finetune_lab.md")


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.2f}%"


def markdown(meta: dict) -> str:
    runs = meta["runs"]
    lines = ["# Fine-tuning lab on MiniLM", "", f"Model: {meta['model']}. {meta['machine']['note']}.", ""]
    cls = [r for r in runs.values() if r["metrics"] and "accuracy" in r["metrics"]]
    if cls:
        lines += ["## Classification: accuracy and time", "",
                  "| run | train examples | eval examples | accuracy | macro-F1 | train time (s) | wall (s) | steps | load avg |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in cls:
            m = r["metrics"]
            lines.append(f"| {r['name']} | {r['n_train']} | {r['n_eval']} | {_pct(m['accuracy'])} | {m['macro_f1']:.4f} | "
                         f"{r['train_time_s']:.1f} | {r['wall_time_s']:.1f} | {r['steps']} | "
                         f"{r['load_average_1min_before']}→{r['load_average_1min_after']} |")
        lines.append("")
    timing = meta.get("step_timing")
    if timing:
        sp, ratio = timing["seconds_per_step"], timing["ratio_to_full"]
        lines += ["## Cost per training step, interleaved in one process (fair timing under a shared load)", "",
                  f"One batch of {timing['batch']} SNLI pairs ({timing['tokens_per_row']} tokens per row after padding), "
                  f"forward + backward + AdamW step, {timing['threads']} thread, median over {timing['rounds']} rounds "
                  f"of {timing['steps_per_round']} steps, variants alternating:", "",
                  "| variant | s / step | vs full |", "|---|---|---|"]
        for k in sp:
            lines.append(f"| {k} | {sp[k]:.3f} | {ratio[k]:.3f} |")
        lines += ["", "The per-run training times in the table above were taken while other jobs shared the 2 cores "
                  "(see the load averages) and are not comparable with each other to better than tens of percent; "
                  "this table is the fair comparison.", ""]
    sliced = [r for r in cls if r.get("slices")]
    if sliced:
        lines += ["## SNLI slices: examples with / without the words " + BIAS_WORDS, "",
                  "| run | training examples dropped | all | with words (n) | without words (n) |", "|---|---|---|---|---|"]
        for r in sliced:
            s, ex = r["slices"], r.get("excluded_words") or {}
            dropped = f"{ex.get('n_dropped')} of {ex.get('n_before')}" if ex else "0"
            lines.append(f"| {r['name']} | {dropped} | {_pct(r['metrics']['accuracy'])} | "
                         f"{_pct(s['with_words']['accuracy'])} ({s['with_words']['n_eval']}) | "
                         f"{_pct(s['without_words']['accuracy'])} ({s['without_words']['n_eval']}) |")
        lines.append("")
    if sliced:
        lines += ["Standard errors: about 1.5 points on all 1,000 eval pairs, about 2.8 points on the 300 with the "
                  "words. `snli_size_control` trains on as many randomly drawn pairs as `snli_biased` kept, so "
                  "biased vs control separates the effect of the missing words from that of less data.", ""]
    if any(r.get("anisotropy") for r in runs.values()):
        lines += ["## SimCSE", "",
                  "MiniLM (all-MiniLM-L6-v2) is already a contrastively trained sentence encoder (mean pooling), so "
                  "its last layer is nearly isotropic before any SimCSE step (mean cosine of random token pairs "
                  "about 0.03, against 0.4-0.7 in the upper layers of BERT-base in Ethayarajh 2019), and a few "
                  "dozen SimCSE steps have little left to fix. The anisotropy sentences are a seeded sample of each "
                  "run's training sentences, so the supervised run's 'before' column differs from the others'. "
                  "The STS numbers are on the SNLI proxy (score 2/1/0 for entailment/neutral/contradiction), "
                  "not STS-B.", ""]
    for r in runs.values():
        if r.get("anisotropy"):
            an = pd.DataFrame(r["anisotropy"])
            piv = an.pivot_table(index="layer", columns="model", values="value")
            lines += [f"## {r['name']}: anisotropy per layer (mean cosine of random token pairs from different sentences)", "",
                      "| layer | before (base) | after (tuned) |", "|---|---|---|"]
            for layer, row in piv.iterrows():
                lines.append(f"| {layer} | {row.get('base', float('nan')):.3f} | {row.get('tuned', float('nan')):.3f} |")
            lines.append("")
            before = [e for e in r["eval_step0"] if e["metric"] == "spearman"]
            if before or (r["metrics"] or {}).get("spearman") is not None:
                lines += [f"STS-proxy Spearman (graded SNLI labels, not STS-B): before {before[0]['value']:.4f}, "
                          f"after {r['metrics'].get('spearman'):.4f}; train time {r['train_time_s']:.1f} s.", ""]
    tr = meta.get("track")
    if tr:
        cka = tr["cka_linear_same_layer"]
        layers = sorted({int(k) for row in cka.values() for k in row})
        lines += ["## Trajectory (`bertology track`): linear CKA, base vs checkpoint, same layer", "",
                  "A 480-sentence SST-2 run with `--save-every 5` (15 steps), tracked on 100 dev sentences "
                  f"(this track call: {tr['track_wall_s']} s for 3 checkpoints x 2 analyses"
                  + (", its compare runs reused from an identical earlier call" if tr.get("track_reused_compare_runs") else "")
                  + "):", "",
                  "| step | " + " | ".join(f"layer {l}" for l in layers) + " |", "|---" * (len(layers) + 1) + "|"]
        for step, row in sorted(cka.items(), key=lambda kv: int(kv[0])):
            lines.append(f"| {step} | " + " | ".join(f"{row[str(l)] if str(l) in row else row.get(l):.4f}" for l in layers) + " |")
        lines += ["", "```", tr["finetune_command"], tr["command"], "```", ""]
    lines += ["## Commands", "", "Data files under /tmp/finetune_lab/data are written by the script (seeded samples, see its "
              "docstring); the step timing is `step_timing()` in the script.", "", "```"]
    lines += [r["command"] for r in runs.values()] + ["```", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
