"""The crosscoder on MiniLM: a planted embedding direction against the model itself, with the cost.

    BERTOLOGY_CACHE=... HF_HUB_OFFLINE=1 OMP_NUM_THREADS=2 PYTHONPATH=src .venv/bin/python benchmarks/crosscoder.py \
        [--data ../shared/data/glue/SST-2/dev.tsv] [--scale 4] [--tokens 20000] [--steps 400] [--latents 512] \
        [--model minilm|bert-base-random] [--pairs planted,self]

The planted copy adds one random unit direction, times ``scale`` times the mean norm of an embedding row, to the
input embeddings of eight frequent review words; the crosscoder (the experiment's defaults unless given) then runs
on MiniLM vs the planted copy and MiniLM vs itself, on the SST-2 dev sentences. Prints, per layer, the latents by
kind, how many tuned-only ones Latent Scaling confirms, the fit, the highest relative norms with their top tokens,
and the seconds spent training and reading out; the numbers go to benchmarks/results/crosscoder.json.

``--model bert-base-random`` measures the cost at BERT-base size instead: a randomly initialised BERT-base
(12 layers, hidden 768, 12 heads, MiniLM's bert-base-uncased vocabulary; seed 0) as the base, the planted copy of
it as the tuned model (results in ``crosscoder-bert-base.json`` unless ``--out``). A random model has no features to
find: only its seconds mean something.
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import tempfile
import time
from pathlib import Path

WORDS = ("movie", "film", "story", "characters", "director", "actors", "plot", "script")


def random_bert_base(folder: Path) -> Path:
    """A randomly initialised BERT-base-sized encoder (seed 0) with MiniLM's tokenizer, saved to ``folder``."""
    import torch
    from transformers import BertConfig, BertModel

    from bertology.models.loading import load_model

    tokenizer = load_model("minilm").tokenizer
    torch.manual_seed(0)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                        intermediate_size=3072, attn_implementation="eager")
    BertModel(config).eval().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def planted_copy(folder: Path, scale: float, seed: int = 5, source: str = "minilm") -> Path:
    """``source`` with ``scale * mean row norm`` times one random unit direction added to the embeddings of WORDS."""
    import torch

    from bertology.models.loading import load_model

    loaded = load_model(source)
    emb = loaded.model.embeddings.word_embeddings.weight
    direction = torch.randn(emb.shape[1], generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        emb[loaded.tokenizer.convert_tokens_to_ids(list(WORDS))] += scale * emb.norm(dim=1).mean() * direction / direction.norm()
    loaded.model.save_pretrained(folder)
    loaded.tokenizer.save_pretrained(folder)
    return folder


def one(base: str, tuned: str, texts: list[str], settings) -> dict:
    from bertology.data.corpus import Corpus
    from bertology.data.encode import encode_corpus
    from bertology.experiments.crosscoder import run_crosscoder
    from bertology.models.pair import ModelPair

    pair = ModelPair.load(base, tuned)
    encoded = encode_corpus(Corpus.from_list(texts), pair.tokenizer, 128)
    t0 = time.perf_counter()
    tables, section = run_crosscoder(pair, encoded, settings, seed=0)
    latents, examples = tables["crosscoder_latents"], tables["crosscoder_examples"]
    top = []
    for r in latents.sort_values("relative_norm", ascending=False).groupby("layer").head(3).itertuples():
        tokens = examples[(examples.layer == r.layer) & (examples.latent == r.latent)]["token"].tolist()
        top.append({"layer": int(r.layer), "latent": int(r.latent), "relative_norm": round(float(r.relative_norm), 3),
                    "kind": r.kind, "verified": None if r.tuned_only_verified is None or str(r.tuned_only_verified) == "<NA>"
                    else bool(r.tuned_only_verified), "tokens": tokens,
                    "planted_share": (sum(t in WORDS for t in tokens) / len(tokens)) if tokens else None})
    return {"seconds": time.perf_counter() - t0, "seconds_training": section["training"]["seconds"],
            "seconds_readout": section["seconds_readout"], "tokens": section["training"]["n_tokens_sampled"],
            "fit": section["fit"], "kinds": section["kinds"], "top": top}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", type=Path, default=Path("../shared/data/glue/SST-2/dev.tsv"))
    parser.add_argument("--scale", type=float, default=4.0)
    for name in ("tokens", "steps", "latents", "k"):
        parser.add_argument(f"--{name}", type=int, default=None)
    parser.add_argument("--model", choices=("minilm", "bert-base-random"), default="minilm")
    parser.add_argument("--pairs", default="planted,self", help="which pairs to run: planted, self or both")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    out_path = args.out or Path("benchmarks/results/" + ("crosscoder.json" if args.model == "minilm"
                                                         else "crosscoder-bert-base.json"))
    pairs = [p.strip() for p in args.pairs.split(",") if p.strip()]

    from bertology.experiments.crosscoder import CrosscoderSettings

    settings = dataclasses.replace(CrosscoderSettings(), **{k: getattr(args, k) for k in ("tokens", "steps", "latents", "k")
                                                             if getattr(args, k) is not None})
    with args.data.open(encoding="utf-8") as f:
        texts = [row[0] for row in csv.reader(f, delimiter="\t")][1:]
    out = {"settings": settings.to_dict(), "scale": args.scale, "words": WORDS, "n_sentences": len(texts),
           "model": args.model}
    with tempfile.TemporaryDirectory() as tmp:
        base = "minilm" if args.model == "minilm" else str(random_bert_base(Path(tmp) / "base"))
        if "planted" in pairs:
            tuned = planted_copy(Path(tmp) / "planted", args.scale, source=base)
            out["planted"] = one(base, str(tuned), texts, settings)
        if "self" in pairs:
            out["self"] = one(base, base, texts, settings)
    for name in pairs:
        r = out[name]
        print(f"{name}: {r['seconds']:.0f} s ({r['seconds_training']:.0f} s training, {r['seconds_readout']:.0f} s "
              f"reading out, {r['tokens']} tokens); kinds {r['kinds']}")
        for layer, fit in r["fit"].items():
            print(f"  L{layer}: FVE base {fit['fve_base']:.3f} tuned {fit['fve_tuned']:.3f}, dead {fit['dead_share']:.1%}")
        for t in r["top"]:
            print(f"  L{t['layer']} latent {t['latent']}: relative norm {t['relative_norm']} {t['kind']} "
                  f"verified={t['verified']} planted share={t['planted_share']} {t['tokens'][:8]}")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(out, indent=1, default=str), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
