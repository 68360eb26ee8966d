"""The activation-difference lens: a planted shift read back exactly, a model against itself reads zero, the head
readouts equal the heads applied by hand (numpy), and the streamed sums equal a one-shot computation."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from bertology.data.corpus import Corpus
from bertology.data.encode import encode_corpus
from bertology.experiments.activation_difference import (DifferenceSettings, accumulate, pair_batches,
                                                         run_activation_difference)
from bertology.models.pair import ModelPair
from bertology.testing import SENTENCES

pytestmark = pytest.mark.usefixtures("one_thread")
SMALL = DifferenceSettings(first=2, tokens=5, top_k=4)


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """A tiny BertForMaskedLM as the base; tuned copies (3-label classifiers on the same encoder) with a vector
    ``v0`` added to the embeddings' LayerNorm bias (every token's layer-0 state moves by v0) or ``vL`` to the last
    block's output LayerNorm bias (every token's last state moves by vL)."""
    from transformers import BertForMaskedLM, BertForSequenceClassification

    from bertology.testing import tiny_config, tiny_tokenizer

    root = tmp_path_factory.mktemp("lens")
    torch.manual_seed(0)
    base = BertForMaskedLM(tiny_config()).eval()
    base.save_pretrained(root / "base")
    tiny_tokenizer().save_pretrained(root / "base")
    g = torch.Generator().manual_seed(3)
    vectors = {"v0": torch.randn(32, generator=g), "vL": torch.randn(32, generator=g)}
    for name, path in (("v0", "bert.embeddings.LayerNorm.bias"), ("vL", "bert.encoder.layer.1.output.LayerNorm.bias")):
        torch.manual_seed(1)
        tuned = BertForSequenceClassification.from_pretrained(root / "base", num_labels=3,
                                                              attn_implementation="eager").eval()
        with torch.no_grad():
            tuned.get_parameter(path).add_(vectors[name])
        tuned.save_pretrained(root / name)
        tiny_tokenizer().save_pretrained(root / name)
    return root, {k: v.double().numpy() for k, v in vectors.items()}


def _run(root, tuned: str, settings=SMALL, batch_size: int = 4):
    pair = ModelPair.load(str(root / "base"), str(root / tuned))
    encoded = encode_corpus(Corpus.from_list(SENTENCES), pair.tokenizer, 64)
    tables, section = run_activation_difference(pair, encoded, settings, batch_size=batch_size)
    return pair, encoded, tables, section


def _hidden(model, encoded) -> list[np.ndarray]:
    """Per example, ``[layers, T, d]`` hidden states from one plain forward of the bare encoder (independent)."""
    out = []
    with torch.no_grad():
        for it in encoded.items:
            ids = torch.tensor([list(it.input_ids)])
            hs = model.base_model(input_ids=ids, output_hidden_states=True).hidden_states
            out.append(torch.stack(hs)[:, 0].double().numpy())
    return out


def test_a_shift_of_every_embedding_is_read_back_exactly_at_layer_0(planted):
    root, vectors = planted
    _, _, tables, section = _run(root, "v0")
    t = tables["activation_difference"].set_index(["layer", "position"])
    for bucket in ("content", "position_0", "first", "rest"):
        assert t.loc[(0, bucket), "norm"] == pytest.approx(np.linalg.norm(vectors["v0"]), rel=1e-5)
        # every token moved by the same v0: the mean difference is as long as the mean distance
        assert t.loc[(0, bucket), "mean_token_distance"] == pytest.approx(t.loc[(0, bucket), "norm"], rel=1e-5)
    assert section["readouts"]["classifier"].startswith("read")
    assert section["readouts"]["masked_lm"].startswith("read")


def test_the_readouts_equal_the_heads_applied_by_hand(planted):
    """Last block's output moved by vL: d_N = vL, earlier layers 0; the classifier's pooler (dense + tanh on the
    first position) and linear layer, and the MLM head's transform (dense, gelu, LayerNorm) and decoder, in numpy."""
    root, vectors = planted
    pair, encoded, tables, _ = _run(root, "vL")
    v = vectors["vL"]
    t = tables["activation_difference"].set_index(["layer", "position"])
    assert t.loc[(2, "content"), "norm"] == pytest.approx(np.linalg.norm(v), rel=1e-5)
    assert t.loc[(1, "content"), "norm"] == pytest.approx(0.0, abs=1e-6)
    base_h = _hidden(pair.base.model, encoded)
    a_cls = np.mean([h[2, 0] for h in base_h], axis=0)
    sd = {k: x.double().numpy() for k, x in pair.tuned.model.state_dict().items()}

    def classifier(x):
        pooled = np.tanh(sd["bert.pooler.dense.weight"] @ x + sd["bert.pooler.dense.bias"])
        return sd["classifier.weight"] @ pooled + sd["classifier.bias"]

    r = tables["activation_difference_readout"]
    for vector in ("content", "position_0"):  # both differences are vL: every token moved by it
        rows = r[(r.readout == "classifier") & (r.vector == vector)].sort_values("rank")
        expected = classifier(a_cls + v) - classifier(a_cls)
        assert rows["label_or_token"].tolist() == [f"LABEL_{i}" for i in np.argsort(-expected)]
        np.testing.assert_allclose(rows["score"], np.sort(expected)[::-1], rtol=1e-5, atol=1e-7)
        assert (rows["layer"] == 2).all()

    from transformers import AutoModelForMaskedLM
    mlm = {k: x.double().numpy() for k, x in AutoModelForMaskedLM.from_pretrained(root / "base").state_dict().items()}
    from scipy.special import erf

    def lm(x):
        h = mlm["cls.predictions.transform.dense.weight"] @ x + mlm["cls.predictions.transform.dense.bias"]
        h = 0.5 * h * (1 + erf(h / np.sqrt(2)))
        h = (h - h.mean()) / np.sqrt(h.var() + 1e-12)
        h = h * mlm["cls.predictions.transform.LayerNorm.weight"] + mlm["cls.predictions.transform.LayerNorm.bias"]
        return mlm["bert.embeddings.word_embeddings.weight"] @ h + mlm["cls.predictions.bias"]

    a_content = np.mean(np.concatenate([h[2][np.flatnonzero(~np.asarray(it.special))]
                                        for h, it in zip(base_h, encoded.items)]), axis=0)
    expected = lm(a_content + v) - lm(a_content)
    rows = r[(r.readout == "masked_lm") & (r.layer == 2)].sort_values("rank")
    vocab = pair.tokenizer.convert_ids_to_tokens(list(np.argsort(-expected)[:SMALL.top_k]))
    assert rows["label_or_token"].tolist() == vocab
    np.testing.assert_allclose(rows["score"], np.sort(expected)[::-1][:SMALL.top_k], rtol=1e-4, atol=1e-6)
    low = r[(r.readout == "masked_lm") & (r.layer == 1)]
    np.testing.assert_allclose(low["score"], 0.0, atol=1e-9)  # nothing moved below the last block


