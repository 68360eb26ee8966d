"""A table declares its reach: a toy analysis (one module, ``toys/toy_reach_analysis.py``) and its one catalog line
get seed-noise verdicts in a toy study, a column in a many-model run and a tracking row, with no other file edited.

Checked against independent answers: the study's p-values against scipy's exact one-sided Mann-Whitney test on
the hand-computed changes and seed distances; the many-model column and the tracking scalars against the
analysis's own per-model table.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy.stats import mannwhitneyu

from bertology.analyses.catalog import ANALYSES
from bertology.config import CompareConfig, DataConfig
from bertology.integrations.tracker import CallbackSettings, scalars
from bertology.results import write_table
from bertology.testing import SENTENCES

pytestmark = pytest.mark.usefixtures("one_thread")

TOY = "toy_norm"


@pytest.fixture()
def toy(monkeypatch):
    """The toy module on the path and its one catalog line (removed again afterwards)."""
    monkeypatch.syspath_prepend(str(Path(__file__).parent / "toys"))
    with ANALYSES.added(TOY, "toy_reach_analysis"):
        yield
    sys.modules.pop("toy_reach_analysis", None)


def _study_rows() -> pd.DataFrame:
    """Three seeds of task ``a``: layer 1 moves by ~1 with seeds 0.01 apart, layer 2 by less than seeds differ."""
    tuned = {1: [2.0, 2.01, 2.02], 2: [1.1, 0.9, 1.05]}  # base 1.0 at both layers
    rows = []
    for seed in range(3):
        for layer in (1, 2):
            rows += [{"tuned": f"a/s{seed}", "task": "a", "seed": seed, "model": "base", "layer": layer, "value": 1.0},
                     {"tuned": f"a/s{seed}", "task": "a", "seed": seed, "model": "tuned", "layer": layer,
                      "value": tuned[layer][seed]}]
    return pd.DataFrame(rows)


def test_a_declared_table_gets_seed_noise_verdicts_in_a_toy_study(toy, tmp_path):
    from bertology.studies.summarise import write_study_tables

    write_table(tmp_path, TOY, _study_rows())
    effects = write_study_tables(tmp_path)["study_effects"].set_index("unit")
    assert set(effects["table"]) == {TOY}
    for unit, tuned in (("L1", [2.0, 2.01, 2.02]), ("L2", [1.1, 0.9, 1.05])):
        c = np.array(tuned) - 1.0
        d = np.array([abs(c[a] - c[b]) for a, b in ((0, 1), (0, 2), (1, 2))])
        expected = mannwhitneyu(np.abs(c), d, alternative="greater", method="exact").pvalue
        assert effects.at[unit, "p_value"] == pytest.approx(expected, abs=1e-12)
    assert effects.at["L1", "p_value"] == pytest.approx(1 / 20)  # every |c_s| above every d_ab: 1 / C(6, 3)
    assert bool(effects.at["L1", "beyond_noise"]) and not bool(effects.at["L2", "beyond_noise"])


def test_a_declared_table_gets_a_column_in_a_many_model_run(toy, identical_pair, tmp_path):
    from bertology.data.corpus import Corpus
    from bertology.multicompare import TunedModel, compare_many

    base, tuned = identical_pair
    config = CompareConfig(base=str(base), tuned=str(tuned), data=DataConfig(path=""), out=str(tmp_path / "many"),
                           analyses=(TOY,), view_examples=0)
    run = compare_many(config, [TunedModel("same", str(tuned)), TunedModel("self", str(base))],
                       corpus=Corpus.from_list(SENTENCES), report=True)
    html = (tmp_path / "many" / "report.html").read_text(encoding="utf-8")
    assert "Toy norm: tuned - base per layer" in html
    table = run.table(TOY) if hasattr(run, "table") else pd.read_parquet(tmp_path / "many/tables" / f"{TOY}.parquet")
    from toy_reach_analysis import side_by_side

    wide = side_by_side(table)
    assert list(wide.columns) == ["same", "self"] and len(wide) == 3  # embeddings + 2 layers of the tiny BERT
    assert np.allclose(wide["self"], 0.0, atol=1e-9)  # the base against itself: no change at any layer


def test_a_declared_analysis_gets_a_tracking_row(toy, tmp_path):
    from bertology.integrations.tracker import Tracker, probe_corpus
    from bertology.models.loading import load_model
    from bertology.testing import save_tiny_bert

    folder = save_tiny_bert(tmp_path / "tiny")
    settings = CallbackSettings(analyses=(TOY,), gradient_norms=False, every_n_steps=1)
    loaded = load_model(folder)
    logged: list[dict] = []
    tracker = Tracker(settings, probe_corpus(SENTENCES), tokenizer=loaded.tokenizer, log=logged.append,
                      out=tmp_path / "track")
    tracker.prepare(loaded.model)
    tracker.begin(loaded.model)
    rows = tracker.tables[TOY]
    assert set(rows["step"]) == {0} and set(rows["model"]) == {"base", "step-0"}  # the tracker names the step
    tuned = rows[rows["model"] == "step-0"]
    assert logged[-1] == {f"bertology/toy_norm/layer_{r.layer}": float(r.value) for r in tuned.itertuples()}
    assert scalars(TOY, tuned.assign(model="tuned")) == logged[-1]
    base = rows[rows["model"] == "base"].set_index("layer")["value"]
    assert np.allclose(tuned.set_index("layer")["value"], base, atol=1e-9)  # step 0: the model is its base


def test_an_analysis_that_declares_no_track_is_refused_by_tracking(toy):
    from bertology.errors import BertologyError

    with pytest.raises(BertologyError, match="must be one of"):
        CallbackSettings(analyses=("head_map",))


def test_the_package_names_the_toy_nowhere():
    """Its reach comes from its spec alone: no file of the package names the toy table."""
    import bertology

    root = Path(bertology.__file__).parent
    assert [p for p in root.rglob("*.py") if TOY in p.read_text(encoding="utf-8")] == []


def test_the_built_in_tables_declare_their_reach_on_their_specs():
    """Every built-in table a study judges, a many-model run shows or tracking records says so on its spec (no list
    beside the specs): a spec that lost its declaration (a merge, a split module) fails here, not in a study."""
    from bertology.reach import declared

    assert list(declared("seed_noise")) == [
        "attention_change", "attention_patterns", "representation_similarity", "geometry",  # analyses, catalog order
        "weight_change", "probe", "token_probe", "ablation", "transplant", "changed_vs_needed"]  # experiments
    assert list(declared("many_view")) == ["attention_change", "representation_similarity"]
    assert list(declared("track")) == ["attention_change", "representation_similarity", "geometry"]
    assert {n: s.pairwise for n, s in declared("seed_noise").items() if s.pairwise} == {
        "attention_change": True, "representation_similarity": True, "weight_change": True}
