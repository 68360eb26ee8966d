"""``bertology ablate`` on a tiny classifier: outputs, resume after an interruption, refusal, clear errors."""
import csv
import json
import re
import shutil

import pandas as pd
import pytest

from bertology.testing import SENTENCES, save_tiny_bert, set_classifier_bias, split_classifier
from cli_checks import assert_user_error, invoke  # noqa: E402


ABLATION_COLUMNS = {"target", "layer", "head", "mode", "metric", "value", "delta", "ci_low", "ci_high", "n_examples", "helps", "layer_mode"}


@pytest.fixture(scope="module")
def split_model(tmp_path_factory):
    """A tiny classifier that predicts both classes, and its predictions on ``SENTENCES * 2``.

    Labelled with its own predictions the data is separable for it: accuracy 1, well above chance, so
    the ablation may name the heads the task needs.
    """
    folder = save_tiny_bert(tmp_path_factory.mktemp("clf"), classifier=True, initializer_range=0.3)
    return folder, split_classifier(folder, SENTENCES * 2)


@pytest.fixture(scope="module")
def model_dir(split_model):
    return split_model[0]


@pytest.fixture()
def labelled_csv(tmp_path, split_model):
    path = tmp_path / "data.csv"
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["text", "label"])
        for s, label in zip(SENTENCES * 2, split_model[1]):
            w.writerow([s, label])
    return path


def _args(model_dir, data, out, *extra):
    return ["ablate", "--model", model_dir, "--data", data, "--out", out, "--bootstrap", 100, "--pruning-step", 0.25, *extra]


def test_ablate_writes_tables_figures_manifest(model_dir, labelled_csv, tmp_path):
    out = tmp_path / "run"
    result = invoke(*_args(model_dir, labelled_csv, out))
    assert result.exit_code == 0, result.output
    t = pd.read_parquet(out / "tables/ablation.parquet")
    assert ABLATION_COLUMNS <= set(t.columns)
    assert len(t[t["target"] == "head"]) == 2 * 4 * 3 and len(t[t["target"] == "layer"]) == 2 * 2 * 3
    assert pd.read_csv(out / "tables/ablation.csv").shape == t.shape
    imp = pd.read_parquet(out / "tables/head_importance.parquet")
    assert {"layer", "head", "importance"} <= set(imp.columns) and len(imp) == 8
    curve = pd.read_parquet(out / "tables/pruning_curve.parquet")
    assert {"order", "fraction_removed", "n_removed", "metric", "value"} <= set(curve.columns)
    assert {p.name for p in (out / "figures").glob("*.svg")} == {
        "ablation_heads_accuracy.svg", "ablation_heads_loss.svg", "ablation_layers_accuracy.svg", "head_importance.svg",
        "pruning_curve_accuracy.svg", "importance_vs_ablation.svg",
    }
    html = (out / "report.html").read_text(encoding="utf-8")
    assert 'id="ablation"' in html and "Unit the task needs most" in html
    m = json.loads((out / "manifest.json").read_text())
    assert m["kind"] == "ablate" and m["status"] == "complete" and m["ablation_mode"] == "uniform"
    assert m["result"]["intact"]["accuracy"] == pytest.approx(t[(t.target == "intact") & (t.metric == "accuracy")]["value"].iloc[0])
    assert "spearman" in m["result"]["importance_vs_ablation_spearman"]["loss"]
    # the settings section, generated from the declarations; the report's settings table shows it
    assert m["settings"]["ablate"]["n_bootstrap"] == {
        "value": 100, "default": 1000, "flag": "--bootstrap", "changes_numbers": True, "paper": None,
        "help": "Bootstrap resamples of the examples for the 95% intervals (0 = none)."}
    assert m["settings"]["ablate"]["mode"]["paper"] == "Kovaleva et al. 2019" and "qa" not in m["settings"]
    assert "Settings: ablate" in html and "<code>--pruning-step</code>" in html and "0.25 (default 0.1)" in html
    text = " ".join(result.output.split())
    assert "intact: accuracy" in text and "removal hurts beyond the 95% CI (accuracy):" in text and "Spearman" in text
    # a classifier that fits its labels is not flagged
    assert "DEGENERATE" not in text and m["result"]["degenerate"]["flagged"] is False
    assert m["result"]["degenerate"]["accuracy"] == 1.0 and sorted(m["result"]["degenerate"]["predicted_classes"]) == ["0", "1"]
    card = re.search(r'<div class="k">Unit the task needs most</div><div class="v[^"]*">([^<]*)</div>', html).group(1)
    hurt = t[(t["metric"] == "accuracy") & t["hurts"] & (t["ci_high"] > t["ci_low"])].sort_values("delta")
    assert card == (hurt["label"].iloc[0] if len(hurt) else "none beyond its interval")


