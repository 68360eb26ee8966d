"""Ablation hooks against independent reference computations; the cached sweep against the naive one;
resuming an interrupted sweep; bootstrap intervals against a slow loop; clear label errors."""
import copy

import numpy as np
import pandas as pd
import pytest
import torch
from sklearn.metrics import accuracy_score, f1_score
from transformers.models.bert import modeling_bert

from bertology.experiments.ablation import (
    TABLE_COLUMNS,
    HeadScoring,
    SweepPlan,
    Unit,
    bootstrap_counts,
    head_means,
    label_ids_for,
    macro_f1_from_counts,
    make_batches,
    plan_units,
    ranked,
    run_ablation,
    score_units,
)
from bertology.data.corpus import Corpus, Example
from bertology.experiments.ablation_table import Bootstrap
from bertology.data.encode import encode_corpus
from bertology.errors import BertologyError
from bertology.models.ablate import (
    ablate_heads,
    bypass_blocks,
    head_gates,
    keep_first_token,
    replace_embeddings,
    replay_output,
    skip_layers,
)
from bertology.models.hooks import count_hooks
from bertology.models.loading import load_model
from bertology.testing import SENTENCES, save_tiny_bert

PAIRS = [("the cat sat .", "a dog ran fast ."), ("i love this movie", "it was boring"), ("john saw mary", "she read a book .")]


@pytest.fixture(scope="module")
def clf(tmp_path_factory):
    """A 3-layer, 4-head, 3-label tiny classifier with large enough weights that ablations matter."""
    folder = save_tiny_bert(
        tmp_path_factory.mktemp("clf"), classifier=True, num_labels=3, num_hidden_layers=3, initializer_range=0.3
    )
    return load_model(folder)


@pytest.fixture(scope="module")
def data(clf):
    texts = SENTENCES + [a for a, _ in PAIRS]
    pairs = [None] * len(SENTENCES) + [b for _, b in PAIRS]
    corpus = Corpus([Example(text=t, text_pair=p, label=str(i % 3)) for i, (t, p) in enumerate(zip(texts, pairs))])
    enc = encode_corpus(corpus, clf.tokenizer)
    return corpus, enc, label_ids_for(corpus, clf.model)


def _special(tok):
    return [tok.cls_token_id, tok.sep_token_id]


def _batched_logits(model, enc, batch_size=4):
    """Logits by item position with padded, length-bucketed batches."""
    b = make_batches(enc, np.zeros(enc.n_input, dtype=np.int64), batch_size=batch_size, pad_id=0, use_token_types=True)
    out = torch.empty(b.n, model.config.num_labels)
    with torch.inference_mode():
        for inp, pos in zip(b.inputs, b.positions):
            out[torch.from_numpy(pos)] = model(**inp).logits
    return out


def _reference_logits(model, enc, monkeypatch, edit):
    """One example at a time (no padding) through a reference eager attention that calls ``edit(layer, probs, value, out, special)``."""
    original = modeling_bert.eager_attention_forward
    state = {}

    def reference(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kw):
        assert attention_mask is None  # single unpadded example
        probs = torch.softmax(query @ key.transpose(2, 3) * scaling, dim=-1)
        probs = edit(module.layer_idx + 1, probs, value, state["special"])
        out = (probs @ value).transpose(1, 2).contiguous()
        return out, probs

    monkeypatch.setattr(modeling_bert, "eager_attention_forward", reference)
    rows = []
    try:
        with torch.inference_mode():
            for it in enc.items:
                state["special"] = torch.from_numpy(it.special)
                ids = torch.from_numpy(it.input_ids)[None]
                tti = torch.from_numpy(it.token_type_ids)[None]
                rows.append(model(input_ids=ids, token_type_ids=tti).logits[0])
    finally:
        monkeypatch.setattr(modeling_bert, "eager_attention_forward", original)
    return torch.stack(rows)


