"""Your own analysis object through ``bt.compare`` beside a built-in: its table against the models' own outputs,
the built-in's numbers unchanged, the run folder's record and resume, and every refusal."""
import json

import numpy as np
import pandas as pd
import pytest
import torch
from transformers import AutoModel, AutoTokenizer

import bertology as bt
from bertology.analyses.attention_change import AttentionChange
from bertology.errors import BertologyError

pytestmark = pytest.mark.usefixtures("one_thread")

TEXTS = ["the cat sat on the mat .", "a good movie", "i like the story very much", "john saw mary",
         "the dog ran fast and the man was slow"]
#: the toy sums float32 activations (values of order 1, a few dozen tokens) in float64; the direct computation runs
#: each sentence alone, unpadded: the two differ by float32 rounding of the same forward, far below 1e-5
TOL = 1e-5


class FirstFeature:
    """Mean of hidden unit 0 over the real tokens, per layer and model (a statistic that differs by layer)."""

    name = "first_feature"
    requires = frozenset({"hidden_states"})

    def __init__(self, unit: int = 0):
        self.unit, self.sums, self.n = unit, {}, 0

    def params(self):
        return {"unit": self.unit}

    def update(self, batch):
        m = batch.mask
        for layer, (hb, ht) in enumerate(zip(batch.base.hidden_states, batch.tuned.hidden_states)):
            s = self.sums.setdefault(layer, np.zeros(2))
            s += [hb[..., self.unit][m].double().sum().item(), ht[..., self.unit][m].double().sum().item()]
        self.n += int(m.sum())

    def compute(self):
        rows = [{"layer": layer, "model": model, "value": s[i] / self.n}
                for layer, s in self.sums.items() for i, model in enumerate(("base", "tuned"))]
        return pd.DataFrame(rows)


def _direct(folder, unit=0):
    """The same statistic from the model's own ``output_hidden_states``, one sentence at a time."""
    tok, model = AutoTokenizer.from_pretrained(folder), AutoModel.from_pretrained(folder).eval()
    sums, n = None, 0
    with torch.no_grad():
        for text in TEXTS:
            hs = model(**tok(text, return_tensors="pt"), output_hidden_states=True).hidden_states
            row = np.array([h[0, :, unit].double().sum().item() for h in hs])
            sums, n = (row if sums is None else sums + row), n + hs[0].shape[1]
    return sums / n


@pytest.fixture(scope="module")
def both(planted_pair):
    base, tuned = map(str, planted_pair)
    mine = bt.compare(base, tuned, TEXTS, analyses=[FirstFeature(), "attention_change"], view_examples=0)
    named = bt.compare(base, tuned, TEXTS, analyses=["attention_change"], view_examples=0)
    return mine, named


def test_the_own_table_equals_the_models_own_hidden_states(both, planted_pair):
    mine, _ = both
    table = mine.first_feature
    for model, folder in zip(("base", "tuned"), planted_pair):
        got = table[table.model == model].sort_values("layer")["value"].to_numpy()
        np.testing.assert_allclose(got, _direct(folder), atol=TOL, rtol=0)
    assert table.layer.nunique() == 3 and table.value.nunique() > 2  # three layers, values that tell them apart


def test_the_built_in_table_is_the_same_beside_an_own_analysis(both):
    mine, named = both
    pd.testing.assert_frame_equal(mine.attention_change, named.attention_change)
    assert set(mine.tables) == {"attention_change", "first_feature"}


def test_the_manifest_records_the_object_by_name_class_and_params(both):
    mine, named = both
    record = mine.manifest["config"]["own_analyses"]
    assert record == [{"name": "first_feature", "class": f"{__name__}.FirstFeature", "params": {"unit": 0}}]
    assert "own_analyses" not in named.manifest["config"]  # runs without them keep their manifest and fingerprint
    assert mine.manifest["fingerprint"] != named.manifest["fingerprint"]
    assert "first_feature" in mine.manifest["tables"]


def test_an_own_analysis_alone_and_an_analysis_subclass(planted_pair):
    base, tuned = map(str, planted_pair)

    class MyChange(AttentionChange):
        name = "my_change"

    run = bt.compare(base, tuned, TEXTS, analyses=[MyChange(2, 4)], view_examples=0)
    named = bt.compare(base, tuned, TEXTS, analyses=["attention_change"], view_examples=0)
    assert set(run.tables) == {"my_change"}
    pd.testing.assert_frame_equal(run.my_change, named.attention_change)