def test_constant_classifier_is_flagged_and_names_no_head(model_dir, labelled_csv, tmp_path):
    """The issue's RTE run: one class for every example, every delta 0; nothing may call a head needed."""
    constant = set_classifier_bias(shutil.copytree(model_dir, tmp_path / "constant"), [50.0, -50.0])
    out = tmp_path / "run"
    result = invoke(*_args(constant, labelled_csv, out, "--no-importance"))
    assert result.exit_code == 0, result.output
    summary = " ".join(result.output[result.output.index("DEGENERATE"):].split())  # the console may wrap lines
    assert summary.startswith("DEGENERATE CLASSIFIER: the tuned model predicts one class for every example (accuracy 0.500")
    assert summary.index("no head or layer can be called needed") < summary.index("intact: accuracy 0.5000")
    assert "removal hurts beyond" not in result.output
    m = json.loads((out / "manifest.json").read_text())
    d = m["result"]["degenerate"]
    assert d["flagged"] and d["constant_predictions"] and d["predicted_classes"] == ["0"]
    assert d["accuracy"] == 0.5 and d["chance"] == 0.5 and d["at_chance"] and d["ci"][0] < 0.5 < d["ci"][1]
    html = (out / "report.html").read_text(encoding="utf-8")
    card = re.search(r'<div class="k">Unit the task needs most</div><div class="v[^"]*">([^<]*)</div>', html)
    assert card and card.group(1) == "none can be named" and not re.search(r"L\dH\d", card.group(1))
    assert "predictions constant, so ablation deltas cannot say which heads the task needs" in html


def test_interrupted_run_continues_with_the_same_command(model_dir, labelled_csv, tmp_path, monkeypatch):
    from bertology.experiments import ablation

    ref = tmp_path / "ref"
    assert invoke(*_args(model_dir, labelled_csv, ref, "--no-importance")).exit_code == 0

    out = tmp_path / "run"
    original = ablation._Sweep._finish
    calls = {"n": 0}

    def flaky(self, unit, logits):
        original(self, unit, logits)
        calls["n"] += 1
        if calls["n"] == 5:
            raise KeyboardInterrupt

    monkeypatch.setattr(ablation._Sweep, "_finish", flaky)
    stopped = invoke(*_args(model_dir, labelled_csv, out, "--no-importance"))
    assert stopped.exit_code == 130
    assert "run the same command again" in " ".join(stopped.output.split())
    assert not (out / "tables/ablation.parquet").exists()
    monkeypatch.setattr(ablation._Sweep, "_finish", original)

    again = invoke(*_args(model_dir, labelled_csv, out, "--no-importance"))
    assert again.exit_code == 0, again.output
    assert "5 ablations reused" in " ".join(again.output.split())
    pd.testing.assert_frame_equal(pd.read_parquet(out / "tables/ablation.parquet"), pd.read_parquet(ref / "tables/ablation.parquet"))

    other = invoke(*_args(model_dir, labelled_csv, out, "--no-importance", "--mode", "zero"))
    assert_user_error(other, "holds another run", "--overwrite")
    ok = invoke(*_args(model_dir, labelled_csv, out, "--no-importance", "--mode", "zero", "--overwrite"))
    assert ok.exit_code == 0, ok.output
    assert "reused" not in ok.output
    assert set(pd.read_parquet(out / "tables/ablation.parquet")["mode"]) == {"zero"}


def test_unlabelled_data_is_refused(model_dir, tmp_path):
    txt = tmp_path / "s.txt"
    txt.write_text("\n".join(SENTENCES), encoding="utf-8")
    assert_user_error(invoke("ablate", "--model", model_dir, "--data", txt, "--out", tmp_path / "o"), "no labels", "--label-column")


def test_model_without_classifier_head_is_refused(labelled_csv, tmp_path):
    enc = save_tiny_bert(tmp_path / "enc")
    result = invoke("ablate", "--model", enc, "--data", labelled_csv, "--out", tmp_path / "o")
    assert_user_error(result, "has no task head bertology can score")


def test_labels_outside_the_models_label_set_are_listed(model_dir, tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("text,label\nthe movie was good .,pos\na dull film .,neg\nthe cat sat .,1\n", encoding="utf-8")
    result = invoke("ablate", "--model", model_dir, "--data", path, "--out", tmp_path / "o")
    assert_user_error(result, "'neg', 'pos'", "its labels are '0', '1'")
    assert not (tmp_path / "o").exists()


def test_no_report_still_saves_the_study_figures(model_dir, labelled_csv, tmp_path):
    out = tmp_path / "run"
    result = invoke(*_args(model_dir, labelled_csv, out, "--no-report", "--no-importance"))
    assert result.exit_code == 0, result.output
    assert not (out / "report.html").exists()
    assert {p.name for p in (out / "figures").glob("*.svg")} == {"ablation_heads_accuracy.svg", "ablation_layers_accuracy.svg"}
