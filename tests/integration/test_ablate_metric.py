"""``bertology ablate`` judged by the task's own metric: CoLA-named data by MCC, ``--metric f1`` honoured, a metric
the task has not refused in one line, and a run that names none unchanged."""
import json

import pandas as pd
import pytest
from sklearn.metrics import matthews_corrcoef

from bertology.testing import SENTENCES, save_tiny_bert, split_classifier
from cli_checks import assert_user_error, invoke, labelled_csv  # noqa: E402

TEXTS = SENTENCES * 2


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """A tiny classifier and labels it mostly fits: its predictions with every fifth one flipped (MCC below 1)."""
    folder = save_tiny_bert(tmp_path_factory.mktemp("clf"), classifier=True, initializer_range=0.3)
    pred = split_classifier(folder, TEXTS)
    labels = [1 - p if i % 5 == 0 else p for i, p in enumerate(pred)]
    return folder, pred, labels


def _run(model, data, out, *extra):
    return invoke("ablate", "--model", model[0], "--data", data, "--out", out, "--bootstrap", 50, "--no-importance",
                  "--no-report", "--layers", "1", *extra)


def test_cola_named_data_is_judged_by_mcc(model, tmp_path):
    (tmp_path / "CoLA").mkdir()
    data = labelled_csv(tmp_path / "CoLA" / "dev.csv", TEXTS, model[2])
    result = _run(model, data, tmp_path / "run")
    assert result.exit_code == 0, result.output
    t = pd.read_parquet(tmp_path / "run/tables/ablation.parquet")
    assert set(t["main_metric"]) == {"mcc"} and t["metric"].iloc[0] == "mcc"
    intact = t[(t.target == "intact") & (t.metric == "mcc")].iloc[0]
    assert intact["value"] == pytest.approx(matthews_corrcoef(model[2], model[1]), abs=1e-9)
    heads = t[(t.target == "head") & (t.metric == "mcc")]
    assert len(heads) == 4 and heads["ci_low"].notna().all()  # with its bootstrap intervals
    assert {"accuracy", "macro_f1", "loss"} <= set(t["metric"])  # the other metrics stay
    m = json.loads((tmp_path / "run/manifest.json").read_text())
    assert m["result"]["main_metric"]["metric"] == "mcc" and m["result"]["main_metric"]["dataset"] == "CoLA"
    assert m["result"]["degenerate"]["metric"] == "accuracy"  # the check reads accuracy against its chance level
    text = " ".join(result.output.split())
    assert "intact: MCC" in text and "main metric: MCC" in text and "beyond the 95% CI (mcc)" in text


def test_metric_f1_is_honoured(model, tmp_path):
    data = labelled_csv(tmp_path / "data.csv", TEXTS, model[2])
    result = _run(model, data, tmp_path / "run", "--metric", "f1")
    assert result.exit_code == 0, result.output
    t = pd.read_parquet(tmp_path / "run/tables/ablation.parquet")
    assert set(t["main_metric"]) == {"f1"} and "mcc" not in set(t["metric"])
    m = json.loads((tmp_path / "run/manifest.json").read_text())
    assert m["result"]["main_metric"] == {"metric": "f1", "why": "--metric", "dataset": None}
    assert "beyond the 95% CI (f1)" in " ".join(result.output.split())


def test_a_run_naming_no_metric_keeps_its_rows(model, tmp_path):
    data = labelled_csv(tmp_path / "data.csv", TEXTS, model[2])
    result = _run(model, data, tmp_path / "run")
    assert result.exit_code == 0, result.output
    t = pd.read_parquet(tmp_path / "run/tables/ablation.parquet")
    assert set(t["metric"]) == {"accuracy", "macro_f1", "loss"} and set(t["main_metric"]) == {"accuracy"}
    assert "main metric" not in result.output


@pytest.mark.parametrize("value, fragment", [
    ("pearson", "--metric (metric) 'pearson' is not a metric of the classification task"),
    ("mccc", "--metric (metric) must be one of"),
])
def test_an_invalid_metric_is_refused_in_one_line(model, tmp_path, value, fragment):
    data = labelled_csv(tmp_path / "data.csv", TEXTS, model[2])
    result = _run(model, data, tmp_path / "run", "--metric", value)
    assert_user_error(result, fragment)
    assert len([line for line in result.output.splitlines() if line.strip()]) == 1
    assert not (tmp_path / "run" / "tables").exists()


def test_compare_reads_the_main_metric_from_the_fine_tune_manifest(model, tmp_path):
    """A tuned model in a ``bertology finetune`` run folder trained on CoLA: compare's ablation is judged by MCC on
    data that names no dataset; ``--ablation-metric accuracy`` puts accuracy back."""
    import shutil

    from bertology.config import CompareConfig, DataConfig
    from bertology.commands.compare import compare
    from bertology.testing import tiny_bert_pair

    base, _ = tiny_bert_pair(tmp_path / "pair", classifier=True)
    tuned = tmp_path / "ft" / "model"
    shutil.copytree(model[0], tuned)
    (tmp_path / "ft" / "manifest.json").write_text(json.dumps(
        {"kind": "finetune", "data": {"train": {"source": "glue/CoLA/train.tsv", "labels": ["0", "1"]}}}))
    data = labelled_csv(tmp_path / "data.csv", TEXTS, model[2])

    def run(out, **settings):
        return compare(CompareConfig(base=str(base), tuned=str(tuned), data=DataConfig(path=str(data)), out=str(out),
                                     analyses=("ablation",), view_examples=0, ablation_bootstrap=50,
                                     ablation_importance=False, **settings))

    t = run(tmp_path / "run").table("ablation")
    assert set(t["main_metric"]) == {"mcc"} and "mcc" in set(t["metric"])
    t = run(tmp_path / "run2", ablation_metric="accuracy").table("ablation")
    assert set(t["main_metric"]) == {"accuracy"} and "mcc" not in set(t["metric"])
