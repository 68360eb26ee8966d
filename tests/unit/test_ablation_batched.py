"""The batched ablation sweep (``SweepPlan.units_per_forward`` = K > 1: K head units per forward, on K copies of
each batch) against the one-unit sweep; the row-group hooks against separate ablations; resuming a batched sweep
interrupted in the middle of a group; the fingerprint of a one-unit sweep; the automatic K.

The bound (every comparison below): a batched unit multiplies the same numbers as the one-unit sweep, in matrices
with K times as many rows. A BLAS kernel picked by shape may sum a dot product in another order, which moves the
product by a few ulp of its magnitude; LayerNorm after every sublayer keeps the hidden states at unit scale, so over
the tiny models' 2-3 blocks the logits move by a few ulp of their own magnitude (3 ulp of max|z| on our development
CPU; 0 where the kernels do not depend on the row count). We allow ``DELTA = 16 eps32 max|z|`` on every logit
(>= 16 ulp of the largest). Cross-entropy is 2-Lipschitz in the logits in the max norm (the gradient
``softmax(z) - onehot(y)`` has an l1 norm <= 2), so a per-example loss moves by <= ``2 DELTA`` plus its own rounding
(``4 eps32 loss``); a prediction cannot change where the one-unit sweep's top-two margin exceeds ``2 DELTA``.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

import bertology.experiments.ablation_sweep as ablation_sweep
from bertology.data.corpus import Corpus, Example
from bertology.data.encode import encode_corpus
from bertology.experiments.ablation import (
    AblationSettings,
    HeadScoring,
    SweepPlan,
    head_means,
    label_ids_for,
    run_ablation,
    run_ablation_study,
)
from bertology.experiments.ablation_sweep import AUTO_UNITS_ON_CUDA, forward_bytes, units_per_forward_for
from bertology.experiments.ablation_units import plan_units
from bertology.experiments.scoring import classifier_batches, fingerprint_of, split_rows, tile_rows
from bertology.models.ablate import ablate_head_groups, ablate_heads
from bertology.models.hooks import count_hooks
from bertology.models.loading import load_model
from bertology.testing import SENTENCES, save_tiny_bert, save_tiny_family

EPS = float(torch.finfo(torch.float32).eps)
PAIRS = [("the cat sat .", "a dog ran fast ."), ("i love this movie", "it was boring"), ("john saw mary", "she read a book .")]
#: the ablation table's columns that are not floats: equal between a batched and a one-unit sweep
EXACT_COLUMNS = ["target", "layer", "head", "label", "mode", "layer_mode", "exclude_special", "metric", "n_examples",
                 "helps", "hurts", "n_predicted", "task"]
FLOAT_COLUMNS = ["value", "delta", "ci_low", "ci_high", "chance"]


@pytest.fixture(scope="module")
def clf(tmp_path_factory):
    """A 3-layer, 4-head, 3-label tiny BERT classifier with weights large enough that ablations matter."""
    folder = save_tiny_bert(
        tmp_path_factory.mktemp("clf"), classifier=True, num_labels=3, num_hidden_layers=3, initializer_range=0.3
    )
    return load_model(folder)


def _corpus() -> Corpus:
    texts = SENTENCES + [a for a, _ in PAIRS]
    pairs = [None] * len(SENTENCES) + [b for _, b in PAIRS]
    return Corpus([Example(text=t, text_pair=p, label=str(i % 3)) for i, (t, p) in enumerate(zip(texts, pairs))])


@pytest.fixture(scope="module")
def data(clf):
    corpus = _corpus()
    return corpus, encode_corpus(corpus, clf.tokenizer), label_ids_for(corpus, clf.model)


def _scoring(tok, mode: str, exclude_special: bool = False, batch_size: int = 4) -> HeadScoring:
    return HeadScoring(mode=mode, exclude_special=exclude_special, special_ids=[tok.cls_token_id, tok.sep_token_id],
                       batch_size=batch_size)


def _sweep_with_logits(monkeypatch, model, enc, y, scoring, **plan):
    """``run_ablation`` and every finished unit's logits (the batches' rows in order), caught at ``_Sweep._finish``."""
    logits: dict[str, torch.Tensor] = {}
    original = ablation_sweep._Sweep._finish

    def keep(self, unit, lg):
        logits[unit.key] = torch.cat(lg)
        return original(self, unit, lg)

    monkeypatch.setattr(ablation_sweep._Sweep, "_finish", keep)
    try:
        result = run_ablation(model, enc, y, scoring, n_bootstrap=20, sweep=SweepPlan(**plan))
    finally:
        monkeypatch.setattr(ablation_sweep._Sweep, "_finish", original)
    return result, logits


def _assert_within_the_bound(one, one_logits, many, many_logits, positions) -> None:
    """The module docstring's bound: logits within DELTA, losses within 2 DELTA + their rounding, predictions equal
    where the one-unit margin exceeds 2 DELTA, the table's non-float columns equal and its floats within the loss bound.
    ``positions``: the batches' item positions (the logits' rows, in order)."""
    assert list(one_logits) and sorted(one_logits) == sorted(many_logits) == sorted(one.per_example)
    zmax = max(float(z.abs().max()) for z in one_logits.values())
    delta = 16 * EPS * zmax
    for key, z in one_logits.items():
        assert float((many_logits[key] - z).abs().max()) <= delta, key
        a, b = one.per_example[key], many.per_example[key]
        np.testing.assert_allclose(b["loss"], a["loss"], rtol=4 * EPS, atol=2 * delta, err_msg=key)
        top2 = z.topk(2, dim=-1).values
        clear = (top2[:, 0] - top2[:, 1] > 2 * delta).numpy()
        rows = np.concatenate(positions)
        assert (a["pred"][rows[clear]] == b["pred"][rows[clear]]).all(), key
    loss_bound = 2 * delta + 4 * EPS * max(float(r["loss"].max()) for r in one.per_example.values())
    pd.testing.assert_frame_equal(many.table[EXACT_COLUMNS], one.table[EXACT_COLUMNS], check_exact=True)
    # a mean of losses, or a difference of two such means (deltas, their percentiles): <= 2 loss bounds
    np.testing.assert_allclose(many.table[FLOAT_COLUMNS].to_numpy(float), one.table[FLOAT_COLUMNS].to_numpy(float),
                               rtol=0, atol=2 * loss_bound)


@pytest.mark.parametrize("mode,exclude_special", [("uniform", False), ("uniform", True), ("zero", False), ("mean", False)])
@pytest.mark.parametrize("k", [3, 20], ids=["K=3, a remainder group", "K above the heads of a layer"])
def test_batched_sweep_equals_the_one_unit_sweep_within_the_bound(clf, data, monkeypatch, mode, exclude_special, k):
    """Cached and naive: K units per forward against one; 4 heads + the all-heads unit = 5 head units per layer, so
    K=3 makes a group of 3 and a remainder of 2, K=20 one group of 5."""
    _, enc, y = data
    scoring = _scoring(clf.tokenizer, mode, exclude_special)
    positions = classifier_batches(clf.model, enc, y, scoring).positions
    for method in ("cached", "naive"):
        one, one_logits = _sweep_with_logits(monkeypatch, clf.model, enc, y, scoring, method=method, units_per_forward=1)
        many, many_logits = _sweep_with_logits(monkeypatch, clf.model, enc, y, scoring, method=method,
                                               units_per_forward=k)
        assert one.params["units_per_forward"] == 1 and many.params["units_per_forward"] == k
        assert many.params["method"] == method
        _assert_within_the_bound(one, one_logits, many, many_logits, positions)
    # the ablations changed the outputs (the comparison is not between two copies of the intact model)
    losses = np.array([r["loss"].mean() for r in many.per_example.values()])
    assert np.ptp(losses) > 1e-3


def test_the_groups_are_cut_from_the_plan(clf, data):
    """Head units of one layer K at a time, in plan order; skip and intact alone; finished units only fill groups."""
    _, enc, y = data
    units = plan_units(3, 4, layers=[1, 2])
    batches = classifier_batches(clf.model, enc, y, HeadScoring(batch_size=4))
    sweep = ablation_sweep._Sweep(clf.model, batches, None, HeadScoring(), units, on_unit=None, units_per_forward=3)
    keys = [[u.key for u in g] for g in sweep._groups(units)]
    assert keys[:4] == [["intact"], ["head-L1-H0", "head-L1-H1", "head-L1-H2"], ["head-L1-H3", "layer-heads-L1"],
                        ["layer-skip-L1"]]
    assert sum(len(g) for g in keys) == len(units)
    # with L1's first three finished, the group holding H3 still holds the all-heads unit; the finished group is gone
    pending = [u for u in units if u.key not in ("intact", "head-L1-H0", "head-L1-H1", "head-L1-H2", "head-L1-H3")]
    assert [[u.key for u in g] for g in sweep._groups(pending)][0] == ["head-L1-H3", "layer-heads-L1"]
    sweep.units_per_forward = 1
    assert [[u.key for u in g] for g in sweep._groups(units)] == [[u.key] for u in units]


@pytest.mark.parametrize("mode", ["uniform", "zero", "mean"])
def test_row_groups_equal_separate_ablations(clf, data, mode):
    """``ablate_head_groups`` on a batch tiled 3 times: row group k within the bound of ``ablate_heads`` with group
    k's heads on the plain batch; an empty group is the intact model. The hooks are removed afterwards."""
    _, enc, y = data
    scoring = _scoring(clf.tokenizer, mode, exclude_special=mode == "uniform")
    batches = classifier_batches(clf.model, enc, y, scoring)
    means = head_means(clf.model, batches) if mode == "mean" else None
    groups = [[(1, 0)], [(2, 1), (2, 3), (3, 0)], []]
    kw = dict(exclude_special=scoring.exclude_special, special_ids=scoring.special_ids, means=means)
    before = count_hooks(clf.model)
    with torch.inference_mode():
        for inp in batches.inputs:
            with ablate_head_groups(clf.model, groups, mode, **kw):
                together = split_rows([clf.model(**tile_rows(inp, len(groups))).logits], len(groups))
            intact = clf.model(**inp).logits
            for heads, (got,) in zip(groups, together):
                with ablate_heads(clf.model, heads, mode, **kw):
                    alone = clf.model(**inp).logits
                assert float((got - alone).abs().max()) <= 16 * EPS * float(alone.abs().max())
                if heads:
                    assert float((alone - intact).abs().max()) > 1e-4  # the group's heads were ablated
            assert float((together[2][0] - intact).abs().max()) <= 16 * EPS * float(intact.abs().max())
    assert count_hooks(clf.model) == before
    with pytest.raises(RuntimeError, match="equal row groups"):
        with torch.inference_mode(), ablate_head_groups(clf.model, groups, mode, **kw):
            clf.model(**batches.inputs[0])  # 4 rows cannot hold 3 groups


