"""Kovaleva pattern classes: synthetic maps get their class, fast == slow features, the analysis, the CNN."""
import numpy as np
import pandas as pd
import pytest
import torch
from matplotlib.figure import Figure

from bertology.activations.extract import collate, run_analyses
from bertology.analyses.attention_patterns import AttentionPatterns, dominant_patterns, layer_mix, pattern_shift
from bertology.analyses.attention_targets import is_punct_token
from bertology.experiments.pattern_cnn import PatternClassifier, TrainSettings, map_images, resize_map, train_pattern_cnn
from bertology.data.corpus import Corpus, Example
from bertology.data.encode import EncodedCorpus, encode_corpus
from bertology.errors import BertologyError
from bertology.metrics.patterns import (
    PATTERNS,
    PatternThresholds,
    block_sums,
    classify,
    excess,
    features_from_sums,
    features_one_map,
    pattern_features,
    pattern_sums,
)
from bertology.models.hooks import capture
from bertology.models.pair import ModelPair
from bertology.testing import SENTENCES
from bertology.viz.patterns import map_grid_figure, pattern_heads_figure, pattern_mix_figure, thumbnail_png

torch.set_num_threads(1)

PAIRS = [("the cat sat on the mat .", "a dog ran fast ."), ("john saw mary", "she read a good book , too !")]
CORPUS = Corpus([Example(s) for s in SENTENCES] + [Example(a, text_pair=b) for a, b in PAIRS])


# -- synthetic maps ----------------------------------------------------------------------------------


def _single(n):
    """vertical keys ([CLS], final ".", [SEP]) and segments of "[CLS] w ... w . [SEP]"."""
    vk = np.zeros(n, bool)
    vk[[0, n - 2, n - 1]] = True
    seg = np.zeros(n, int)
    seg[[0, n - 1]] = -1
    return vk, seg


def _pair(n1, n2):
    n = n1 + n2 + 3
    vk = np.zeros(n, bool)
    vk[[0, n1 + 1, n - 1]] = True
    seg = np.full(n, -1)
    seg[1 : n1 + 1] = 0
    seg[n1 + 2 : n - 1] = 1
    return vk, seg


def _rows(a):
    return a / a.sum(-1, keepdims=True)


def synthetic(kind: str, rng: np.random.Generator, noise: float = 0.0):
    """One map of a known class with its vertical keys and segments."""
    if kind == "block":
        n1, n2 = rng.integers(10, 20, size=2)
        vk, seg = _pair(n1, n2)
        n = len(seg)
        a = np.full((n, n), 1e-3)
        for q in range(n):  # content tokens attend inside their own text, specials to the specials
            a[q, seg == seg[q]] = 1.0
    else:
        n = int(rng.integers(12, 40))
        vk, seg = _single(n)
        eye = np.eye(n)
        shift = np.eye(n, k=int(rng.choice([-1, 0, 1])))
        shift[shift.sum(1) == 0, 0] = 1.0
        cls = np.zeros((n, n))
        cls[:, 0] = 1.0
        cls[:, n - 1] = rng.uniform(0, 0.5)
        if kind == "vertical":
            a = cls
        elif kind == "diagonal":
            a = shift if rng.random() < 0.7 else eye
        elif kind == "vertical+diagonal":
            a = 0.5 * _rows(cls) + 0.5 * shift
        else:
            a = rng.dirichlet(np.full(n, 0.3), size=n)
    a = _rows(a + 1e-4)
    if noise:
        a = (1 - noise) * a + noise * rng.dirichlet(np.full(len(a), 1.0), size=len(a))
    return a, vk, seg


def _features(a, vk, seg, band=1):
    t = torch.as_tensor(a)[None, None]
    return pattern_features(t, torch.ones(1, len(a), dtype=torch.bool), torch.as_tensor(vk)[None],
                            torch.as_tensor(seg)[None], band=band)[0, 0]


