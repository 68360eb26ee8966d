"""Geometry's per-batch ``update`` at BERT-base size, two implementations alternately (issue 18).

The forward passes run once: both random-init BERT-base encoders (``scale_gpu.save_bert``, seeds 0 and
1, the packaged MiniLM tokenizer) capture the hidden states of ``--n`` SST-2 sentences in bertology's
length buckets, and the batches are kept in memory. Then each implementation's ``Geometry`` streams
the same batches, alternately for ``--rounds`` rounds, only ``update`` inside the clock; its
``compute()`` tables are compared at the end (largest difference per column, and whether they are
identical). ``--old FILE`` is the other implementation's ``geometry.py`` (e.g. from ``git show``)::

    git show <commit>:src/bertology/analyses/geometry.py > /tmp/geometry_old.py
    PYTHONPATH=src python benchmarks/geometry_update.py --data SST-2/dev.tsv --n 500 --old /tmp/geometry_old.py
"""
from __future__ import annotations

import argparse
import atexit
import importlib.util
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scale_gpu import SIZES, read_sentences, save_bert  # noqa: E402


def load_module(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def stream(geometry_cls, batches, num_layers: int, tokenizer) -> tuple[float, object]:
    geo = geometry_cls(num_layers, tokenizer=tokenizer)
    t0 = time.perf_counter()
    for batch in batches:
        geo.update(batch)
    return time.perf_counter() - t0, geo


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--n", type=int, default=500)
    ap.add_argument("--size", choices=sorted(SIZES), default="base")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--old", type=Path, required=True, help="The other implementation's geometry.py.")
    args = ap.parse_args()

    from bertology.activations.extract import iter_pair_batches
    from bertology.analyses.geometry import Geometry
    from bertology.data.corpus import Corpus
    from bertology.data.encode import encode_corpus
    from bertology.models.loading import builtin_model_path, load_model
    from bertology.models.pair import ModelPair

    old = load_module(args.old, "geometry_old").Geometry
    tmp = Path(tempfile.mkdtemp())
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)  # the saved models and runs are GBs
    paths = [save_bert(tmp / name, builtin_model_path("minilm"), seed, args.size) for seed, name in enumerate(("base", "tuned"))]
    pair = ModelPair(*(load_model(p) for p in paths))
    encoded = encode_corpus(Corpus.from_list(read_sentences(args.data, args.n)), pair.tokenizer, max_length=128, overlong="skip")
    torch.set_grad_enabled(False)
    batches = list(iter_pair_batches(pair, encoded, batch_size=32, requires=frozenset({"hidden_states"})))
    print(f"{len(encoded.items)} sentences, {sum(len(i.input_ids) for i in encoded.items)} tokens, "
          f"{len(batches)} batches, torch threads {torch.get_num_threads()}")
    times: dict[str, list[float]] = {"old": [], "new": []}
    done = {}
    for r in range(args.rounds):
        for name, cls in ((("old", old), ("new", Geometry)) if r % 2 == 0 else (("new", Geometry), ("old", old))):
            dt, done[name] = stream(cls, batches, pair.num_layers, pair.tokenizer)
            times[name].append(dt)
            print(f"round {r + 1} {name}: update {dt:.2f} s", flush=True)
    med = {k: float(np.median(v)) for k, v in times.items()}
    low = {k: float(np.min(v)) for k, v in times.items()}
    print(f"median update: old {med['old']:.2f} s, new {med['new']:.2f} s, new/old {med['new'] / med['old']:.3f}; "
          f"fastest: old {low['old']:.2f} s, new {low['new']:.2f} s, new/old {low['new'] / low['old']:.3f}")
    a, b = done["old"].compute().table, done["new"].compute().table
    same_rows = a.drop(columns="value").equals(b.drop(columns="value"))
    diff = float(np.nanmax(np.abs(a["value"].to_numpy() - b["value"].to_numpy())))
    print(f"geometry tables: same rows {same_rows}; identical values {a.equals(b)}; largest |difference| {diff:.3g}")
    wa, wb = done["old"].word_table().table, done["new"].word_table().table
    print(f"word tables: identical {wa.equals(wb)}; words {len(wa)} / {len(wb)}")


if __name__ == "__main__":
    main()