def test_interrupted_batched_sweep_resumes_to_the_same_table(clf, data, tmp_path):
    """Interrupted in the middle of a group (after layer 1's head 3, before its all-heads unit, which shares its
    forward): the resumed sweep runs that group again (the same shapes) and records only the unfinished unit, so
    the table equals an uninterrupted batched sweep's exactly."""
    _, enc, y = data
    scoring = _scoring(clf.tokenizer, "uniform")
    plan = SweepPlan(units_per_forward=3)
    kw = dict(n_bootstrap=100, seed=3, sweep=plan)
    full = run_ablation(clf.model, enc, y, scoring, **kw)
    progress = tmp_path / "partial"
    seen: list[str] = []

    def stop_after_4(unit, done, total):
        seen.append(unit.key)
        if len(seen) == 4:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_ablation(clf.model, enc, y, scoring, progress_dir=progress, on_unit=stop_after_4, **kw)
    # the cached sweep runs layer 1's groups first (the intact unit finishes at the last layer)
    assert seen == ["head-L1-H0", "head-L1-H1", "head-L1-H2", "head-L1-H3"]
    rest: list[str] = []
    resumed = run_ablation(clf.model, enc, y, scoring, progress_dir=progress, on_unit=lambda u, d, t: rest.append(u.key),
                           **kw)
    assert rest[0] == "layer-heads-L1" and not set(rest) & set(seen) and len(rest) + 4 == len(full.units)
    assert resumed.params["resumed_units"] == 4 and resumed.params["fingerprint"] == full.params["fingerprint"]
    pd.testing.assert_frame_equal(resumed.table, full.table, check_exact=True)
    # a one-unit sweep in the same folder has another fingerprint: the batched units are discarded, never mixed in
    one = run_ablation(clf.model, enc, y, scoring, progress_dir=progress, **{**kw, "sweep": SweepPlan(units_per_forward=1)})
    assert one.params["resumed_units"] == 0


