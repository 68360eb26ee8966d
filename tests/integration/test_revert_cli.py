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
    from bertology.commands.ablate import ablate

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
    assert "mode revert" in text and "revert hurts beyond the 95% CI" in text
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


def test_a_revert_sweep_names_the_planted_change_the_task_needs(tmp_path):
    """The tuned classifier differs from its base only in layer 2's feed-forward and is scored on its own
    predictions: reverting that layer's feed-forward (or the whole layer) hurts beyond its interval and is named in
    the summary and the report card; every other unit is unchanged, its zero-width interval never a finding."""
    import re

    import torch
    from transformers import BertForSequenceClassification

    from bertology.testing import split_classifier, tiny_tokenizer

    base = save_tiny_bert(tmp_path / "base")
    model = BertForSequenceClassification.from_pretrained(base, num_labels=2, attn_implementation="eager")
    with torch.no_grad():
        ffn = model.bert.encoder.layer[1].intermediate.dense.weight
        ffn.add_(torch.randn(ffn.shape, generator=torch.Generator().manual_seed(4)) * 3 * ffn.std())
    tuned = tmp_path / "tuned"
    model.save_pretrained(tuned)
    tiny_tokenizer().save_pretrained(tuned)
    texts = SENTENCES * 4
    data = labelled_csv(tmp_path / "d.csv", texts, split_classifier(tuned, texts))
    out = tmp_path / "run"
    result = invoke("ablate", "--mode", "revert", "--base", base, "--model", tuned, "--data", data, "--out", out,
                    "--bootstrap", 200)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    hurts = text[text.index("revert hurts beyond the 95% CI (accuracy): "):].split(" revert helps")[0]
    named = re.findall(r"(L\dH\d|L\d [a-z -]+?|embeddings) [+-]\d", hurts)
    assert named and set(named) <= {"L2 feed-forward", "L2 whole layer"}, hurts
    t = pd.read_parquet(out / "tables/ablation.parquet")
    same = t[(t["metric"] == "accuracy") & (t["target"] == "head")]
    assert (same["delta"] == 0).all() and not same["hurts"].any()  # the heads were not changed
    html = (out / "report.html").read_text(encoding="utf-8")
    card = re.search(r'<div class="k">Change the task needs most</div><div class="v[^"]*">([^<]*)</div>', html)
    assert card and card.group(1) in ("L2 feed-forward", "L2 whole layer")
