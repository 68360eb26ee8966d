"""`bertology patterns export` and `train` on a tiny model: files, labels round trip, clear errors."""
import json
import re

import numpy as np
import pandas as pd
import pytest

from bertology.experiments.pattern_cnn import PatternClassifier
from bertology.experiments.pattern_labels import LABEL_COLUMNS
from bertology.metrics.patterns import PATTERNS
from bertology.testing import SENTENCES
from cli_checks import assert_user_error, invoke  # noqa: E402


@pytest.fixture(scope="module")
def exported(identical_pair, tmp_path_factory):
    base, _ = identical_pair
    tmp = tmp_path_factory.mktemp("patterns")
    data = tmp / "sentences.txt"
    data.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    out = tmp / "export"
    result = invoke("patterns", "export", "--model", base, "--data", data, "--out", out,
                    "--examples", 6, "--limit", 40, "--seed", 1)
    assert result.exit_code == 0, result.output
    return out, data, base, result.output


def test_export_writes_maps_labels_and_contact_sheet(exported):
    out, _, _, output = exported
    labels = pd.read_csv(out / "labels.csv", keep_default_na=False)
    assert list(labels.columns[: len(LABEL_COLUMNS)]) == list(LABEL_COLUMNS)
    assert len(labels) == 40  # 6 examples x 2 layers x 4 heads = 48, capped at 40
    assert (labels.label == "").all() and set(labels.predicted) <= set(PATTERNS)
    assert labels.id.is_unique and set(labels.layer) <= {1, 2} and set(labels["head"]) <= set(range(4))
    assert labels.example.nunique() <= 6
    for image in labels.image:
        assert (out / image).read_bytes().startswith(b"\x89PNG")
    with np.load(out / "maps.npz") as npz:
        assert list(npz["ids"]) == list(labels.id)
        assert npz["images"].shape == (40, 32, 32) and npz["images"].max() <= 1.0
        assert npz["raw"].size == int((npz["raw_lengths"] ** 2).sum())
    html = (out / "index.html").read_text(encoding="utf-8")
    assert html.count('class="card"') == 40 and "Download labels.csv" in html
    assert not re.search(r"(src|href)=\"https?://", html)
    meta = json.loads((out / "export.json").read_text())
    assert meta["n_maps"] == 40 and meta["seed"] == 1 and meta["thresholds"]["band"] == 1
    assert "exported 40 maps" in " ".join(output.split())


def test_export_is_deterministic_and_refuses_a_non_empty_folder(exported, tmp_path):
    out, data, base, _ = exported
    again = tmp_path / "again"
    assert invoke("patterns", "export", "--model", base, "--data", data, "--out", again,
                  "--examples", 6, "--limit", 40, "--seed", 1).exit_code == 0
    pd.testing.assert_frame_equal(pd.read_csv(out / "labels.csv"), pd.read_csv(again / "labels.csv"))
    refused = invoke("patterns", "export", "--model", base, "--data", data, "--out", again, "--examples", 2)
    assert_user_error(refused, "not empty", "--overwrite")
    (again / "notes.txt").write_text("mine")
    ok = invoke("patterns", "export", "--model", base, "--data", data, "--out", again, "--examples", 2, "--overwrite")
    assert ok.exit_code == 0, ok.output
    assert len(pd.read_csv(again / "labels.csv")) == 16 and (again / "notes.txt").read_text() == "mine"
    assert len(list((again / "maps").glob("*.png"))) == 16


def test_export_bad_heads(exported, tmp_path):
    _, data, base, _ = exported
    assert_user_error(invoke("patterns", "export", "--model", base, "--data", data, "--out", tmp_path / "x",
                             "--heads", "L3H0"), "layer 3 is outside 1..2")
    assert_user_error(invoke("patterns", "export", "--model", base, "--data", data, "--out", tmp_path / "y",
                             "--heads", "head7"), "--heads")


def test_export_only_some_heads(exported, tmp_path):
    _, data, base, _ = exported
    out = tmp_path / "some"
    assert invoke("patterns", "export", "--model", base, "--data", data, "--out", out, "--heads", "L2H1,L1",
                  "--examples", 3).exit_code == 0
    labels = pd.read_csv(out / "labels.csv")
    assert len(labels) == 3 * 5
    assert set(zip(labels.layer, labels["head"])) == {(2, 1), (1, 0), (1, 1), (1, 2), (1, 3)}