@pytest.mark.parametrize("kind", PATTERNS)
def test_synthetic_maps_get_their_class(kind):
    rng = np.random.default_rng(0)
    for _ in range(10):
        a, vk, seg = synthetic(kind, rng)
        f = _features(a, vk, seg)
        assert PATTERNS[int(classify(f))] == kind, (kind, excess(f))


def test_textbook_maps():
    n = 10
    vk, seg = _single(n)
    cls = np.zeros((n, n))
    cls[:, 0] = 1
    ex = excess(_features(cls, vk, seg))
    assert ex[0] > 0.7 and ex[1] < 0  # a [CLS] column: vertical; its rows 0-1 touch the band
    ex = excess(_features(np.eye(n), vk, seg))
    assert ex[0] < 0 and ex[1] == pytest.approx(1.0)
    uni = np.full((n, n), 1 / n)
    f = _features(uni, vk, seg)
    assert np.allclose(excess(f)[:2], 0, atol=1e-12)
    assert f[3] == pytest.approx(1.0)  # normalised entropy of a uniform map
    bvk, bseg = _pair(5, 6)
    f = _features(np.full((len(bseg),) * 2, 1 / len(bseg)), bvk, bseg)
    assert excess(f)[2] == pytest.approx(0.0, abs=1e-12)
    assert np.isnan(float(excess(_features(np.eye(n), vk, seg))[2]))  # no block for a single text


def test_uniform_baselines_are_the_features_of_the_uniform_map():
    vk, seg = _pair(4, 7)
    n = len(seg)
    for band in (0, 1, 3):
        f = _features(np.full((n, n), 1 / n), vk, seg, band)
        assert np.allclose(f[:3].numpy(), f[4:].numpy())


def test_thresholds_are_validated_and_recorded():
    with pytest.raises(ValueError, match="band"):
        PatternThresholds(band=-1)
    with pytest.raises(ValueError, match="vertical_min"):
        PatternThresholds(vertical_min=float("nan"))
    d = PatternThresholds(vertical_min=0.4).to_dict()
    assert d["vertical_min"] == 0.4 and d["band"] == 1


# -- tiny models -------------------------------------------------------------------------------------


def _vertical_keys(tok, item):
    toks = tok.convert_ids_to_tokens(item.input_ids.tolist())
    return np.array([s or is_punct_token(t) for s, t in zip(item.special, toks)])


@pytest.mark.parametrize("band", [1, 2])
def test_features_equal_a_per_map_loop_on_padded_batches(planted_pair, band):
    pair = ModelPair.load(*map(str, planted_pair))
    tok = pair.tokenizer
    enc = encode_corpus(CORPUS, tok)
    t = collate(enc.items, tok.pad_token_id)
    B, T = t["mask"].shape
    vk = torch.zeros(B, T, dtype=torch.bool)
    seg = torch.full((B, T), -1)
    for b, it in enumerate(enc.items):
        vk[b, : len(it)] = torch.as_tensor(_vertical_keys(tok, it))
        seg[b, : len(it)] = torch.as_tensor(it.segment)
    with torch.inference_mode(), capture(pair.tuned.model, hidden_states=False) as cap:
        pair.tuned.model(input_ids=t["input_ids"], token_type_ids=t["token_type_ids"], attention_mask=t["attention_mask"])
    assert len(set(t["lengths"].tolist())) > 3  # different lengths: padding is exercised
    for layer in (1, 2):
        a = cap.attentions[layer]
        fast = pattern_features(a, t["mask"], vk, seg, band=band).numpy()
        for b, it in enumerate(enc.items):
            n = len(it)
            for h in range(a.shape[1]):
                slow = features_one_map(a[b, h, :n, :n].numpy(), vk[b, :n].numpy(), it.segment, band=band)
                np.testing.assert_allclose(fast[b, h], slow, atol=1e-6, equal_nan=True)
        assert np.isnan(fast[: len(SENTENCES), :, 2]).all() and not np.isnan(fast[len(SENTENCES) :, :, 2]).any()
        # the pairs told from the host (issue 35: no read-back of the segments) give the same features, bit for bit
        pairs = np.array([(np.asarray(it.segment) == 1).any() for it in enc.items])
        sums = pattern_sums(a, t["mask"], vk, seg, band=band, pairs=pairs)
        told = features_from_sums({k: v[None] for k, v in sums.items()}, t["mask"], vk, seg, band, pairs=pairs)[0]
        np.testing.assert_array_equal(told.numpy(), fast)
        np.testing.assert_array_equal(block_sums(a, t["mask"], seg, pairs).numpy(), block_sums(a, t["mask"], seg).numpy())
        singles = np.zeros(B, dtype=bool)  # no pair in the batch: every block NaN, nothing indexed
        assert torch.isnan(block_sums(a, t["mask"], seg, singles)).all()


