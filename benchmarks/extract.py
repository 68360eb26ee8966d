"""Benchmark: bertology's extraction engine against the naive ways of getting the same activations.

Methods (both models, base and tuned, every time; tokens = real tokens incl. [CLS]/[SEP], counted once
per example, the same definition for every method):

1. ``bertology``: ``run_analyses`` with AttentionChange and RepresentationSimilarity attached
   (length-bucketed batches, one hooked forward per model per batch). ``compute()`` is timed separately.
2. ``plain batched``: the reference for the ratio. Batches of ``--batch-size`` in corpus order (not
   sorted), padded to the batch max, ``torch.inference_mode()``, ``model(**batch)`` asking for no
   attentions or hidden states. Tokenisation happens before the clock starts (bertology's collate runs
   inside it), so the baseline is, if anything, favoured.
   ``plain batched, length-sorted`` (extra row): the same, but on bertology's own length buckets, so the
   difference to bertology is the engine's overhead (hooks, attention outputs, analysis updates) alone.
3. ``per-sentence loop``: how the reference notebooks do it: one sentence at a time,
   ``padding="max_length", max_length=128``, ``output_attentions=True, output_hidden_states=True``,
   tokenised inside the loop. Timed on the first ``--loop-n`` sentences only (it is slow).
4. Peak memory of bertology's extraction (both analyses) in a fresh subprocess for two corpus sizes:
   peak RSS and its increase over the RSS just after loading the models. Model loading itself has a
   transient peak far above the steady RSS, so the high-water mark is reset right after loading
   (``/proc/self/clear_refs`` = 5); otherwise the loading peak would hide the extraction's. The peak is
   read as ``VmHWM`` from ``/proc/self/status``; ``ru_maxrss`` (``getrusage``) is recorded too and
   agrees with it here, but on Linux a child's ``ru_maxrss`` starts at its parent's high-water mark
   (it is carried across ``exec``), so the subprocesses run before this process loads any model.

Timing: every method runs once as a warm-up (on the first ``--warmup-n`` sentences), then ``--repeats``
timed rounds; within a round the methods run one after another (interleaved), so slow drifts in
machine load hit all methods alike. The median per method is reported. ``torch`` threads are left at
the default unless ``--threads`` is given. Usage::

    .venv/bin/python benchmarks/extract.py                      # 2,000 SST-2 sentences, 3 repeats
    .venv/bin/python benchmarks/extract.py --n 500 --repeats 1 --no-memory
    .venv/bin/python benchmarks/extract.py --profile          # plus a cProfile breakdown of one run

``results/extract.json`` records which engine code was measured (git blob ids of the engine files and
whether they equal HEAD's), so a run on a working tree with uncommitted edits is recognisable.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pandas as pd  # noqa: E402
import torch  # noqa: E402

HERE = Path(__file__).resolve().parent
DEFAULT_DATA = Path("/work/shared/data/glue/SST-2/train.tsv")


# ----------------------------------------------------------------------------------------------- setup
def read_sentences(path: Path, n: int) -> list[str]:
    df = pd.read_csv(path, sep="\t", quoting=csv.QUOTE_NONE, nrows=n)
    return [str(s) for s in df["sentence"].tolist()]


def load_pair(base: str, tuned: str):
    from bertology.models.loading import load_model
    from bertology.models.pair import ModelPair

    # Two separately loaded copies even when both names are the same (two real models in memory).
    return ModelPair(load_model(base), load_model(tuned))


def encode(pair, texts: list[str]):
    from bertology.data.corpus import Corpus
    from bertology.data.encode import encode_corpus

    return encode_corpus(Corpus.from_list(texts), pair.tokenizer, max_length=128, overlong="skip")


def make_analyses(pair):
    from bertology.analyses.attention_change import AttentionChange
    from bertology.analyses.representation_similarity import RepresentationSimilarity

    return [
        AttentionChange(pair.num_layers, pair.num_heads),
        RepresentationSimilarity(pair.num_layers, n_tokens=2000, seed=0),
    ]


# ----------------------------------------------------------------------------------------------- methods
def run_bertology(pair, encoded, batch_size: int):
    from bertology.activations.extract import run_analyses

    analyses = make_analyses(pair)
    run_analyses(pair, encoded, analyses, batch_size=batch_size)
    return analyses


def plain_batches(pair, texts: list[str], batch_size: int) -> list[dict]:
    """Corpus-order batches padded to their longest sentence (tokenised here, outside the clock)."""
    tok = pair.tokenizer
    return [dict(tok(texts[s : s + batch_size], padding=True, return_tensors="pt"))
            for s in range(0, len(texts), batch_size)]


def sorted_batches(pair, encoded, batch_size: int) -> list[dict]:
    """bertology's own length buckets, as plain HF inputs (no hooks, no outputs)."""
    from bertology.data.batching import collate, length_batches

    pad_id = pair.tokenizer.pad_token_id or 0
    out = []
    for items in length_batches(encoded.items, batch_size):
        t = collate(items, pad_id)
        out.append({k: t[k] for k in ("input_ids", "token_type_ids", "attention_mask")})
    return out


