"""Structural probes: stacked training equals training each probe alone; exact trees score perfectly;
features equal a per-sentence forward; run_probes end to end on tiny models."""

import numpy as np
import pytest
import torch

from bertology.experiments.probe import (
    COLUMNS,
    ProbeCorpora,
    ProbeData,
    ProbeSettings,
    TreeSet,
    _batch_tensors,
    encodable,
    ensure_trees,
    epoch_order,
    evaluate_probes,
    extract_word_features,
    fit_probes,
    init_probe,
    random_init_model,
    run_probes,
    split_dev,
    tree_set,
)
from bertology.data.align import pool_words
from bertology.data.corpus import Corpus, Example
from bertology.errors import BertologyError
from bertology.metrics.trees import tree_depths, tree_distances
from bertology.models.loading import load_model
from bertology.testing import SENTENCES, random_heads, save_tiny_bert


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py



def _trees(rng, n_sent, max_len=9, name="split"):
    heads = [np.array(random_heads(rng, int(rng.integers(2, max_len + 1)))) for _ in range(n_sent)]
    words = [tuple(f"w{i}" for i in range(len(h))) for h in heads]
    keep = [np.array([i % 5 != 4 for i in range(len(h))]) for h in heads]
    return TreeSet(words, heads, keep, [tree_distances(h) for h in heads], [tree_depths(h) for h in heads], name)


def _path_features(ts: TreeSet, dim: int) -> torch.Tensor:
    """h_i = sum of one-hot edge vectors on the path from word i to the root: ||h_i - h_j||² = distance, ||h_i||² = depth."""
    rows = []
    for h in ts.heads:
        for i in range(len(h)):
            v = np.zeros(dim)
            cur = i
            while h[cur] != 0:
                v[cur] = 1.0
                cur = h[cur] - 1
            rows.append(v)
    return torch.tensor(np.array(rows), dtype=torch.float32)


def _noisy(ts, dim, noise, seed):
    g = torch.Generator().manual_seed(seed)
    x = _path_features(ts, dim)
    rot = torch.linalg.qr(torch.randn(dim, dim, generator=g))[0]
    return x @ rot + noise * torch.randn(x.shape, generator=g)


# -------------------------------------------------------------------------------------------- stacking
def _reference_alone(key, x_train, train, x_dev, dev, s: ProbeSettings, rank, hidden):
    """One probe trained alone with plain loops, torch.optim.Adam and ReduceLROnPlateau."""
    kind = key[2]
    w = init_probe(key, rank, hidden, s.seed, s.init_scale).clone().requires_grad_(True)
    opt = torch.optim.Adam([w], lr=s.lr)
    sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode="min", factor=s.lr_factor, patience=s.lr_patience)
    off_tr, off_dv = train.offsets, dev.offsets

    def sent_loss(x, ts, off, i):
        n = len(ts.words[i])
        y = x[off[i] : off[i] + n] @ w.T
        if kind == "distance":
            pred = ((y[:, None, :] - y[None, :, :]) ** 2).sum(-1)
            return (pred - torch.tensor(ts.distances[i], dtype=torch.float32)).abs().sum() / n**2
        return ((y**2).sum(-1) - torch.tensor(ts.depths[i], dtype=torch.float32)).abs().sum() / n

    best, best_epoch, best_w, history = np.inf, 0, w.detach().clone(), []
    for epoch in range(s.epochs):
        order = epoch_order(len(train), s.seed, epoch)
        for b in range(0, len(order), s.batch_size):
            idx = order[b : b + s.batch_size]
            loss = sum(sent_loss(x_train, train, off_tr, i) for i in idx) / len(idx)
            opt.zero_grad()
            loss.backward()
            opt.step()
        with torch.no_grad():
            dev_loss = float(sum(sent_loss(x_dev, dev, off_dv, i) for i in range(len(dev))) / len(dev))
        history.append(dev_loss)
        sched.step(dev_loss)
        if dev_loss < best - s.min_delta:
            best, best_epoch, best_w = dev_loss, epoch + 1, w.detach().clone()
        elif epoch + 1 - best_epoch >= s.patience:
            break
    return best, best_epoch, best_w, history