@pytest.mark.parametrize("exclude_special", [False, True])
def test_uniform_equals_attention_set_to_one_over_L(clf, data, monkeypatch, exclude_special):
    _, enc, _ = data
    heads = [(1, 2), (3, 0)]

    def edit(layer, probs, value, special):
        probs = probs.clone()
        for l, h in heads:
            if l == layer:
                keep = ~special if exclude_special else torch.ones_like(special)
                probs[0, h] = (keep.double() / keep.sum()).to(probs.dtype)[None, :]
        return probs

    ref = _reference_logits(clf.model, enc, monkeypatch, edit)
    with ablate_heads(clf.model, heads, "uniform", exclude_special=exclude_special, special_ids=_special(clf.tokenizer)):
        ours = _batched_logits(clf.model, enc)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(ours, _batched_logits(clf.model, enc), atol=1e-4)  # the ablation did something


def test_uniform_rewrites_the_captured_attention_probabilities(clf):
    from bertology.models.hooks import capture

    enc = clf.tokenizer(["the cat sat on the mat .", "a dull film"], return_tensors="pt", padding=True)
    with torch.inference_mode(), ablate_heads(clf.model, [(2, 1)], "uniform"), capture(clf.model, hidden_states=False) as cap:
        clf.model(**enc)
    probs = cap.attentions[2][:, 1]
    mask = enc["attention_mask"].bool()
    for b in range(2):
        n = int(mask[b].sum())
        torch.testing.assert_close(probs[b, :n, :n], torch.full((n, n), 1.0 / n))
        assert float(probs[b, :, n:].abs().sum()) == 0.0


def test_zero_and_mean_equal_a_reference_attention_output(clf, data, monkeypatch):
    _, enc, y = data
    b = make_batches(enc, y, batch_size=4, pad_id=0, use_token_types=True)
    means = head_means(clf.model, b)
    assert means.shape == (3, 4, 8)
    for mode in ("zero", "mean"):
        # reference: a head's context = sum_k p_k v_k; make it 0 (zero) or the mean by editing values and probs
        def edit_ctx(layer, probs, value, special, mode=mode):
            if layer == 2:
                probs = probs.clone()
                if mode == "zero":
                    probs[0, 3] = 0.0
                else:  # attention on one key whose value is the mean: p = e_0, v_0 := mean
                    probs[0, 3] = 0.0
                    probs[0, 3, :, 0] = 1.0
                    value[0, 3, 0] = means[1, 3]
            return probs

        ref = _reference_logits(clf.model, enc, monkeypatch, edit_ctx)
        with ablate_heads(clf.model, [(2, 3)], mode, means=means):
            ours = _batched_logits(clf.model, enc)
        torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-5)


def test_head_means_are_means_over_real_tokens(clf, data):
    _, enc, y = data
    b = make_batches(enc, y, batch_size=3, pad_id=0, use_token_types=True)
    seen = []
    dense = clf.model.bert.encoder.layer[0].attention.output.dense
    h = dense.register_forward_pre_hook(lambda _m, a: seen.append(a[0]))
    try:
        means = head_means(clf.model, b)
    finally:
        h.remove()
    rows = torch.cat([x[m] for x, m in zip(seen, b.mask)])  # real tokens only
    torch.testing.assert_close(means[0].reshape(-1), rows.double().mean(0).float(), rtol=1e-5, atol=1e-6)


def test_skip_layer_equals_the_model_without_that_block(clf, data):
    _, enc, _ = data
    short = copy.deepcopy(clf.model)
    del short.bert.encoder.layer[1]
    with skip_layers(clf.model, [2]):
        ours = _batched_logits(clf.model, enc)
    torch.testing.assert_close(ours, _batched_logits(short, enc), rtol=1e-6, atol=1e-6)


def test_gates_at_one_change_nothing(clf, data):
    _, enc, _ = data
    ref = _batched_logits(clf.model, enc, batch_size=100)
    with head_gates(clf.model) as gates:
        gates.prepare(enc.n_input)
        ours = _batched_logits(clf.model, enc, batch_size=100)
    torch.testing.assert_close(ours, ref)


