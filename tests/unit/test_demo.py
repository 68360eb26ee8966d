"""The demo compares on a label-balanced sample of the held-out split (Corpus.stratified_sample), in corpus order."""
from collections import Counter

from bertology.data.corpus import Corpus
from bertology.demo import split_heldout


def test_stratified_sample_is_balanced_ordered_and_seeded():
    # like the polarity file: every positive sentence first, then every negative one
    corpus = Corpus.from_list([f"s{i}" for i in range(200)], labels=["1"] * 100 + ["-1"] * 100)
    _, held = split_heldout(corpus, 0.5, seed=0)
    assert Counter(ex.label for ex in list(held)[:40]) == {"1": 40}  # what head(40) would have compared
    sample = held.stratified_sample(40, seed=0)
    assert Counter(ex.label for ex in sample) == {"1": 20, "-1": 20}
    texts = [ex.text for ex in sample]
    order = {ex.text: i for i, ex in enumerate(held)}
    assert [order[t] for t in texts] == sorted(order[t] for t in texts)
    assert [ex.text for ex in held.stratified_sample(40, seed=0)] == texts
    assert len(held.stratified_sample(1000, seed=0)) == len(held)