def _run(pair, corpus=CORPUS, batch_size=4, items=None, **kwargs):
    enc = encode_corpus(corpus, pair.tokenizer)
    if items is not None:
        enc = EncodedCorpus([enc.items[i] for i in items], enc.max_length, enc.overlong, enc.n_input)
    a = AttentionPatterns(pair.tokenizer, pair.num_layers, pair.num_heads, **kwargs)
    run_analyses(pair, enc, [a], batch_size=batch_size)
    return a


def test_analysis_table_fractions_and_identity(identical_pair):
    pair = ModelPair.load(*map(str, identical_pair))
    res = _run(pair).compute()
    table = res.table
    assert {"model", "layer", "head", "pattern", "fraction"} <= set(table.columns)
    assert len(table) == 2 * 2 * 4 * len(PATTERNS)
    sums = table.groupby(["model", "layer", "head"])["fraction"].sum()
    assert np.allclose(sums, 1.0)
    base = table[table.model == "base"].drop(columns="model").reset_index(drop=True)
    tuned = table[table.model == "tuned"].drop(columns="model").reset_index(drop=True)
    pd.testing.assert_frame_equal(base, tuned)
    assert (table.n_examples == len(CORPUS)).all() and (table.n_pairs == len(PAIRS)).all()
    assert res.params["thresholds"]["vertical_min"] == PatternThresholds().vertical_min
    assert res.params["classifier"] == {"kind": "rules"}
    mix = layer_mix(table)
    assert list(mix.columns) == ["model", "layer", "pattern", "fraction"]
    assert np.allclose(mix.groupby(["model", "layer"])["fraction"].sum(), 1.0)
    dom = dominant_patterns(table)
    assert len(dom) == 2 * 2 * 4 and set(dom.pattern) <= set(PATTERNS)
    shift = pattern_shift(table)
    assert np.allclose(shift.change, 0.0)


def test_analysis_counts_equal_per_example_classification(planted_pair):
    pair = ModelPair.load(*map(str, planted_pair))
    table = _run(pair, batch_size=3).compute().table.set_index(["model", "layer", "head", "pattern"])
    tok = pair.tokenizer
    counts = np.zeros((2, 2, 4, len(PATTERNS)), dtype=int)
    feats = np.zeros((2, 2, 4, 4))
    for i, ex in enumerate(CORPUS):
        enc = tok(ex.text, ex.text_pair, return_tensors="pt") if ex.text_pair else tok(ex.text, return_tensors="pt")
        item = encode_corpus(Corpus([ex]), tok).items[0]
        vk = _vertical_keys(tok, item)
        for m, model in enumerate((pair.base.model, pair.tuned.model)):
            with torch.inference_mode():
                att = model(**enc, output_attentions=True).attentions
            for layer in range(2):
                for h in range(4):
                    f = features_one_map(att[layer][0, h].numpy(), vk, item.segment)
                    counts[m, layer, h, int(classify(f))] += 1
                    feats[m, layer, h] += np.nan_to_num(f[:4])
    for m, model in enumerate(("base", "tuned")):
        for layer in range(2):
            for h in range(4):
                for p, name in enumerate(PATTERNS):
                    assert table.loc[(model, layer + 1, h, name), "count"] == counts[m, layer, h, p]
                row = table.loc[(model, layer + 1, h, "vertical")]
                assert row.mean_vertical == pytest.approx(feats[m, layer, h, 0] / len(CORPUS), abs=1e-6)
                assert row.mean_block == pytest.approx(feats[m, layer, h, 2] / len(PAIRS), abs=1e-6)