def run_plain(pair, batches: list[dict]) -> None:
    models = (pair.base.model, pair.tuned.model)
    with torch.inference_mode():
        for batch in batches:
            for model in models:
                model(**batch)


def run_loop(pair, texts: list[str]) -> None:
    tok = pair.tokenizer
    models = (pair.base.model, pair.tuned.model)
    with torch.inference_mode():
        for text in texts:
            enc = tok(text, padding="max_length", max_length=128, truncation=True, return_tensors="pt")
            for model in models:
                model(**enc, output_attentions=True, output_hidden_states=True)


# ----------------------------------------------------------------------------------------------- memory
def _status_mib(field: str) -> float:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _maxrss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _reset_peak() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
        return True
    except OSError:
        return False


def memory_child(args) -> None:
    """Runs in a fresh interpreter: load, reset the peak, encode, extract with both analyses; print JSON."""
    if args.threads:
        torch.set_num_threads(args.threads)
    out: dict = {"n": args.n}
    pair = load_pair(args.base, args.tuned)
    out["hwm_during_load_mib"] = _status_mib("VmHWM")
    out["maxrss_during_load_mib"] = _maxrss_mib()
    out["peak_reset"] = _reset_peak()
    out["rss_after_load_mib"] = _status_mib("VmRSS")
    out["rss_anon_after_load_mib"], out["rss_file_after_load_mib"] = _status_mib("RssAnon"), _status_mib("RssFile")
    texts = read_sentences(args.data, args.n)
    encoded = encode(pair, texts)
    out["n_kept"] = len(encoded.items)
    out["n_tokens"] = encoded.n_tokens
    out["rss_after_encode_mib"] = _status_mib("VmRSS")
    t0 = time.perf_counter()
    analyses = run_bertology(pair, encoded, args.batch_size)
    out["extract_s"] = time.perf_counter() - t0
    out["peak_rss_mib"] = _status_mib("VmHWM")  # high-water mark of this process since the reset
    out["maxrss_after_extract_mib"] = _maxrss_mib()  # ru_maxrss (see the module docstring)
    out["rss_after_extract_mib"] = _status_mib("VmRSS")
    # Split of the RSS left after extraction: anonymous (heap, tensors) vs file-backed (the mmapped
    # safetensors weights and the libraries' code, paged in by the first forwards).
    out["rss_anon_after_extract_mib"], out["rss_file_after_extract_mib"] = _status_mib("RssAnon"), _status_mib("RssFile")
    if args.memory_compute:
        for a in analyses:
            a.compute()
        out["peak_rss_with_compute_mib"] = _status_mib("VmHWM")
    print("MEMORY_JSON " + json.dumps(out))


def measure_memory(args, n: int) -> dict:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--memory-child", "--n", str(n),
           "--batch-size", str(args.batch_size), "--base", args.base, "--tuned", args.tuned, "--data", str(args.data)]
    if args.threads:
        cmd += ["--threads", str(args.threads)]
    if args.memory_compute:
        cmd += ["--memory-compute"]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"memory subprocess failed:\n{proc.stderr[-3000:]}")
    line = next(l for l in proc.stdout.splitlines() if l.startswith("MEMORY_JSON "))
    res = json.loads(line[len("MEMORY_JSON "):])
    res["extract_increase_mib"] = res["peak_rss_mib"] - res["rss_after_load_mib"]
    return res


# ----------------------------------------------------------------------------------------------- provenance
ENGINE_FILES = ("activations/extract.py", "models/hooks.py", "analyses/attention_change.py",
                "analyses/representation_similarity.py", "metrics/attention.py", "metrics/similarity.py")


