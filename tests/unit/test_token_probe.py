"""Token probes: the online code's blocks and uniform baseline exact, MDL orders a planted task above random labels,
the control task fixed per word type, and the probe's accuracy equal to scikit-learn's logistic regression on word
vectors computed by hand from the model's own hidden states."""

import math

import numpy as np
import pytest
import torch

from bertology.data.corpus import Corpus, Example
from bertology.errors import BertologyError
from bertology.experiments.ablation_table import Bootstrap
from bertology.experiments.probe_features import FeaturePass
from bertology.experiments.token_probe import (
    COLUMNS,
    TokenProbeSettings,
    _fit_predict,
    control_labels,
    full_probabilities,
    labelled_words,
    token_probes,
)
from bertology.metrics.description_length import block_ends, online_codelength, uniform_codelength
from bertology.models.loading import load_model
from bertology.testing import TINY_WORDS, UPOS_TAGS, save_tiny_bert

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


# ------------------------------------------------------------------------------------------ MDL
def test_block_ends_are_voita_and_titovs_fractions():
    assert block_ends(10_000) == [10, 20, 40, 80, 160, 320, 625, 1250, 2500, 5000, 10_000]
    assert block_ends(50) == [1, 3, 6, 12, 25, 50]  # the first blocks are empty below 1,000 examples: merged


def test_uniform_probabilities_cost_exactly_the_uniform_code():
    rng = np.random.default_rng(0)
    n, k = 10_000, 5
    x, y = rng.normal(size=(n, 3)), np.arange(n) % k  # the first block (10 examples) holds every label
    code = online_codelength(x, y, k, lambda xt, yt, xe, kk: np.full((len(xe), kk), 1.0 / kk))
    assert code["uniform_bits"] == pytest.approx(n * math.log2(5), rel=1e-12)
    assert code["bits"] == pytest.approx(code["uniform_bits"], rel=1e-12)
    assert code["compression"] == pytest.approx(1.0, rel=1e-12)
    assert uniform_codelength(7, 1) == 0.0


def test_mdl_compresses_a_planted_linear_task_and_not_random_labels():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(2000, 8))
    planted = np.argmax(x @ rng.normal(size=(8, 4)), axis=1)  # labels a linear function of the features
    shuffled = rng.permutation(planted)  # the same label counts, no relation to x
    fit = _fit_predict(TokenProbeSettings(tasks="upos"), seed=0)
    good, bad = online_codelength(x, planted, 4, fit), online_codelength(x, shuffled, 4, fit)
    assert good["compression"] > 3.0
    assert bad["compression"] < 1.05  # about the uniform code: nothing to learn (a little lost to fitting noise)
    assert good["bits"] < bad["bits"]


def test_an_unseen_label_keeps_a_pseudo_count():
    from sklearn.linear_model import LogisticRegression

    x = np.array([[0.0], [1.0], [0.1], [0.9]])
    probe = LogisticRegression().fit(x, np.array([0, 2, 0, 2]))
    p = full_probabilities(probe, x, 3, 4)
    assert np.allclose(p.sum(1), 1.0)
    assert np.allclose(p[:, 1], 1 / 7)


# ------------------------------------------------------------------------------------------ control task
def test_control_labels_fixed_per_type_and_drawn_from_the_training_distribution():
    train = ["NOUN"] * 600 + ["VERB"] * 300 + ["DET"] * 100
    types = [f"w{i}" for i in range(6000)]
    a = control_labels(types, train, seed=3)
    b = control_labels(list(reversed(types))[:50], train, seed=3)
    assert all(a[t] == b[t] for t in b)  # a type's label does not depend on the order or the other types
    share = {lab: sum(v == lab for v in a.values()) / len(a) for lab in ("NOUN", "VERB", "DET")}
    # binomial standard error at n=6000 is below 0.007: 0.03 is more than four of them
    assert share["NOUN"] == pytest.approx(0.6, abs=0.03)
    assert share["VERB"] == pytest.approx(0.3, abs=0.03)
    assert control_labels(types[:200], train, seed=4) != {t: a[t] for t in types[:200]}


# ------------------------------------------------------------------------------------------ end to end
TAG_OF = {w: UPOS_TAGS[i % len(UPOS_TAGS)] for i, w in enumerate(TINY_WORDS)}


