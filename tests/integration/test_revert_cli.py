"""``bertology ablate --mode revert --base B`` and ``compare --ablation-mode revert`` end to end on a tiny BERT pair."""
import json

import pandas as pd
import pytest

from bertology.testing import SENTENCES, moved_classifier_pair, save_tiny_bert
from cli_checks import assert_user_error, invoke, labelled_csv  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

REVERT_LAYER_MODES = {"revert_attention", "revert_ffn", "revert_layer", "revert_embeddings"}


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(base encoder, tuned classifier whose encoder weights all moved, labels the tuned model fits)."""
    return moved_classifier_pair(tmp_path_factory.mktemp("revert-pair"))


@pytest.fixture()
def data(tmp_path, pair):
    return labelled_csv(tmp_path / "d.csv", SENTENCES * 2, pair[2])


def _check_revert_table(t: pd.DataFrame, n_layers: int = 2, n_heads: int = 4) -> None:
    assert set(t["mode"]) == {"revert"}
    n_metrics = t["metric"].nunique()
    assert len(t[t["target"] == "head"]) == n_layers * n_heads * n_metrics
    layers = t[t["target"] == "layer"]
    assert set(layers["layer_mode"]) == REVERT_LAYER_MODES
    assert len(layers) == (3 * n_layers + 1) * n_metrics
    emb = layers[layers["layer_mode"] == "revert_embeddings"]
    assert set(emb["layer"]) == {0} and set(emb["label"]) == {"embeddings"}
    assert t[t["target"] != "intact"]["ci_low"].notna().all()


def test_ablate_revert_runs_end_to_end_and_matches_python(pair, data, tmp_path):
    from bertology.study.ablate import ablate

    base, tuned, _ = pair
    out = tmp_path / "cli"
    result = invoke("ablate", "--mode", "revert", "--base", base, "--model", tuned, "--data", data, "--out", out,
                    "--bootstrap", 50)
    assert result.exit_code == 0, result.output
    t = pd.read_parquet(out / "tables/ablation.parquet")
    _check_revert_table(t)
    assert not (out / "tables/head_importance.parquet").exists()
    m = json.loads((out / "manifest.json").read_text())
    assert m["ablation_mode"] == "revert" and "base" in m["models"]
    assert "not run in revert mode" in m["result"]["head_importance"]["skipped"]
    assert (out / "report.html").exists()
    text = " ".join(result.output.split())
    assert "mode revert" in text and "most harmful heads to revert" in text
    run = ablate(str(tuned), str(data), {"mode": "revert", "n_bootstrap": 50}, base=str(base), out=tmp_path / "py")
    pd.testing.assert_frame_equal(run.table("ablation"), t)
    assert run.manifest["fingerprint"] == m["fingerprint"]


def test_ablate_revert_refuses_a_missing_foreign_or_unused_base(pair, data, tmp_path):
    base, tuned, _ = pair
    args = ("--model", tuned, "--data", data, "--bootstrap", 10)
    assert_user_error(invoke("ablate", "--mode", "revert", *args, "--out", tmp_path / "a"), "--mode revert needs --base")
    wide = save_tiny_bert(tmp_path / "wide", hidden_size=48, num_attention_heads=4)
    assert_user_error(invoke("ablate", "--mode", "revert", "--base", wide, *args, "--out", tmp_path / "b"),
                      "different shapes", "hidden_size: 48 vs 32")
    assert_user_error(invoke("ablate", "--base", base, *args, "--out", tmp_path / "c"),
                      "--base is read by --mode revert and transplant only")
    assert_user_error(invoke("ablate", "--mode", "revert", "--base", base, "--layer-modes", "skip", *args,
                             "--out", tmp_path / "d"), "cannot go with --mode revert")


def test_compare_runs_the_revert_ablation(pair, data, tmp_path):
    base, tuned, _ = pair
    out = tmp_path / "cmp"
    result = invoke("compare", "--base", base, "--tuned", tuned, "--data", data, "--out", out,
                    "--analyses", "ablation", "--ablation-mode", "revert", "--ablation-bootstrap", 50, "--view-examples", 0)
    assert result.exit_code == 0, result.output
    _check_revert_table(pd.read_parquet(out / "tables/ablation.parquet"))
    m = json.loads((out / "manifest.json").read_text())
    assert m["analyses"]["ablation"]["settings"]["mode"] == "revert"
