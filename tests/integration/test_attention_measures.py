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
from bertology.analyses.catalog import ANALYSES as CATALOG
from bertology.analyses.registry import BuildContext
from bertology.data.batching import collate, length_batches
from bertology.errors import BertologyError
from bertology.models.hooks import Captured
from bertology.models.pair import ModelPair
from bertology.commands.compare import prepare_inputs, resolve_settings
from bertology.commands.selection import make_config

pytestmark = pytest.mark.usefixtures("one_thread")
#: every analysis that reads attention maps (their specs say ``per_measure=True``)
ANALYSES = ("attention_change", "attention_patterns", "attention_targets", "relation_heads", "head_map")
#: small enough that the sentences make two length batches
BATCH = 3
#: settings the tiny treebank needs (relations seen once; the head map's sample)
SMALL = dict(relation_min_count=1, head_map_examples=4)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """Four CoNLL-U sentences: every attention analysis (relation heads too) has what it needs."""
    rows = ["the cats sat on the mat .".split(), "she liked the dogs and the books .".split()]
    heads = [[2, 3, 0, 6, 6, 3, 3], [2, 0, 4, 2, 7, 7, 4, 2]]
    upos = [["DET", "NOUN", "VERB", "ADP", "DET", "NOUN", "PUNCT"],
            ["PRON", "VERB", "DET", "NOUN", "CCONJ", "DET", "NOUN", "PUNCT"]]
    rels = [["det", "nsubj", "root", "case", "det", "obl", "punct"],
            ["nsubj", "root", "det", "obj", "cc", "det", "conj", "punct"]]
    lines = []
    sentences = list(zip(rows, heads, upos, rels))
    for words, hs, us, rs in sentences + sentences[::-1]:
        lines.append("# text = " + " ".join(words))
        lines += [f"{i}\t{w}\t{w}\t{u}\t_\t_\t{h}\t{r}\t_\t_" for i, (w, h, u, r) in enumerate(zip(words, hs, us, rs), 1)]
        lines.append("")
    path = tmp_path_factory.mktemp("ud") / "tiny.conllu"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _run(pair_dirs, data, out, **settings):
    base, tuned = pair_dirs
    return bt.compare(str(base), str(tuned), str(data), out=str(out), analyses=list(ANALYSES), batch_size=BATCH,
                      view_examples=0, report=False, **SMALL, **settings)


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


def test_the_analyses_that_read_maps_declare_it():
    assert sorted(s.name for s in CATALOG.specs() if s.per_measure) == sorted(ANALYSES)


def test_weights_rows_are_the_default_run_s_rows(runs):
    three = runs["three"]
    assert three.manifest["fingerprint"] != runs["plain"].manifest["fingerprint"]
    assert three.manifest["config"]["attention_measures"] == ["weights", "norm", "rollout"]
    assert sorted(three.manifest["tables"]) == sorted(runs["plain"].manifest["tables"])
    for name in three.manifest["tables"]:
        table = three.table(name)
        assert list(table.columns)[0] == "measure"
        assert table["measure"].unique().tolist() == ["weights", "norm", "rollout"]
        rows = table[table["measure"] == "weights"].drop(columns="measure").reset_index(drop=True)
        pd.testing.assert_frame_equal(rows, runs["plain"].table(name))
    for name in ANALYSES:
        assert three.manifest["analyses"][name]["attention_measures"] == ["weights", "norm", "rollout"]


def _by_hand(pair_dirs, data, measure: str) -> dict[str, pd.DataFrame]:
    """Both analyses fed batch by batch with ``contribution_maps``' maps of each model, as the run batches them."""
    base, tuned = pair_dirs
    config, selection, _ = resolve_settings(make_config(str(data), base=str(base), tuned=str(tuned),
                                                        analyses=ANALYSES, batch_size=BATCH, **SMALL))
    pair = ModelPair.load(str(base), str(tuned))
    inputs = prepare_inputs(config, selection, None, pair.tokenizer)
    heads = 1 if measure == "rollout" else pair.num_heads
    ctx = BuildContext(pair.num_layers, heads, pair.tokenizer, inputs.corpus, inputs.encoded)
    analyses = [CATALOG.spec(name).build(config, ctx) for name in ANALYSES]  # each analysis's own builder
    with torch.inference_mode():
        for items in length_batches(inputs.encoded.items, BATCH):
            t = collate(items, pair.tokenizer.pad_token_id or 0, None)
            maps = [contribution_maps(m.model, t, (measure,))[measure] for m in (pair.base, pair.tuned)]
            batch = PairBatch(items, t["input_ids"], t["mask"], t["content"], t["lengths"],
                              Captured([], maps[0]), Captured([], maps[1]))
            for a in analyses:
                a.update(batch)
    tables = {r.name: r.table for a in analyses for r in a.results()}
    if measure == "rollout":  # one map per layer: its rows are the layer's, head -1
        tables = {n: t.assign(**{c: -1 for c in ("head", "head_a", "head_b") if c in t}) for n, t in tables.items()}
    return tables


