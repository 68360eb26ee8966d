"""Michel et al. head importance against finite differences, per-layer normalisation, pruning curves
(orders, steps, resuming) and the rank correlation with single-head deltas."""
import copy

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from bertology.experiments.ablation import HeadScoring, SweepPlan, label_ids_for, make_batches, run_ablation
from bertology.experiments.head_importance import (
    CURVE_COLUMNS,
    IMPORTANCE_COLUMNS,
    PruningPlan,
    _steps,
    gradient_pass,
    importance_table,
    importance_vs_deltas,
    normalise_per_layer,
    run_head_importance,
)
from bertology.data.corpus import Corpus
from bertology.data.encode import encode_corpus
from bertology.models.hooks import count_hooks
from bertology.models.loading import load_model
from bertology.testing import SENTENCES, save_tiny_bert


@pytest.fixture(scope="module")
def clf(tmp_path_factory):
    folder = save_tiny_bert(tmp_path_factory.mktemp("imp"), classifier=True, num_labels=2, initializer_range=0.3)
    return load_model(folder)


@pytest.fixture(scope="module")
def data(clf):
    corpus = Corpus.from_list(SENTENCES * 2, labels=[str(i % 2) for i in range(2 * len(SENTENCES))])
    return corpus, encode_corpus(corpus, clf.tokenizer), label_ids_for(corpus, clf.model)


def test_importance_is_the_mean_absolute_per_example_gradient(clf, data):
    """Against central finite differences of each example's loss in float64, one example at a time."""
    _, enc, y = data
    model = copy.deepcopy(clf.model).double()
    batches = make_batches(enc, y, batch_size=7, pad_id=0, use_token_types=True)
    raw, _ = gradient_pass(model, batches)
    assert raw.shape == (2, 4) and (raw > 0).all()

    size, eps = 8, 1e-6
    ref = np.zeros((2, 4))
    for it in enc.items[:20]:
        ids = torch.from_numpy(it.input_ids)[None]
        target = torch.tensor([y[it.index]])
        for layer in (1, 2):
            dense = model.bert.encoder.layer[layer - 1].attention.output.dense
            for head in range(4):
                losses = []
                for scale in (1 + eps, 1 - eps):
                    def pre(_m, args, scale=scale, head=head):
                        x = args[0].clone()
                        x[..., head * size:(head + 1) * size] *= scale
                        return (x,)

                    h = dense.register_forward_pre_hook(pre)
                    try:
                        with torch.no_grad():
                            losses.append(float(F.cross_entropy(model(input_ids=ids).logits, target)))
                    finally:
                        h.remove()
                ref[layer - 1, head] += abs(losses[0] - losses[1]) / (2 * eps)
    ref /= len(enc.items)
    np.testing.assert_allclose(raw, ref, rtol=1e-4)
    assert count_hooks(model) == 0
    assert all(p.requires_grad for p in model.parameters())  # parameters restored


def test_batching_does_not_change_importance(clf, data):
    _, enc, y = data
    a, rec_a = gradient_pass(clf.model, make_batches(enc, y, batch_size=3, pad_id=0, use_token_types=True))
    b, rec_b = gradient_pass(clf.model, make_batches(enc, y, batch_size=20, pad_id=0, use_token_types=True))
    np.testing.assert_allclose(a, b, rtol=1e-4)
    np.testing.assert_allclose(rec_a["loss"], rec_b["loss"], rtol=1e-5)


def test_per_layer_normalisation_and_ranks():
    raw = np.array([[3.0, 4.0, 0.0], [1.0, 1.0, 1.0]])
    norm = normalise_per_layer(raw)
    np.testing.assert_allclose(np.linalg.norm(norm, axis=1), 1.0)
    np.testing.assert_allclose(norm[0], [0.6, 0.8, 0.0])
    t = importance_table(raw, 10)
    assert list(t.columns) == IMPORTANCE_COLUMNS
    assert t.sort_values("rank")["label"].tolist()[:2] == ["L1H1", "L1H0"]
    assert sorted(t["rank"]) == list(range(1, 7))
    kept = normalise_per_layer(raw, np.array([[True, False, True], [True, True, True]]))
    np.testing.assert_allclose(kept[0], [1.0, 0.0, 0.0])