def test_a_one_unit_sweep_keeps_its_fingerprint(clf, data):
    """K=1 (given, or auto on the CPU) hashes the settings a sweep hashed before K existed: old caches stay valid."""
    _, enc, y = data
    scoring = _scoring(clf.tokenizer, "zero")
    batches = classifier_batches(clf.model, enc, y, scoring)
    before = fingerprint_of(clf.model, batches, {
        "mode": "zero", "exclude_special": False, "special_ids": sorted(scoring.special_ids), "batch_size": 4,
        "means": None})
    kw = dict(n_bootstrap=0, sweep=SweepPlan(layers=[3]))
    auto = run_ablation(clf.model, enc, y, scoring, **kw)
    one = run_ablation(clf.model, enc, y, scoring, **{**kw, "sweep": SweepPlan(layers=[3], units_per_forward=1)})
    two = run_ablation(clf.model, enc, y, scoring, **{**kw, "sweep": SweepPlan(layers=[3], units_per_forward=2)})
    assert auto.params["units_per_forward"] == 1
    assert auto.params["fingerprint"] == one.params["fingerprint"] == before != two.params["fingerprint"]


def test_the_automatic_k(clf, data):
    """1 off CUDA; on CUDA at most AUTO_UNITS_ON_CUDA, fewer when a quarter of the device's memory holds fewer copies of
    one forward's activations (the arithmetic, run here with a stated device and memory)."""
    _, enc, y = data
    batches = classifier_batches(clf.model, enc, y, HeadScoring(batch_size=4))
    assert units_per_forward_for(None, clf.model, batches) == 1
    assert units_per_forward_for(5, clf.model, batches) == 5
    cuda = torch.device("cuda")
    one = forward_bytes(clf.model, batches)
    t = max(inp["input_ids"].shape[1] for inp in batches.inputs)
    assert one >= 4 * 4 * t * 32  # at least one row's hidden states, float32
    assert units_per_forward_for(None, clf.model, batches, device=cuda, memory_bytes=10**12) == AUTO_UNITS_ON_CUDA
    assert units_per_forward_for(None, clf.model, batches, device=cuda, memory_bytes=4 * one * 3) == 3
    assert units_per_forward_for(None, clf.model, batches, device=cuda, memory_bytes=0) == 1
    for bad in (0, -2, 1.5, True):
        with pytest.raises(ValueError, match="units_per_forward"):
            units_per_forward_for(bad, clf.model, batches)


