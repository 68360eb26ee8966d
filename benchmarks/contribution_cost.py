"""Cost of each contribution measure against the weights alone, interleaved, on the built-in MiniLM (CPU).

Run: HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/contribution_cost.py [--rounds 3]
One padded batch of the 20 sentences of cls_share.py; per round every measure once, in turn; medians.
"""
import argparse
import statistics
import time

import torch
from transformers import AutoModel, AutoTokenizer

from bertology.activations.contributions import contribution_maps
from bertology.models.loading import resolve_model

from cls_share import SENTENCES

MEASURES = ("weights", "norm", "rollout", "value_zeroing")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    path = resolve_model("minilm")[1]
    tok, model = AutoTokenizer.from_pretrained(path), AutoModel.from_pretrained(path, attn_implementation="eager").eval()
    t = dict(tok(SENTENCES, return_tensors="pt", padding=True))
    times: dict[str, list[float]] = {m: [] for m in MEASURES}
    with torch.inference_mode():
        contribution_maps(model, t, ("weights",))  # warm-up
        for _ in range(args.rounds):
            for m in MEASURES:
                start = time.perf_counter()
                contribution_maps(model, t, ("weights",) if m == "weights" else (m,))
                times[m].append(time.perf_counter() - start)
    base = statistics.median(times["weights"])
    print(f"batch {tuple(t['input_ids'].shape)}, {args.rounds} rounds, medians")
    for m in MEASURES:
        med = statistics.median(times[m])
        print(f"{m}: {med:.3f} s, {med / base:.2f}x weights")


if __name__ == "__main__":
    main()
