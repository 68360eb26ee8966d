"""Models of different tasks in one ``compare --tuned A=... --tuned B=...`` (issue 32): each is ablated only on
labels of its own task kind. A regressor beside a classifier on the classifier's 0/1 labels is skipped with
its reason (pair warnings, the run's manifest, the CLI, the index page); the classifier still runs; an
ablation the user named that can run on no model is one refusal naming each model's reason."""
import csv
import json

import pytest
from transformers import BertForSequenceClassification

from bertology.config import CompareConfig, DataConfig
from bertology.errors import BertologyError
from bertology.multicompare import TunedModel, compare_many
from bertology.testing import SENTENCES, classifier_logits, save_tiny_bert, split_classifier, tiny_tokenizer
from cli_checks import assert_user_error, invoke

pytestmark = pytest.mark.usefixtures("one_thread")

TEXTS = SENTENCES * 2


def _csv(path, labels):
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["text", "label"] if labels is not None else ["text"])
        for i, s in enumerate(TEXTS):
            w.writerow([s, labels[i]] if labels is not None else [s])
    return path


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """A tiny base, a binary classifier that splits the texts, a regressor, and three corpora: the classifier's
    own 0/1 labels, regression scores, and no labels."""
    root = tmp_path_factory.mktemp("mixed")
    base = save_tiny_bert(root / "base")
    for name, n in (("clf", 2), ("reg", 1)):
        model = BertForSequenceClassification.from_pretrained(
            base, num_labels=n, attn_implementation="eager", **({"problem_type": "regression"} if n == 1 else {}))
        model.save_pretrained(root / name)
        tiny_tokenizer().save_pretrained(root / name)
    split_classifier(root / "clf", TEXTS)  # it predicts both classes, so its own predictions are labels it fits
    labels = classifier_logits(root / "clf", TEXTS).argmax(-1).tolist()
    data = {"classes": _csv(root / "cls.csv", labels),
            "scores": _csv(root / "sts.csv", [f"{(i * 0.37) % 5:.3f}" for i in range(len(TEXTS))]),
            "none": _csv(root / "text.csv", None)}
    return base, {"sst2/s0": root / "clf", "stsb/s0": root / "reg"}, data


def _config(base, data, out, analyses=("attention_change", "ablation")) -> CompareConfig:
    return CompareConfig(base=str(base), tuned="", data=DataConfig(str(data)), out=str(out), analyses=analyses,
                         view_examples=0, ablation_bootstrap=20, ablation_importance=False)


def _tuned(models):
    return [TunedModel(name, str(path)) for name, path in models.items()]


def test_a_regressor_beside_a_classifier_is_not_ablated_on_its_labels(mixed, tmp_path):
    base, models, data = mixed
    run = compare_many(_config(base, data["classes"], tmp_path / "run"), _tuned(models), report=True)
    assert "ablation" in run.pairs["sst2/s0"].results  # the classifier is scored on its own labels
    assert "ablation" not in run.pairs["stsb/s0"].results  # the regressor is not scored on them
    assert set(run.tables["ablation"]["tuned"]) == {"sst2/s0"}
    [skip] = run.skipped_experiments
    assert skip["tuned"] == "stsb/s0" and skip["experiment"] == "ablation"
    assert "are the classes of sst2/s0" in skip["reason"] and "a regressor (one output)" in skip["reason"]
    manifest = json.loads((run.out / "manifest.json").read_text())
    assert manifest["skipped_experiments"] == [skip]
    pair_warnings = run.pairs["stsb/s0"].manifest["warnings"]
    assert any(w.startswith("Ablation and head importance were skipped: ") and skip["reason"] in w for w in pair_warnings)
    assert not any("skipped" in w for w in run.pairs["sst2/s0"].manifest["warnings"])
    page = (run.out / "report.html").read_text()
    assert 'class="skipped"' in page and "stsb/s0" in page and "are the classes of sst2/s0" in page
    assert "are the classes of sst2/s0" in (run.out / "pairs/stsb~s0/report.html").read_text()


def test_a_classifier_beside_a_regressor_is_not_ablated_on_scores(mixed, tmp_path):
    base, models, data = mixed
    run = compare_many(_config(base, data["scores"], tmp_path / "run"), _tuned(models), report=False)
    assert set(run.tables["ablation"]["tuned"]) == {"stsb/s0"}
    assert set(run.tables["ablation"]["task"].dropna()) <= {"stsb"}
    [skip] = run.skipped_experiments
    assert skip["tuned"] == "sst2/s0" and "a regression task's scores" in skip["reason"]


def test_a_named_ablation_that_runs_on_no_model_is_one_refusal(mixed, tmp_path):
    base, models, data = mixed
    with pytest.raises(BertologyError, match="Cannot run the ablation of the tuned classifier: sst2/s0: .*text.csv has "
                                             "no labels.*; stsb/s0: .*text.csv has no labels"):
        compare_many(_config(base, data["none"], tmp_path / "run"), _tuned(models))
    assert not (tmp_path / "run").exists()  # refused before anything was written


def test_cli_says_the_skip_and_report_rerenders_it(mixed, tmp_path):
    base, models, data = mixed
    out = tmp_path / "cli"
    args = ["compare", "--base", base, *(a for n, p in models.items() for a in ("--tuned", f"{n}={p}")),
            "--data", data["classes"], "--out", out, "--analyses", "attention_change,ablation", "--view-examples", 0,
            "--ablation-bootstrap", 20, "--no-importance"]
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "stsb/s0" in text and "warning: Ablation and head importance were skipped: the labels of" in text
    assert "are the classes of sst2/s0" in text
    # bertology report over the many-model folder: the index page again; a corrupt table is one clear error
    assert invoke("report", out).exit_code == 0
    (out / "pairs/stsb~s0/tables/attention_change.parquet").write_bytes(b"not parquet")
    assert_user_error(invoke("report", out), "Table(s) attention_change (pairs/stsb~s0) of", "could not be read")
    (out / "tables/ablation.parquet").write_bytes(b"not parquet")
    assert_user_error(invoke("report", out), "ablation, attention_change (pairs/stsb~s0)")


def test_a_regressor_alone_is_still_ablated_on_whole_numbers(mixed, tmp_path):
    """Nothing says 0/1 are not a given regressor's own scores: the single-model path runs as before."""
    base, models, data = mixed
    run = compare_many(_config(base, data["classes"], tmp_path / "run"), [TunedModel("stsb/s0", str(models["stsb/s0"]))],
                       report=False)
    assert set(run.tables["ablation"]["metric"]) == {"pearson", "spearman", "mse"} and run.skipped_experiments == []


def test_a_folder_whose_regressor_was_ablated_on_those_labels_is_not_resumed(mixed, tmp_path, monkeypatch):
    """A run made before the rule (simulated: the rule switched off) ablated the regressor; the same command now
    differs from it (the regressor's pair skips what it ran), so it is refused, not resumed with that table kept."""
    import bertology.experiments.ablation as ablation

    base, models, data = mixed
    config = _config(base, data["classes"], tmp_path / "run", ("ablation",))
    with monkeypatch.context() as m:
        m.setattr(ablation, "mismatch", lambda *a, **k: None)
        old = compare_many(config, _tuned(models), report=False)
    assert set(old.tables["ablation"]["tuned"]) == {"sst2/s0", "stsb/s0"}
    with pytest.raises(BertologyError, match="different settings|--overwrite"):
        compare_many(config, _tuned(models), report=False)
    again = compare_many(config, _tuned(models), report=False, overwrite=True)
    assert set(again.tables["ablation"]["tuned"]) == {"sst2/s0"}