def test_no_hook_or_bypass_leaks_even_when_the_body_raises(clf):
    model = clf.model
    before = count_hooks(model)
    blocks = model.bert.encoder.layer
    managers = [
        lambda: ablate_heads(model, [(1, 0), (2, 3)], "uniform", exclude_special=True, special_ids=[2, 3]),
        lambda: ablate_heads(model, [(1, 0)], "zero"),
        lambda: ablate_heads(model, [(1, 0)], "mean", means=torch.zeros(3, 4, 8)),
        lambda: skip_layers(model, [1, 3]),
        lambda: head_gates(model),
        lambda: replace_embeddings(model),
        lambda: keep_first_token(model),
        lambda: bypass_blocks(model, [1, 2]),
        lambda: replay_output(model.bert.encoder.layer[0].attention.self),
    ]
    for make in managers:
        with pytest.raises(RuntimeError, match="boom"):
            with make():
                raise RuntimeError("boom")
        assert count_hooks(model) == before
        assert all("forward" not in b.__dict__ and "forward" not in b.attention.self.__dict__ for b in blocks)


def test_ablate_heads_rejects_bad_arguments(clf):
    with pytest.raises(ValueError, match="no head L4H0"):
        with ablate_heads(clf.model, [(4, 0)]):
            pass
    with pytest.raises(ValueError, match="mode"):
        with ablate_heads(clf.model, [(1, 0)], "mean"):
            pass
    assert count_hooks(clf.model) == 0


