"""Task-appropriate main metrics: MCC and positive-class F1 equal scikit-learn's, GLUE datasets named from the data
or a fine-tune's manifest, ``--metric`` checked, and the under-training check compares like with like."""
import json
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from sklearn.metrics import f1_score, matthews_corrcoef

from bertology.data.corpus import Corpus
from bertology.errors import BertologyError
from bertology.metrics.bootstrap import bootstrap_counts
from bertology.tasks.catalog import all_tasks, get_task, task_of_table
from bertology.tasks.classification import positive_id
from bertology.tasks.main_metric import METRIC_CHOICES, check_metric, dataset_of, main_metric
from bertology.training.recipes import RECIPES, undertraining_warnings


def _from_confusion(confusion: list[list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """Targets and predictions with ``confusion[true][pred]`` examples of each pair."""
    pairs = [(t, p) for t, row in enumerate(confusion) for p, count in enumerate(row) for _ in range(count)]
    y, pred = (np.array(v, dtype=np.int64) for v in zip(*pairs))
    return y, pred


def _scores(metric: str, y: np.ndarray, pred: np.ndarray, weights: np.ndarray | None = None, positive: int = 1):
    task = get_task("classification").with_main(metric)
    task.positive = positive
    w = np.ones((1, len(y)), dtype=np.float32) if weights is None else weights.astype(np.float32)
    records = {"pred": pred[None, :], "loss": np.zeros((1, len(y)))}
    return task.scores(w, records, y)[metric][:, 0]


@pytest.mark.parametrize("confusion", [[[30, 5], [7, 40]], [[12, 0], [9, 1]], [[5, 2, 1], [0, 7, 3], [4, 1, 9]]])
def test_mcc_equals_sklearn_on_a_hand_made_confusion(confusion):
    y, pred = _from_confusion(confusion)
    assert _scores("mcc", y, pred)[0] == pytest.approx(matthews_corrcoef(y, pred), abs=1e-12)


def test_mcc_of_one_predicted_class_is_zero_as_in_sklearn():
    y, pred = _from_confusion([[10, 0], [6, 0]])
    assert _scores("mcc", y, pred)[0] == matthews_corrcoef(y, pred) == 0.0


def test_mcc_and_f1_equal_sklearn_under_bootstrap_weights():
    y, pred = _from_confusion([[30, 5], [7, 40]])
    counts = bootstrap_counts(len(y), 20, seed=3)
    mcc, f1 = _scores("mcc", y, pred, counts), _scores("f1", y, pred, counts)
    f1_zero = _scores("f1", y, pred, counts, positive=0)
    for r, w in enumerate(counts):
        assert mcc[r] == pytest.approx(matthews_corrcoef(y, pred, sample_weight=w), abs=1e-12)
        assert f1[r] == pytest.approx(f1_score(y, pred, sample_weight=w), abs=1e-12)
        assert f1_zero[r] == pytest.approx(f1_score(y, pred, sample_weight=w, pos_label=0), abs=1e-12)


def test_a_main_metric_adds_rows_and_leaves_the_others_bit_for_bit():
    task = get_task("classification")
    assert task.with_main("accuracy") is task and task.with_main(None) is task
    mcc = task.with_main("mcc")
    assert mcc.metrics == ("mcc", "accuracy", "macro_f1", "loss") and mcc.primary == "mcc"
    assert mcc.default_metric == "accuracy" and task.metrics == ("accuracy", "macro_f1", "loss")
    y, pred = _from_confusion([[30, 5], [7, 40]])
    w = bootstrap_counts(len(y), 10, seed=0).astype(np.float32)
    records = {"pred": pred[None, :], "loss": np.linspace(0, 1, len(y))[None, :]}
    plain, more = task.scores(w, records, y), mcc.scores(w, records, y)
    assert set(plain) == {"accuracy", "macro_f1", "loss"} and set(more) == set(plain) | {"mcc"}
    for m in plain:
        np.testing.assert_array_equal(plain[m], more[m])
    with pytest.raises(ValueError, match="no metric 'pearson'"):
        task.with_main("pearson")


def test_metric_choices_are_every_tasks_metrics_but_the_loss():
    assert METRIC_CHOICES[0] == "auto"
    assert set(METRIC_CHOICES[1:]) == {m for t in all_tasks() for m in t.main_choices}


def test_a_tables_main_metric_column_names_its_primary():
    table = pd.DataFrame({"task": ["classification"], "metric": ["mcc"], "main_metric": ["mcc"]})
    assert task_of_table(table).primary == "mcc"
    assert task_of_table(table.drop(columns="main_metric")).primary == "accuracy"  # tables from before the column


@pytest.mark.parametrize("source, stats, name", [
    ("hf:glue:cola:validation", {"hf": {"name": "glue", "config": "cola", "split": "validation"}}, "CoLA"),
    ("hf:nyu-mll/glue:mrpc:train", None, "MRPC"),
    ("data/glue/CoLA/dev.tsv", None, "CoLA"),
    ("/data/cola_dev.tsv", None, "CoLA"),
    ("glue/SST-2/train.tsv", None, "SST-2"),
    ("glue/STS-B/train.tsv", None, "STS-B"),
    ("in_domain.tsv", {"layout": "GLUE CoLA"}, "CoLA"),  # CoLA's header-less layout, whatever the file is called
    ("polarity.csv", None, None),
    ("/home/me/cola-project/runs/data.csv", None, None),  # only the file's name and its folder's are read
])
def test_the_dataset_is_read_from_the_data(source, stats, name):
    found = dataset_of(source, stats)
    assert (found.name if found else None) == name


def _model(path="", num_labels=2, label2id=None):
    return SimpleNamespace(name_or_path=str(path), config=SimpleNamespace(num_labels=num_labels, label2id=label2id))


def test_main_metric_from_the_setting_the_data_the_fine_tune_or_the_task(tmp_path):
    clf = get_task("classification")
    cola = Corpus.from_list(["a", "b"], labels=["0", "1"], name="cola")
    cola.source = str(tmp_path / "CoLA" / "dev.tsv")
    plain = Corpus.from_list(["a", "b"], labels=["0", "1"])
    assert main_metric(clf, corpus=cola, model=_model()).metric == "mcc"
    assert main_metric(clf, corpus=cola, model=_model()).dataset == "CoLA"
    assert main_metric(clf, "f1", corpus=cola, model=_model()).metric == "f1"  # --metric wins
    assert main_metric(clf, corpus=plain, model=_model()).metric == "accuracy"
    run = tmp_path / "run"
    (run / "model").mkdir(parents=True)
    (run / "manifest.json").write_text(json.dumps(
        {"kind": "finetune", "data": {"train": {"source": "hf:glue:qqp:train", "hf": {"name": "glue", "config": "qqp"}}}}))
    found = main_metric(clf, corpus=plain, model=_model(run / "model"))
    assert (found.metric, found.dataset) == ("f1", "QQP") and "fine-tune" in found.why
    # a dataset of another task names nothing: STS-B's Pearson is no classifier's
    stsb = Corpus.from_list(["a", "b"], labels=["0", "1"])
    stsb.source = "glue/STS-B/dev.tsv"
    assert main_metric(clf, corpus=stsb, model=_model()).metric == "accuracy"
    assert main_metric(get_task("regression"), corpus=stsb, model=_model()).metric == "pearson"


def test_a_metric_the_task_has_not_is_refused_in_one_line():
    clf = get_task("classification")
    with pytest.raises(BertologyError, match=r"--metric \(metric\) 'pearson' is not a metric of the classification task"):
        check_metric(clf, "pearson", _model())
    with pytest.raises(BertologyError, match="use macro_f1"):
        check_metric(clf, "f1", _model(num_labels=3))
    check_metric(clf, "mcc", _model(num_labels=3))


def test_the_positive_class_of_f1():
    assert positive_id(SimpleNamespace(label2id={"0": 0, "1": 1})) == 1
    assert positive_id(SimpleNamespace(label2id={"equivalent": 0, "not_equivalent": 1})) == 0
    assert positive_id(SimpleNamespace(label2id={"LABEL_0": 0, "LABEL_1": 1})) == 1
    assert positive_id(SimpleNamespace(label2id=None)) == 1


def _flat_loss() -> pd.DataFrame:
    return pd.DataFrame({"step": range(1, 9), "epoch": np.linspace(0.25, 2.0, 8), "split": "train", "metric": "loss",
                         "value": [1.0] * 8})


def test_the_undertraining_check_of_a_cola_run_names_no_sst2():
    said = undertraining_warnings(_flat_loss(), {"mcc": 0.05, "accuracy": 0.3}, "classification", metric="mcc",
                                  dataset="CoLA")
    assert len(said) == 1 and "No reference figure for CoLA's mcc" in said[0]
    assert "SST-2" not in said[0] and "0.848" not in said[0]
    # a run of the reference's own dataset and metric, or one naming none, is compared as before
    ref = RECIPES["classification"].reference
    for kwargs in ({}, {"metric": "accuracy", "dataset": "SST-2"}, {"metric": "accuracy"}):
        low = undertraining_warnings(_flat_loss(), {"accuracy": 0.3}, "classification", **kwargs)
        assert len(low) == 1 and "far below" in low[0] and f"{ref.value:.3f}" in low[0]
    # another dataset judged by accuracy is not compared with SST-2's accuracy either
    mnli = undertraining_warnings(_flat_loss(), {"accuracy": 0.3}, "classification", metric="accuracy", dataset="MNLI")
    assert len(mnli) == 1 and "No reference figure for MNLI's accuracy" in mnli[0]
    assert undertraining_warnings(_flat_loss(), {"pearson": 0.84}, "regression", metric="pearson",
                                  dataset="STS-B") == []


def test_a_cola_fine_tune_reports_mcc_and_no_sst2_reference(tmp_path):
    """A fine-tune on CoLA-named data: MCC among its metrics, tables and intervals; its under-training check
    names no SST-2 figure (one short, under-trained run: the old check compared it with SST-2's accuracy)."""
    import torch

    from bertology.config import FinetuneConfig
    from bertology.results import read_table
    from bertology.testing import TINY_WORDS, save_tiny_bert
    from bertology.training.run import finetune_to_dir

    torch.set_num_threads(1)
    words = [w for w in TINY_WORDS if w.isalpha()][:12]
    texts = [" ".join(words[(i + j) % len(words)] for j in range(4)) for i in range(40)]
    train = Corpus.from_list(texts, labels=[str(i % 2) for i in range(40)], name="cola")
    train.source = str(tmp_path / "glue" / "CoLA" / "train.tsv")
    config = FinetuneConfig(model=str(save_tiny_bert(tmp_path / "m")), out=str(tmp_path / "run"), epochs=1,
                            batch_size=8, learning_rate=1e-4, warmup_ratio=0.0, seed=0)
    run = finetune_to_dir(config, train)
    assert {"mcc", "accuracy", "macro_f1"} <= set(run.metrics)
    eval_rows = run.table[run.table["split"] == "eval"]
    assert "mcc" in set(eval_rows["metric"])
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["result"]["main_metric"]["metric"] == "mcc" and manifest["result"]["main_metric"]["dataset"] == "CoLA"
    assert "mcc" in set(read_table(tmp_path / "run", "finetune_intervals")["metric"])
    assert not any("SST-2" in w for w in manifest["warnings"])
    assert any("No reference figure for CoLA's mcc" in w for w in manifest["model_warnings"])