def code_provenance() -> dict:
    """Which bertology code was measured: its path, and the git blob id of each engine file.

    Blob ids compare directly with ``git ls-tree <commit> src/bertology/...``, so a result can be tied
    to a commit even when the working tree had uncommitted edits.
    """
    import hashlib

    import bertology

    root = Path(bertology.__file__).resolve().parent
    blobs = {}
    for rel in ENGINE_FILES:
        data = (root / rel).read_bytes()
        blobs[rel] = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
    out: dict = {"bertology_path": str(root), "engine_blobs": blobs}

    def git(*cmd: str) -> str:
        return subprocess.run(["git", "-C", str(HERE), *cmd], capture_output=True, text=True, check=True).stdout

    try:  # the checkout holding this script: its HEAD, and whether the measured engine files are HEAD's
        out["git_head"] = git("rev-parse", "HEAD").strip()
        head_blobs = {}
        for rel in ENGINE_FILES:
            fields = git("ls-tree", "--full-tree", "HEAD", f"src/bertology/{rel}").split()
            head_blobs[rel] = fields[2] if len(fields) >= 3 else None
        out["engine_files_differing_from_head"] = [rel for rel in ENGINE_FILES if head_blobs[rel] != blobs[rel]]
    except (OSError, subprocess.CalledProcessError):
        out.update(git_head=None, engine_files_differing_from_head=None)
    return out


# ----------------------------------------------------------------------------------------------- profile
PROFILE_POINTS = (  # (label, file suffix, function name): cumulative time of one bertology run
    ("forward, both models (incl. hooks)", "activations/extract.py", "_forward"),
    ("collate", "activations/extract.py", "collate"),
    ("attention_change.update", "analyses/attention_change.py", "update"),
    ("of which js_divergence", "metrics/attention.py", "js_divergence"),
    ("of which map_cosine", "metrics/attention.py", "map_cosine"),
    ("representation_similarity.update", "analyses/representation_similarity.py", "update"),
    ("of which _keep (bottom-k merge)", "analyses/representation_similarity.py", "_keep"),
)


