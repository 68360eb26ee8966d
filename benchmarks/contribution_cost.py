"""Cost of each contribution measure against the weights alone, interleaved, on the built-in MiniLM (CPU).

Run: HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/contribution_cost.py [--rounds 3]
One padded batch of the 20 sentences of cls_share.py; per round every measure once, in turn; medians.
``--random-base``: a random-init BERT-base-sized model (hidden 768, 12 layers, 12 heads; MiniLM's tokenizer, nothing
downloaded) instead of MiniLM; ``--measures norm,norm_residual,rollout`` picks the measures (weights is always timed).
"""
import argparse
import statistics
import time

import torch
from transformers import AutoModel, AutoTokenizer, BertConfig, BertModel

from bertology.activations.contributions import contribution_maps
from bertology.models.loading import resolve_model

from cls_share import SENTENCES

MEASURES = ("weights", "norm", "norm_residual", "rollout", "value_zeroing", "alti")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--random-base", action="store_true")
    ap.add_argument("--measures", default=",".join(MEASURES[1:]))
    args = ap.parse_args()
    measures = ("weights", *[m for m in args.measures.split(",") if m != "weights"])
    path = resolve_model("minilm")[1]
    tok = AutoTokenizer.from_pretrained(path)
    if args.random_base:
        torch.manual_seed(0)
        config = BertConfig(vocab_size=tok.vocab_size, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                            intermediate_size=3072, attn_implementation="eager")
        model = BertModel(config).eval()
    else:
        model = AutoModel.from_pretrained(path, attn_implementation="eager").eval()
    t = dict(tok(SENTENCES, return_tensors="pt", padding=True))
    times: dict[str, list[float]] = {m: [] for m in measures}
    with torch.inference_mode():
        contribution_maps(model, t, ("weights",))  # warm-up
        for _ in range(args.rounds):
            for m in measures:
                start = time.perf_counter()
                contribution_maps(model, t, ("weights",) if m == "weights" else (m,))
                times[m].append(time.perf_counter() - start)
    base = statistics.median(times["weights"])
    print(f"batch {tuple(t['input_ids'].shape)}, {args.rounds} rounds, medians")
    for m in measures:
        med = statistics.median(times[m])
        print(f"{m}: {med:.3f} s, {med / base:.2f}x weights")


if __name__ == "__main__":
    main()
