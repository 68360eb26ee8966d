"""Benchmark: one base against K tuned models in one ``compare_many`` run vs K separate ``compare`` runs (issue 16).

The tuned models are copies of the built-in ``minilm`` with every weight tensor perturbed (seeded Gaussian
noise of ``--noise`` times the tensor's standard deviation), saved under ``--workdir``. Each variant runs
in a fresh subprocess, as a user would run the CLI:

* ``separate``: K processes, each one ``compare --tuned PATH`` (the base loaded and run K times);
* ``shared``: one process, ``compare --tuned NAME=PATH`` x K (the base forward once per batch).

Time: the wall time of the subprocesses (interpreter start and imports included; for ``separate`` the
sum of its K processes), and the time inside the API call. Memory: each process's peak resident set,
read as ``VmHWM`` from ``/proc/self/status`` at its end (a fresh high-water mark per ``exec``, unlike
``ru_maxrss``, which a child inherits from its parent; the parent here never loads a model anyway);
for ``separate`` the largest of its K. Rounds interleave the variants so drifts in machine load hit
both; medians are reported. At the end each shared pair's tables are checked equal to its separate run.

    PYTHONPATH=src .venv/bin/python benchmarks/multicompare.py            # 4 models, 500 SST-2 sentences
    PYTHONPATH=src .venv/bin/python benchmarks/multicompare.py --k 2 --n 100 --rounds 1   # a quick check
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()
ANALYSES = "attention_change,representation_similarity"
SST2 = "shared/data/glue/SST-2/dev.tsv"  # ../shared from the repository root


def vm_hwm_mib() -> float:
    """This process's peak resident set (VmHWM), MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def make_models(work: Path, k: int, noise: float) -> None:
    """K perturbed copies of minilm under ``work/tuned<i>`` (skipped when present)."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    from bertology.models.loading import builtin_model_path

    src = builtin_model_path("minilm")
    for i in range(k):
        out = work / f"tuned{i}"
        if (out / "config.json").exists():
            continue
        model = AutoModel.from_pretrained(src, attn_implementation="eager")
        gen = torch.Generator().manual_seed(i + 1)
        with torch.no_grad():
            for p in model.parameters():
                if p.numel() > 1:
                    p.add_(torch.randn(p.shape, generator=gen) * noise * float(p.std()))
        model.save_pretrained(out)
        AutoTokenizer.from_pretrained(src).save_pretrained(out)


def config(args, out: Path, tuned: str = ""):
    from bertology.config import CompareConfig, DataConfig

    return CompareConfig(base="minilm", tuned=tuned, data=DataConfig(args.data, max_examples=args.n), out=str(out),
                         analyses=tuple(ANALYSES.split(",")), batch_size=32, view_examples=0)


def child(args) -> None:
    """One variant's process: run it, print {"api_s", "peak_mib"} as JSON on the last line."""
    work = Path(args.workdir)
    if args.child == "make":
        make_models(work, args.k, args.noise)
        return
    import shutil

    from bertology.multicompare import TunedModel, compare_many
    from bertology.commands.compare import compare

    out = work / ("shared" if args.child == "shared" else args.child)
    shutil.rmtree(out, ignore_errors=True)  # a fresh run each time, never a resumed one
    t0, c0 = time.perf_counter(), time.process_time()  # after the imports: "api" is the run itself
    if args.child == "shared":
        compare_many(config(args, out), [TunedModel(f"m{i}", str(work / f"tuned{i}")) for i in range(args.k)], report=False)
    else:
        i = int(args.child.removeprefix("separate"))
        compare(config(args, out, str(work / f"tuned{i}")), report=False)
    print(json.dumps({"api_s": time.perf_counter() - t0, "api_cpu_s": time.process_time() - c0, "peak_mib": vm_hwm_mib()}))


def run_child(args, which: str) -> dict:
    cmd = [sys.executable, str(HERE), "--child", which, "--workdir", args.workdir, "--k", str(args.k), "--n", str(args.n),
           "--data", args.data, "--noise", str(args.noise)]
    t0, before = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    wall, after = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)  # the process's user + system time
    if done.returncode:
        raise SystemExit(f"{which} failed:\n{done.stderr[-3000:]}")
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "wall_s": wall, "cpu_s": cpu} if which != "make" else {}