def _labelled_copy(exported, tmp_path, edit):
    """Copy the export and fill in the label column with ``edit(table)``."""
    import shutil

    out, *_ = exported
    copy = tmp_path / "labelled"
    shutil.copytree(out, copy)
    table = pd.read_csv(copy / "labels.csv", keep_default_na=False)
    edit(table)
    table.to_csv(copy / "labels.csv", index=False)
    return copy / "labels.csv"


def test_train_reports_scores_and_saves_a_loadable_model(exported, tmp_path):
    def edit(t):
        t["label"] = [PATTERNS[i % len(PATTERNS)] for i in range(len(t))]
        t.loc[t.index[-3:], "label"] = ""  # three left unlabelled
        t.loc[t.index[0], "label"] = " Vertical + Diagonal "  # case and spaces are forgiven

    csv = _labelled_copy(exported, tmp_path, edit)
    result = invoke("patterns", "train", csv, "--folds", 2, "--epochs", 2)
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "37 labelled maps (3 rows with an empty label skipped)" in text
    assert "macro-F1 over 2 folds" in text and "kappa" in text and "per-class F1" in text
    model_dir = csv.parent / "cnn"
    clf = PatternClassifier.load(model_dir)
    assert clf.classes == PATTERNS and len(clf.metadata["cv"]["fold_macro_f1"]) == 2
    assert clf.metadata["cv"]["agreement"]["rules_vs_labels"]["n"] == 37
    with np.load(csv.parent / "maps.npz") as npz:
        assert set(clf.predict(npz["images"])) <= set(range(len(PATTERNS)))
    again = invoke("patterns", "train", csv, "--folds", 2, "--epochs", 1)
    assert_user_error(again, "already holds a pattern CNN", "--overwrite")


def test_train_names_a_bad_label_row(exported, tmp_path):
    def edit(t):
        t["label"] = "vertical"
        t.loc[t.index[4], "label"] = "verticle"

    csv = _labelled_copy(exported, tmp_path, edit)
    bad_id = pd.read_csv(csv).id.iloc[4]
    assert_user_error(invoke("patterns", "train", csv), "line 6", bad_id, "'verticle'", "heterogeneous")


def test_train_needs_labels_and_two_classes(exported, tmp_path):
    out, *_ = exported
    assert_user_error(invoke("patterns", "train", out / "labels.csv"), "no labelled rows")

    def one_class(t):
        t["label"] = "vertical"

    csv = _labelled_copy(exported, tmp_path, one_class)
    assert_user_error(invoke("patterns", "train", csv), "label at least two classes")
    assert_user_error(invoke("patterns", "train", tmp_path / "missing.csv"), "does not exist")


@pytest.mark.browser
def test_contact_sheet_labels_and_downloads_a_csv(exported, tmp_path):
    import os
    import shutil
    from pathlib import Path

    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("Python playwright is not installed")
    chromium = os.environ.get("BERTOLOGY_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium or not Path(chromium).is_file():
        pytest.skip("no Chromium executable found")
    out, *_ = exported
    errors, remote = [], []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, headless=True,
                                     args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"])
        try:
            page = browser.new_page(accept_downloads=True)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("request", lambda r: remote.append(r.url) if not r.url.startswith(("file:", "data:", "blob:")) else None)
            page.goto((out / "index.html").resolve().as_uri(), wait_until="load")
            cards = page.locator(".card")
            cards.nth(0).locator("button[data-l='block']").click()
            cards.nth(1).focus()
            page.keyboard.press("2")  # diagonal, then focus moves on
            page.keyboard.press("5")  # heterogeneous for the third card
            assert "3 of 40 labelled" in page.inner_text("#progress")
            with page.expect_download() as dl:
                page.click("#download")
            path = tmp_path / "labels.csv"
            dl.value.save_as(str(path))
        finally:
            browser.close()
    assert errors == [] and remote == []
    got = pd.read_csv(path, keep_default_na=False)
    want = pd.read_csv(out / "labels.csv", keep_default_na=False)
    assert list(got.columns) == list(want.columns) and list(got.id) == list(want.id)
    assert list(got.label[:4]) == ["block", "diagonal", "heterogeneous", ""]