def _tagged_corpus(n: int, seed: int) -> Corpus:
    """Sentences of the tiny vocabulary whose UPOS is a fixed function of the word (learnable)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        words = tuple(rng.choice(TINY_WORDS, size=int(rng.integers(3, 9))))
        out.append(Example(" ".join(words), words=words, upos=tuple(TAG_OF[w] for w in words)))
    return Corpus(out)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return load_model(save_tiny_bert(tmp_path_factory.mktemp("token-probe") / "m", seed=0))


def _by_hand(loaded, corpus: Corpus, layer: int) -> np.ndarray:
    """Word vectors from the model's own ``output_hidden_states``: each word tokenised alone, its pieces averaged."""
    tok, model = loaded.tokenizer, loaded.encoder
    rows = []
    for ex in corpus:
        pieces = [tok.convert_tokens_to_ids(tok.tokenize(w)) for w in ex.words]
        ids = [tok.cls_token_id] + [i for p in pieces for i in p] + [tok.sep_token_id]
        with torch.no_grad():
            hidden = model(torch.tensor([ids]), output_hidden_states=True).hidden_states[layer][0].double()
        at = 1
        for p in pieces:
            rows.append(hidden[at:at + len(p)].mean(0).numpy())
            at += len(p)
    return np.array(rows)


def test_accuracy_equals_sklearn_on_hand_computed_word_vectors(tiny):
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    train, test = _tagged_corpus(60, 0), _tagged_corpus(25, 1)
    s = TokenProbeSettings(tasks="upos", mdl=False)
    table, params = token_probes({"base": tiny}, train, test, s, features=FeaturePass(layers=(0, 2)),
                                 bootstrap=Bootstrap(n=200))
    assert list(table.columns[: len(COLUMNS)]) == COLUMNS
    for layer in (0, 2):
        y_tr = np.array([u for ex in train for u in ex.upos])
        y_te = np.array([u for ex in test for u in ex.upos])
        ref = make_pipeline(StandardScaler(), LogisticRegression(C=1.0, max_iter=200))
        ref.fit(_by_hand(tiny, train, layer), y_tr)
        expected = float((ref.predict(_by_hand(tiny, test, layer)) == y_te).mean())
        row = table[table["layer"] == layer].iloc[0]
        # float32 features against float64 ones: a word on a decision boundary may flip; the issue allows 0.02
        assert row["accuracy"] == pytest.approx(expected, abs=0.02)
        assert row["selectivity"] == pytest.approx(row["accuracy"] - row["control_accuracy"], abs=1e-12)
        assert row["accuracy_ci_low"] <= row["accuracy"] <= row["accuracy_ci_high"]
        assert row["selectivity_ci_low"] <= row["selectivity"] <= row["selectivity_ci_high"]
        assert row["n_words"] == len(y_te) and row["n_labels"] == len(set(y_tr))
    assert params["data"]["train"]["n_sentences"] == 60


def test_mdl_columns_and_the_mlp_probe(tiny):
    train, test = _tagged_corpus(40, 2), _tagged_corpus(10, 3)
    table, _ = token_probes({"base": tiny}, train, test, TokenProbeSettings(tasks="upos", classifier="mlp",
                                                                         mlp_hidden=16, max_iter=50),
                            features=FeaturePass(layers=(1,)), bootstrap=Bootstrap(n=0))
    row = table.iloc[0]
    assert row["classifier"] == "mlp"
    assert row["uniform_bits"] == pytest.approx(sum(len(ex.words) for ex in train) * math.log2(row["n_labels"]))
    assert row["compression"] == pytest.approx(row["uniform_bits"] / row["mdl_bits"])
    assert np.isnan(row["accuracy_ci_low"])  # no resamples asked: no interval, never a made-up one


def test_refusals():
    with pytest.raises(BertologyError, match="Unknown probe task"):
        TokenProbeSettings(tasks="upos,lemma")
    with pytest.raises(BertologyError, match="no sentence has word-level labels"):
        labelled_words(Corpus([Example("a b")]), ("upos",), "train")
    words = labelled_words(Corpus([Example("a b", words=("a", "b"), deprels=("nmod:poss", "root"))]), ("deprel",), "t")
    assert words.labels["deprel"] == [("nmod", "root")]