@pytest.mark.parametrize(
    "mode,exclude_special", [("uniform", False), ("uniform", True), ("zero", False), ("mean", False)]
)
def test_cached_sweep_equals_the_naive_full_rerun(clf, data, mode, exclude_special):
    _, enc, y = data
    scoring = HeadScoring(mode=mode, exclude_special=exclude_special, special_ids=_special(clf.tokenizer), batch_size=4)
    naive = run_ablation(clf.model, enc, y, scoring, n_bootstrap=50, sweep=SweepPlan(method="naive"))
    cached = run_ablation(clf.model, enc, y, scoring, n_bootstrap=50, sweep=SweepPlan(method="cached"))
    assert [u.key for u in naive.units] == [u.key for u in cached.units]
    assert len(naive.units) == 1 + 3 * 4 + 3 * 2
    # Bit for bit: every product of the cached sweep has the shape it has in the naive re-run.
    for key, ref in naive.per_example.items():
        np.testing.assert_array_equal(cached.per_example[key]["loss"], ref["loss"])
        np.testing.assert_array_equal(cached.per_example[key]["pred"], ref["pred"])
    pd.testing.assert_frame_equal(cached.table, naive.table, check_exact=True)
    assert cached.params["first_token_shortcut"] is False and naive.params["first_token_shortcut"] is None
    # with the shortcut allowed: equal to float rounding (some batches may take it)
    fast = run_ablation(clf.model, enc, y, scoring, n_bootstrap=50,
                        sweep=SweepPlan(method="cached", first_token_shortcut=True))
    for key, ref in naive.per_example.items():
        np.testing.assert_allclose(fast.per_example[key]["loss"], ref["loss"], rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(fast.per_example[key]["pred"], ref["pred"])
    assert fast.params["first_token_shortcut_batches"][1] == cached.params["first_token_shortcut_batches"][1]
    # ablations really changed the model's outputs
    losses = np.array([r["loss"].mean() for r in cached.per_example.values()])
    assert np.ptp(losses) > 1e-3


def test_cached_sweep_without_the_first_token_shortcut(clf, data, monkeypatch):
    """A classifier that reads every token: the check falls back to full last blocks, still exact."""
    _, enc, y = data
    model = clf.model
    h = model.bert.pooler.register_forward_pre_hook(lambda _m, a: (a[0].mean(1, keepdim=True).expand_as(a[0]),))
    try:
        naive = run_ablation(model, enc, y, HeadScoring(batch_size=4), n_bootstrap=0,
                             sweep=SweepPlan(method="naive", layers=[3]))
        cached = run_ablation(model, enc, y, HeadScoring(batch_size=4), n_bootstrap=0,
                              sweep=SweepPlan(method="cached", layers=[3], first_token_shortcut=True))
    finally:
        h.remove()
    assert cached.params["first_token_shortcut"] is False
    for key, ref in naive.per_example.items():
        np.testing.assert_array_equal(cached.per_example[key]["loss"], ref["loss"])


@pytest.mark.parametrize("rounding", ["same bits", "one ulp off", "one ulp off on the short batch"])
def test_the_shortcut_is_taken_only_where_it_gives_the_same_bits(clf, data, monkeypatch, rounding):
    """Some BLAS builds choose kernels by shape, so the one-token product may round differently: allowed, the
    shortcut is taken only on the batches where the intact model gives the same bits (simulated here: a first-token cut that
    changes nothing, or one that moves the values by one ulp), and its results equal the naive ones bit for bit."""
    import contextlib

    import bertology.experiments.ablation_sweep as ablation_module  # the check's module: where it looks the name up
    import bertology.experiments.layer_cache as layer_cache  # the cached forward's module

    _, enc, y = data

    @contextlib.contextmanager
    def simulated_shortcut(model):
        last = model.bert.encoder.layer[-1].attention.output
        def bump(out):
            if rounding == "same bits" or (rounding.endswith("short batch") and len(out) == 4):
                return out
            return torch.nextafter(out, torch.tensor(float("inf")))
        handle = last.register_forward_hook(lambda _m, _i, out: bump(out))
        try:
            yield
        finally:
            handle.remove()

    monkeypatch.setattr(ablation_module, "keep_first_token", simulated_shortcut)
    monkeypatch.setattr(layer_cache, "keep_first_token", simulated_shortcut)
    scoring = HeadScoring(batch_size=4)
    naive = run_ablation(clf.model, enc, y, scoring, n_bootstrap=20, sweep=SweepPlan(method="naive"))
    cached = run_ablation(clf.model, enc, y, scoring, n_bootstrap=20,
                          sweep=SweepPlan(method="cached", first_token_shortcut=True))
    taken, n_batches = cached.params["first_token_shortcut_batches"]
    assert len(y) % 4 and n_batches == len(y) // 4 + 1  # one short batch
    assert taken == {"same bits": n_batches, "one ulp off": 0, "one ulp off on the short batch": n_batches - 1}[rounding]
    assert cached.params["first_token_shortcut"] is (taken > 0)
    for key, ref in naive.per_example.items():
        np.testing.assert_array_equal(cached.per_example[key]["loss"], ref["loss"])
    pd.testing.assert_frame_equal(cached.table, naive.table, check_exact=True)


def test_table_has_the_contract_columns_and_conventions(clf, data):
    _, enc, y = data
    res = run_ablation(clf.model, enc, y, HeadScoring(batch_size=8), n_bootstrap=100, sweep=SweepPlan(layers=[2]))
    t = res.table
    assert list(t.columns) == TABLE_COLUMNS
    assert set(t["target"]) == {"intact", "head", "layer"}
    assert set(t["metric"]) == {"accuracy", "macro_f1", "loss"}
    lay = t[t["target"] == "layer"]
    assert set(lay["head"]) == {-1} and set(lay["layer_mode"]) == {"skip", "uniform_heads"}
    assert set(t[t["target"] == "head"]["layer"]) == {2}
    intact = t[t["target"] == "intact"]
    assert (intact["delta"] == 0).all() and (intact["layer"] == -1).all()
    assert (t["n_examples"] == len(enc.items)).all()
    assert (t["ci_low"] <= t["delta"] + 1e-12).all() and (t["delta"] <= t["ci_high"] + 1e-12).all()
    acc = accuracy_score(res.y, res.per_example["intact"]["pred"])
    assert res.intact["accuracy"] == pytest.approx(acc)


def test_interrupted_sweep_resumes_with_no_row_lost_or_duplicated(clf, data, tmp_path):
    _, enc, y = data
    kw = dict(n_bootstrap=100, seed=3)
    four = HeadScoring(batch_size=4)
    full = run_ablation(clf.model, enc, y, four, **kw)
    progress = tmp_path / "partial"
    seen: list[str] = []

    def stop_after_7(unit, done, total):
        seen.append(unit.key)
        if len(seen) == 7:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_ablation(clf.model, enc, y, four, progress_dir=progress, on_unit=stop_after_7, **kw)
    assert len(list((progress / "units").glob("*.npz"))) == 7
    assert not list((progress / "units").glob(".*tmp"))  # no half-written file
    (progress / "units" / ".head-L3-H0.npz.abc.tmp").write_bytes(b"torn")  # as a kill mid-write would leave
    rest: list[str] = []
    resumed = run_ablation(clf.model, enc, y, four, progress_dir=progress, on_unit=lambda u, d, t: rest.append(u.key), **kw)
    assert not set(rest) & set(seen) and len(rest) + 7 == len(full.units)
    assert resumed.params["resumed_units"] == 7
    assert not list((progress / "units").glob(".*tmp"))
    pd.testing.assert_frame_equal(resumed.table, full.table)
    assert not resumed.table.duplicated(["target", "layer", "head", "layer_mode", "metric"]).any()
    # another mode in the same folder: stale units are discarded, never mixed
    zero = HeadScoring(mode="zero", batch_size=4)
    other = run_ablation(clf.model, enc, y, zero, progress_dir=progress, **kw)
    assert other.params["resumed_units"] == 0
    pd.testing.assert_frame_equal(other.table, run_ablation(clf.model, enc, y, zero, **kw).table)


# ------------------------------------------------------------------------------------------ scoring


def test_macro_f1_from_counts_matches_sklearn():
    rng = np.random.default_rng(0)
    for _ in range(20):
        y = rng.integers(0, 4, 30)
        p = rng.integers(0, 3, 30)
        k = 4
        tp = np.array([((p == c) & (y == c)).sum() for c in range(k)], dtype=float)
        pc = np.array([(p == c).sum() for c in range(k)], dtype=float)
        tc = np.array([(y == c).sum() for c in range(k)], dtype=float)
        assert macro_f1_from_counts(tp, pc, tc) == pytest.approx(f1_score(y, p, average="macro", zero_division=0))


def _synthetic(n=60, seed=0):
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n)
    intact = np.where(rng.random(n) < 0.6, y, (y + 1) % 3)
    fixed = np.where(rng.random(n) < 0.9, y, intact)  # helps: fixes most errors
    broken = np.where(rng.random(n) < 0.7, (y + 2) % 3, intact)  # hurts
    loss_i = rng.random(n) + 0.5
    per = {
        "intact": {"pred": intact, "loss": loss_i},
        "head-L1-H0": {"pred": fixed, "loss": loss_i - 0.3},
        "head-L1-H1": {"pred": broken, "loss": loss_i + 0.4},
        "head-L1-H2": {"pred": intact.copy(), "loss": loss_i + rng.normal(0, 0.01, n)},
    }
    units = [Unit("intact"), Unit("head", 1, 0), Unit("head", 1, 1), Unit("head", 1, 2)]
    return units, per, y


