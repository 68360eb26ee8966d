"""Every streaming analysis of ``compare`` on captured batches, without the forward passes (issue 18).

The forward passes run once: both random-init encoders of ``--size`` (``scale_gpu.save_bert``, seeds 0
and 1, the packaged MiniLM tokenizer) capture hidden states and attention maps of ``--n`` SST-2
sentences in bertology's length buckets, kept in memory. Each round then builds the analyses the way
``compare`` does (``pipeline.build_analyses``, every setting at its default), streams the same batches
into them (fresh ``PairBatch`` objects, so no cache carries over) and runs their ``compute()``s the way
``compare`` finishes them (``commands.compare.finish_analyses``). It prints the seconds of each analysis's
``update`` (summed over batches) and ``compute``, and the total: the part of ``compare`` that is not
the forward passes, measured in seconds rather than as a ratio of two noisy runs. ``--profile NAME``
profiles that analysis's stage (``update`` or ``compute``, ``--stage``) in the last round::

    PYTHONPATH=src python benchmarks/analysis_replay.py --data SST-2/dev.tsv --n 500 --rounds 3
"""
from __future__ import annotations

import argparse
import atexit
import cProfile
import io
import json
import pstats
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from threadpoolctl import threadpool_limits

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scale_gpu import ANALYSES, SIZES, read_sentences, save_bert  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--n", type=int, default=500)
    ap.add_argument("--size", choices=sorted(SIZES), default="base")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--profile", default=None, help="An analysis to profile in the last round.")
    ap.add_argument("--stage", choices=["update", "compute"], default="compute")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--callers", default=None, help="With --profile: also print who calls functions matching this.")
    ap.add_argument("--threaded-blas", action="store_true",
                    help="Stream with NumPy's BLAS on its default threads (compare uses one: bertology.blas).")
    ap.add_argument("--out", type=Path, default=None, help="Write the timings (JSON) here.")
    args = ap.parse_args()

    from bertology.activations.batch import PairBatch
    from bertology.activations.extract import iter_pair_batches
    from bertology.config import CompareConfig, DataConfig
    from bertology.data.corpus import Corpus
    from bertology.data.encode import encode_corpus
    from bertology.models.loading import builtin_model_path, load_model
    from bertology.models.pair import ModelPair
    from bertology.commands.compare import finish_analyses
    from bertology.commands.selection import build_analyses

    tmp = Path(tempfile.mkdtemp())
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)  # the saved models and runs are GBs
    paths = [save_bert(tmp / name, builtin_model_path("minilm"), seed, args.size) for seed, name in enumerate(("base", "tuned"))]
    pair = ModelPair(*(load_model(p) for p in paths))
    corpus = Corpus.from_list(read_sentences(args.data, args.n))
    encoded = encode_corpus(corpus, pair.tokenizer, max_length=128, overlong="skip")
    config = CompareConfig(base="base", tuned="tuned", data=DataConfig(path="bench"), analyses=ANALYSES, view_examples=0)
    t0 = time.perf_counter()
    batches = list(iter_pair_batches(pair, encoded, batch_size=config.batch_size))
    print(f"{len(encoded.items)} sentences, {len(batches)} batches, captured in {time.perf_counter() - t0:.1f} s, "
          f"torch threads {torch.get_num_threads()}", flush=True)
    rounds = []
    for r in range(args.rounds):
        analyses = build_analyses(config, pair, corpus, encoded)
        timings: dict[str, float] = {}
        cpus: dict[str, float] = {}  # process CPU seconds (all threads) of each stage
        prof = cProfile.Profile() if args.profile and r == args.rounds - 1 else None
        lim = None if args.threaded_blas else threadpool_limits(1, user_api="blas")
        for b in batches:
            fresh = PairBatch(b.items, b.input_ids, b.mask, b.content, b.lengths, b.base, b.tuned)
            for a in analyses:
                on = prof is not None and a.name == args.profile and args.stage == "update"
                if on:
                    prof.enable()
                clock, cpu = time.perf_counter(), time.process_time()
                a.update(fresh)
                timings[f"update:{a.name}"] = timings.get(f"update:{a.name}", 0.0) + time.perf_counter() - clock
                cpus[f"update:{a.name}"] = cpus.get(f"update:{a.name}", 0.0) + time.process_time() - cpu
                if on:
                    prof.disable()
        if lim is not None:
            lim.restore_original_limits()
        if prof is not None and args.stage == "compute":
            prof.enable()
        clock, cpu = time.perf_counter(), time.process_time()
        finish_analyses(analyses, timings)
        timings["compute phase"] = time.perf_counter() - clock
        cpus["compute phase"] = time.process_time() - cpu
        if prof is not None and args.stage == "compute":
            prof.disable()
        total = sum(v for k, v in timings.items() if k.startswith("update:")) + timings["compute phase"]
        rounds.append({**{k: round(v, 3) for k, v in timings.items()}, "total": round(total, 3)})
        print(f"round {r + 1}: " + json.dumps(rounds[-1]), flush=True)
        print("  cpu seconds: " + json.dumps({k: round(v, 3) for k, v in cpus.items()}), flush=True)
        if prof is not None:
            for key in ("cumulative", "tottime"):
                buf = io.StringIO()
                stats = pstats.Stats(prof, stream=buf).sort_stats(key)
                stats.print_stats(args.top)
                if key == "tottime" and args.callers:
                    stats.print_callers(args.callers)
                print(buf.getvalue(), flush=True)
    print("median total", float(np.median([r["total"] for r in rounds])))
    if args.out is not None:
        args.out.write_text(json.dumps(rounds, indent=1))


if __name__ == "__main__":
    main()