def check_same_tables(work: Path, k: int) -> bool:
    import pandas as pd

    for i in range(k):
        for name in ANALYSES.split(","):
            a = pd.read_parquet(work / f"separate{i}/tables/{name}.parquet")
            b = pd.read_parquet(work / f"shared/pairs/m{i}/tables/{name}.parquet")
            pd.testing.assert_frame_equal(a, b, check_exact=True)
    return True


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--child")
    ap.add_argument("--workdir", default="/tmp/bertology-multicompare")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--n", type=int, default=500)
    ap.add_argument("--data", default=str(next((p for p in (HERE.parents[2] / SST2, Path("/work") / SST2) if p.exists()),
                                                HERE.parents[2] / SST2)))
    ap.add_argument("--noise", type=float, default=0.05)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", default=str(HERE.parent / "results/multicompare.json"))
    args = ap.parse_args()
    if args.child:
        child(args)
        return
    Path(args.workdir).mkdir(parents=True, exist_ok=True)
    run_child(args, "make")
    load_before = os.getloadavg()
    rounds = []
    for r in range(args.rounds):
        shared = run_child(args, "shared")
        separate = [run_child(args, f"separate{i}") for i in range(args.k)]
        row = {"shared": shared, "separate": separate,
               "separate_wall_s": sum(s["wall_s"] for s in separate), "separate_api_s": sum(s["api_s"] for s in separate),
               "separate_cpu_s": sum(s["cpu_s"] for s in separate), "separate_api_cpu_s": sum(s["api_cpu_s"] for s in separate),
               "separate_peak_mib": max(s["peak_mib"] for s in separate)}
        rounds.append(row)
        print(f"round {r + 1}: shared {shared['wall_s']:.1f} s (api {shared['api_s']:.1f}; cpu {shared['cpu_s']:.1f}), "
              f"peak {shared['peak_mib']:.0f} MiB; {args.k} separate {row['separate_wall_s']:.1f} s "
              f"(api {row['separate_api_s']:.1f}; cpu {row['separate_cpu_s']:.1f}), peak {row['separate_peak_mib']:.0f} MiB",
              flush=True)
    med = {
        "shared_wall_s": statistics.median(r["shared"]["wall_s"] for r in rounds),
        "shared_api_s": statistics.median(r["shared"]["api_s"] for r in rounds),
        "separate_wall_s": statistics.median(r["separate_wall_s"] for r in rounds),
        "separate_api_s": statistics.median(r["separate_api_s"] for r in rounds),
        "shared_cpu_s": statistics.median(r["shared"]["cpu_s"] for r in rounds),
        "separate_cpu_s": statistics.median(r["separate_cpu_s"] for r in rounds),
        "shared_peak_mib": statistics.median(r["shared"]["peak_mib"] for r in rounds),
        "separate_peak_mib": statistics.median(r["separate_peak_mib"] for r in rounds),
    }
    med["ratio_wall"] = med["shared_wall_s"] / med["separate_wall_s"]
    med["ratio_api"] = med["shared_api_s"] / med["separate_api_s"]
    med["ratio_cpu"] = med["shared_cpu_s"] / med["separate_cpu_s"]
    same = check_same_tables(Path(args.workdir), args.k)
    print(f"median of {args.rounds}: shared / separate = {med['ratio_wall']:.2f}x wall ({med['ratio_api']:.2f}x inside the API, "
          f"{med['ratio_cpu']:.2f}x CPU time); "
          f"peak {med['shared_peak_mib']:.0f} vs {med['separate_peak_mib']:.0f} MiB; tables identical: {same}")
    import torch

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE.parent).stdout.strip()
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps({
        "commit": commit, "k": args.k, "n": args.n, "analyses": ANALYSES, "noise": args.noise, "rounds": rounds,
        "median": med, "tables_identical": same, "machine": {"cpus": os.cpu_count(), "torch": torch.__version__,
        "threads": torch.get_num_threads(), "python": platform.python_version(), "load_before": load_before,
        "load_after": os.getloadavg()},
    }, indent=2))


if __name__ == "__main__":
    main()
