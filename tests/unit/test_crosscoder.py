"""The crosscoder: Latent Scaling against a hand least-squares fit, kinds and verdicts on constructed activations,
the streamed buffer (content tokens only, bounded, every token once per pass), determinism for a seed."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from bertology.data.corpus import Corpus
from bertology.data.encode import encode_corpus
from bertology.experiments.crosscoder import CrosscoderSettings, latent_rows, run_crosscoder
from bertology.experiments.crosscoder_buffer import ShuffledBuffer, TokenChunk, budgeted, pair_chunks
from bertology.experiments.crosscoder_eval import LayerReadout
from bertology.experiments.crosscoder_model import Crosscoder, Trainer
from bertology.metrics import crosscoder as cc
from bertology.models.pair import ModelPair
from bertology.testing import SENTENCES

pytestmark = pytest.mark.usefixtures("one_thread")

SMALL = CrosscoderSettings(latents=16, k=2, tokens=200, steps=20, batch=32, buffer=128, examples=3)


def _hand_crosscoder(decoders: np.ndarray) -> Crosscoder:
    """A crosscoder with the given ``[m, 2, d]`` decoders, encoder = decoder transpose, zero biases, threshold 0."""
    m, _, d = decoders.shape
    model = Crosscoder(d, m, 1, torch.Generator().manual_seed(0))
    with torch.no_grad():
        model.W_dec.copy_(torch.as_tensor(decoders, dtype=torch.float32))
        model.W_enc.copy_(model.W_dec.permute(1, 2, 0))
        model.b_enc.zero_()
        model.b_dec.zero_()
        model.threshold.fill_(0.0)
    return model


def _lstsq_beta(f: np.ndarray, direction: np.ndarray, y: np.ndarray) -> float:
    """argmin_beta sum_i ||beta f_i d - y_i||^2 by numpy's least squares on the stacked vectors (independent)."""
    a = (f[:, None] * direction[None, :]).reshape(-1, 1)
    return float(np.linalg.lstsq(a, y.reshape(-1), rcond=None)[0][0])