def test_batch_size_invariance_and_merge(planted_pair):
    pair = ModelPair.load(*map(str, planted_pair))
    whole = _run(pair, batch_size=4).compute().table
    other = _run(pair, batch_size=1).compute().table
    pd.testing.assert_frame_equal(whole, other, check_exact=False, atol=1e-9)
    n = len(CORPUS)
    a = _run(pair, items=range(0, 5))
    b = _run(pair, items=range(5, n))
    merged = a.merge(b).compute().table
    pd.testing.assert_frame_equal(whole, merged, check_exact=False, atol=1e-9)
    with pytest.raises(ValueError, match="cannot merge"):
        a.merge(AttentionPatterns(pair.tokenizer, 2, 4, thresholds=PatternThresholds(vertical_min=0.9)))


# -- CNN -----------------------------------------------------------------------------------------------


def synthetic_set(n_per_class, seed=0, size=32):
    rng = np.random.default_rng(seed)
    images, labels = [], []
    for kind in PATTERNS:
        for _ in range(n_per_class):
            a, _, _ = synthetic(kind, rng, noise=float(rng.uniform(0.05, 0.3)))
            images.append(resize_map(torch.as_tensor(a), size))
            labels.append(kind)
    return torch.stack(images), labels


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    images, labels = synthetic_set(40)
    rules = ["heterogeneous"] * len(labels)
    clf, report = train_pattern_cnn(images, labels, folds=3, settings=TrainSettings(epochs=12, seed=0), rules=rules)
    folder = tmp_path_factory.mktemp("cnn")
    clf.save(folder)
    return clf, report, folder, images


def test_cnn_learns_synthetic_patterns(trained):
    clf, report, _, _ = trained
    assert report.folds == 3 and len(report.fold_macro_f1) == 3
    assert report.macro_f1 > 0.9, report.to_dict()
    assert set(report.per_class_f1) == set(PATTERNS)
    assert set(report.agreement) == {"cnn_vs_labels", "rules_vs_labels", "cnn_vs_rules"}
    conf = np.array(report.agreement["cnn_vs_labels"]["confusion"])
    assert conf.sum() == 200 and np.trace(conf) / 200 > 0.9


def test_cnn_save_load_round_trip(trained):
    clf, _, folder, images = trained
    loaded = PatternClassifier.load(folder)
    np.testing.assert_array_equal(loaded.predict(images), clf.predict(images))
    assert loaded.sha256 == clf.sha256 and loaded.identity()["sha256"]
    assert loaded.metadata["cv"]["macro_f1_mean"] > 0.9 and loaded.classes == PATTERNS
    with pytest.raises(BertologyError, match="does not exist"):
        PatternClassifier.load(folder / "missing")


def test_cnn_training_is_seeded():
    images, labels = synthetic_set(6, seed=1)
    s = TrainSettings(epochs=2, seed=3)
    a, ra = train_pattern_cnn(images, labels, folds=2, settings=s)
    b, rb = train_pattern_cnn(images, labels, folds=2, settings=s)
    assert ra.fold_macro_f1 == rb.fold_macro_f1
    np.testing.assert_array_equal(a.predict(images), b.predict(images))


def test_cnn_folds_follow_the_smallest_class():
    images, labels = synthetic_set(4)
    labels = list(labels)
    labels[4:8] = ["diagonal", "diagonal", "diagonal", "vertical"]  # diagonal: 3 maps, so 3 folds
    _, report = train_pattern_cnn(images, labels, folds=5, settings=TrainSettings(epochs=1))
    assert report.folds == min(5, min(report.label_counts.values()))
    labels[8:12] = ["vertical+diagonal", "block", "block", "block"]
    with pytest.raises(BertologyError, match="at least 2"):
        train_pattern_cnn(images, labels, folds=5, settings=TrainSettings(epochs=1))


