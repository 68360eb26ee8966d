"""Edge probes: the arcs of a tree and the negatives drawn beside them, the pairs' feature rows, and the probe's
accuracy equal to scikit-learn's logistic regression on head and dependent vectors computed by hand."""

import numpy as np
import pytest

from bertology.data.corpus import Corpus, Example
from bertology.errors import BertologyError
from bertology.experiments.ablation_table import Bootstrap
from bertology.experiments.probe_features import FeaturePass
from bertology.experiments.edge_probe import ARC, NONE, edge_items, non_arcs, sentence_arcs
from bertology.experiments.token_probe import TokenProbeSettings, labelled_words, token_probes
from bertology.models.loading import load_model
from bertology.testing import TINY_WORDS, UPOS_TAGS, save_tiny_bert

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def test_arcs_and_non_arcs_of_a_tree():
    heads = (2, 0, 2, 3)  # w0 <- w1 (root) -> w2 -> w3
    arcs = sentence_arcs(heads)
    assert arcs == [(1, 0), (1, 2), (2, 3)]
    neg = non_arcs(4, arcs, 3, seed=0, sentence=5)
    assert len(neg) == 3 and len(set(neg)) == 3
    linked = {*arcs, *((d, h) for h, d in arcs)}
    assert all(i != j and (i, j) not in linked for i, j in neg)
    assert neg == non_arcs(4, arcs, 3, seed=0, sentence=5)  # seeded
    # 12 ordered pairs, 6 of them linked: at most 6 negatives exist
    assert len(non_arcs(4, arcs, 50, seed=0, sentence=5)) == 6


def _treebank(n: int, seed: int) -> Corpus:
    """Chains over the tiny vocabulary (each word's head is the word before it), relation = a function of the
    dependent word: learnable from the dependent's vector."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        words = tuple(rng.choice(TINY_WORDS, size=int(rng.integers(3, 8))))
        heads = tuple(range(len(words)))  # 0 (root), 1, 2, ...
        rels = tuple("root" if i == 0 else ["nsubj", "obj", "amod:x"][TINY_WORDS.index(w) % 3] for i, w in enumerate(words))
        out.append(Example(" ".join(words), words=words, heads=heads, deprels=rels,
                           upos=tuple(UPOS_TAGS[0] for _ in words)))
    return Corpus(out)


def test_edge_items_point_at_the_head_and_the_dependent():
    words = labelled_words(_treebank(5, 0), ("edge_deprel", "edge_arc"), "train")
    flat = words.flat_words()
    items = edge_items(words, "edge_deprel", seed=0)
    assert len(items.labels) == words.n_words - len(words)  # every word but the root
    for (h, d), types, label in zip(items.index, items.types, items.labels):
        assert types == flat[d] and h == d - 1  # the control keys on the dependent; each head is the word before
        assert label in {"nsubj", "obj", "amod"}  # the universal part of amod:x
    arc = edge_items(words, "edge_arc", seed=0)
    assert (arc.labels == ARC).sum() == len(items.labels) and set(arc.labels) == {ARC, NONE}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return load_model(save_tiny_bert(tmp_path_factory.mktemp("edge-probe") / "m", seed=0))


def test_accuracy_equals_sklearn_on_hand_computed_pairs(tiny):
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from tests.unit.test_token_probe import _by_hand

    train, test = _treebank(60, 0), _treebank(25, 1)
    table, _ = token_probes({"base": tiny}, train, test, TokenProbeSettings(tasks="edge_deprel,edge_arc", mdl=False),
                            features=FeaturePass(layers=(0, 2)), bootstrap=Bootstrap(n=100))
    assert set(table["unit"]) == {"word pair"}
    for task in ("edge_deprel", "edge_arc"):
        tr = edge_items(labelled_words(train, (task,), "train"), task, seed=0)
        te = edge_items(labelled_words(test, (task,), "test"), task, seed=0)
        for layer in (0, 2):
            f_tr, f_te = _by_hand(tiny, train, layer), _by_hand(tiny, test, layer)
            x_tr = np.concatenate([f_tr[tr.index[:, 0]], f_tr[tr.index[:, 1]]], axis=1)
            x_te = np.concatenate([f_te[te.index[:, 0]], f_te[te.index[:, 1]]], axis=1)
            ref = make_pipeline(StandardScaler(), LogisticRegression(C=1.0, max_iter=200)).fit(x_tr, tr.labels)
            expected = float((ref.predict(x_te) == te.labels).mean())
            row = table[(table["probe_task"] == task) & (table["layer"] == layer)].iloc[0]
            # float32 features against float64 ones: a pair on a decision boundary may flip (the token probes' 0.02)
            assert row["accuracy"] == pytest.approx(expected, abs=0.02)
            assert row["n_words"] == len(te.labels)
    arc = table[table["probe_task"] == "edge_arc"]
    assert arc["majority_rate"].between(0.4, 0.6).all()  # as many negatives as arcs


def test_edge_tasks_cannot_be_erased():
    with pytest.raises(BertologyError, match="edge tasks read a pair"):
        TokenProbeSettings(erase="edge_arc")
