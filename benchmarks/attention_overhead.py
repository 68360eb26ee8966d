"""What the attention analyses add to the cost of the forward passes (issue target: at most 30 %).

Runs bertology's extraction over a treebank (gold trees, so no parser time is counted) three ways,
interleaved over rounds: capture only (no analysis), + attention_change, and + all attention
analyses (attention_change, attention_patterns, attention_targets, relation_heads, head_map with its
default 100-example sample). Reports the median seconds and the overhead relative to capture only,
and, for the last setup, the seconds spent inside each analysis's ``update`` (wall clock, median over
rounds); ``forward`` is the rest of that run. Process CPU time (all threads) is reported next to wall
time, and the CPU time stolen by other guests of the virtual machine during each run (``/proc/stat``,
Linux) is recorded: on a shared machine a run with much steal is slower for reasons of its own. The
load average before and after goes in the JSON.

    .venv/bin/python benchmarks/attention_overhead.py [--data CONLLU] [--n 2000] [--repeats 3] [--threads N]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import torch

from bertology.activations.extract import run_analyses
from bertology.analyses.attention_change import AttentionChange
from bertology.analyses.attention_patterns import AttentionPatterns
from bertology.analyses.attention_targets import AttentionTargets
from bertology.analyses.head_map import HeadMap
from bertology.analyses.relation_heads import RelationHeads
from bertology.data.encode import encode_corpus
from bertology.data.loaders import load_corpus
from bertology.models.pair import ModelPair

DEFAULT_DATA = Path(__file__).resolve().parents[2] / "shared/data/ud/en_ewt-ud-dev.conllu"


class _CaptureOnly(AttentionChange):
    """Requests attentions but does nothing with them: the cost of the forward with capture."""

    def update(self, batch) -> None:  # noqa: D401 - intentionally empty
        return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=str(DEFAULT_DATA))
    ap.add_argument("--base", default="minilm")
    ap.add_argument("--tuned", default="minilm")
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results/attention_overhead.json"))
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    load_before = os.getloadavg()

    pair = ModelPair.load(args.base, args.tuned)
    corpus = load_corpus(args.data, limit=args.n)
    enc = encode_corpus(corpus, pair.tokenizer, 128, "skip")
    L, H = pair.num_layers, pair.num_heads

    def all_five(data, **head_map) -> list:
        return [AttentionChange(L, H), AttentionPatterns(pair.tokenizer, L, H), AttentionTargets(data, pair.tokenizer, L, H),
                RelationHeads(data, L, H), HeadMap(L, H, **head_map)]

    setups = {
        "capture only": lambda: [_CaptureOnly(L, H)],
        "+ attention_change": lambda: [AttentionChange(L, H)],
        "+ all attention analyses": lambda: all_five(corpus, example_indices=[it.index for it in enc.items]),
    }
    # Warm-up on 64 sentences with every analysis: one-time costs (loading the compiled Numba kernels,
    # importing scikit-learn for the MDS) are paid here, not in the first measured round.
    t_warm = time.perf_counter()
    small = corpus.head(64)
    warm = all_five(small, max_examples=8)
    run_analyses(pair, encode_corpus(small, pair.tokenizer), warm, batch_size=args.batch_size)
    for a in warm:
        a.compute()
    t_warm = time.perf_counter() - t_warm
    times: dict[str, list[float]] = {k: [] for k in setups}
    cpu: dict[str, list[float]] = {k: [] for k in setups}
    steal: dict[str, list[float]] = {k: [] for k in setups}
    updates: dict[str, list[float]] = {}
    for _ in range(args.repeats):
        for name, make in setups.items():
            analyses = make()
            spent = _time_updates(analyses) if name == "+ all attention analyses" else None
            s0, c0, t0 = _steal_seconds(), time.process_time(), time.perf_counter()
            run_analyses(pair, enc, analyses, batch_size=args.batch_size)
            t_compute = time.perf_counter()
            for a in analyses:
                if not isinstance(a, _CaptureOnly):
                    a.compute()
            t_compute = time.perf_counter() - t_compute
            times[name].append(time.perf_counter() - t0)
            cpu[name].append(time.process_time() - c0)
            steal[name].append(_steal_seconds() - s0)
            if spent is not None:
                spent["compute (all five)"] = t_compute
            if spent is not None:
                for k, v in spent.items():
                    updates.setdefault(k, []).append(v)
                updates.setdefault("forward (rest of the run)", []).append(times[name][-1] - sum(spent.values()))
    base = statistics.median(times["capture only"])
    base_cpu = statistics.median(cpu["capture only"])
    rows = [{"setup": k, "seconds": statistics.median(v), "runs": v, "overhead": statistics.median(v) / base - 1,
             "cpu_seconds": statistics.median(cpu[k]), "cpu_runs": cpu[k], "cpu_overhead": statistics.median(cpu[k]) / base_cpu - 1,
             "steal_seconds": steal[k]}
            for k, v in times.items()]
    print(f"{len(enc.items)} sentences, {enc.n_tokens} tokens, torch threads {torch.get_num_threads()}, {args.repeats} rounds")
    print("| setup | wall s (median) | wall overhead | CPU s (median) | CPU overhead | steal s per run |\n|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['setup']} | {r['seconds']:.2f} | {100 * r['overhead']:+.1f} % | {r['cpu_seconds']:.2f} | "
              f"{100 * r['cpu_overhead']:+.1f} % | {' '.join(f'{x:.1f}' for x in r['steal_seconds'])} |")
    update_rows = {k: statistics.median(v) for k, v in updates.items()}
    # Two cross-checks against the machine's drift (a shared VM's speed moves by ~10 % within a minute):
    # the overhead of each round against the capture-only run of the same round, and within the runs
    # with analyses, the analysis seconds (updates and compute) over the rest of the run.
    paired = [a / c - 1 for a, c in zip(times["+ all attention analyses"], times["capture only"])]
    inside = [sum(updates[k][i] for k in updates if not k.startswith("forward")) / updates["forward (rest of the run)"][i]
              for i in range(args.repeats)]
    print(f"per-round overhead (all vs capture of the same round): median {100 * statistics.median(paired):+.1f} %, "
          f"rounds {' '.join(f'{100 * x:+.0f}' for x in paired)}")
    print(f"analysis seconds / forward seconds within the runs with all analyses: median {100 * statistics.median(inside):.1f} %")
    print("\nseconds inside update (+ all attention analyses, median):")
    for k, v in update_rows.items():
        print(f"  {k}: {v:.2f}")
    print(f"warm-up on 64 sentences (includes one-time costs): {t_warm:.2f} s")
    load_after = os.getloadavg()
    print(f"load average before {load_before[0]:.2f}, after {load_after[0]:.2f}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"args": vars(args), "n_sentences": len(enc.items), "n_tokens": enc.n_tokens,
                                          "torch_threads": torch.get_num_threads(), "load_before": load_before,
                                          "load_after": load_after, "warmup_seconds": t_warm, "rows": rows,
                                          "per_round_overhead": paired, "analysis_over_forward_within_run": inside, "update_seconds": update_rows,
                                          "update_runs": updates}, indent=2))


def _steal_seconds() -> float:
    """CPU seconds stolen by the hypervisor so far, all CPUs (0 where /proc/stat is missing)."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
        return int(fields[8]) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def _time_updates(analyses) -> dict[str, float]:
    """Wrap each analysis's ``update`` with a wall-clock timer; returns the live totals by name."""
    spent: dict[str, float] = {}
    for a in analyses:
        spent[a.name] = 0.0

        def timed(batch, _update=a.update, _name=a.name):
            t = time.perf_counter()
            _update(batch)
            spent[_name] += time.perf_counter() - t

        a.update = timed
    return spent


if __name__ == "__main__":
    main()
