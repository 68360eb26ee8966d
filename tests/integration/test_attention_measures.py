"""``--attention-measures`` through compare: the default run is today's, table by table; each other measure's rows
are what its contribution maps (computed on their own, outside the run's capture) give fed by hand into the
analysis; a model compared with itself shows no change under any measure."""
from __future__ import annotations

import dataclasses

import pandas as pd
import pytest
import torch

import bertology as bt
from bertology.activations.batch import PairBatch
from bertology.activations.contributions import contribution_maps
from bertology.analyses import attention_change, attention_targets
from bertology.analyses.registry import BuildContext
from bertology.data.batching import collate, length_batches
from bertology.errors import BertologyError
from bertology.models.hooks import Captured
from bertology.models.pair import ModelPair
from bertology.pipeline import make_config, prepare_inputs, resolve_settings
from bertology.testing import SENTENCES

pytestmark = pytest.mark.usefixtures("one_thread")
ANALYSES = ("attention_change", "attention_targets")
#: one sentence per line, twice: two length batches of batch size 8
BATCH = 8


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "d.txt"
    path.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    return path


def _run(pair_dirs, data, out, **settings):
    base, tuned = pair_dirs
    return bt.compare(str(base), str(tuned), str(data), out=str(out), analyses=list(ANALYSES), batch_size=BATCH,
                      view_examples=0, report=False, **settings)


@pytest.fixture(scope="module")
def runs(planted_pair, data, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("runs")
    return {"plain": _run(planted_pair, data, tmp / "plain"),
            "weights": _run(planted_pair, data, tmp / "weights", attention_measures="weights"),
            "three": _run(planted_pair, data, tmp / "three", attention_measures=("weights", "norm", "rollout"))}


def test_the_default_is_today_s_run_table_by_table(runs):
    plain, weights = runs["plain"], runs["weights"]
    assert plain.manifest["fingerprint"] == weights.manifest["fingerprint"]
    assert sorted(plain.manifest["tables"]) == sorted(weights.manifest["tables"])
    for name in plain.manifest["tables"]:
        assert "measure" not in plain.table(name).columns
        pd.testing.assert_frame_equal(plain.table(name), weights.table(name))


def test_weights_rows_are_the_default_run_s_rows(runs):
    three = runs["three"]
    assert three.manifest["fingerprint"] != runs["plain"].manifest["fingerprint"]
    assert three.manifest["config"]["attention_measures"] == ["weights", "norm", "rollout"]
    for name in ANALYSES:
        table = three.table(name)
        assert list(table.columns)[0] == "measure"
        assert table["measure"].unique().tolist() == ["weights", "norm", "rollout"]
        assert three.manifest["analyses"][name]["attention_measures"] == ["weights", "norm", "rollout"]
        rows = table[table["measure"] == "weights"].drop(columns="measure").reset_index(drop=True)
        pd.testing.assert_frame_equal(rows, runs["plain"].table(name))


def _by_hand(pair_dirs, data, measure: str) -> dict[str, pd.DataFrame]:
    """Both analyses fed batch by batch with ``contribution_maps``' maps of each model, as the run batches them."""
    base, tuned = pair_dirs
    config, selection, _ = resolve_settings(make_config(str(data), base=str(base), tuned=str(tuned),
                                                        analyses=ANALYSES, batch_size=BATCH))
    pair = ModelPair.load(str(base), str(tuned))
    inputs = prepare_inputs(config, selection, None, pair.tokenizer)
    heads = 1 if measure == "rollout" else pair.num_heads
    ctx = BuildContext(pair.num_layers, heads, pair.tokenizer, inputs.corpus, inputs.encoded)
    analyses = [attention_change._build(config, ctx), attention_targets._build(config, ctx)]
    with torch.inference_mode():
        for items in length_batches(inputs.encoded.items, BATCH):
            t = collate(items, pair.tokenizer.pad_token_id or 0, None)
            maps = [contribution_maps(m.model, t, (measure,))[measure] for m in (pair.base, pair.tuned)]
            batch = PairBatch(items, t["input_ids"], t["mask"], t["content"], t["lengths"],
                              Captured([], maps[0]), Captured([], maps[1]))
            for a in analyses:
                a.update(batch)
    tables = {a.name: a.compute().table for a in analyses}
    if measure == "rollout":  # one map per layer: its rows are the layer's, head -1
        tables = {n: t.assign(head=-1) for n, t in tables.items()}
    return tables


@pytest.mark.parametrize("measure", ["norm", "rollout"])
def test_a_measure_s_rows_are_its_maps_fed_by_hand(runs, planted_pair, data, measure):
    by_hand = _by_hand(planted_pair, data, measure)
    for name in ANALYSES:
        table = runs["three"].table(name)
        rows = table[table["measure"] == measure].drop(columns="measure").reset_index(drop=True)
        assert len(rows) == len(by_hand[name]) > 0
        # the same forward and the same arithmetic on float32 maps; float64 sums: equal to float32 rounding
        pd.testing.assert_frame_equal(rows, by_hand[name], check_exact=False, rtol=1e-6, atol=1e-7)
    if measure == "rollout":
        assert set(runs["three"].table("attention_change").query("measure == 'rollout'")["head"]) == {-1}


def test_the_planted_head_changes_under_norm_too(runs):
    t = runs["three"].table("attention_change")
    norm = t[t["measure"] == "norm"].set_index(["layer", "head"])["cosine"]
    assert norm.idxmin() == (2, 1) and norm.min() < 0.99  # only L2H1 differs in the planted pair
    assert norm.drop((2, 1)).min() > 1 - 1e-6


def test_a_model_compared_with_itself_shows_no_change_under_every_measure(identical_pair, data, tmp_path):
    measures = ("weights", "norm", "rollout", "value_zeroing")
    run = _run(identical_pair, data, tmp_path / "same", attention_measures=measures)
    change = run.table("attention_change")
    assert change["measure"].unique().tolist() == list(measures)
    # the same weights give the same maps: cosine 1 and JS 0 up to float32 rounding of the maps
    assert change["cosine"].min() > 1 - 1e-6 and change["js_divergence"].abs().max() < 1e-6
    targets = run.table("attention_targets")
    base, tuned = (targets[targets["model"] == m].drop(columns="model").reset_index(drop=True) for m in ("base", "tuned"))
    pd.testing.assert_frame_equal(base, tuned)


def test_a_run_with_measures_resumes_its_own_tables(runs, planted_pair, data):
    again = _run(planted_pair, data, runs["three"].out, attention_measures=("weights", "norm", "rollout"))
    assert sorted(again.manifest["resumed_tables"]) == sorted(ANALYSES)
    for name in ANALYSES:
        pd.testing.assert_frame_equal(again.table(name), runs["three"].table(name))


def test_a_bad_measure_is_one_line_from_bt_compare(planted_pair, data, tmp_path):
    with pytest.raises(BertologyError, match=r"^--attention-measures \(attention_measures\) must be one of weights, "
                                             r"norm, rollout, value_zeroing, not 'alti'\.$"):
        _run(planted_pair, data, tmp_path / "bad", attention_measures="weights,alti")
    assert not (tmp_path / "bad").exists()
