"""Benchmark at BERT-base size (issue 18): ``compare`` with every streaming analysis against the bare
forward passes, in float32 and bfloat16, on a GPU (or the CPU).

Models: two random-init BERT-base encoders (12 layers x 12 heads, hidden 768, FFN 3072, 512
positions; seeds 0 and 1) with the packaged MiniLM tokenizer (bert-base-uncased's 30,522-piece
vocab), saved to a temporary folder and loaded through bertology's own loader (eager attention) in
the dtype under test. No download.

Methods, timed per dtype on the same corpus (interleaved rounds, median reported):

- ``bare``: both models' plain forward, ``torch.inference_mode()``, no attentions or hidden states
  asked for, on bertology's own length-sorted batches (``length_batches`` + ``collate``), tensors
  moved to the device inside the clock. The reference of the ratio.
- ``compare``: ``bertology.commands.compare.compare`` on the same pair and corpus with every streaming
  analysis that needs no annotations (attention_change, attention_patterns, representation_similarity,
  head_map, geometry, pca_views), extraction and every ``compute()`` together, tables written,
  no report, no viewer examples. attention_targets and relation_heads need POS tags and trees
  (spaCy or CoNLL-U) and are left out. Model loading is outside the clock for both methods.

Peak device memory (``torch.cuda.max_memory_allocated``) is recorded per method, and the process's
peak resident memory (``ru_maxrss``) at the end. ``--methods compare --repeats 1 --no-warmup`` in a
fresh process per corpus size measures what ``compare`` alone needs (issue 18, item 2);
``--keep-tables DIR`` keeps each round's tables (to compare the numbers of two trees). Usage::

    PYTHONPATH=src python benchmarks/scale_gpu.py --data SST-2/dev.tsv --n 500 --device cuda --out results/scale_gpu.json
"""
from __future__ import annotations

import argparse
import atexit
import csv
import json
import os
import platform
import resource
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import pandas as pd
import torch

ANALYSES = ("attention_change", "attention_patterns", "representation_similarity", "head_map", "geometry", "pca_views")


def read_sentences(path: Path, n: int) -> list[str]:
    df = pd.read_csv(path, sep="\t", quoting=csv.QUOTE_NONE, nrows=n)
    return [str(s) for s in df["sentence"].tolist()]


#: (layers, heads, hidden) of each --size; "small" only checks that the script runs; "base-2layers" is
#: BERT-base width (12 heads, 768, FFN 3072) with 2 layers, for memory runs on a loaded CPU.
SIZES = {"base": (12, 12, 768), "large": (24, 16, 1024), "small": (2, 4, 64), "base-2layers": (2, 12, 768)}


