"""Run the same small set of commands on one checkout's code and keep their run folders, to compare two checkouts.

    PYTHONPATH=src python benchmarks/reshape_tables.py OUT [--demo]          # before the reshape (one checkout)
    PYTHONPATH=../other/src python benchmarks/reshape_tables.py OUT2 [--demo]   # after (another)
    python benchmarks/reshape_tables.py --diff OUT OUT2                       # every run folder's tables, exactly

The set: a 1-task x 2-seed study on a tiny BERT (fine-tunes, compare, seed comparisons), a compare of the base
with both seeds' models (many tuned models), ``ablate`` in uniform, revert and transplant modes on one of them,
and a structural probe; ``--demo`` adds ``bertology demo`` on the packaged MiniLM (minutes). Everything is
seeded, so two runs of one checkout give identical tables; a difference between checkouts is a changed number.
The tiny model and the data are made by seeded code in ``OUT`` itself (``bertology.testing``), so a difference
in the inputs would show as a difference in every table of the study.
"""
from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from same_tables import compare_tables  # noqa: E402

WORDS = ["the", "a", "film", "movie", "plot", "was", "is", "very", "quite", "story", "actor", "scene"]


def _labelled(path: Path, cue: tuple[str, str], n: int, seed: int) -> None:
    """Sentences labelled by a cue word (``cue[0]`` -> 1), as the study tests write them."""
    rng = random.Random(seed)
    rows = [{"sentence": f"the {rng.choice(WORDS)} {cue[i % 2]} {rng.choice(WORDS)} .", "label": 1 - i % 2}
            for i in range(n)]
    pd.DataFrame(rows).to_csv(path, sep="\t", index=False)


def _conllu(path: Path, n: int, seed: int) -> None:
    """Right-branching toy trees over random words (enough for a probe's arithmetic, not its meaning)."""
    rng = random.Random(seed)
    blocks = []
    for k in range(n):
        words = [rng.choice(WORDS) for _ in range(rng.randint(4, 8))] + ["."]
        lines = [f"# sent_id = s{k}", "# text = " + " ".join(words)]
        lines += ["\t".join([str(i), w, w, "X", "_", "_", str(i - 1), "root" if i == 1 else "dep", "_", "_"])
                  for i, w in enumerate(words, 1)]
        blocks.append("\n".join(lines))
    path.write_text("\n\n".join(blocks) + "\n\n", encoding="utf-8")


def make_inputs(folder: Path) -> None:
    """The tiny base, the task's data, the comparison corpus, treebanks and the study spec."""
    from bertology.testing import save_tiny_bert

    folder.mkdir(parents=True, exist_ok=True)
    save_tiny_bert(folder / "base")
    _labelled(folder / "a_train.tsv", ("good", "bad"), 32, 0)
    _labelled(folder / "a_dev.tsv", ("good", "bad"), 12, 1)
    _labelled(folder / "shared.tsv", ("good", "bad"), 16, 4)
    _conllu(folder / "train.conllu", 24, 5)
    _conllu(folder / "test.conllu", 10, 6)
    (folder / "study.toml").write_text("""base = "base"
seeds = [0, 1]
out = "study"

[lab]
epochs = 1
batch_size = 8
lr = 1e-3
max_length = 16

[[task]]
name = "a"
type = "classification"
data = "a_train.tsv"
eval_data = "a_dev.tsv"
text_column = "sentence"
label_column = "label"

[compare]
data = "shared.tsv"
text_column = "sentence"
max_examples = 12
max_length = 16
analyses = ["attention_change", "representation_similarity"]
report = false
""", encoding="utf-8")


def commands(root: Path, demo: bool) -> list[list[str]]:
    """The commands, run in ``root`` (which holds the inputs)."""
    tuned = [f"study/finetune/a/s{s}/model" for s in (0, 1)]
    data = ["--data", "a_dev.tsv", "--text-column", "sentence", "--label-column", "label"]
    common = ["--bootstrap", "50", "--no-report"]
    cmds = [
        ["study", "study.toml"],
        ["compare", "--base", "base", "--tuned", f"a/s0={tuned[0]}", "--tuned", f"a/s1={tuned[1]}", "--data", "shared.tsv",
         "--text-column", "sentence", "--analyses", "attention_change,representation_similarity", "--max-length",
         "16", "--out", "many", "--no-report"],
        ["ablate", "--model", tuned[0], *data, "--out", "ablate-uniform", *common],
        ["ablate", "--model", tuned[0], "--mode", "revert", "--base", "base", *data, "--out", "ablate-revert", *common],
        ["ablate", "--model", tuned[0], "--mode", "transplant", "--base", "base", *data, "--out", "ablate-transplant",
         *common],
        ["probe", "--base", "base", "--tuned", tuned[0], "--train", "train.conllu", "--test", "test.conllu",
         "--rank", "4", "--epochs", "2", "--batch-size", "6", "--out", "probe", "--no-report"],
    ]
    if demo:
        cmds.append(["demo", "--out", "demo"])
    return cmds


def run_all(out: Path, demo: bool) -> int:
    """Make the inputs, run every command with this interpreter's bertology; the first failure's status."""
    make_inputs(out)
    for cmd in commands(out, demo):
        print("$ bertology", " ".join(cmd), flush=True)
        done = subprocess.run([sys.executable, "-m", "bertology", *cmd], cwd=out, env={**os.environ, "CI": "true"})
        if done.returncode != 0:
            return done.returncode
    return 0


def run_folders(root: Path) -> list[Path]:
    """Every folder under ``root`` that holds a tables/ folder, relative to ``root``."""
    return sorted(p.parent.relative_to(root) for p in root.rglob("tables") if p.is_dir())


def diff(a: Path, b: Path) -> int:
    """Compare each run folder's tables exactly; 1 on any difference or a folder only on one side."""
    folders = sorted(set(run_folders(a)) | set(run_folders(b)))
    problems = []
    for rel in folders:
        if not ((a / rel / "tables").is_dir() and (b / rel / "tables").is_dir()):
            problems.append(f"{rel}: only on one side")
            continue
        problems += [f"{rel}: {p}" for p in compare_tables(a / rel, b / rel)]
    n_tables = sum(len(list((a / rel / "tables").glob("*.parquet"))) for rel in folders if (a / rel / "tables").is_dir())
    print(f"{len(folders)} run folders, {n_tables} tables compared: "
          + ("identical" if not problems else f"{len(problems)} differences"))
    for p in problems:
        print("  " + p)
    return 1 if problems else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("other", type=Path, nargs="?")
    parser.add_argument("--demo", action="store_true", help="also run `bertology demo` (minutes)")
    parser.add_argument("--diff", action="store_true", help="compare OUT with OTHER instead of running")
    args = parser.parse_args()
    if args.diff:
        return diff(args.out, args.other)
    if args.out.exists():
        shutil.rmtree(args.out)
    return run_all(args.out, args.demo)


if __name__ == "__main__":
    raise SystemExit(main())