def test_map_images_crop_each_example(planted_pair):
    a = torch.zeros(2, 1, 6, 6)
    a[0, 0, :, 0] = 1.0  # 6 real tokens
    a[1, 0, :4, 3] = 1.0  # 4 real tokens, padding after
    img = map_images(a, [6, 4], size=8)
    assert img.shape == (2, 1, 8, 8)
    assert torch.allclose(img[1, 0, :, 6:], torch.ones(8, 2)) and img[1, 0, :, :6].sum() == 0
    assert img.max() == 1.0


def test_analysis_with_cnn_classifier(trained, identical_pair, tmp_path):
    import shutil

    clf, _, folder, _ = trained
    pair = ModelPair.load(*map(str, identical_pair))
    loaded = PatternClassifier.load(folder)
    whole = _run(pair, classifier=loaded)
    res = whole.compute()
    assert (res.table.classifier == "cnn").all()
    assert np.allclose(res.table.groupby(["model", "layer", "head"])["fraction"].sum(), 1.0)
    assert res.params["classifier"]["sha256"] == loaded.sha256
    # The maps the CNN saw are map_images of the cropped maps: same codes as predicting them directly.
    enc = encode_corpus(CORPUS, pair.tokenizer)
    t = collate(enc.items, pair.tokenizer.pad_token_id)
    with torch.inference_mode(), capture(pair.base.model, hidden_states=False) as cap:
        pair.base.model(input_ids=t["input_ids"], token_type_ids=t["token_type_ids"], attention_mask=t["attention_mask"])
    direct = [loaded.predict(resize_map(cap.attentions[2][b, :, :n, :n])) for b, n in enumerate(t["lengths"].tolist())]
    counts = np.stack([np.bincount(np.array(direct)[:, h], minlength=len(PATTERNS)) for h in range(4)])
    got = res.table.query("model == 'base' and layer == 2").pivot(index="head", columns="pattern", values="count")
    np.testing.assert_array_equal(got[list(PATTERNS)].to_numpy(), counts)
    # Shards that loaded the same CNN from different folders merge.
    shutil.copytree(folder, tmp_path / "copy")
    a = _run(pair, items=range(0, 5), classifier=loaded)
    b = _run(pair, items=range(5, len(CORPUS)), classifier=PatternClassifier.load(tmp_path / "copy"))
    pd.testing.assert_frame_equal(a.merge(b).compute().table, res.table, check_exact=False, atol=1e-9)


# -- figures -------------------------------------------------------------------------------------------


def test_figures(identical_pair):
    pair = ModelPair.load(*map(str, identical_pair))
    table = _run(pair).compute().table
    for data in (table, layer_mix(table)):
        fig = pattern_mix_figure(data, title="patterns")
        assert isinstance(fig, Figure) and len(fig.axes) == 2
    heads = pattern_heads_figure(table)
    assert isinstance(heads, Figure) and len(heads.axes) == 2
    rows = [
        {"model": m, "layer": 1, "head": h, "pattern": p, "fraction": float(p == dom)}
        for m, doms in (("base", ("vertical", "block")), ("tuned", ("diagonal", "block")))
        for h, dom in enumerate(doms)
        for p in PATTERNS
    ]
    fig = pattern_heads_figure(pd.DataFrame(rows))
    assert len(fig.axes[0].patches) == 0 and len(fig.axes[1].patches) == 1  # head 0 changed class
    png = thumbnail_png(np.eye(5), scale=3)
    assert png.startswith(b"\x89PNG")
    assert isinstance(map_grid_figure([np.eye(4), np.ones((3, 3))], ["a", "b"]), Figure)
    with pytest.raises(ValueError, match="missing"):
        pattern_mix_figure(table.drop(columns="fraction"))