def test_bootstrap_intervals_match_a_slow_resampling_loop():
    units, per, y = _synthetic()
    n, reps, seed = len(y), 100, 7
    t = score_units(units, per, y, mode="uniform", exclude_special=False, bootstrap=Bootstrap(reps, seed, chunk=64))
    counts = bootstrap_counts(n, reps, seed).astype(int)
    for j, u in enumerate(units[1:], start=1):
        deltas = {"accuracy": [], "macro_f1": [], "loss": []}
        for c in counts:
            idx = np.repeat(np.arange(n), c)
            yi = y[idx]
            for m, fn in (("accuracy", accuracy_score), ("macro_f1", lambda a, b: f1_score(a, b, average="macro", zero_division=0))):
                deltas[m].append(fn(yi, per[u.key]["pred"][idx]) - fn(yi, per["intact"]["pred"][idx]))
            deltas["loss"].append(per[u.key]["loss"][idx].mean() - per["intact"]["loss"][idx].mean())
        for m, d in deltas.items():
            row = t[(t["target"] == "head") & (t["head"] == u.head) & (t["metric"] == m)].iloc[0]
            assert row["ci_low"] == pytest.approx(np.percentile(d, 2.5), abs=1e-6)
            assert row["ci_high"] == pytest.approx(np.percentile(d, 97.5), abs=1e-6)


def test_helps_and_hurts_flags_follow_the_metric_direction():
    units, per, y = _synthetic()
    t = score_units(units, per, y, mode="uniform", exclude_special=False, bootstrap=Bootstrap(500, 0))
    flag = t.set_index(["head", "metric"])
    assert flag.loc[(0, "accuracy"), "helps"] and flag.loc[(0, "loss"), "helps"] and flag.loc[(0, "macro_f1"), "helps"]
    assert flag.loc[(1, "accuracy"), "hurts"] and flag.loc[(1, "loss"), "hurts"]
    assert not flag.loc[(1, "accuracy"), "helps"] and not flag.loc[(0, "loss"), "hurts"]
    assert not flag.loc[(2, "accuracy"), "helps"] and not flag.loc[(2, "accuracy"), "hurts"]  # identical predictions
    assert not t[t["target"] == "intact"]["helps"].any()
    assert list(ranked(t, "accuracy", harmful=True, top=1)["head"]) == [1]
    assert list(ranked(t, "loss", harmful=False, top=1)["head"]) == [0]