def test_a_run_folder_resumes_its_built_ins_and_recomputes_the_own_table(planted_pair, tmp_path):
    base, tuned = map(str, planted_pair)
    out = tmp_path / "run"
    first = bt.compare(base, tuned, TEXTS, analyses=[FirstFeature(), "attention_change"], out=out, view_examples=0)
    again = FirstFeature()
    second = bt.compare(base, tuned, TEXTS, analyses=[again, "attention_change"], out=out, view_examples=0)
    assert second.manifest["resumed_tables"] == ["attention_change"] and again.n > 0  # streamed again
    pd.testing.assert_frame_equal(second.first_feature, first.first_feature)
    assert json.loads((out / "manifest.json").read_text())["config"]["own_analyses"][0]["name"] == "first_feature"
    with pytest.raises(BertologyError):  # another analysis object: another run, not mixed into this folder
        bt.compare(base, tuned, TEXTS, analyses=[FirstFeature(unit=1), "attention_change"], out=out, view_examples=0)


class _Named(FirstFeature):
    def __init__(self, name, requires=frozenset({"hidden_states"}), tables=None):
        super().__init__()
        self.name, self.requires, self.tables = name, requires, tables

    def compute(self):
        return self.tables if self.tables is not None else super().compute()


@pytest.mark.parametrize("obj, why", [
    (_Named("attention_change"), "built-in"),
    (_Named("ablation"), "built-in"),
    (_Named("my norm"), "letters, digits"),
    (_Named("mine", requires={"logits"}), "requires"),
    (_Named("mine", requires="hidden_states"), "requires"),
], ids=["analysis-name", "experiment-name", "not-identifier", "unknown-activation", "requires-a-string"])
def test_what_cannot_run_is_refused_before_any_model_loads(obj, why):
    with pytest.raises(BertologyError, match=why):
        bt.compare("/nonexistent/base", "/nonexistent/tuned", TEXTS, analyses=[obj])


@pytest.mark.parametrize("tables, why", [
    ({"other": pd.DataFrame({"a": [1]})}, "named 'attention' or"),
    ([1, 2], "returns a DataFrame"),
    ({"attention_x": [1, 2]}, "tables are DataFrames"),
], ids=["foreign-table-name", "not-a-table", "not-a-dataframe"])
def test_tables_of_the_wrong_shape_are_refused(planted_pair, tables, why):
    base, tuned = map(str, planted_pair)
    with pytest.raises(BertologyError, match=why):
        bt.compare(base, tuned, TEXTS[:2], analyses=[_Named("attention", tables=tables)], view_examples=0)


def test_a_table_a_built_in_writes_is_refused(planted_pair):
    base, tuned = map(str, planted_pair)
    obj = _Named("representation", tables={"representation_similarity": pd.DataFrame({"a": [1]})})
    with pytest.raises(BertologyError, match="built-in analysis writes"):
        bt.compare(base, tuned, TEXTS[:2], analyses=[obj], view_examples=0)


def test_two_objects_of_one_name_a_many_model_run_and_other_things_are_refused():
    with pytest.raises(BertologyError, match="another analysis of this run"):
        bt.compare("/nonexistent/b", "/nonexistent/t", TEXTS, analyses=[FirstFeature(), FirstFeature()])
    with pytest.raises(BertologyError, match="one tuned model"):
        bt.compare("/nonexistent/b", {"a": "/nonexistent/t", "b": "/nonexistent/u"}, TEXTS, analyses=[FirstFeature()])
    with pytest.raises(BertologyError, match="names and analysis objects"):
        bt.compare("/nonexistent/b", "/nonexistent/t", TEXTS, analyses=[3])
    with pytest.raises(BertologyError, match="Unknown analysis"):  # no name and no object: as before
        bt.compare("/nonexistent/b", "/nonexistent/t", TEXTS, analyses=[])


def test_tracking_takes_names_only():
    with pytest.raises(BertologyError, match="track takes analyses by name"):
        bt.track("/nonexistent/run", analyses=[FirstFeature()])