def save_bert(folder: Path, tokenizer_dir: Path, seed: int, size: str = "base") -> Path:
    """A random-init BERT encoder of ``size`` with the given tokenizer, saved as a Hugging Face folder."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    layers, heads, hidden = SIZES[size]
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    cfg = BertConfig(vocab_size=len(tok), hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                     intermediate_size=4 * hidden, max_position_embeddings=512)
    torch.manual_seed(seed)
    model = BertModel(cfg).eval()
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bare(pair, encoded, batch_size: int, device: torch.device) -> None:
    """Both models' plain forward on bertology's length buckets."""
    from bertology.data.batching import collate, length_batches
    from bertology.models import sites

    pad_id = pair.tokenizer.pad_token_id or 0
    with torch.inference_mode():
        for items in length_batches(encoded.items, batch_size):
            t = collate(items, pad_id)
            for m in (pair.base.model, pair.tuned.model):
                m(**sites.model_inputs(m, t, device))
    sync(device)


def bertology_compare(pair, corpus, out: Path, batch_size: int, device: str, dtype: str) -> None:
    from bertology.config import CompareConfig, DataConfig
    from bertology.commands.compare import compare

    cfg = CompareConfig(base="base", tuned="tuned", data=DataConfig(path="bench"), out=str(out), analyses=ANALYSES,
                        batch_size=batch_size, device=device, dtype=dtype, view_examples=0)
    compare(cfg, pair=pair, corpus=corpus, report=False, overwrite=True)
    sync(torch.device(device))


def timed(fn, device: torch.device) -> tuple[float, float | None]:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    fn()
    dt = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None
    return dt, peak


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, required=True, help="GLUE SST-2 style TSV with a 'sentence' column.")
    ap.add_argument("--n", type=int, default=500)
    ap.add_argument("--tokenizer", type=Path, default=None, help="Tokenizer folder (default: the packaged MiniLM's).")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--size", choices=sorted(SIZES), default="base")
    ap.add_argument("--profile", type=int, default=0, help="Also profile one compare per dtype and print this many functions.")
    ap.add_argument("--methods", default="bare,compare", help="Which methods to time (comma list of bare, compare).")
    ap.add_argument("--no-warmup", action="store_true", help="Skip the 64-sentence warm-up (a memory-only run).")
    ap.add_argument("--keep-tables", type=Path, default=None, help="Copy each compare round's tables to DIR/<dtype>-<round>.")
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/scale_gpu.json"))
    args = ap.parse_args()

    from bertology.data.corpus import Corpus
    from bertology.data.encode import encode_corpus
    from bertology.models.loading import builtin_model_path, load_model
    from bertology.models.pair import ModelPair
    from bertology.models.precision import torch_dtype

    device = torch.device(args.device)
    tok_dir = args.tokenizer or builtin_model_path("minilm")
    texts = read_sentences(args.data, args.n)
    if len(texts) < args.n:  # a run labelled 4,000 sentences must have them (SST-2 dev has 872: use train's rows)
        raise SystemExit(f"{args.data} has {len(texts)} sentences, fewer than --n {args.n}")
    corpus = Corpus.from_list(texts)
    tmp = Path(tempfile.mkdtemp())
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)  # the saved models and runs are GBs
    paths = [save_bert(tmp / name, tok_dir, seed, args.size) for seed, name in enumerate(("base", "tuned"))]
    rows = []
    for dtype in args.dtypes.split(","):
        pair = ModelPair(*(load_model(p, dtype=torch_dtype(dtype)) for p in paths))
        for m in (pair.base.model, pair.tuned.model):
            m.to(device).eval()
        encoded = encode_corpus(corpus, pair.tokenizer, max_length=128, overlong="skip")
        n_tokens = int(sum(len(it.input_ids) for it in encoded.items))
        methods = args.methods.split(",")
        if not args.no_warmup:
            warm = Corpus.from_list(texts[:64])
            bare(pair, encode_corpus(warm, pair.tokenizer, max_length=128, overlong="skip"), args.batch_size, device)
            bertology_compare(pair, warm, tmp / "warm", args.batch_size, args.device, dtype)
        times: dict[str, list[float]] = {m: [] for m in methods}
        stages: list[dict] = []  # each compare round's manifest timings (forward, update and compute per analysis)
        peaks: dict[str, float | None] = {m: None for m in methods}
        for i in range(args.repeats):
            # a fresh folder per round: the same folder would resume the finished tables instead of computing them
            for method, fn in (("bare", lambda: bare(pair, encoded, args.batch_size, device)),
                               ("compare", lambda: bertology_compare(pair, corpus, tmp / f"run-{dtype}-{i}", args.batch_size,
                                                                     args.device, dtype))):
                if method not in methods:
                    continue
                dt, peak = timed(fn, device)
                times[method].append(dt)
                peaks[method] = peak
                print(f"round {i + 1} {dtype} {method}: {dt:.1f} s", flush=True)
                if method == "compare":
                    manifest = json.loads((tmp / f"run-{dtype}-{i}" / "manifest.json").read_text())
                    stages.append(manifest.get("timings", {}))
                    print("  stages:", json.dumps(stages[-1].get("analyses", {})), "forward", stages[-1].get("forward_s"),
                          flush=True)
            if args.keep_tables is not None and "compare" in methods:
                shutil.copytree(tmp / f"run-{dtype}-{i}" / "tables", args.keep_tables / f"{dtype}-{i}", dirs_exist_ok=True)
        if args.profile:  # where one compare's time goes (cumulative and own time, top functions)
            import cProfile
            import io
            import pstats

            prof = cProfile.Profile()
            prof.enable()
            bertology_compare(pair, corpus, tmp / f"profile-{dtype}", args.batch_size, args.device, dtype)
            prof.disable()
            for key in ("cumulative", "tottime"):
                buf = io.StringIO()
                pstats.Stats(prof, stream=buf).sort_stats(key).print_stats(args.profile)
                print(buf.getvalue(), flush=True)
        med = {k: statistics.median(v) for k, v in times.items()}
        row = {"dtype": dtype, "n_examples": len(encoded.items), "n_tokens": n_tokens,
               "bare_s": med.get("bare"), "compare_s": med.get("compare"),
               "ratio": med["compare"] / med["bare"] if len(med) == 2 else None,
               "bare_all_s": times.get("bare"), "compare_all_s": times.get("compare"),
               "peak_mib_bare": peaks.get("bare"), "peak_mib_compare": peaks.get("compare"),
               "compare_stages": stages,
               "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
               "load_average": os.getloadavg()}
        rows.append(row)
        print(json.dumps({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items() if not k.endswith("all_s") and k != "compare_stages"}),
              flush=True)
        del pair
        if device.type == "cuda":
            torch.cuda.empty_cache()
    env = {"torch": torch.__version__, "python": platform.python_version(), "device": str(device),
           "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor(),
           "analyses": ANALYSES, "size": args.size, "layers_heads_hidden": SIZES[args.size], "batch_size": args.batch_size, "repeats": args.repeats, "data": str(args.data)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"env": env, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