def test_plan_units_and_bad_layers():
    units = plan_units(2, 3, layer_modes=("skip",))
    assert [u.key for u in units] == [
        "intact", "head-L1-H0", "head-L1-H1", "head-L1-H2", "layer-skip-L1",
        "head-L2-H0", "head-L2-H1", "head-L2-H2", "layer-skip-L2",
    ]
    with pytest.raises(BertologyError, match="1..2"):
        plan_units(2, 3, layers=[3])


# ------------------------------------------------------------------------------------------- labels


def test_label_errors_are_clear(clf, identical_pair):
    unlabelled = Corpus.from_list(["a b", "c d"])
    with pytest.raises(BertologyError, match="needs labelled data.*2 of 2"):
        label_ids_for(unlabelled, clf.model)
    foreign = Corpus.from_list(["a", "b", "c"], labels=["pos", "neg", "0"])
    with pytest.raises(BertologyError, match=r"'neg', 'pos'.*its labels are '0', '1', '2'"):
        label_ids_for(foreign, clf.model)
    encoder = load_model(identical_pair[0])
    from bertology.tasks.catalog import task_of_model

    with pytest.raises(BertologyError, match="has no task head bertology can score .*; pass a fine-tuned classifier"):
        task_of_model(encoder.model)


def test_generic_label_names_accept_integer_labels(tmp_path):
    from transformers import BertForSequenceClassification

    from bertology.testing import tiny_config

    model = BertForSequenceClassification(tiny_config(num_labels=2))
    assert model.config.label2id == {"LABEL_0": 0, "LABEL_1": 1}
    ids = label_ids_for(Corpus.from_list(["a", "b", "c"], labels=["1", "LABEL_0", "0"]), model)
    assert list(ids) == [1, 0, 0]


# -------------------------------------------------------------------------------------------- figures


def test_figures_render(clf, data):
    from matplotlib.figure import Figure

    from bertology.experiments.head_importance import importance_table
    from bertology.viz.ablation import ablation_figures
    from bertology.viz.figures import figure_to_svg

    _, enc, y = data
    res = run_ablation(clf.model, enc, y, HeadScoring(batch_size=8), n_bootstrap=50)
    imp = importance_table(np.random.default_rng(0).random((3, 4)), len(y))
    curve = pd.DataFrame({
        "order": ["importance", "importance", "random", "random"], "step": [0, 1, 0, 1],
        "fraction_removed": [0, 0.5, 0, 0.5], "n_removed": [0, 6, 0, 6], "metric": "accuracy",
        "value": [0.8, 0.7, 0.8, 0.5], "mode": "uniform",
    })
    figs = ablation_figures(res.table, imp, curve)
    assert set(figs) == {"ablation_heads_accuracy", "ablation_layers_accuracy", "pruning_curve_accuracy", "importance_vs_ablation"}
    for fig in figs.values():
        assert isinstance(fig, Figure)
        assert "<svg" in figure_to_svg(fig)


def test_without_resamples_the_interval_is_absent_not_zero(clf, data):
    """``--bootstrap 0``: NaN intervals, no helps/hurts claims, and the summary prints no interval."""
    from bertology.experiments.ablation import _fmt_row, summary

    _, enc, y = data
    t = run_ablation(clf.model, enc, y, HeadScoring(batch_size=8), n_bootstrap=0, sweep=SweepPlan(layers=[2])).table
    assert t["ci_low"].isna().all() and t["ci_high"].isna().all()
    assert not t["helps"].any() and not t["hurts"].any()
    assert (t[t["target"] == "head"]["delta"] != 0).any()  # deltas are there; only the interval is absent
    text = summary({"ablation": t})
    assert "nan" not in text and "[+0.000, +0.000]" not in text
    head = next(t[(t["target"] == "head") & (t["metric"] == "accuracy")].itertuples())
    assert _fmt_row(head) == f"{head.label} {head.delta:+.3f}"  # the delta, and no interval
