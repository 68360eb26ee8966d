"""A compare's streaming pass with ``--attention-measures`` against the weights alone, interleaved (CPU).

Run: HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/measures_compare.py [--rounds 3]
The built-in MiniLM against itself on the 20 sentences of cls_share.py (one batch), the five attention analyses;
per round every setting once, in turn; the medians of the forward passes and the analyses' updates (the manifest's
``timings``: what the measures add to the pass). Also the capture alone: the measures folded into the capture's
forward (what a run does) against the capture plus ``contribution_maps``' own forward.
"""
import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from bertology.activations.contributions import contribution_maps
from bertology.activations.extract import MEASURE_PREFIX, capture_forward
from bertology.models.pair import ModelPair
from bertology.commands.compare import compare
from bertology.commands.selection import make_config

from cls_share import SENTENCES

ANALYSES = ("attention_change", "attention_patterns", "attention_targets", "head_map")
SETTINGS = ("weights", "weights,norm", "weights,rollout", "weights,norm,rollout", "weights,norm_residual", "weights,alti")


def streaming_seconds(manifest: dict) -> tuple[float, float]:
    """The forward passes (the measures' maps included) and every analysis's updates, from a run's timings."""
    timings = manifest["timings"]
    return timings["forward_s"], sum(a.get("update_s", 0.0) for a in timings["analyses"].values())


def capture_seconds(pair: ModelPair, tensors: dict, folded: bool) -> float:
    """One capture of the base with norm and rollout: folded into its forward, or from a second forward."""
    start = time.perf_counter()
    with torch.inference_mode():
        if folded:
            capture_forward(pair.base.model, tensors, frozenset({"attentions", MEASURE_PREFIX + "norm",
                                                                 MEASURE_PREFIX + "rollout"}), torch.device("cpu"))
        else:
            capture_forward(pair.base.model, tensors, frozenset({"attentions"}), torch.device("cpu"))
            contribution_maps(pair.base.model, tensors, ("norm", "rollout"))
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    pair = ModelPair.load("minilm", "minilm")
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "d.txt"
        data.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
        times: dict[str, list[tuple[float, float]]] = {s: [] for s in SETTINGS}
        for r in range(args.rounds + 1):  # round 0 warms up
            for s in SETTINGS:
                config = make_config(str(data), base="minilm", tuned="minilm", out=f"{tmp}/{r}-{s}",
                                     analyses=ANALYSES, attention_measures=s, view_examples=0, head_map_examples=20)
                run = compare(config, pair=pair, report=False)
                if r:
                    times[s].append(streaming_seconds(run.manifest))
        tensors = dict(pair.tokenizer(SENTENCES, padding=True, return_tensors="pt"))
        cap = {True: [], False: []}
        for _ in range(args.rounds + 1):
            for folded in (True, False):
                cap[folded].append(capture_seconds(pair, tensors, folded))
    total = {s: statistics.median(f + u for f, u in times[s]) for s in SETTINGS}
    print(f"{len(SENTENCES)} sentences, {args.rounds} rounds, medians")
    for s in SETTINGS:
        forward, updates = (statistics.median(x[i] for x in times[s]) for i in (0, 1))
        print(f"{s}: forward {forward:.3f} s, updates {updates:.3f} s, pass {total[s]:.3f} s, "
              f"{total[s] / total['weights']:.2f}x weights")
    folded, apart = statistics.median(cap[True][1:]), statistics.median(cap[False][1:])
    print(f"capture with norm,rollout: folded {folded:.3f} s, with a second forward {apart:.3f} s")


if __name__ == "__main__":
    main()
