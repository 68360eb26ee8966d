"""The two analyses on tiny models: planted signal, identity, streaming == one-shot, merge."""
import numpy as np
import pandas as pd
import pytest

from bertology.activations.extract import run_analyses
from bertology.analyses.attention_change import AttentionChange, layer_summary
from bertology.analyses.representation_similarity import RepresentationSimilarity, same_layer, token_keys
from bertology.data.corpus import Corpus
from bertology.data.encode import EncodedCorpus, encode_corpus
from bertology.metrics.attention import js_divergence
from bertology.metrics.similarity import debiased_cka, linear_cka, rsa
from bertology.models.pair import ModelPair
from bertology.testing import SENTENCES


def _run(pair, analyses, corpus=None, batch_size=4):
    enc = encode_corpus(corpus or Corpus.from_list(SENTENCES), pair.tokenizer)
    run_analyses(pair, enc, analyses, batch_size=batch_size)
    return [a.compute().table for a in analyses]


def test_planted_head_ranks_first_and_others_do_not_move(planted_pair):
    pair = ModelPair.load(*map(str, planted_pair))
    (table,) = _run(pair, [AttentionChange(pair.num_layers, pair.num_heads)])
    ranked = table.sort_values("cosine")
    assert (ranked.iloc[0]["layer"], ranked.iloc[0]["head"]) == (2, 1)
    assert ranked.iloc[0].cosine < 0.8
    others = table[~((table.layer == 2) & (table["head"] == 1))]
    assert np.allclose(others.cosine, 1.0, atol=1e-6)
    assert np.allclose(others.js_divergence, 0.0, atol=1e-9)
    assert table.loc[(table.layer == 2) & (table["head"] == 1), "js_divergence"].item() > 0.05
    assert set(table.columns) >= {"layer", "head", "cosine", "js_divergence", "n_examples"}
    assert (table.n_examples == len(SENTENCES)).all()
    assert layer_summary(table).set_index("layer").loc[2, "cosine_min"] == pytest.approx(ranked.iloc[0].cosine)


def test_attention_change_equals_a_per_sentence_computation(planted_pair):
    """Batched + padded + cropped == one sentence at a time with no padding at all."""
    import torch

    pair = ModelPair.load(*map(str, planted_pair))
    (table,) = _run(pair, [AttentionChange(pair.num_layers, pair.num_heads)], batch_size=3)
    cos = np.zeros((2, 4))
    js = np.zeros((2, 4))
    for s in SENTENCES:
        enc = pair.tokenizer(s, return_tensors="pt")
        with torch.inference_mode():
            a = pair.base.model(**enc, output_attentions=True).attentions
            b = pair.tuned.model(**enc, output_attentions=True).attentions
        for layer in range(2):
            for h in range(4):
                u, v = a[layer][0, h].double(), b[layer][0, h].double()
                cos[layer, h] += float((u * v).sum() / u.norm() / v.norm())
                js[layer, h] += float(js_divergence(u, v).mean())
    table = table.sort_values(["layer", "head"])
    assert np.allclose(table.cosine.to_numpy(), (cos / len(SENTENCES)).ravel(), atol=1e-6)
    assert np.allclose(table.js_divergence.to_numpy(), (js / len(SENTENCES)).ravel(), atol=1e-6)


def test_padded_mode_counts_padding_rows(planted_pair):
    pair = ModelPair.load(*map(str, planted_pair))
    cropped, padded = _run(pair, [AttentionChange(2, 4), AttentionChange(2, 4, mode="padded", pad_length=40)])
    assert (padded["mode"] == "padded").all()
    a = cropped.set_index(["layer", "head"]).cosine
    b = padded.set_index(["layer", "head"]).cosine
    assert abs(a.loc[(2, 1)] - b.loc[(2, 1)]) > 1e-4  # padding query rows change the number
    assert np.allclose(b.drop((2, 1)), 1.0, atol=1e-6)


def test_identical_models_give_cka_and_rsa_one_and_cosine_one(identical_pair):
    pair = ModelPair.load(*map(str, identical_pair))
    att, rep = _run(pair, [AttentionChange(2, 4), RepresentationSimilarity(2, n_tokens=50)])
    assert np.allclose(att.cosine, 1.0) and np.allclose(att.js_divergence, 0.0)
    diag = same_layer(rep)
    assert set(diag.metric) == {"rsa_pearson", "rsa_spearman", "cka_linear", "cka_debiased"}
    assert np.allclose(diag.value, 1.0, atol=1e-9)
    assert len(rep) == 3 * 3 * 4


def test_representation_similarity_matches_direct_computation(planted_pair):
    pair = ModelPair.load(*map(str, planted_pair))
    analysis = RepresentationSimilarity(2, n_tokens=30, seed=3)
    (table,) = _run(pair, [analysis])
    _, base, tuned = analysis.token_sample()
    x, y = base[1].astype(float), tuned[2].astype(float)
    row = table[(table.layer_base == 1) & (table.layer_tuned == 2)].set_index("metric").value
    assert row["cka_linear"] == pytest.approx(linear_cka(x, y))
    assert row["cka_debiased"] == pytest.approx(debiased_cka(x, y))
    assert row["rsa_pearson"] == pytest.approx(rsa(x, y, "pearson"))
    assert row["rsa_spearman"] == pytest.approx(rsa(x, y, "spearman"))
    assert (table.n_tokens == 30).all()


def test_token_sample_is_the_bottom_k_of_all_content_tokens_whatever_the_batching(planted_pair):
    pair = ModelPair.load(*map(str, planted_pair))
    enc = encode_corpus(Corpus.from_list(SENTENCES), pair.tokenizer)
    expected = []
    for it in enc.items:
        pos = np.nonzero(~it.special)[0]
        keys = token_keys(7, np.full(len(pos), it.index), pos)
        expected += [(int(k), it.index, int(p)) for k, p in zip(keys, pos)]
    expected = sorted(expected)[:25]
    samples = []
    for bs in (1, 4, 10):
        a = RepresentationSimilarity(2, n_tokens=25, seed=7)
        run_analyses(pair, enc, [a], batch_size=bs)
        ids, base, _ = a.token_sample()
        samples.append(base)
        assert [(i, p) for _, i, p in expected] == [tuple(r) for r in ids]
    for base in samples[1:]:
        for l in range(3):
            np.testing.assert_allclose(base[l], samples[0][l], atol=1e-5)


def test_merge_of_shards_equals_the_whole_corpus(planted_pair):
    pair = ModelPair.load(*map(str, planted_pair))
    enc = encode_corpus(Corpus.from_list(SENTENCES), pair.tokenizer)
    half = len(enc.items) // 2
    shards = [EncodedCorpus(enc.items[:half], 128, "skip", half), EncodedCorpus(enc.items[half:], 128, "skip", len(enc.items) - half)]

    def fresh():
        return [AttentionChange(2, 4), RepresentationSimilarity(2, n_tokens=20, seed=1)]

    whole = fresh()
    run_analyses(pair, enc, whole, batch_size=4)
    parts = [fresh(), fresh()]
    for shard, analyses in zip(shards, parts):
        run_analyses(pair, shard, analyses, batch_size=3)
    merged = [a.merge(b) for a, b in zip(*parts)]
    for w, m in zip(whole, merged):
        pd.testing.assert_frame_equal(w.compute().table, m.compute().table, atol=1e-6)
    with pytest.raises(ValueError):
        AttentionChange(2, 4).merge(AttentionChange(2, 4, mode="padded"))
