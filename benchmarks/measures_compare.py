"""A compare's streaming pass with ``--attention-measures`` against the weights alone, interleaved (CPU).

Run: HF_HUB_OFFLINE=1 OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/measures_compare.py [--rounds 3]
The built-in MiniLM against itself on the 20 sentences of cls_share.py (one batch), the five attention analyses;
per round every setting once, in turn; the medians of the forward passes and the analyses' updates (the manifest's
``timings``: what the measures add to the pass). Also the capture alone: the measures folded into the capture's
forward (what a run does) against the capture plus ``contribution_maps``' own forward.
``--random-base --tokens T --n N``: a random-init BERT-base-sized model (hidden 768, 12 layers, 12 heads, MiniLM's
tokenizer; saved to a temporary folder, nothing downloaded) against itself on N sentences of about T tokens (the
20 sentences joined), without the capture comparison; ``--settings`` picks the measure lists (``;``-separated).
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


def random_base(folder: Path) -> str:
    """A random-init BERT-base-sized model with MiniLM's tokenizer, saved in ``folder`` (its path)."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    from bertology.models.loading import resolve_model

    tok = AutoTokenizer.from_pretrained(resolve_model("minilm")[1])
    torch.manual_seed(0)
    config = BertConfig(vocab_size=tok.vocab_size, hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                        intermediate_size=3072, attn_implementation="eager")
    BertModel(config).eval().save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


def long_sentences(n: int, tokens: int) -> list[str]:
    """``n`` texts of about ``tokens`` word pieces: the 20 sentences joined in turn (each about 11 pieces)."""
    words = " ".join(SENTENCES * 40).split()
    per = max(1, int(tokens * 0.8))  # about 1.2 pieces a word
    return [" ".join(words[i * 7:i * 7 + per]) for i in range(n)]


def report(times: dict[str, list[tuple[float, float, float]]], settings: tuple[str, ...], rounds: int) -> None:
    """Each setting's medians (forward passes, updates, the whole pass: wall; the whole compare: CPU time of this
    process, the steadier on a loaded machine) and each against weights alone."""
    total = {s: statistics.median(f + u for f, u, _ in times[s]) for s in settings}
    cpu = {s: statistics.median(c for *_, c in times[s]) for s in settings}
    print(f"{rounds} rounds, medians")
    for s in settings:
        forward, updates = (statistics.median(x[i] for x in times[s]) for i in (0, 1))
        print(f"{s}: forward {forward:.3f} s, updates {updates:.3f} s, pass {total[s]:.3f} s, "
              f"{total[s] / total['weights']:.2f}x weights; compare CPU {cpu[s]:.3f} s, {cpu[s] / cpu['weights']:.2f}x")
    print("rounds (forward, updates, compare CPU):", {s: [tuple(round(x, 3) for x in r) for r in v]
                                                       for s, v in times.items()})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--random-base", action="store_true")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--settings", default=";".join(SETTINGS))
    args = ap.parse_args()
    settings = tuple(args.settings.split(";"))
    with tempfile.TemporaryDirectory() as tmp:
        model = random_base(Path(tmp) / "base") if args.random_base else "minilm"
        pair = ModelPair.load(model, model)
        sentences = long_sentences(args.n, args.tokens) if args.random_base else SENTENCES
        data = Path(tmp) / "d.txt"
        data.write_text("\n".join(sentences) + "\n", encoding="utf-8")
        lengths = [len(pair.tokenizer(s)["input_ids"]) for s in sentences]
        print(f"{len(sentences)} texts of {min(lengths)}-{max(lengths)} tokens, model {model}")
        times: dict[str, list[tuple[float, float]]] = {s: [] for s in settings}
        for r in range(args.rounds + 1):  # round 0 warms up
            for s in settings:
                config = make_config(str(data), base=model, tuned=model, out=f"{tmp}/{r}-{s}", analyses=ANALYSES,
                                     attention_measures=s, view_examples=0, head_map_examples=len(sentences),
                                     max_length=max(lengths) + 2)
                cpu = time.process_time()
                run = compare(config, pair=pair, report=False)
                if r:
                    times[s].append((*streaming_seconds(run.manifest), time.process_time() - cpu))
        if args.random_base:
            report(times, settings, args.rounds)
            return
        tensors = dict(pair.tokenizer(SENTENCES, padding=True, return_tensors="pt"))
        cap = {True: [], False: []}
        for _ in range(args.rounds + 1):
            for folded in (True, False):
                cap[folded].append(capture_seconds(pair, tensors, folded))
    report(times, settings, args.rounds)
    folded, apart = statistics.median(cap[True][1:]), statistics.median(cap[False][1:])
    print(f"capture with norm,rollout: folded {folded:.3f} s, with a second forward {apart:.3f} s")


if __name__ == "__main__":
    main()