def test_stacked_training_equals_each_probe_alone():
    rng = np.random.default_rng(0)
    train, dev = _trees(rng, 40), _trees(rng, 12)
    hidden = 10
    # two "models" with two layers each, noise levels that make the probes stop at different epochs
    tr_feats = {m: torch.stack([_noisy(train, hidden, nz, seed) for nz, seed in lv]) for m, lv in
                {"a": [(0.0, 1), (0.8, 2)], "b": [(0.3, 3), (2.0, 4)]}.items()}
    dv_feats = {m: torch.stack([_noisy(dev, hidden, nz, seed + 10) for nz, seed in lv]) for m, lv in
                {"a": [(0.0, 1), (0.8, 2)], "b": [(0.3, 3), (2.0, 4)]}.items()}
    s = ProbeSettings(rank=6, epochs=12, batch_size=8, lr=0.02, patience=2, min_delta=1e-3)
    keys = [(m, layer, kind) for kind in ("distance", "depth") for m in ("a", "b") for layer in (0, 5)]
    layer_index = {(m, layer): i for m in ("a", "b") for i, layer in enumerate((0, 5))}
    stack = fit_probes(keys, layer_index, ProbeData(tr_feats, train), ProbeData(dv_feats, dev), s)
    assert len(set(stack.epochs.tolist())) > 1, "probes should stop at different epochs for this test to bite"
    assert (stack.epochs < s.epochs).any()
    for p, key in enumerate(keys):
        li = layer_index[key[:2]]
        best, best_epoch, best_w, history = _reference_alone(
            key, tr_feats[key[0]][li], train, dv_feats[key[0]][li], dev, s, 6, hidden)
        assert stack.best_epoch[p] == best_epoch, key
        assert stack.epochs[p] == len(history), key
        np.testing.assert_allclose(stack.history[p], history, rtol=2e-4, err_msg=str(key))
        assert stack.best_dev_loss[p] == pytest.approx(best, rel=2e-4)
        torch.testing.assert_close(stack.weights[p], best_w, rtol=1e-3, atol=1e-4)


def test_probes_are_independent_of_their_neighbours():
    """The same probe trained beside different probes ends with the same weights."""
    rng = np.random.default_rng(1)
    train, dev = _trees(rng, 30), _trees(rng, 8)
    feats = {"a": torch.stack([_noisy(train, 10, 0.2, 1), _noisy(train, 10, 1.0, 2)])}
    dfeats = {"a": torch.stack([_noisy(dev, 10, 0.2, 3), _noisy(dev, 10, 1.0, 4)])}
    s = ProbeSettings(rank=4, epochs=4, batch_size=7)
    li = {("a", 0): 0, ("a", 1): 1}
    alone = fit_probes([("a", 0, "distance")], li, ProbeData(feats, train), ProbeData(dfeats, dev), s)
    both = fit_probes([("a", 1, "depth"), ("a", 0, "distance"), ("a", 1, "distance")], li, ProbeData(feats, train),
                      ProbeData(dfeats, dev), s)
    torch.testing.assert_close(both.weights[1], alone.weights[0], rtol=1e-5, atol=1e-6)