def test_the_setting_reaches_the_sweep_and_the_manifest(clf, data):
    """``AblationSettings.units_per_forward`` (``--units-per-forward``; 0 = auto) is the sweep's K, recorded."""
    corpus, enc, _ = data
    assert AblationSettings(units_per_forward=0).units_per_forward is None
    settings = AblationSettings(units_per_forward=2, layers=(2,), importance=False, n_bootstrap=0, batch_size=4)
    study = run_ablation_study(clf.model, clf.tokenizer, corpus, settings, None, encoded=enc)
    assert study.summary["ablation"]["units_per_forward"] == 2
    assert study.summary["settings"]["units_per_forward"] == 2


def test_compare_declares_the_setting_once_and_keeps_its_fingerprint():
    """compare's ``ablation_units_per_forward`` (a study's [compare] takes it too) reaches the sweep's settings, and,
    like the device, leaves the run's fingerprint as it was (it changes the numbers by float rounding only)."""
    from bertology.config import CompareConfig
    from bertology.experiments.ablation import settings_from
    from bertology.commands.selection import complete_config

    plain = complete_config(CompareConfig())
    four = complete_config(CompareConfig(ablation_units_per_forward=4))
    assert settings_from(plain).units_per_forward is None and settings_from(four).units_per_forward == 4
    assert plain.fingerprint() == four.fingerprint()


