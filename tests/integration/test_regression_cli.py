"""Regression end to end through the CLI (issue 15): finetune an STS-B-layout file, ablate the regressor,
compare it with its base (the ablation runs inside compare), and the report speaks Pearson, not accuracy."""
import json
import re

import numpy as np
import pandas as pd
import pytest
from transformers import AutoConfig

from bertology.testing import SENTENCES, check_final_intervals, save_tiny_bert
from cli_checks import invoke


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("regcli")
    base = save_tiny_bert(root / "base", initializer_range=0.3)
    rng = np.random.default_rng(0)
    rows = []
    for i in range(60):  # GLUE STS-B's layout: sentence1, sentence2, score with decimals
        a, b = SENTENCES[i % len(SENTENCES)], SENTENCES[(3 * i + 1) % len(SENTENCES)]
        rows.append({"index": i, "sentence1": a, "sentence2": b, "score": f"{rng.uniform(0, 5):.3f}"})
    data = root / "sts.tsv"
    pd.DataFrame(rows).to_csv(data, sep="\t", index=False)
    ft = invoke("finetune", "--model", base, "--data", data, "--epochs", "1", "--batch-size", "8",
                "--out", root / "ft", "--no-report")
    assert ft.exit_code == 0, ft.output
    return root, base, data, ft


def test_finetune_chooses_regression_and_saves_a_one_output_regressor(run):
    root, _, _, ft = run
    assert "held-out Pearson" in ft.output and "MSE" in ft.output
    cfg = AutoConfig.from_pretrained(root / "ft" / "model")
    assert cfg.problem_type == "regression" and cfg.num_labels == 1
    manifest = json.loads((root / "ft" / "manifest.json").read_text())
    assert manifest["result"]["task"] == "regression"
    assert manifest["result"]["task_choice"].startswith("auto: numeric labels with decimals")
    assert manifest["result"]["split"]["strata"] == "quintiles of the target"
    # the fresh head starts at the mean of the training targets (the scores left after the held-out split)
    assert manifest["result"]["head_bias_start"] == pytest.approx(manifest["result"]["targets"]["train"]["mean"])
    table = pd.read_parquet(root / "ft" / "tables" / "finetune.parquet")
    assert {"pearson", "spearman", "mse"} <= set(table[table["split"] == "eval"]["metric"])
    preds = pd.read_parquet(root / "ft" / "tables" / "finetune_predictions.parquet")
    assert np.allclose(preds["error"], preds["predicted"] - preds["label"])
    ci = check_final_intervals(root / "ft", ["pearson", "spearman", "mse"])
    assert ci["n_eval"].iloc[0] == preds["predicted"].notna().sum()


def test_ablate_scores_the_regressor_in_its_own_metrics(run):
    root, _, data, _ = run
    out = root / "ablate"
    res = invoke("ablate", "--model", root / "ft" / "model", "--data", data, "--out", out, "--bootstrap", "50")
    assert res.exit_code == 0, res.output
    t = pd.read_parquet(out / "tables" / "ablation.parquet")
    assert set(t["metric"]) == {"pearson", "spearman", "mse"} and set(t["task"]) == {"regression"}
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["task"] == "regression" and manifest["result"]["degenerate"]["metric"] == "pearson"
    html = (out / "report.html").read_text()
    assert "Intact Pearson r" in html and "Intact accuracy" not in html


def test_a_classifier_flag_on_numeric_labels_is_kept(run, tmp_path):
    _, base, data, _ = run
    res = invoke("finetune", "--model", base, "--data", data, "--epochs", "0.2", "--task", "regression",
                 "--early-stopping-metric", "accuracy", "--out", tmp_path / "x", "--no-report")
    assert res.exit_code == 2 and "is not a metric of the regression task" in " ".join(res.output.split())


def test_compare_runs_the_regression_ablation(run):
    root, base, data, _ = run
    out = root / "compare"
    res = invoke("compare", "--base", base, "--tuned", root / "ft" / "model", "--data", data, "--out", out,
                 "--analyses", "attention_change,ablation", "--ablation-bootstrap", "20")
    assert res.exit_code == 0, res.output
    assert re.search(r"intact: pearson -?\d\.\d{4}, spearman", res.output)
    t = pd.read_parquet(out / "tables" / "ablation.parquet")
    assert set(t["task"]) == {"regression"}


def test_the_overview_names_the_objective_by_its_loss_not_the_objective_flag(run):
    """The summary card reads "supervised (mean squared error)", the regression task's own loss name, not
    the --objective flag's "supervised" beside "Task: regression"."""
    from bertology.report.render import build_context
    from bertology.tasks.catalog import get_task

    root = run[0]
    manifest = json.loads((root / "ft" / "manifest.json").read_text())
    assert manifest["summary"]["objective"] == f"supervised ({get_task('regression').loss_name})"
    assert manifest["result"]["objective"] == "supervised" and manifest["result"]["loss"] == "mean squared error"
    cards = {c["label"]: c["text"] for c in build_context(root / "ft")["overview"]["summary"]}
    assert cards["Training objective"] == "supervised (mean squared error)" and cards["Task"] == "regression"
    facts = dict(build_context(root / "ft")["sections"]["finetune"]["facts"])  # what the "loss" rows measure
    assert facts["Objective"] == "supervised (mean squared error)"