# -------------------------------------------------------------------------------------- exact trees
def test_exact_tree_features_with_identity_probe_score_perfectly():
    rng = np.random.default_rng(2)
    ts = _trees(rng, 25, max_len=14, name="test")
    dim = 14
    feats = {"m": _path_features(ts, dim)[None]}
    from bertology.experiments.probe import ProbeStack

    keys = [("m", 3, "distance"), ("m", 3, "depth")]
    stack = ProbeStack(keys, torch.eye(dim).repeat(2, 1, 1), np.zeros(2), np.ones(2, int), np.ones(2, int), [[], []])
    rows = evaluate_probes(stack, {("m", 3): 0}, feats, ts, batch_size=7)
    dist, depth = rows
    assert dist["uuas"] == 1.0 and dist["dspr"] == pytest.approx(1.0) and np.isnan(dist["root_acc"])
    assert depth["nspr"] == pytest.approx(1.0) and np.isnan(depth["uuas"])
    # a punctuation root can never be found (as in Hewitt & Manning's evaluation) ...
    kept_root = np.mean([k[list(h).index(0)] for h, k in zip(ts.heads, ts.keep)])
    assert kept_root < 1 and depth["root_acc"] == pytest.approx(kept_root)
    # ... and with every word kept the root is always right
    ts.keep = [np.ones(len(h), bool) for h in ts.heads]
    assert evaluate_probes(stack, {("m", 3): 0}, feats, ts)[1]["root_acc"] == 1.0
    assert dist["loss"] == pytest.approx(0.0, abs=1e-5) and depth["loss"] == pytest.approx(0.0, abs=1e-5)
    # intervals over sentences: absent without resamples, around the score with them (a perfect probe: zero width)
    assert np.isnan(dist["uuas_ci_low"]) and np.isnan(depth["nspr_ci_high"])
    boot = evaluate_probes(stack, {("m", 3): 0}, feats, ts, n_bootstrap=100, seed=0)
    assert boot[0]["uuas_ci_low"] == boot[0]["uuas"] == boot[0]["uuas_ci_high"] == 1.0
    assert boot[1]["nspr_ci_low"] <= boot[1]["nspr"] <= boot[1]["nspr_ci_high"]


def test_training_recovers_planted_trees_and_not_noise():
    rng = np.random.default_rng(3)
    train, dev, test = _trees(rng, 60), _trees(rng, 15), _trees(rng, 40, name="test")
    dim = 12
    g = torch.Generator().manual_seed(0)
    mk = lambda ts, seed: {"m": torch.stack([_noisy(ts, dim, 0.05, seed), torch.randn(ts.n_words, dim, generator=g)])}  # noqa: E731
    s = ProbeSettings(rank=12, epochs=25, batch_size=10, lr=0.02)
    keys = [("m", layer, kind) for kind in ("distance", "depth") for layer in (0, 1)]
    li = {("m", 0): 0, ("m", 1): 1}
    trf = mk(train, 1)
    stack = fit_probes(keys, li, ProbeData(trf, train), ProbeData(mk(dev, 1) | {}, dev), s)
    rows = {(r["layer"], r["probe"]): r for r in evaluate_probes(stack, li, mk(test, 1), test)}
    assert rows[(0, "distance")]["uuas"] > 0.9 and rows[(0, "distance")]["dspr"] > 0.85
    assert rows[(0, "depth")]["root_acc"] > 0.8 and rows[(0, "depth")]["nspr"] > 0.8
    assert rows[(1, "distance")]["uuas"] < 0.75


# ---------------------------------------------------------------------------------------- features
@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("probe-models")
    base = load_model(save_tiny_bert(root / "base", seed=0))
    tuned = load_model(save_tiny_bert(root / "tuned", seed=1, classifier=True))
    return base, tuned


def _chain_corpus(sentences, with_punct=True):
    """Sentences with a right-branching chain tree (each word heads the next) and PUNCT tags on '.'/','."""
    out = []
    for s in sentences:
        words = tuple(s.split())
        heads = tuple([0] + list(range(1, len(words))))
        upos = tuple("PUNCT" if w in ".,!?" else "X" for w in words) if with_punct else None
        out.append(Example(text=s, words=words, upos=upos, heads=heads, deprels=tuple("dep" for _ in words)))
    return Corpus(out, name="chains", source="test")