def profile_bertology(pair, encoded, batch_size: int, top: int = 15) -> dict:
    """cProfile one bertology run; cumulative seconds at the engine's main steps and the top functions."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    t0 = time.perf_counter()
    run_bertology(pair, encoded, batch_size)
    total = time.perf_counter() - t0
    prof.disable()
    stats = pstats.Stats(prof).stats  # {(file, line, func): (cc, nc, tottime, cumtime, callers)}
    points = []
    for label, suffix, func in PROFILE_POINTS:
        cum = sum(v[3] for (f, _l, fn), v in stats.items() if f.replace("\\", "/").endswith(suffix) and fn == func)
        calls = sum(v[1] for (f, _l, fn), v in stats.items() if f.replace("\\", "/").endswith(suffix) and fn == func)
        if calls:
            points.append({"step": label, "seconds": cum, "share": cum / total, "calls": calls})
    ranked = sorted(stats.items(), key=lambda kv: kv[1][2], reverse=True)[:top]
    top_rows = [{"function": f"{Path(f).name}:{l}({fn})" if f != "~" else fn, "tottime": v[2], "calls": v[1]}
                for (f, l, fn), v in ranked]
    return {"total_s": total, "steps": points, "top_tottime": top_rows}


def fmt_profile(prof: dict) -> str:
    lines = [f"Profile of one bertology run under cProfile ({prof['total_s']:.2f} s, profiler overhead included):", "",
             "| step | seconds | share |", "|---|---:|---:|"]
    lines += [f"| {p['step']} | {p['seconds']:.2f} | {p['share']:.1%} |" for p in prof["steps"]]
    lines += ["", "| top functions by own time | seconds | calls |", "|---|---:|---:|"]
    lines += [f"| `{t['function']}` | {t['tottime']:.2f} | {t['calls']} |" for t in prof["top_tottime"]]
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------- main
def fmt_table(rows: list[dict]) -> str:
    lines = ["| method | sentences | tokens | seconds | tokens/s | ratio vs plain batched |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['method']} | {r['sentences']:,} | {r['tokens']:,} | {r['seconds']:.2f} | "
                     f"{r['tokens_per_s']:,.0f} | {r['ratio_vs_plain']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=2000, help="sentences (the first N of the data file)")
    p.add_argument("--repeats", type=int, default=3, help="timed rounds after one warm-up (median reported)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--loop-n", type=int, default=200, help="sentences timed in the per-sentence loop (a subset)")
    p.add_argument("--warmup-n", type=int, default=256, help="sentences in each method's warm-up run")
    p.add_argument("--memory-sizes", default="500,2000", help="corpus sizes for the peak-memory subprocesses")
    p.add_argument("--memory-compute", action="store_true", help="also run compute() in the memory subprocesses")
    p.add_argument("--no-memory", action="store_true", help="skip the peak-memory subprocesses")
    p.add_argument("--no-sorted-baseline", action="store_true", help="skip the length-sorted plain baseline")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: leave torch's default)")
    p.add_argument("--base", default="minilm")
    p.add_argument("--tuned", default="minilm", help="fine-tuned model folder (default: a second copy of minilm)")
    p.add_argument("--data", type=Path, default=DEFAULT_DATA)
    p.add_argument("--out", type=Path, default=HERE / "results" / "extract.json")
    p.add_argument("--profile", action="store_true", help="also cProfile one bertology run and print the breakdown")
    p.add_argument("--memory-only", action="store_true", help="only the peak-memory subprocesses")
    p.add_argument("--memory-child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)

    if args.memory_child:
        memory_child(args)
        return
    if args.threads:
        torch.set_num_threads(args.threads)

    t_start = time.perf_counter()
    load_before = os.getloadavg()
    # Memory first, while this process is still small: a child's ru_maxrss starts at its parent's.
    memory: list[dict] = []
    if not args.no_memory:
        for n in [int(x) for x in args.memory_sizes.split(",") if x]:
            memory.append(measure_memory(args, n))
            print(f"memory n={n}: {memory[-1]}", flush=True)
    if args.memory_only:
        notes = memory_notes(memory)
        print("\n".join(notes))
        write_result(args, argv, {"memory": memory, "markdown": "\n".join(notes),
                                  "load_average_before": load_before, "load_average_after": os.getloadavg(),
                                  "total_wall_s": time.perf_counter() - t_start})
        return
    pair = load_pair(args.base, args.tuned)
    texts = read_sentences(args.data, args.n)
    encoded = encode(pair, texts)
    if len(encoded.items) != len(texts):  # keep every method on exactly the same sentences
        kept = {it.index for it in encoded.items}
        texts = [t for i, t in enumerate(texts) if i in kept]
        encoded = encode(pair, texts)
    n_tokens = encoded.n_tokens
    lengths = [len(it) for it in encoded.items]
    print(f"{len(texts)} sentences, {n_tokens} tokens (mean {n_tokens / len(texts):.1f}, max {max(lengths)}); "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads; load average {load_before}", flush=True)

    # Inputs, prepared outside the clock.
    plain_in = plain_batches(pair, texts, args.batch_size)
    sorted_in = sorted_batches(pair, encoded, args.batch_size)
    loop_texts = texts[: args.loop_n]
    loop_tokens = sum(lengths[: args.loop_n])
    padded = {
        "bertology": sum(int(b["input_ids"].numel()) for b in sorted_in),
        "plain": sum(int(b["input_ids"].numel()) for b in plain_in),
        "plain_sorted": sum(int(b["input_ids"].numel()) for b in sorted_in),
        "loop": len(loop_texts) * 128,
    }

    methods = {
        "plain": lambda: run_plain(pair, plain_in),
        "bertology": lambda: run_bertology(pair, encoded, args.batch_size),
        "loop": lambda: run_loop(pair, loop_texts),
    }
    if not args.no_sorted_baseline:
        methods["plain_sorted"] = lambda: run_plain(pair, sorted_in)

    # Warm-up: every method once on a small prefix.
    wn = min(args.warmup_n, len(texts))
    warm_enc = encode(pair, texts[:wn])
    run_plain(pair, plain_batches(pair, texts[:wn], args.batch_size))
    run_bertology(pair, warm_enc, args.batch_size)
    run_loop(pair, texts[: min(8, wn)])

    times: dict[str, list[float]] = {k: [] for k in methods}
    analyses = None
    for r in range(args.repeats):
        for name, fn in methods.items():
            t0 = time.perf_counter()
            res = fn()
            times[name].append(time.perf_counter() - t0)
            if name == "bertology":
                analyses = res
        print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.2f}s" for k, v in times.items()), flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}

    compute_s = {}
    for a in analyses:
        t0 = time.perf_counter()
        a.compute()
        compute_s[a.name] = time.perf_counter() - t0
    print("compute: " + ", ".join(f"{k} {v:.2f}s" for k, v in compute_s.items()), flush=True)
    prof = profile_bertology(pair, encoded, args.batch_size) if args.profile else None

    plain_tps = n_tokens / med["plain"]

    def row(key, method, sentences, tokens):
        tps = tokens / med[key]
        return dict(method=method, key=key, sentences=sentences, tokens=tokens, seconds=med[key], tokens_per_s=tps,
                    ratio_vs_plain=tps / plain_tps, runs_s=times[key], padded_tokens_per_model=padded[key])

    rows = [
        row("bertology", "bertology `run_analyses` (attention_change + representation_similarity)", len(texts), n_tokens),
        row("plain", "plain batched HF forward (corpus order, no outputs requested)", len(texts), n_tokens),
    ]
    if "plain_sorted" in med:
        rows.append(row("plain_sorted", "plain batched HF forward, length-sorted (bertology's buckets)", len(texts), n_tokens))
    rows.append(row("loop", f"per-sentence loop, pad 128, attentions + hidden states (first {len(loop_texts)})",
                    len(loop_texts), loop_tokens))

    load_after = os.getloadavg()

    table = fmt_table(rows)
    notes = [
        "- analyses `compute()` (once, after extraction of all sentences): "
        + ", ".join(f"{k} {v:.2f} s" for k, v in compute_s.items()),
        "- padded tokens fed per model: " + ", ".join(f"{k} {v:,}" for k, v in padded.items())
        + f" (real tokens: {n_tokens:,}; loop: {loop_tokens:,})",
    ]
    notes += memory_notes(memory)
    notes.append(f"- load average (1/5/15 min) before: {', '.join(f'{x:.2f}' for x in load_before)}; "
                 f"after: {', '.join(f'{x:.2f}' for x in load_after)}; cores: {os.cpu_count()}")
    print()
    print(table)
    print()
    print("\n".join(notes))
    if prof is not None:
        print()
        print(fmt_profile(prof))

    write_result(args, argv, {
        "data": {"path": str(args.data), "sentences": len(texts), "tokens": n_tokens,
                 "mean_length": n_tokens / len(texts), "max_length": max(lengths)},
        "rows": rows,
        "compute_seconds": compute_s,
        "memory": memory,
        "profile": prof,
        "markdown": table + "\n\n" + "\n".join(notes) + ("\n\n" + fmt_profile(prof) if prof else ""),
        "load_average_before": load_before,
        "load_average_after": load_after,
        "total_wall_s": time.perf_counter() - t_start,
    })


def memory_notes(memory: list[dict]) -> list[str]:
    notes = []
    for m in memory:
        notes.append(
            f"- memory, {m['n']:,} sentences ({m['n_tokens']:,} tokens), fresh process: peak RSS during extraction "
            f"{m['peak_rss_mib']:.0f} MiB (ru_maxrss {m['maxrss_after_extract_mib']:.0f} MiB); RSS just after loading "
            f"the models {m['rss_after_load_mib']:.0f} MiB; increase {m['extract_increase_mib']:.0f} MiB "
            f"(loading itself peaked at {m['hwm_during_load_mib']:.0f} MiB; peak reset after loading: {m['peak_reset']}); "
            f"RSS after extraction: anonymous {m['rss_anon_after_load_mib']:.0f} -> {m['rss_anon_after_extract_mib']:.0f} MiB, "
            f"file-backed {m['rss_file_after_load_mib']:.0f} -> {m['rss_file_after_extract_mib']:.0f} MiB"
        )
    if len(memory) >= 2:
        a, b = memory[0], memory[-1]
        ratio = b["extract_increase_mib"] / a["extract_increase_mib"] if a["extract_increase_mib"] > 0 else float("nan")
        notes.append(f"- memory increase ratio, {b['n']:,} vs {a['n']:,} sentences: {ratio:.2f} "
                     f"(corpus {b['n'] / a['n']:g}x larger; 1.00 = flat)")
    return notes


def write_result(args, argv, body: dict) -> None:
    result = {
        "command": ".venv/bin/python benchmarks/extract.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "memory_child"},
        "machine": {
            "cpu_count": os.cpu_count(),
            "affinity_cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
            "torch_version": torch.__version__,
            "torch_threads": torch.get_num_threads(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "code": code_provenance(),
        **body,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwrote {args.out} ({body.get('total_wall_s', 0):.0f} s in all)")


if __name__ == "__main__":
    main()
