"""Write 200 sentences of the demo's held-out split (seed 0, stratified) to .cache/data/heldout200.csv, for the
revert/transplant runs on the demo's fine-tune (docs/results/demo.md). Run from the repository root after make demo."""
import csv
from bertology.data.loaders import load_corpus
from bertology.demo import split_heldout
c = load_corpus(".cache/data/polarity-pang-lee.csv", text_column="text", label_column="label")
train, held = split_heldout(c, 0.2, 0)
s = held.stratified_sample(200, 0)
with open(".cache/data/heldout200.csv", "w", newline="") as fh:
    w = csv.writer(fh); w.writerow(["text", "label"]); w.writerows((ex.text, ex.label) for ex in s)
print(len(s), sorted({ex.label for ex in s}))