def test_a_model_against_itself_reads_zero_everywhere(identical_pair):
    base, tuned = identical_pair
    pair = ModelPair.load(str(base), str(tuned))
    encoded = encode_corpus(Corpus.from_list(SENTENCES), pair.tokenizer, 64)
    tables, section = run_activation_difference(pair, encoded, SMALL)
    t = tables["activation_difference"]
    assert (t["norm"] == 0).all() and (t["mean_token_distance"] == 0).all() and t["cosine_to_base_mean"].isna().all()
    assert (tables["activation_difference_tokens"]["distance"] == 0).all()
    readout = tables["activation_difference_readout"]  # an encoder against an encoder: no head to read
    assert readout["readout"].tolist() == ["classifier", "masked_lm"] and readout["score"].isna().all()
    assert readout["note"].str.startswith("not read: ").all() and readout["rank"].isna().all()
    assert "no sequence-classification head" in section["readouts"]["classifier"]
    assert "no masked-LM head" in section["readouts"]["masked_lm"]


def test_streaming_equals_a_one_shot_computation(planted):
    """Batches of 3 against all tokens at once in numpy: means, norms, cosines, distances and the top tokens."""
    root, _ = planted
    pair, encoded, tables, _ = _run(root, "v0", batch_size=3)
    base_h, tuned_h = _hidden(pair.base.model, encoded), _hidden(pair.tuned.model, encoded)
    content = [np.flatnonzero(~np.asarray(it.special)) for it in encoded.items]
    t = tables["activation_difference"].set_index(["layer", "position"])
    for layer in range(3):
        diff = np.concatenate([(tu[layer] - b[layer])[c] for b, tu, c in zip(base_h, tuned_h, content)])
        base = np.concatenate([b[layer][c] for b, c in zip(base_h, content)])
        d, m = diff.mean(0), base.mean(0)
        row = t.loc[(layer, "content")]
        assert row["norm"] == pytest.approx(np.linalg.norm(d), rel=1e-6)
        assert row["cosine_to_base_mean"] == pytest.approx(d @ m / np.linalg.norm(d) / np.linalg.norm(m), rel=1e-6)
        assert row["mean_token_distance"] == pytest.approx(np.linalg.norm(diff, axis=1).mean(), rel=1e-6)
        assert row["base_rms"] == pytest.approx(np.sqrt((base ** 2).sum(1).mean()), rel=1e-6)
        assert row["n_tokens"] == len(diff)
        rest = np.concatenate([(tu[layer] - b[layer])[c[c > SMALL.first]] for b, tu, c in zip(base_h, tuned_h, content)])
        assert t.loc[(layer, "rest"), "norm"] == pytest.approx(np.linalg.norm(rest.mean(0)), rel=1e-6)
        dist = [(np.linalg.norm(tu[layer] - b[layer], axis=1)[c], it.index, c)
                for b, tu, c, it in zip(base_h, tuned_h, content, encoded.items)]
        flat = sorted(((-x, ex, int(p)) for ds, ex, cs in dist for x, p in zip(ds, cs)))[:SMALL.tokens]
        top = tables["activation_difference_tokens"].query("layer == @layer").sort_values("rank")
        np.testing.assert_allclose(top["distance"], [-x for x, _, _ in flat], rtol=1e-6)
    # one sentence per forward, so both sides see the same float32 activations; the float64 sums then agree
    one = accumulate(pair, encoded, SMALL, batch_size=1)
    halves = [accumulate(pair, type(encoded)(part, encoded.max_length, encoded.overlong, len(part), [], []), SMALL, batch_size=1)
              for part in (encoded.items[:4], encoded.items[4:])]
    merged = halves[0].merge(halves[1])
    torch.testing.assert_close(merged.sum_diff, one.sum_diff, rtol=1e-12, atol=1e-12)
    for a, b in zip(merged.top, one.top):
        np.testing.assert_allclose(a, b, rtol=1e-12)


def test_batches_hold_every_layer_and_the_content_mask(identical_pair):
    base, tuned = identical_pair
    pair = ModelPair.load(str(base), str(tuned))
    encoded = encode_corpus(Corpus.from_list(SENTENCES), pair.tokenizer, 64)
    batches = list(pair_batches(pair, encoded, batch_size=4))
    assert all(b.base.shape[0] == 3 and b.base.dtype == torch.float64 for b in batches)
    assert sum(int(b.content.sum()) for b in batches) == sum(len(it) - int(np.sum(it.special)) for it in encoded.items)
    assert not any(bool(b.content[:, 0].any()) for b in batches)  # position 0 is [CLS]