@pytest.mark.parametrize("measure", ["norm", "rollout"])
def test_a_measure_s_rows_are_its_maps_fed_by_hand(runs, planted_pair, data, measure):
    by_hand = _by_hand(planted_pair, data, measure)
    assert sorted(by_hand) == sorted(runs["three"].manifest["tables"])
    for name in by_hand:
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
    measures = ("weights", "norm", "norm_residual", "rollout", "value_zeroing", "alti")
    run = _run(identical_pair, data, tmp_path / "same", attention_measures=measures)
    change = run.table("attention_change")
    assert change["measure"].unique().tolist() == list(measures)
    # the same weights give the same maps: cosine 1 and JS 0 up to float32 rounding of the maps
    assert change["cosine"].min() > 1 - 1e-6 and change["js_divergence"].abs().max() < 1e-6
    for name in ("attention_targets", "attention_patterns", "relation_heads"):  # base rows are the tuned rows
        t = run.table(name)
        assert t["measure"].unique().tolist() == list(measures)
        base, tuned = (t[t["model"] == m].drop(columns="model").reset_index(drop=True) for m in ("base", "tuned"))
        pd.testing.assert_frame_equal(base, tuned)
    # no head moved on the head map (JS distances of equal maps: 0 up to float32 rounding, square-rooted)
    assert run.table("head_map")["moved"].max() < 1e-3


def test_a_run_with_measures_resumes_its_own_tables(runs, planted_pair, data):
    again = _run(planted_pair, data, runs["three"].out, attention_measures=("weights", "norm", "rollout"))
    assert sorted(again.manifest["resumed_tables"]) == sorted(ANALYSES)
    for name in again.manifest["tables"]:
        pd.testing.assert_frame_equal(again.table(name), runs["three"].table(name))


def test_a_bad_measure_is_one_line_from_bt_compare(planted_pair, data, tmp_path):
    with pytest.raises(BertologyError, match=r"^--attention-measures \(attention_measures\) must be one of weights, "
                                             r"norm, norm_residual, rollout, value_zeroing, alti, not 'flow'\.$"):
        _run(planted_pair, data, tmp_path / "bad", attention_measures="weights,flow")
    assert not (tmp_path / "bad").exists()



def test_measure_agreement_of_a_run_with_three_measures(runs):
    from bertology.experiments.measure_agreement import SOURCES, agreement

    three = runs["three"]
    table = agreement({name: three.table(name) for name in SOURCES})
    assert set(table["measure"]) == {"norm", "rollout"}
    assert set(table["analysis"]) == set(SOURCES)
    assert set(table.loc[table["measure"] == "rollout", "level"]) == {"layer"}
    # the planted head L2H1 is the most changed under weights and under norm
    change = table[(table["analysis"] == "attention_change") & (table["measure"] == "norm")].iloc[0]
    assert change["weights_unit"] == "L2H1" and change["measure_unit"] == "L2H1"


def test_measure_agreement_named_in_compare_reaches_the_table_and_the_report(planted_pair, data, tmp_path):
    """Named beside the analyses it reads, ``measure_agreement`` is written by compare (equal to the function on the
    run's own tables) and drawn in the report: its section, both share figures, the headline table."""
    from bertology.experiments.measure_agreement import SOURCES, agreement

    base, tuned = planted_pair
    run = bt.compare(str(base), str(tuned), str(data), out=str(tmp_path / "run"), batch_size=BATCH, view_examples=0,
                     analyses=["attention_change", "attention_targets", "measure_agreement"], report=True,
                     attention_measures=("weights", "norm", "alti"), **SMALL)
    table = run.table("measure_agreement")
    again = agreement({name: run.table(name) for name in SOURCES if name in run.tables})
    pd.testing.assert_frame_equal(table.reset_index(drop=True), again.reset_index(drop=True), check_dtype=False)
    assert set(table["measure"]) == {"norm", "alti"}
    html = (tmp_path / "run" / "report.html").read_text(encoding="utf-8")
    section = html[html.index('id="measure-agreement"'):]
    assert "measure_agreement_cls_share.svg" in section and "measure_agreement_sep_share.svg" in section
    assert "top_changed_heads" in section
