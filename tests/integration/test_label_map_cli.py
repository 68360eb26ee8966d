"""``--label-map`` on ``ablate`` (every mode) and ``compare``'s ablation, and a label mismatch said before any weights load.

The tuned classifier's copy ``relabelled`` is the same model with the labels ``-1`` / ``1`` in its config, so data
labelled ``0`` / ``1`` is scored by it only through ``--label-map 0=-1,1=1``, and then exactly as the original model
scores the same data (the tables equal). A mismatch is caught from ``config.json`` alone: in a copy whose weights
file is garbage the error is still the label one, so no weights were read before it.
"""
import json
import shutil

import pandas as pd
import pytest

from bertology.testing import SENTENCES, moved_classifier_pair
from cli_checks import assert_user_error, invoke, labelled_csv  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

FAST = ("--bootstrap", 20, "--no-importance", "--no-report")
#: every column of the ablation table but the mode's bookkeeping (the numbers the two runs must share)
NUMBERS = ["target", "layer", "head", "layer_mode", "metric", "value", "delta", "ci_low", "ci_high", "n_examples"]


def _relabel(folder, to, id2label):
    """A copy of the classifier in ``folder`` whose config names its labels ``id2label`` (id order)."""
    shutil.copytree(folder, to)
    config = json.loads((to / "config.json").read_text())
    config["id2label"] = {str(i): lab for i, lab in enumerate(id2label)}
    config["label2id"] = {lab: i for i, lab in enumerate(id2label)}
    (to / "config.json").write_text(json.dumps(config))
    return to


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """base encoder, tuned classifier (labels '0'/'1'), its copy labelled '-1'/'1', that copy with garbage weights,
    and the data (0/1 labels the tuned model fits)."""
    root = tmp_path_factory.mktemp("label-map")
    base, tuned, labels = moved_classifier_pair(root / "pair")
    relabelled = _relabel(tuned, root / "relabelled", ["-1", "1"])
    garbage = _relabel(tuned, root / "garbage", ["-1", "1"])
    (garbage / "model.safetensors").write_bytes(b"not a safetensors file at all")
    data = labelled_csv(root / "data.csv", SENTENCES * 2, labels)
    return dict(base=base, tuned=tuned, relabelled=relabelled, garbage=garbage, data=data)


def _table(out) -> pd.DataFrame:
    t = pd.read_parquet(out / "tables/ablation.parquet")
    return t[[c for c in NUMBERS if c in t.columns]].reset_index(drop=True)


@pytest.mark.parametrize("mode", ["uniform", "revert"])
def test_ablate_with_a_label_map_scores_as_the_model_with_the_datas_labels(models, tmp_path, mode):
    base = ("--base", models["base"]) if mode == "revert" else ()
    ref, mapped = tmp_path / "ref", tmp_path / "mapped"
    result = invoke("ablate", "--model", models["tuned"], "--data", models["data"], "--out", ref, "--mode", mode,
                    *base, *FAST)
    assert result.exit_code == 0, result.output
    result = invoke("ablate", "--model", models["relabelled"], "--data", models["data"], "--out", mapped,
                    "--mode", mode, *base, "--label-map", "0=-1, 1=1", *FAST)
    assert result.exit_code == 0, result.output
    pd.testing.assert_frame_equal(_table(mapped), _table(ref))
    m = json.loads((mapped / "manifest.json").read_text())
    assert m["settings"]["ablate"]["label_map"]["value"] == "0=-1,1=1"  # canonical, recorded with its flag
    assert m["settings"]["ablate"]["label_map"]["flag"] == "--label-map"
    assert m["data"]["label_map"] == "0=-1,1=1" and m["data"]["labels"] == ["-1", "1"]
    assert m["fingerprint"] != json.loads((ref / "manifest.json").read_text())["fingerprint"]


def test_ablate_transplant_and_the_python_api_take_a_label_map(models, tmp_path):
    import bertology as bt

    ref = bt.ablate(str(models["tuned"]), str(models["data"]), base=str(models["base"]), mode="transplant",
                    n_bootstrap=20)
    frame = pd.read_csv(models["data"])  # in memory, the map as a dict of numbers
    mapped = bt.ablate(str(models["relabelled"]), frame, base=str(models["base"]), mode="transplant", n_bootstrap=20,
                       label_map={0: -1, 1: 1})
    cols = ["target", "layer", "metric", "value", "delta"]
    keep = [c for c in cols if c in ref.transplant.columns]
    pd.testing.assert_frame_equal(mapped.transplant[keep], ref.transplant[keep])
    assert mapped.manifest["settings"]["ablate"]["label_map"]["value"] == "0=-1,1=1"