@pytest.mark.parametrize("model_type", ["distilbert", "modernbert"])
def test_a_family_without_the_cached_layout_batches_its_full_forwards(tmp_path, monkeypatch, model_type):
    """The plain (naive) sweep of a family without ``cached_sweep`` runs K units per full forward, within the bound."""
    loaded = load_model(save_tiny_family(tmp_path / model_type, model_type, classifier=True, num_labels=3))
    corpus = Corpus([Example(text=t, label=str(i % 3)) for i, t in enumerate(SENTENCES * 2)])
    enc = encode_corpus(corpus, loaded.tokenizer)
    y = label_ids_for(corpus, loaded.model)
    for mode in ("uniform", "zero"):
        scoring = _scoring(loaded.tokenizer, mode, batch_size=3)
        positions = classifier_batches(loaded.model, enc, y, scoring).positions
        one, one_logits = _sweep_with_logits(monkeypatch, loaded.model, enc, y, scoring, units_per_forward=1)
        many, many_logits = _sweep_with_logits(monkeypatch, loaded.model, enc, y, scoring, units_per_forward=3)
        assert one.params["method"] == many.params["method"] == "naive"
        _assert_within_the_bound(one, one_logits, many, many_logits, positions)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_a_gpu_auto_batches_within_the_bound(tmp_path, monkeypatch):
    """On CUDA the automatic K is AUTO_UNITS_ON_CUDA for a tiny model (memory is no bound) and the batched sweep
    stays within the module's bound of the one-unit sweep on the same device."""
    import copy

    folder = save_tiny_bert(tmp_path / "gpu", classifier=True, num_labels=3, num_hidden_layers=3, initializer_range=0.3)
    loaded = load_model(folder)
    model = copy.deepcopy(loaded.model)
    corpus = _corpus()
    enc = encode_corpus(corpus, loaded.tokenizer)
    y = label_ids_for(corpus, model)
    scoring = HeadScoring(mode="uniform", special_ids=[loaded.tokenizer.cls_token_id, loaded.tokenizer.sep_token_id],
                          batch_size=4, device="cuda")
    positions = classifier_batches(model, enc, y, scoring).positions
    one, one_logits = _sweep_with_logits(monkeypatch, model, enc, y, scoring, units_per_forward=1)
    auto, auto_logits = _sweep_with_logits(monkeypatch, model, enc, y, scoring)
    assert auto.params["units_per_forward"] == AUTO_UNITS_ON_CUDA
    _assert_within_the_bound(one, {k: v.cpu() for k, v in one_logits.items()}, auto,
                             {k: v.cpu() for k, v in auto_logits.items()}, positions)
