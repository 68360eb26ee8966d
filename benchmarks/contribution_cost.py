"""Cost of each contribution measure against the weights alone, interleaved, on the built-in MiniLM (CPU).

Run: HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/contribution_cost.py [--rounds 3]
One padded batch of the 20 sentences of cls_share.py; per round every measure once, in turn; medians.
``--random-base``: a random-init BERT-base-sized model (hidden 768, 12 layers, 12 heads; MiniLM's tokenizer, nothing
downloaded) instead of MiniLM; ``--measures norm,norm_residual,rollout`` picks the measures (weights is always timed).
``--tokens T --batch B``: B random sequences of T tokens (no padding) instead of the 20 sentences. Value zeroing and
ALTI are also given against ``T x`` the weights alone (one forward with the attention captured): the issue's target.
Each timing is wall-clock and CPU time of this process (``time.process_time``; one thread, so on a machine loaded by
other jobs the CPU time is the steadier of the two). ``--zeroing-chunks 128,16``: value zeroing once per number of
zeroed tokens per re-run (``contributions.zeroing_chunk``'s ``c``), interleaved like the measures.
"""
import argparse
import statistics
import time

import torch
from transformers import AutoModel, AutoTokenizer, BertConfig, BertModel

from bertology.activations import contributions
from bertology.activations.contributions import contribution_maps
from bertology.models.loading import resolve_model

from cls_share import SENTENCES

MEASURES = ("weights", "norm", "norm_residual", "rollout", "value_zeroing", "alti")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--random-base", action="store_true")
    ap.add_argument("--measures", default=",".join(MEASURES[1:]))
    ap.add_argument("--tokens", type=int, default=0, help="random sequences of this many tokens (0: the sentences)")
    ap.add_argument("--batch", type=int, default=2, help="how many random sequences (with --tokens)")
    ap.add_argument("--zeroing-chunks", default="", help="value zeroing with these chunk sizes too (comma list)")
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
    if args.tokens:
        gen = torch.Generator().manual_seed(0)
        ids = torch.randint(1000, tok.vocab_size, (args.batch, args.tokens), generator=gen)
        ids[:, 0], ids[:, -1] = tok.cls_token_id, tok.sep_token_id
        t = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)}
    else:
        t = dict(tok(SENTENCES, return_tensors="pt", padding=True))
    chunks = [int(c) for c in args.zeroing_chunks.split(",") if c]
    measures = measures + tuple(f"value_zeroing@{c}" for c in chunks)
    b, n = t["input_ids"].shape
    per_chunk = b * n * max(model.config.num_attention_heads * n, 4 * model.config.hidden_size)
    times: dict[str, list[tuple[float, float]]] = {m: [] for m in measures}
    default_chunk = contributions.ZEROING_CHUNK
    with torch.inference_mode():
        contribution_maps(model, t, ("weights",))  # warm-up
        for _ in range(args.rounds):
            for m in measures:
                name, _, chunk = m.partition("@")
                contributions.ZEROING_CHUNK = int(chunk) * per_chunk if chunk else default_chunk
                start, cpu = time.perf_counter(), time.process_time()
                contribution_maps(model, t, (name,))
                times[m].append((time.perf_counter() - start, time.process_time() - cpu))
    contributions.ZEROING_CHUNK = default_chunk
    print(f"batch {tuple(t['input_ids'].shape)}, {args.rounds} rounds, medians (wall / CPU)")
    base = [statistics.median(x[i] for x in times["weights"]) for i in (0, 1)]
    for m in measures:
        med = [statistics.median(x[i] for x in times[m]) for i in (0, 1)]
        line = f"{m}: {med[0]:.3f} s / {med[1]:.3f} s CPU, {med[0] / base[0]:.2f}x / {med[1] / base[1]:.2f}x weights"
        if m.startswith(("value_zeroing", "alti")):
            line += f", {med[0] / (base[0] * n):.2f}x / {med[1] / (base[1] * n):.2f}x T x weights"
        print(line)
    print("rounds (wall, CPU s):", {m: [(round(w, 3), round(c, 3)) for w, c in v] for m, v in times.items()})


if __name__ == "__main__":
    main()
