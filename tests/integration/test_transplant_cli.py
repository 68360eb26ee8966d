"""``bertology ablate --mode transplant --base B`` and ``compare --ablation-mode transplant`` end to end on a tiny
BERT pair: the table, the headline, the report section with its curves, and the CLI equal to the Python call."""
import json

import pandas as pd
import pytest

from bertology.testing import SENTENCES, moved_classifier_pair
from cli_checks import assert_user_error, invoke, labelled_csv  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(base encoder, tuned classifier whose encoder weights all moved, labels the tuned model fits)."""
    return moved_classifier_pair(tmp_path_factory.mktemp("transplant-pair"))


@pytest.fixture()
def data(tmp_path, pair):
    return labelled_csv(tmp_path / "d.csv", SENTENCES * 2, pair[2])


def _check(t: pd.DataFrame, n_layers: int = 2) -> None:
    assert set(t["mode"]) == {"transplant"}
    assert set(t["unit_kind"]) == {"embeddings", "layer", "attention", "ffn", "layers"}
    curve = t[t["unit_kind"] == "layers"]
    assert sorted(set(curve["k"])) == list(range(n_layers + 1)) and set(curve["direction"]) == {"top", "bottom"}
    k0, kL = curve[curve["k"] == 0], curve[curve["k"] == n_layers]
    assert (k0["value"] == k0["value_head_alone"]).all() and (kL["value"] == kL["value_tuned"]).all()


def test_ablate_transplant_runs_end_to_end_and_matches_python(pair, data, tmp_path):
    from bertology.commands.ablate import ablate

    base, tuned, _ = pair
    out = tmp_path / "cli"
    result = invoke("ablate", "--mode", "transplant", "--base", base, "--model", tuned, "--data", data, "--out", out,
                    "--bootstrap", 50)
    assert result.exit_code == 0, result.output
    t = pd.read_parquet(out / "tables/transplant.parquet")
    _check(t)
    assert not (out / "tables/ablation.parquet").exists()
    m = json.loads((out / "manifest.json").read_text())
    assert m["ablation_mode"] == "transplant" and "base" in m["models"]
    text = " ".join(result.output.split())
    assert "head alone" in text and ("of the gain" in text or "undefined" in text)
    page = (out / "report.html").read_text()
    assert 'id="transplant"' in page
    if t.loc[t["metric"] == "loss", "gain_recovered"].notna().any():
        assert (out / "figures/transplant_loss.svg").exists()
    run = ablate(str(tuned), str(data), {"mode": "transplant", "n_bootstrap": 50}, base=str(base), out=tmp_path / "py")
    pd.testing.assert_frame_equal(run.table("transplant"), t)
    assert run.manifest["fingerprint"] == m["fingerprint"]


def test_ablate_transplant_refuses_a_missing_base_and_layer_modes(pair, data, tmp_path):
    base, tuned, _ = pair
    args = ("--model", tuned, "--data", data, "--bootstrap", 10)
    assert_user_error(invoke("ablate", "--mode", "transplant", *args, "--out", tmp_path / "a"),
                      "--mode transplant needs --base")
    assert_user_error(invoke("ablate", "--mode", "transplant", "--base", base, "--layer-modes", "skip", *args,
                             "--out", tmp_path / "b"), "cannot go with --mode transplant")


def test_compare_runs_the_transplant_ablation(pair, data, tmp_path):
    base, tuned, _ = pair
    out = tmp_path / "cmp"
    result = invoke("compare", "--base", base, "--tuned", tuned, "--data", data, "--out", out, "--analyses",
                    "ablation", "--ablation-mode", "transplant", "--ablation-bootstrap", 50, "--view-examples", 0)
    assert result.exit_code == 0, result.output
    _check(pd.read_parquet(out / "tables/transplant.parquet"))
    m = json.loads((out / "manifest.json").read_text())
    assert m["analyses"]["ablation"]["settings"]["mode"] == "transplant"
