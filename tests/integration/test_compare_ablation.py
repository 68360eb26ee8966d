"""``compare`` runs the ablation when the tuned model classifies and the data is labelled; the report shows it."""
import csv
import json
import re

import pandas as pd
import pytest
from typer.testing import CliRunner

from bertology.cli import app
from bertology.config import CompareConfig, DataConfig
from bertology.errors import BertologyError
from bertology.commands.compare import compare
from bertology.testing import SENTENCES, classifier_logits, set_classifier_bias, split_classifier, tiny_bert_pair

runner = CliRunner()


@pytest.fixture(scope="module")
def pair_dirs(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pair")
    base, tuned = tiny_bert_pair(folder / "clf", classifier=True)
    split_classifier(tuned, SENTENCES * 2)  # it predicts both classes; labelled by its own predictions it is above chance
    _, encoder = tiny_bert_pair(folder / "enc")
    return base, tuned, encoder


@pytest.fixture(scope="module")
def labels(pair_dirs):
    """The tuned classifier's own predictions on ``SENTENCES * 2``: labels it fits (accuracy 1)."""
    return classifier_logits(pair_dirs[1], SENTENCES * 2).argmax(-1).tolist()


def _csv(path, labels=None):
    """``SENTENCES * 2`` as a CSV, with a label column when ``labels`` are given."""
    with path.open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["text", "label"] if labels is not None else ["text"])
        for i, s in enumerate(SENTENCES * 2):
            w.writerow([s, labels[i]] if labels is not None else [s])
    return path


def _config(base, tuned, data, out, analyses=("attention_change", "ablation")):
    return CompareConfig(base=str(base), tuned=str(tuned), data=DataConfig(path=str(data)), out=str(out),
                         analyses=tuple(analyses), view_examples=0, ablation_bootstrap=100)


def test_compare_includes_ablation_and_report_section(pair_dirs, labels, tmp_path):
    base, tuned, _ = pair_dirs
    data = _csv(tmp_path / "d.csv", labels)
    run = compare(_config(base, tuned, data, tmp_path / "run"))
    t = run.table("ablation")
    # tiny model: 2 layers x 4 heads, 2 layer modes, 3 metrics, plus the intact rows
    assert len(t[t["target"] == "head"]) == 8 * 3 and len(t[t["target"] == "layer"]) == 2 * 2 * 3
    assert set(t["mode"]) == {"uniform"}
    assert {"head_importance", "pruning_curve"} <= set(run.results)
    assert (tmp_path / "run/tables/ablation.parquet").exists()
    assert run.manifest["analyses"]["ablation"]["settings"]["mode"] == "uniform"
    # how the sweep ran and what a delta means, as `bertology ablate` records them
    swept = run.manifest["analyses"]["ablation"]["ablation"]
    assert swept["method"] == "cached" and swept["first_token_shortcut"] is False and swept["delta"].startswith("ablated")
    assert run.manifest["analyses"]["ablation"]["head_importance"] and run.manifest["analyses"]["ablation"]["tokenisation"]
    html = run.report.read_text(encoding="utf-8")
    assert 'id="ablation"' in html and "fig-ablation_heads_accuracy" in html and "fig-pruning_curve_accuracy" in html
    # the overview names the unit whose removal hurts most beyond its interval (computed here from the table), or none
    acc = t[(t["metric"] == "accuracy") & t["hurts"] & (t["ci_high"] > t["ci_low"])].sort_values("delta")
    named = acc["label"].iloc[0] if len(acc) else "none beyond its interval"
    assert f'<div class="k">Unit the task needs most</div><div class="v">{named}</div>' in html
    assert run.manifest["analyses"]["ablation"]["degenerate"]["flagged"] is False

    # same settings again: the ablation tables are read back, not recomputed
    again = compare(_config(base, tuned, data, tmp_path / "run"))
    assert "ablation" in again.resumed
    pd.testing.assert_frame_equal(again.table("ablation"), t, check_dtype=False)
    assert named == "none beyond its interval" or named in set(again.table("ablation")["label"])


def test_default_analyses_skip_ablation_with_a_note_when_tuned_has_no_head(pair_dirs, labels, tmp_path):
    base, _, encoder = pair_dirs
    data = _csv(tmp_path / "d.csv", labels)
    run = compare(_config(base, encoder, data, tmp_path / "run", analyses=("all",)))
    assert "ablation" not in run.results
    assert any("Ablation and head importance were skipped: the tuned model has no classification or regression head" in w
               for w in run.manifest["warnings"])