def _readout(model: Crosscoder, x: np.ndarray) -> LayerReadout:
    out = LayerReadout(model, np.arange(model.latents), 2)
    xt = torch.as_tensor(x, dtype=torch.float32)
    out.update(xt[: len(x) // 2])
    out.update(xt[len(x) // 2:])  # two chunks: the sums add up across chunks
    return out


def test_latent_scaling_equals_a_hand_least_squares_fit():
    """On random activations and decoders, every beta equals numpy's least squares on the paper's targets."""
    rng = np.random.default_rng(0)
    dec = rng.normal(size=(3, 2, 4))
    x = rng.normal(size=(40, 2, 4))
    model = _hand_crosscoder(dec)
    readout = _readout(model, x)
    table = latent_rows(1, model, readout, CrosscoderSettings(only_threshold=0.55))
    with torch.no_grad():
        xt = torch.as_tensor(x, dtype=torch.float32)
        f = model.encode(xt).double().numpy()
        xhat = model.decode(model.encode(xt)).double().numpy()
    dec32 = model.W_dec.detach().double().numpy()
    checked = 0
    for j in range(3):
        row = table.iloc[j]
        if row.kind != "tuned_only":
            assert np.isnan(row.beta_error_base) and row.tuned_only_verified is pd.NA
            continue
        d = dec32[j, 1]
        for m, name in ((0, "base"), (1, "tuned")):
            err = x[:, m] - (xhat[:, m] - f[:, j:j + 1] * dec32[j, m][None, :])
            assert row[f"beta_reconstruction_{name}"] == pytest.approx(_lstsq_beta(f[:, j], d, xhat[:, m]), rel=1e-4)
            assert row[f"beta_error_{name}"] == pytest.approx(_lstsq_beta(f[:, j], d, err), rel=1e-4)
        assert row.nu_error == pytest.approx(row.beta_error_base / row.beta_error_tuned)
        checked += 1
    assert checked >= 1, "no tuned_only latent to check: pick another seed"


def _two_directions(carried_by_base: bool) -> tuple[Crosscoder, np.ndarray]:
    """Latent 0 shared (e0 in both), latent 1 put on the tuned side only (e1); the tuned model carries e1, and the
    base carries it too when ``carried_by_base``."""
    dec = np.zeros((2, 2, 4))
    dec[0, :, 0] = 1.0
    dec[1, 1, 1] = 1.0
    rng = np.random.default_rng(1)
    a0, a1 = rng.uniform(0.5, 1.5, 50), rng.uniform(0.5, 1.5, 50) * (rng.random(50) < 0.5)
    x = np.zeros((50, 2, 4))
    x[:, :, 0] = a0[:, None]
    x[:, 1, 1] = a1
    if carried_by_base:
        x[:, 0, 1] = a1
    model = _hand_crosscoder(dec)
    with torch.no_grad():  # latent 1 reads e1 from the tuned half only, so it fires with a1 whichever model has it
        model.W_enc[0, :, 1] = 0.0
    return model, x


def test_a_direction_both_models_carry_is_not_called_tuned_only():
    """The dictionary splits e1 into a tuned-only latent, but the base error carries all of it: nu_error = 1."""
    model, x = _two_directions(carried_by_base=True)
    row = latent_rows(1, model, _readout(model, x), CrosscoderSettings()).iloc[1]
    assert row.kind == "tuned_only" and row.relative_norm == 1.0
    assert row.nu_error == pytest.approx(1.0, abs=1e-6)  # the base error is exactly f_1 e1
    assert row.nu_reconstruction == pytest.approx(0.0, abs=1e-6)  # the base reconstruction has no e1
    assert not row.tuned_only_verified


def test_a_direction_only_the_tuned_model_carries_is_confirmed():
    model, x = _two_directions(carried_by_base=False)
    table = latent_rows(1, model, _readout(model, x), CrosscoderSettings())
    row = table.iloc[1]
    assert row.kind == "tuned_only"
    assert row.nu_error == pytest.approx(0.0, abs=1e-6) and row.nu_reconstruction == pytest.approx(0.0, abs=1e-6)
    assert row.tuned_only_verified
    assert table.iloc[0].kind == "shared" and table.iloc[0].relative_norm == 0.5
    assert table.iloc[0].decoder_cosine == pytest.approx(1.0)


def test_kinds_and_relative_norms():
    rel = cc.relative_norm(np.array([[1.0, 1.0], [0.05, 1.0], [1.0, 0.0], [0.0, 0.0]]))
    np.testing.assert_allclose(rel, [0.5, 1 / 1.05, 0.0, np.nan])
    assert cc.latent_kinds(rel, 0.9).tolist() == ["shared", "tuned_only", "base_only", "shared"]
    verdict = cc.tuned_only_verdict(np.array(["tuned_only", "tuned_only", "shared"], dtype=object),
                                    np.array([0.1, np.nan, 0.1]), np.array([0.2, 0.1, 0.1]), 0.5)
    assert verdict.tolist() == [True, False, None]
    x = np.random.default_rng(0).normal(size=(30, 5))
    sse = float(((x - x.mean(0)) ** 2).sum()) * 0.25
    assert cc.fraction_of_variance_explained(sse, float((x ** 2).sum()), x.sum(0), 30) == pytest.approx(0.75)


# ------------------------------------------------------------------------------------------------ the buffer


@pytest.fixture(scope="module")
def identical(identical_pair):
    base, tuned = identical_pair
    pair = ModelPair.load(str(base), str(tuned))
    return pair, encode_corpus(Corpus.from_list(SENTENCES * 3), pair.tokenizer, 64)


def test_chunks_hold_content_tokens_only_at_the_chosen_layers(identical):
    pair, encoded = identical
    chunks = list(pair_chunks(pair, encoded, (0, 2), batch_size=4))
    ids = np.concatenate([c.token_id for c in chunks])
    tok = pair.tokenizer
    specials = {tok.cls_token_id, tok.sep_token_id, tok.pad_token_id}  # [UNK] is a real token of the text
    assert not specials & set(ids.tolist())
    assert len(ids) == sum(len(it) - int(np.sum(it.special)) for it in encoded.items)
    for c in chunks:  # each row is the token's hidden state at the layer, base then tuned
        for layer in (0, 2):
            assert c.acts[layer].shape == (len(c.token_id), 2, 32)
        item = next(it for it in encoded.items if it.index == c.example[0])
        assert item.input_ids[c.position[0]] == c.token_id[0]


def _fake_stream(n: int, chunk: int):
    def stream():
        for s in range(0, n, chunk):
            v = torch.arange(s, min(n, s + chunk), dtype=torch.float32)
            acts = v[:, None, None].expand(-1, 2, 3).clone()
            yield TokenChunk({1: acts}, np.zeros(len(v), np.int64), np.zeros(len(v), np.int64), np.zeros(len(v), np.int64))
    return stream


def test_the_buffer_reads_no_token_twice_within_a_pass_and_holds_at_most_its_capacity():
    """A buffer of 40 over a stream of 100 tokens: half refilled after each half read, so within the stream's first
    pass no token comes twice, and over many passes every token comes about equally often."""
    buffer = ShuffledBuffer(_fake_stream(100, 7), (1,), 40, 10, torch.Generator().manual_seed(0),
                            scale={1: torch.ones(2, 1)})
    batches = iter(buffer)
    seen = [v for _ in range(6) for v in next(batches)[1][:, 0, 0].int().tolist()]
    assert buffer.epochs == 1 and buffer.drawn == 80 and len(set(seen)) == 60  # 40 + 2 refills of 20
    assert seen[:10] != sorted(seen[:10])  # shuffled
    seen += [v for _ in range(194) for v in next(batches)[1][:, 0, 0].int().tolist()]  # 2000 reads in all
    counts = np.bincount(seen, minlength=100)
    assert counts.min() >= 18 and counts.max() <= 22  # 20 each, +-1 per pass boundary


def test_a_resident_buffer_runs_the_models_once():
    calls = []
    stream = _fake_stream(30, 8)
    buffer = ShuffledBuffer(lambda: calls.append(1) or stream(), (1,), 30, 10, torch.Generator().manual_seed(0),
                            scale={1: torch.ones(2, 1)}, resident=True)
    batches = iter(buffer)
    seen = [next(batches)[1][:, 0, 0].int().tolist() for _ in range(6)]
    assert len(calls) == 1 and sorted(sum(seen[:3], [])) == list(range(30)) == sorted(sum(seen[3:], []))


def test_the_token_budget_takes_whole_sentences_up_to_the_budget(identical):
    _, encoded = identical
    sample = budgeted(encoded, 40, seed=0)
    counts = [len(it) - int(np.sum(it.special)) for it in sample.items]
    assert sum(counts) >= 40 and sum(counts) - max(counts) < 40
    assert [it.index for it in sample.items] == sorted(it.index for it in sample.items)


# ------------------------------------------------------------------------------------------------ training


def test_training_lowers_the_loss_on_a_planted_sparse_code():
    """Activations made of 8 sparse shared features: the crosscoder's loss falls well below its start."""
    g = torch.Generator().manual_seed(0)
    feats = torch.nn.functional.normalize(torch.randn(8, 6, generator=g), dim=1)
    codes = (torch.rand(512, 8, generator=g) < 0.2).float() * torch.rand(512, 8, generator=g)
    x = torch.stack([codes @ feats, codes @ feats], dim=1)
    trainer = Trainer(Crosscoder(6, 16, 2, torch.Generator().manual_seed(1)), 300, 1e-2)
    for step in range(300):
        trainer.step(x[(step * 64) % 512:(step * 64) % 512 + 64])
    assert np.mean(trainer.log.loss[-10:]) < 0.3 * np.mean(trainer.log.loss[:10])
    assert trainer.log.threshold > 0


def test_same_seed_same_tables_other_seed_other_tables(identical):
    pair, encoded = identical
    a, sec_a = run_crosscoder(pair, encoded, SMALL, seed=3)
    b, sec_b = run_crosscoder(pair, encoded, SMALL, seed=3)
    for name in a:
        pd.testing.assert_frame_equal(a[name], b[name])
    assert sec_a["fit"] == sec_b["fit"]
    c, _ = run_crosscoder(pair, encoded, SMALL, seed=4)
    assert not np.allclose(a["crosscoder_latents"]["base_norm"], c["crosscoder_latents"]["base_norm"])
    assert set(a["crosscoder_latents"]["layer"]) == {1, 2}  # a middle layer and the last of two


def test_a_checkpoint_is_resumed_and_the_tables_are_an_uninterrupted_runs(identical, tmp_path):
    """120 steps save checkpoints at 50 and 100; a second run finds the one at 100, replays the buffer's first 100
    batches without training and ends with exactly the first run's tables. A checkpoint of other settings is
    left alone (trained afresh)."""
    from bertology.experiments.crosscoder import CHECKPOINT_EVERY
    from bertology.state_files import load_state

    pair, encoded = identical
    settings = CrosscoderSettings(latents=16, k=2, tokens=200, steps=120, batch=32, buffer=64, examples=3)
    plain, _ = run_crosscoder(pair, encoded, settings, seed=2)
    first, sec_first = run_crosscoder(pair, encoded, settings, seed=2, work_dir=tmp_path)
    assert load_state(tmp_path / "training.pt")["step"] == 2 * CHECKPOINT_EVERY == 100
    again, sec_again = run_crosscoder(pair, encoded, settings, seed=2, work_dir=tmp_path)
    assert sec_first["training"]["resumed_from_step"] == 0 and sec_again["training"]["resumed_from_step"] == 100
    assert not sec_first["training"]["resident"]  # the buffer streamed: the replay re-ran the models' forwards
    for name in plain:
        pd.testing.assert_frame_equal(first[name], plain[name], check_exact=True)
        pd.testing.assert_frame_equal(again[name], plain[name], check_exact=True)
    other = CrosscoderSettings(**{**settings.to_dict(), "lr": 2e-3})
    _, sec_other = run_crosscoder(pair, encoded, other, seed=2, work_dir=tmp_path)
    assert sec_other["training"]["resumed_from_step"] == 0


# ------------------------------------------------------------------------------------------------ planted feature

PLANTED = ("cat", "dog", "book", "house", "movie", "film", "man", "girl", "boy", "woman", "actor", "story", "plot",
           "day", "night", "mat")
TINY = CrosscoderSettings(latents=32, k=4, tokens=4000, steps=600, batch=128, buffer=8192, layers=(2,))


@pytest.fixture(scope="module")
def planted_feature(tmp_path_factory):
    """The tiny base, and a copy in which one direction (norm 0.4, about four times an embedding row's) is added to
    the input embeddings of the PLANTED words; 400 random sentences of the tiny vocabulary."""
    from transformers import BertModel

    from bertology.testing import TINY_WORDS, save_tiny_bert, tiny_tokenizer, tiny_vocab

    root = tmp_path_factory.mktemp("planted-feature")
    base = save_tiny_bert(root / "base", seed=0)
    tuned = BertModel.from_pretrained(base, attn_implementation="eager")
    direction = torch.randn(tuned.config.hidden_size, generator=torch.Generator().manual_seed(5))
    vocab = tiny_vocab()
    with torch.no_grad():
        tuned.embeddings.word_embeddings.weight[[vocab[w] for w in PLANTED]] += 0.4 * direction / direction.norm()
    tuned.save_pretrained(root / "tuned")
    tiny_tokenizer().save_pretrained(root / "tuned")
    rng = np.random.default_rng(0)
    texts = [" ".join(rng.choice(list(TINY_WORDS), size=rng.integers(5, 12))) for _ in range(400)]
    return base, root / "tuned", Corpus.from_list(texts)


def _run(base, tuned, corpus, seed=0):
    pair = ModelPair.load(str(base), str(tuned))
    return run_crosscoder(pair, encode_corpus(corpus, pair.tokenizer, 64), TINY, seed=seed)


def test_the_planted_feature_is_a_confirmed_tuned_only_latent_on_the_planted_words(planted_feature):
    tables, _ = _run(*planted_feature)
    latents, examples = tables["crosscoder_latents"], tables["crosscoder_examples"]
    confirmed = latents[latents["tuned_only_verified"].fillna(False)]
    assert len(confirmed) >= 1
    for latent in confirmed["latent"]:
        tokens = examples[examples["latent"] == latent]["token"].tolist()
        assert len(tokens) == TINY.examples and sum(t in PLANTED for t in tokens) >= 0.75 * len(tokens), tokens
    shared = latents[latents["kind"] == "shared"]
    assert confirmed["relative_norm"].min() > shared["relative_norm"].max()


def test_a_model_against_itself_has_nothing_tuned_only(planted_feature):
    base, _, corpus = planted_feature
    tables, section = _run(base, base, corpus)
    latents = tables["crosscoder_latents"]
    live = latents[~latents["dead"]]
    assert (live["kind"] == "shared").all() and not latents["tuned_only_verified"].fillna(False).any()
    assert live["relative_norm"].between(0.45, 0.55).all()
    fit = tables["crosscoder"].iloc[0]
    assert fit.fve_base == pytest.approx(fit.fve_tuned, abs=1e-3) and fit.fve_base > 0.5
    # the corpus holds fewer tokens than the budget: all read (the manifest section has JSON keys)
    assert section["fit"]["2"]["n_tokens"] == section["training"]["n_tokens_sampled"] < TINY.tokens
