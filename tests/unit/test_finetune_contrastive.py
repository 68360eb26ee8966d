"""Contrastive (SimCSE) fine-tuning: losses against slow loops, anisotropy and STS against direct
computations, unsupervised and supervised runs on tiny models."""
from __future__ import annotations

import math
import os
import random

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import pandas as pd
import pytest
import torch
from scipy.stats import spearmanr

from bertology.config import FinetuneConfig
from bertology.data.corpus import Corpus
from bertology.errors import BertologyError
from bertology.models.loading import load_model
from bertology.testing import TINY_WORDS, save_tiny_bert
from bertology.training.contrastive import (
    _encode_sentences, _Encoder, anisotropy_per_layer, nli_triplets, pool, sample_token_pairs, simcse_loss,
    supervised_simcse_loss,
)
from bertology.training.finetune import finetune


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _cos(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_simcse_loss_equals_a_slow_reference():
    g = torch.Generator().manual_seed(0)
    z1, z2 = torch.randn(5, 7, generator=g, dtype=torch.float64), torch.randn(5, 7, generator=g, dtype=torch.float64)
    t = 0.05
    total = 0.0
    for i in range(5):
        num = math.exp(_cos(z1[i].numpy(), z2[i].numpy()) / t)
        den = sum(math.exp(_cos(z1[i].numpy(), z2[j].numpy()) / t) for j in range(5))
        total += -math.log(num / den)
    assert float(simcse_loss(z1, z2, t)) == pytest.approx(total / 5, rel=1e-10)
    # identical views of orthogonal sentences: the positive dominates, the loss is ~0
    eye = torch.eye(4, dtype=torch.float64)
    assert float(simcse_loss(eye, eye, t)) < 1e-6


def test_supervised_loss_with_hard_negatives_equals_a_slow_reference():
    g = torch.Generator().manual_seed(1)
    h, hp, hn = (torch.randn(4, 6, generator=g, dtype=torch.float64) for _ in range(3))
    t = 0.05
    total = 0.0
    for i in range(4):
        num = math.exp(_cos(h[i], hp[i]) / t)
        den = sum(math.exp(_cos(h[i], hp[j]) / t) + math.exp(_cos(h[i], hn[j]) / t) for j in range(4))
        total += -math.log(num / den)
    assert float(supervised_simcse_loss(h, hp, hn, t)) == pytest.approx(total / 4, rel=1e-10)
    # a hard negative as close as the positive costs log(2) at least; a far one costs less
    eye = torch.eye(4, dtype=torch.float64)
    assert float(supervised_simcse_loss(eye, eye, eye, t)) == pytest.approx(math.log(2), abs=1e-6)
    assert float(supervised_simcse_loss(eye, eye, -eye, t)) < 1e-6


def test_pooling():
    hidden = torch.arange(2 * 3 * 2, dtype=torch.float32).reshape(2, 3, 2)
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    assert torch.equal(pool(hidden, mask, "cls"), hidden[:, 0])
    assert torch.allclose(pool(hidden, mask, "mean")[0], hidden[0, :2].mean(0))
    assert torch.allclose(pool(hidden, mask, "mean")[1], hidden[1].mean(0))


def test_token_pairs_come_from_different_sentences_and_anisotropy_matches_a_direct_computation(tmp_path):
    loaded = load_model(save_tiny_bert(tmp_path / "m"))
    texts = ["the cat sat on the mat", "a dog ran fast", "john read a big book", "mary saw the red house"]
    enc = _encode_sentences(texts, loaded.tokenizer, 32)
    pairs = sample_token_pairs(enc, 300, seed=0)
    assert (pairs[:, 0] != pairs[:, 2]).all()
    for item, tok in np.concatenate([pairs[:, :2], pairs[:, 2:]]):
        assert not enc.items[item].special[tok]
    rows = anisotropy_per_layer(loaded.model, _Encoder(0, True, torch.device("cpu"), "cls"), enc, pairs, batch_size=2)
    assert [r["layer"] for r in rows] == [0, 1, 2]
    # direct: each sentence alone, hidden states, mean cosine over the pairs
    states = []
    for text in texts:
        with torch.inference_mode():
            out = loaded.model(**loaded.tokenizer(text, return_tensors="pt"), output_hidden_states=True)
        states.append([h[0].numpy().astype(np.float64) for h in out.hidden_states])
    for layer in range(3):
        direct = np.mean([_cos(states[a][layer][ta], states[b][layer][tb]) for a, ta, b, tb in pairs])
        assert rows[layer]["value"] == pytest.approx(direct, abs=1e-5)
        assert rows[layer]["n"] == 300


def _sentences(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.sample(TINY_WORDS, 4)) for _ in range(n)]


