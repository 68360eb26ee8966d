"""``attention_measures`` in ``view`` and ``absa``: a contribution measure changes what they show, the default
(``weights``) leaves it as it was, and both refuse what ``compare`` refuses with the same line."""
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from absa_fixture import write_absa  # noqa: E402
from cli_checks import assert_user_error, invoke  # noqa: E402

from bertology.errors import BertologyError  # noqa: E402
from bertology.testing import save_tiny_bert, tiny_bert_pair  # noqa: E402

TEXT = "the soup was cold but the staff were kind ."
# the view rounds every weight to 4 decimals (bertology.view_format.DECIMALS): half a unit of the last one
ROUNDED = 0.5e-4


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return save_tiny_bert(tmp_path_factory.mktemp("view") / "m")


def _probabilities(folder, text):
    """The attention probabilities of the model's own forward, ``[layers, heads, T, T]``, computed here."""
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModel.from_pretrained(folder, attn_implementation="eager").eval()
    with torch.no_grad():
        out = model(**tok(text, return_tensors="pt"), output_attentions=True)
    return torch.stack([a[0] for a in out.attentions]).double().numpy(), model, tok


def test_view_default_is_the_attention_weights_and_a_measure_changes_the_maps(tiny):
    from bertology.activations.contributions import contribution_maps
    from bertology.commands.view import view

    probs, model, tok = _probabilities(tiny, TEXT)
    default = view(TEXT, model=str(tiny)).view.data
    explicit = view(TEXT, model=str(tiny), attention_measures="weights").view.data
    assert default == explicit and "measure" not in default
    np.testing.assert_allclose(np.array(default["attention"]["base"]), probs, atol=ROUNDED, rtol=0)

    shown = view(TEXT, model=str(tiny), attention_measures="norm")
    norm = np.array(shown.view.data["attention"]["base"])
    assert shown.view.data["measure"] == "norm" and shown.manifest["attention_measures"] == ["norm"]
    with torch.no_grad():
        ref = contribution_maps(model, dict(tok(TEXT, return_tensors="pt")), ("norm",))["norm"]
    np.testing.assert_allclose(norm, torch.stack([m[0] for m in ref[1:]]).double().numpy(), atol=ROUNDED, rtol=0)
    assert np.abs(norm - probs).max() > 100 * ROUNDED  # the norm maps are not the weights
    np.testing.assert_allclose(norm.sum(-1), 1, atol=norm.shape[-1] * ROUNDED)

    rollout = view(TEXT, model=str(tiny), attention_measures=("rollout",)).view.data
    assert rollout["n_heads"] == 1 and np.array(rollout["attention"]["base"]).shape[1] == 1  # one map per layer


def test_view_refuses_what_compare_refuses_and_more_than_one_measure(tiny):
    from bertology.config import CompareConfig
    from bertology.commands.view import view

    for bad in ("weights,weights", "attention"):
        with pytest.raises(BertologyError) as compare_error:
            CompareConfig(tuned="t", attention_measures=bad)
        with pytest.raises(BertologyError) as view_error:
            view(TEXT, model=str(tiny), attention_measures=bad)
        assert str(view_error.value) == str(compare_error.value)
    with pytest.raises(BertologyError, match="one measure for the viewer"):
        view(TEXT, model=str(tiny), attention_measures="weights,norm")


def test_view_command_takes_the_measure(tiny, tmp_path):
    result = invoke("view", TEXT, "--model", tiny, "--out", tmp_path / "v.json", "--attention-measures", "alti")
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "v.json").read_text())
    assert data["measure"] == "alti" and data["n_heads"] == 1
    assert_user_error(invoke("view", TEXT, "--model", tiny, "--out", tmp_path / "w.json", "--attention-measures",
                             "nrom"), "--attention-measures", "'nrom'")


@pytest.fixture(scope="module")
def absa_runs(tmp_path_factory):
    """The ABSA study on a tiny planted pair (no fine-tuning), with the default measure and with weights,norm."""
    from bertology.commands.absa import AbsaConfig, run_absa

    tmp = tmp_path_factory.mktemp("absa")
    data = write_absa(tmp / "rest.xml")
    base, tuned = tiny_bert_pair(tmp / "pair", planted=(1, 0), classifier=True)
    common = dict(data=str(data), base=str(base), tuned=str(tuned), eval_fraction=0.5, max_length=40, opinions=False,
                  view_examples=0, report=False)
    default = run_absa(AbsaConfig(out=str(tmp / "default"), **common))
    measured = run_absa(AbsaConfig(out=str(tmp / "measured"), attention_measures="weights,norm,rollout", **common))
    return default, measured


def test_absa_default_tables_are_the_weights_rows_of_a_measured_run(absa_runs):
    from bertology.analyses.absa_heads import TABLES

    default, measured = absa_runs
    for name in TABLES:
        table = measured.tables[name]
        assert "measure" not in default.tables[name] and list(table.measure.unique()) == ["weights", "norm", "rollout"]
        weights = table[table.measure == "weights"].drop(columns="measure").reset_index(drop=True)
        pd.testing.assert_frame_equal(weights, default.tables[name].reset_index(drop=True), check_exact=True)
    manifest = json.loads((measured.out / "manifest.json").read_text())
    assert manifest["config"]["attention_measures"] == ["weights", "norm", "rollout"]


def test_absa_under_a_measure_shows_other_numbers(absa_runs):
    _, measured = absa_runs
    sep = measured.tables["absa_sep_share"]
    key = ["model", "layer", "head"]
    w = sep[sep.measure == "weights"].set_index(key).sort_index()
    n = sep[sep.measure == "norm"].set_index(key).sort_index()
    assert w.index.equals(n.index)
    assert (w["sep_absent"] - n["sep_absent"]).abs().max() > 1e-3  # the [SEP] share under norm is not the weights'
    rollout = sep[sep.measure == "rollout"]
    assert set(rollout["head"]) == {-1} and len(rollout) == 2 * rollout.layer.nunique()  # one row per model, layer
    change = measured.tables["absa_head_change"]
    assert set(change.measure) == {"weights", "norm", "rollout"}


def test_absa_refuses_what_compare_refuses(tmp_path):
    from bertology.config import CompareConfig
    from bertology.commands.absa import AbsaConfig

    for bad in ("norm,norm", "weight"):
        with pytest.raises(BertologyError) as compare_error:
            CompareConfig(tuned="t", attention_measures=bad)
        with pytest.raises(BertologyError) as absa_error:
            AbsaConfig(data="x.xml", attention_measures=bad)
        assert str(absa_error.value) == str(compare_error.value)
    result = invoke("absa", "--data", tmp_path / "none.xml", "--attention-measures", "norm,norm")
    assert_user_error(result, "--attention-measures", "names a measure twice")