def test_named_ablation_without_labels_or_head_is_a_clear_error(pair_dirs, labels, tmp_path):
    base, tuned, encoder = pair_dirs
    with pytest.raises(BertologyError, match="no classification or regression head"):
        compare(_config(base, encoder, _csv(tmp_path / "d.csv", labels), tmp_path / "a"))
    with pytest.raises(BertologyError, match="no labels"):
        compare(_config(base, tuned, _csv(tmp_path / "u.csv"), tmp_path / "b"))


def test_cli_compare_prints_ablation_summary(pair_dirs, labels, tmp_path):
    base, tuned, _ = pair_dirs
    data = _csv(tmp_path / "d.csv", labels)
    result = runner.invoke(app, ["compare", "--base", str(base), "--tuned", str(tuned), "--data", str(data),
                                 "--out", str(tmp_path / "run"), "--analyses", "ablation", "--ablation-mode", "zero",
                                 "--ablation-bootstrap", "50", "--no-importance", "--view-examples", "0"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "ablation of the tuned classifier" in text and "mode zero" in text
    assert re.search(r"intact: accuracy \d\.\d{4}", text)
    manifest = json.loads((tmp_path / "run/manifest.json").read_text())
    assert manifest["config"]["ablation_mode"] == ["zero"]
    assert not (tmp_path / "run/tables/head_importance.parquet").exists()
    bad = runner.invoke(app, ["compare", "--base", str(base), "--tuned", str(tuned), "--data", str(data),
                              "--out", str(tmp_path / "bad"), "--ablation-mode", "half"])
    assert bad.exit_code == 2 and "--ablation-mode (ablation_mode) must be one of uniform, zero, mean, revert, transplant, not" in " ".join(bad.output.split())


def test_compare_flags_a_constant_classifier(pair_dirs, labels, tmp_path):
    """One class for every example: the manifest records it, the summary says so first, the report names no head."""
    import shutil

    base, tuned, _ = pair_dirs
    constant = set_classifier_bias(shutil.copytree(tuned, tmp_path / "constant"), [-50.0, 50.0])
    result = runner.invoke(app, ["compare", "--base", str(base), "--tuned", str(constant), "--data", str(_csv(tmp_path / "d.csv", labels)),
                                 "--out", str(tmp_path / "run"), "--analyses", "ablation", "--ablation-bootstrap", "50",
                                 "--no-importance", "--view-examples", "0"])
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "ablation of the tuned classifier DEGENERATE CLASSIFIER: the tuned model predicts one class for every example" in text
    assert "removal hurts beyond" not in text
    d = json.loads((tmp_path / "run/manifest.json").read_text())["analyses"]["ablation"]["degenerate"]
    assert d["flagged"] and d["constant_predictions"] and d["predicted_classes"] == ["LABEL_1"]
    assert d["chance"] == pytest.approx(max(labels.count(0), labels.count(1)) / len(labels))
    html = (tmp_path / "run/report.html").read_text(encoding="utf-8")
    assert '<div class="k">Unit the task needs most</div><div class="v">none can be named</div>' in html


@pytest.mark.browser
def test_new_sections_render_in_headless_chromium(pair_dirs, labels, tmp_path):
    """Ablation, geometry, PCA views and the out-of-domain figure in a real browser: no errors, figures drawn."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).parent))
    from test_report import chromium_page  # noqa: E402

    base, tuned, _ = pair_dirs
    data = _csv(tmp_path / "d.csv", labels)
    ood = tmp_path / "ood.txt"
    ood.write_text("the stock market fell on monday .\nrain is expected tomorrow .\n" * 3, encoding="utf-8")
    config = CompareConfig(base=str(base), tuned=str(tuned), data=DataConfig(path=str(data)), out=str(tmp_path / "run"),
                           analyses=("representation_similarity", "geometry", "pca_views", "ablation"), view_examples=0,
                           ablation_bootstrap=50, rsa_tokens=40, geometry_pairs=10, geometry_min_contexts=2,
                           ood_data=str(ood))
    run = compare(config)
    with chromium_page(run.report) as (page, errors):
        for sid, n_min in (("geometry", 1), ("pca-views", 2), ("ablation", 5)):
            figs = page.locator(f"section#{sid} figure svg")
            assert figs.count() >= n_min, sid
            box = figs.first.bounding_box()
            assert box and box["width"] > 150 and box["height"] > 100, (sid, box)
        assert page.locator("#fig-similarity_domains svg").count() == 1
        # the ablation table sorts when its header is clicked (the report's own script)
        header = page.locator("section#ablation table th").nth(2)
        before = page.locator("section#ablation table tbody tr td").nth(2).inner_text()
        header.click()
        header.click()
        cells = page.locator("section#ablation table tbody tr td:nth-child(3)").all_inner_texts()
        values = [float(c) for c in cells]
        assert values == sorted(values) or values == sorted(values, reverse=True)
        assert before  # the table had rows before sorting
    assert errors == [], errors