def test_unsupervised_simcse_saves_an_encoder_with_anisotropy_and_sts(tmp_path):
    base = save_tiny_bert(tmp_path / "m", hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1)
    train = Corpus.from_list(_sentences(32))
    a, b = _sentences(12, seed=1), _sentences(12, seed=2)
    sts = tmp_path / "sts.tsv"
    # near-copies (two words swapped) score high, unrelated sentences low; no two cosines tie
    near = [" ".join([x.split()[1], x.split()[0], *x.split()[2:]]) for x in a]
    pd.DataFrame({"sentence1": a, "sentence2": [n if i % 3 == 0 else y for i, (n, y) in enumerate(zip(near, b))],
                  "score": [5.0 if i % 3 == 0 else float(i % 5) for i in range(12)]}).to_csv(sts, sep="\t", index=False)
    cfg = FinetuneConfig(model=str(base), out=str(tmp_path / "run"), objective="contrastive", contrastive="unsupervised",
                         epochs=2, batch_size=8, learning_rate=1e-3, warmup_ratio=0.0, sts_data=str(sts),
                         anisotropy_sentences=20, anisotropy_pairs=200, pooling="mean")
    result = finetune(cfg, train)
    assert result.details["objective"] == "contrastive" and result.details["steps"] == 8
    assert result.details["training_objective"] == ("contrastive (SimCSE InfoNCE, unsupervised: in-batch negatives, "
                                                    "temperature 0.05)")
    reloaded = load_model(result.model_dir)
    assert not reloaded.is_classifier and not any(k.startswith("classifier") for k in reloaded.model.state_dict())
    assert (result.model_dir / "sentence_pooling.json").exists()

    an = result.extra_tables["anisotropy"]
    assert list(an.columns) == ["model", "layer", "metric", "value", "n"]
    assert set(an["model"]) == {"base", "tuned"} and sorted(set(an["layer"])) == [0, 1, 2]
    base_rows = an.query("model == 'base'")["value"].to_numpy()
    assert not np.allclose(base_rows, an.query("model == 'tuned'")["value"].to_numpy())

    table = result.table
    losses = table.query("split == 'train' and metric == 'loss'")["value"]
    assert len(losses) > 0 and (losses > 0).all()
    rho = table.query("split == 'sts' and metric == 'spearman'").set_index("step")["value"]
    assert list(rho.index) == [0, 4, 8]
    # the final Spearman is what the saved encoder gives, computed independently
    m, tok = reloaded.model, reloaded.tokenizer
    def embed(texts):
        with torch.inference_mode():
            enc = tok(texts, padding=True, return_tensors="pt")
            h = m(**enc).last_hidden_state
            mask = enc["attention_mask"].unsqueeze(-1).float()
            return ((h * mask).sum(1) / mask.sum(1)).numpy().astype(np.float64)
    s = pd.read_csv(sts, sep="\t")
    e1, e2 = embed(list(s.sentence1)), embed(list(s.sentence2))
    cos = (e1 * e2).sum(1) / (np.linalg.norm(e1, axis=1) * np.linalg.norm(e2, axis=1))
    assert rho[8] == pytest.approx(spearmanr(cos, s.score).statistic, abs=1e-6)
    assert result.metrics["spearman"] == pytest.approx(rho[8])


def test_supervised_simcse_builds_triplets_and_trains(tmp_path):
    rows = []
    for i, premise in enumerate(_sentences(10, seed=3)):
        rows.append((premise, premise.split()[0] + " is good", "entailment"))
        rows.append((premise, "a dog ran", "neutral"))
        if i % 5:
            rows.append((premise, "no one " + premise.split()[-1], "contradiction"))
    corpus = Corpus.from_list([r[0] for r in rows], pairs=[r[1] for r in rows], labels=[r[2] for r in rows])
    triplets, info = nli_triplets(corpus, "entailment", "contradiction", seed=0)
    assert info == {"n_triplets": 8, "n_positive_pairs_without_negative": 2, "n_premises": 10}
    assert all(n.startswith("no one") and p.endswith("is good") for _, p, n in triplets)

    base = save_tiny_bert(tmp_path / "m", hidden_dropout_prob=0.1)
    cfg = FinetuneConfig(model=str(base), out=str(tmp_path / "run"), objective="contrastive", contrastive="supervised",
                         epochs=1, batch_size=4, learning_rate=1e-3, anisotropy_sentences=0)
    result = finetune(cfg, corpus)
    assert result.n_train == 8 and result.details["steps"] == 2
    assert result.details["in_batch_negatives"] == 7
    assert "anisotropy" not in result.extra_tables
    with pytest.raises(BertologyError, match="no 'contradiction'"):
        nli_triplets(Corpus.from_list(["a"], pairs=["b"], labels=["entailment"]), "entailment", "contradiction", 0)
    scores = [f"{k / 10:.1f}" for k in range(60)]  # an STS-style file: 60 distinct scores, 10 of them named
    with pytest.raises(BertologyError, match=r"labels: '0\.0', '0\.1', .*'0\.9', and 50 more\)") as err:
        nli_triplets(Corpus.from_list(["a"] * 60, pairs=["b"] * 60, labels=scores), "entailment", "contradiction", 0)
    assert "'1.0'" not in str(err.value)
    with pytest.raises(BertologyError, match="sentence pairs"):
        finetune(cfg, Corpus.from_list(["a b", "c d"]))