def test_steps():
    assert _steps(8, 0.25) == [0, 2, 4, 6, 8]
    assert _steps(72, 0.1) == [0, 7, 14, 21, 28, 35, 42, 49, 56, 63, 70, 72]
    assert _steps(3, 1.0) == [0, 3]


def test_pruning_curves(clf, data):
    _, enc, y = data
    res = run_head_importance(clf.model, enc, y, HeadScoring(mode="zero", batch_size=8), pruning=PruningPlan(0.25, seed=1))
    c = res.curve
    assert list(c.columns) == CURVE_COLUMNS
    assert set(c["order"]) == {"importance", "random"} and set(c["metric"]) == {"accuracy", "macro_f1", "loss"}
    acc = c[c["metric"] == "loss"].pivot(index="n_removed", columns="order", values="value")
    assert list(acc.index) == [0, 2, 4, 6, 8]
    assert acc.loc[0, "importance"] == acc.loc[0, "random"]  # both start from the intact model
    assert acc.loc[8, "importance"] == pytest.approx(acc.loc[8, "random"])  # and end with every head removed
    intact = run_ablation(clf.model, enc, y, n_bootstrap=0, sweep=SweepPlan(heads=False, layer_modes=())).intact
    assert acc.loc[0, "importance"] == pytest.approx(intact["loss"])
    # the first heads removed are the least important of the intact model
    first = res.importance.sort_values(["importance", "layer", "head"]).label.tolist()[:2]
    assert res.removal_order["importance"][:2] == first
    assert len(set(res.removal_order["importance"])) == 8 and len(res.removal_order["random"]) == 8
    again = run_head_importance(clf.model, enc, y, HeadScoring(mode="zero", batch_size=8), pruning=PruningPlan(0.25, seed=1))
    pd.testing.assert_frame_equal(res.curve, again.curve)
    assert res.removal_order == again.removal_order


def test_without_recomputation_the_order_is_the_intact_ranking(clf, data):
    _, enc, y = data
    res = run_head_importance(clf.model, enc, y, HeadScoring(batch_size=8),
                              pruning=PruningPlan(0.125, recompute=False, orders=("importance",)))
    order = res.importance.sort_values(["importance", "layer", "head"])["label"].tolist()
    assert res.removal_order["importance"] == order
    assert not res.curve["recompute"].any()


def test_interrupted_importance_resumes(clf, data, tmp_path):
    _, enc, y = data
    kw = dict(scoring=HeadScoring(batch_size=8), pruning=PruningPlan(0.25, seed=2))
    full = run_head_importance(clf.model, enc, y, **kw)
    calls = []

    def stop(name, done, total):
        calls.append(name)
        if len(calls) == 4:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_head_importance(clf.model, enc, y, progress_dir=tmp_path, on_step=stop, **kw)
    resumed = run_head_importance(clf.model, enc, y, progress_dir=tmp_path, **kw)
    pd.testing.assert_frame_equal(resumed.curve, full.curve)
    pd.testing.assert_frame_equal(resumed.importance, full.importance)
    assert resumed.removal_order == full.removal_order


def test_importance_vs_deltas_signs():
    imp = importance_table(np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]), 5)
    rows = []
    for r in imp.itertuples():
        rows += [
            {"target": "head", "layer": r.layer, "head": r.head, "metric": "loss", "delta": 0.1 * r.importance_raw},
            {"target": "head", "layer": r.layer, "head": r.head, "metric": "accuracy", "delta": -0.01 * r.importance_raw},
            {"target": "head", "layer": r.layer, "head": r.head, "metric": "macro_f1", "delta": 0.0},
        ]
    rows.append({"target": "layer", "layer": 1, "head": -1, "metric": "loss", "delta": 9.0})
    # normalised importance per layer is increasing within each layer but not across: use raw-ordered deltas
    rho = importance_vs_deltas(imp, pd.DataFrame(rows))
    expected = imp["importance"].rank().corr(imp["importance_raw"].rank())
    assert rho["loss"]["spearman"] == pytest.approx(expected)
    assert rho["accuracy"]["spearman"] == pytest.approx(expected)
    assert np.isnan(rho["macro_f1"]["spearman"]) and rho["loss"]["n"] == 6