def test_features_equal_a_per_sentence_forward(tiny_models):
    base, _ = tiny_models
    ts = tree_set(_chain_corpus(SENTENCES + ["the cats liked the funnily slow dogs ."]))
    layers = (0, 1, 2)
    feats = extract_word_features(base, ts, layers, batch_size=3)
    off = ts.offsets
    for i, words in enumerate(ts.words):
        enc = base.tokenizer(" ".join(words), return_tensors="pt")  # the plain text; its words are these words
        with torch.no_grad():
            hs = base.model(**enc, output_hidden_states=True).hidden_states
        wid = np.array([-1 if w is None else w for w in enc.word_ids()])
        for k, layer in enumerate(layers):
            want = pool_words(hs[layer][0], wid, "mean", n_words=len(words))
            torch.testing.assert_close(feats[k, off[i] : off[i] + len(words)], want, rtol=1e-4, atol=1e-5)


def test_random_control_is_seeded_and_differs(tiny_models):
    base, _ = tiny_models
    r1, r2, r3 = random_init_model(base, 0), random_init_model(base, 0), random_init_model(base, 1)
    p1, p2, p3 = (dict(r.model.named_parameters())["encoder.layer.0.attention.self.query.weight"] for r in (r1, r2, r3))
    assert torch.equal(p1, p2) and not torch.equal(p1, p3)
    assert not torch.equal(p1, dict(base.model.named_parameters())["encoder.layer.0.attention.self.query.weight"])
    assert r1.name == "random" and r1.tokenizer is base.tokenizer


# ---------------------------------------------------------------------------------------------- data
def test_split_dev_is_seeded_ten_percent():
    ts = tree_set(_chain_corpus([f"the cat sat {'very ' * k}." for k in range(30)]))
    tr, dv = split_dev(ts, 0.1, seed=0)
    assert len(dv) == 3 and len(tr) == 27
    assert not set(map(tuple, tr.words)) & set(map(tuple, dv.words))
    assert split_dev(ts, 0.1, seed=0)[1].words == dv.words
    assert split_dev(ts, 0.1, seed=1)[1].words != dv.words


def test_conllu_without_heads_and_pairs_are_refused():
    no_heads = Corpus([Example(text="a b", words=("a", "b"))], source="x.conllu", stats={"format": "conllu"})
    with pytest.raises(BertologyError, match="no dependency heads"):
        ensure_trees(no_heads)
    with pytest.raises(BertologyError, match="no examples"):
        ensure_trees(Corpus([], source="e.txt"))
    with pytest.raises(BertologyError, match="sentence pairs"):
        ensure_trees(Corpus.from_list(["a b"], pairs=["c d"]))


def test_multi_root_and_overlong_sentences_are_dropped_and_counted(tiny_models):
    base, _ = tiny_models
    c = _chain_corpus(["the cat sat .", "a dog ran ."])
    c.examples.append(Example(text="x y", words=("the", "dog"), upos=("X", "X"), heads=(0, 0), deprels=("d", "d")))
    ts = tree_set(c)
    assert len(ts) == 2 and ts.stats["n_not_single_tree"] == 1
    long = tree_set(_chain_corpus(["the cat sat .", " ".join(["the"] * 40)]))
    kept, info = encodable(long, [base.tokenizer], max_length=20)
    assert len(kept) == 1 and info["n_over_max_length"] == 1


def test_batches_pad_gold_trees():
    rng = np.random.default_rng(5)
    ts = _trees(rng, 4)
    b = _batch_tensors(ts, [2, 0], "cpu")
    n2 = len(ts.words[2])
    assert b["mask"][0].sum() == n2 and torch.equal(b["dist"][0, :n2, :n2], torch.tensor(ts.distances[2], dtype=torch.float32))
    n0 = len(ts.words[0])
    assert b["words"].tolist() == list(range(ts.offsets[2], ts.offsets[2] + n2)) + list(range(n0))
    T = b["shape"][1]
    assert b["flat"].tolist() == list(range(n2)) + list(range(T, T + n0))


