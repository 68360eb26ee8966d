"""A tiny study on disk: a tiny BERT base, two labelled tasks, a comparison corpus and the spec."""
from __future__ import annotations

import random
from pathlib import Path

import pandas as pd

from bertology.testing import TINY_WORDS, save_tiny_bert

FILLER = [w for w in TINY_WORDS if w not in {"good", "bad", "fun", "boring"}]


def labelled(path: Path, cue: tuple[str, str], n: int = 24, seed: int = 0) -> Path:
    """Sentences whose label is given by a cue word (``cue[0]`` -> 1, ``cue[1]`` -> 0)."""
    rng = random.Random(seed)
    rows = [{"sentence": f"the {rng.choice(FILLER)} {cue[i % 2]} {rng.choice(FILLER)} .", "label": 1 - i % 2} for i in range(n)]
    pd.DataFrame(rows).to_csv(path, sep="\t", index=False)
    return path


def tiny_study(root: Path, *, seeds=(0, 1), extra: str = "", lab: str = "epochs = 1\nbatch_size = 8\nlr = 1e-3\nmax_length = 16\n") -> Path:
    """Write base/, two tasks' data, a shared corpus and study.toml into ``root``; the spec's path."""
    root.mkdir(parents=True, exist_ok=True)
    if not (root / "base" / "config.json").exists():
        save_tiny_bert(root / "base")
    labelled(root / "a_train.tsv", ("good", "bad"))
    labelled(root / "a_dev.tsv", ("good", "bad"), n=8, seed=1)
    labelled(root / "b_train.tsv", ("fun", "boring"), seed=2)
    labelled(root / "b_dev.tsv", ("fun", "boring"), n=8, seed=3)
    labelled(root / "shared.tsv", ("good", "fun"), n=10, seed=4)
    spec = root / "study.toml"
    spec.write_text(f"""base = "base"
seeds = {list(seeds)}
out = "out"

[lab]
{lab}
[[task]]
name = "a"
type = "classification"
data = "a_train.tsv"
eval_data = "a_dev.tsv"
text_column = "sentence"
label_column = "label"

[[task]]
name = "b"
data = "b_train.tsv"
eval_data = "b_dev.tsv"
text_column = "sentence"
label_column = "label"

[compare]
data = "shared.tsv"
text_column = "sentence"
max_examples = 10
max_length = 16
analyses = ["attention_change", "representation_similarity"]
{extra}""")
    return spec