def test_compare_ablation_with_a_label_map_equals_the_model_with_the_datas_labels(models, tmp_path):
    common = ("--base", models["base"], "--data", models["data"], "--analyses", "ablation", "--ablation-mode",
              "uniform,revert", "--ablation-bootstrap", 20, "--no-importance", "--no-report")
    ref, mapped = tmp_path / "ref", tmp_path / "mapped"
    assert invoke("compare", "--tuned", models["tuned"], "--out", ref, *common).exit_code == 0
    result = invoke("compare", "--tuned", models["relabelled"], "--out", mapped, "--label-map", "0=-1,1=1", *common)
    assert result.exit_code == 0, result.output
    pd.testing.assert_frame_equal(_table(mapped), _table(ref))
    m = json.loads((mapped / "manifest.json").read_text())
    assert m["settings"]["ablation"]["label_map"]["value"] == "0=-1,1=1"


@pytest.mark.parametrize("command", ["ablate", "compare"])
def test_a_label_mismatch_is_one_line_before_any_weights_load(models, tmp_path, command):
    """Data 0/1, a model of -1/1 whose weights file is garbage: the error is the labels' (naming the fix), never the
    weights', so it came from config.json alone; nothing is written."""
    out = tmp_path / "run"
    args = (["ablate", "--model", models["garbage"], *FAST] if command == "ablate" else
            ["compare", "--base", models["base"], "--tuned", models["garbage"], "--analyses", "ablation", "--no-report"])
    result = invoke(*args, "--data", models["data"], "--out", out)
    assert_user_error(result, "label(s) '0'", "its labels are '-1', '1'", "--label-map 0=-1,1=1")
    assert "safetensors" not in result.output
    # a map that leaves a label out, or names a label the model does not have: refused as early
    result = invoke(*args, "--data", models["data"], "--out", out, "--label-map", "0=-1")
    assert_user_error(result, "--label-map (label_map) 0=-1 does not map the label(s) '1'")
    result = invoke(*args, "--data", models["data"], "--out", out, "--label-map", "0=neg,1=1")
    assert_user_error(result, "label(s) 'neg' after --label-map 0=neg,1=1", "its labels are '-1', '1'")
    assert not out.exists()


@pytest.mark.parametrize("command", ["ablate", "compare"])
def test_bad_label_map_syntax_is_refused_before_anything_is_read(tmp_path, monkeypatch, command):
    monkeypatch.chdir(tmp_path)  # absent model and data: the setting is refused before either is looked at
    args = ["ablate", "--model", "absent"] if command == "ablate" else ["compare", "--tuned", "absent"]
    for bad, says in (("0=-1,0=1", "maps the data's label '0' twice (to '-1' and to '1')"),
                      ("0-1", "'0-1' has no '='")):
        result = invoke(*args, "--data", "absent.csv", "--label-map", bad)
        assert_user_error(result, "error: --label-map (label_map) ", says, f"not '{bad}'.")
        assert len([line for line in result.output.splitlines() if line.startswith("error:")]) == 1
    assert not any(tmp_path.iterdir())


def test_compare_of_all_analyses_warns_before_loading_and_skips_the_ablation(models, caplog):
    """Not named (``--analyses all``): the mismatch is a warning said before the weights load, not an error."""
    import logging

    from bertology.commands.compare import resolve_settings
    from bertology.commands.compare_data import load_data
    from bertology.commands.selection import make_config, precheck_experiments

    config, selection, _ = resolve_settings(make_config(str(models["data"]), base=str(models["base"]),
                                                        tuned=str(models["garbage"]), out="unused"))
    with caplog.at_level(logging.WARNING, logger="bertology.commands.selection"):
        precheck_experiments(config, selection, load_data(config.data))
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "The ablation of the tuned classifier will be skipped" in said and "--label-map 0=-1,1=1" in said