# ------------------------------------------------------------------------------------------ end to end
def test_run_probes_end_to_end_with_cache(tiny_models, tmp_path):
    base, tuned = tiny_models
    train = _chain_corpus(SENTENCES * 3)
    test = _chain_corpus(SENTENCES[:5])
    models = {"base": base, "tuned": tuned, "random": random_init_model(base, 0)}
    s = ProbeSettings(rank=8, epochs=3, batch_size=5)
    stages = []
    res = run_probes(models, ProbeCorpora(train, test), s, on_progress=lambda st, d, t: stages.append(st),
                     work_dir=tmp_path)
    t = res.table
    assert list(t.columns) == COLUMNS
    assert len(t) == 3 * 3 * 2 * 2  # models x layers 0..2 x probes x {dev, test}
    assert set(t["model"]) == {"base", "tuned", "random"} and set(t["layer"]) == {0, 1, 2}
    assert set(t["split"]) == {"dev", "test"}
    d, p = t[t.probe == "distance"], t[t.probe == "depth"]
    assert d["uuas"].between(0, 1).all() and d["root_acc"].isna().all() and d["nspr"].isna().all()
    assert p["root_acc"].between(0, 1).all() and p["uuas"].isna().all() and p["dspr"].isna().all()
    assert res.params["data"]["dev"]["n_sentences"] == 3 and res.params["data"]["train"]["n_sentences"] == 27
    assert {"features train base", "features test random", "training", "scoring"} <= set(stages)
    assert not any(res.params["timings_s"]["features_from_cache"]["train"].values())
    assert (tmp_path / "features" / "train-tuned.safetensors").exists()
    again = run_probes(models, ProbeCorpora(train, test), s, work_dir=tmp_path)
    assert all(again.params["timings_s"]["features_from_cache"]["test"].values())
    import pandas as pd

    pd.testing.assert_frame_equal(again.table, t)
    # base and tuned are different models: their probes differ
    key = ["layer", "probe", "split"]
    b = t[t.model == "base"].set_index(key)["loss"]
    assert not np.allclose(b, t[t.model == "tuned"].set_index(key)["loss"].loc[b.index])


def test_run_probes_layers_option_and_errors(tiny_models):
    base, _ = tiny_models
    train = _chain_corpus(SENTENCES * 2)
    res = run_probes({"base": base}, ProbeCorpora(train, train),
                     ProbeSettings(rank=4, epochs=1, layers=(2,), probes=("depth",)))
    assert set(res.table["layer"]) == {2} and set(res.table["probe"]) == {"depth"}
    with pytest.raises(BertologyError, match="out of range"):
        run_probes({"base": base}, ProbeCorpora(train, train), ProbeSettings(epochs=1, layers=(7,)))
    with pytest.raises(BertologyError, match=r"--probes \(probes\) must be one of distance, depth, not .nope."):
        ProbeSettings(probes=("nope",))


def test_probe_figures_draw_one_line_per_model():
    import pandas as pd

    from bertology.viz.probe import probe_figures, probe_layer_figure

    rows = []
    for model in ("base", "tuned", "random"):
        for layer in range(3):
            for split in ("dev", "test"):
                rows.append({"model": model, "layer": layer, "probe": "distance", "split": split, "uuas": 0.1 * layer,
                             "dspr": 0.2, "root_acc": np.nan, "nspr": np.nan})
                rows.append({"model": model, "layer": layer, "probe": "depth", "split": split, "uuas": np.nan,
                             "dspr": np.nan, "root_acc": 0.3, "nspr": -0.2})
    t = pd.DataFrame(rows)
    figs = probe_figures(t)
    assert set(figs) == {"probe_distance", "probe_depth"}
    ax_uuas, ax_dspr = figs["probe_distance"].axes[:2]
    assert len(ax_uuas.get_lines()) == 3 and [line.get_label() for line in ax_uuas.get_lines()] == ["base", "tuned", "random"]
    assert figs["probe_depth"].axes[1].get_ylim()[0] <= -0.2  # negative NSpr stays visible
    with pytest.raises(ValueError, match="no uuas"):
        probe_layer_figure(t, split="train")
