"""A model that learned nothing is never analysed without a word: what its fine-tune warned of it (not above chance,
one class for every example, under-trained) travels with it into compare, ablate and probe (summary, manifest,
report), and a study's comparisons carry it too."""
from __future__ import annotations

import json

import numpy as np
import pytest

from bertology.tasks.match import training_warnings
from bertology.testing import SENTENCES, save_tiny_bert
from cli_checks import invoke, labelled_csv

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def learned_nothing(tmp_path_factory):
    """A tiny model fine-tuned on labels drawn at random: its fine-tune warns it is not shown to beat chance."""
    root = tmp_path_factory.mktemp("nothing")
    base = save_tiny_bert(root / "base")
    texts = [SENTENCES[i % len(SENTENCES)] + " " + SENTENCES[(7 * i) % len(SENTENCES)] for i in range(120)]
    labels = np.random.default_rng(0).integers(0, 2, len(texts)).tolist()
    data = labelled_csv(root / "d.csv", texts, labels)
    ft = invoke("finetune", "--model", base, "--data", data, "--epochs", "1", "--batch-size", "16", "--out",
                root / "ft", "--no-report")
    assert ft.exit_code == 0, ft.output
    manifest = json.loads((root / "ft" / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["model_warnings"] and any("beat chance" in w or "one class" in w for w in manifest["model_warnings"])
    # so weak a run of so few steps is told what it would need, from its own schedule
    import math

    from bertology.training.recipes import MIN_STEPS

    r = manifest["result"]
    assert r["steps"] < MIN_STEPS
    assert any(f"made {r['steps']} optimizer steps" in w and f"--epochs {math.ceil(MIN_STEPS / r['steps_per_epoch'])} "
               in w for w in manifest["model_warnings"]), manifest["model_warnings"]
    return root, base, root / "ft" / "model", data, manifest["model_warnings"]


def _said(output: str, manifest_path, warnings: list[str]) -> None:
    """Each fine-tune warning is in the run's manifest, its report and the printed output."""
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    carried = [w for w in manifest["warnings"] if w.startswith("From the fine-tune of")]
    assert len(carried) == len(warnings) and all(w in c for w, c in zip(warnings, carried)), manifest["warnings"]
    html = (manifest_path.parent / "report.html").read_text(encoding="utf-8")
    assert "From the fine-tune of" in html
    assert "From the fine-tune of" in " ".join(output.split())


def test_compare_of_a_model_that_learned_nothing_says_so(learned_nothing, tmp_path):
    root, base, tuned, data, warnings = learned_nothing
    out = tmp_path / "cmp"
    result = invoke("compare", "--base", base, "--tuned", tuned, "--data", data, "--analyses", "attention_change",
                    "--out", out, "--view-examples", "0")
    assert result.exit_code == 0, result.output
    _said(result.output, out / "manifest.json", warnings)


def test_ablate_of_a_model_that_learned_nothing_says_so(learned_nothing, tmp_path):
    root, base, tuned, data, warnings = learned_nothing
    out = tmp_path / "abl"
    result = invoke("ablate", "--model", tuned, "--data", data, "--bootstrap", "20", "--no-importance", "--out", out)
    assert result.exit_code == 0, result.output
    _said(result.output, out / "manifest.json", warnings)


def test_a_model_not_made_by_finetune_carries_nothing(learned_nothing):
    root, base, *_ = learned_nothing
    assert training_warnings(base) == [] and training_warnings("bert-base-uncased") == []


def test_an_older_manifest_without_the_key_still_carries_the_model_warnings(learned_nothing, tmp_path):
    import shutil

    root, _, tuned, _, warnings = learned_nothing
    run = shutil.copytree(tuned.parent, tmp_path / "old", ignore=shutil.ignore_patterns("checkpoints"))
    manifest = json.loads((run / "manifest.json").read_text(encoding="utf-8"))
    del manifest["model_warnings"]
    (run / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    # the few-steps note is newer than the key: a manifest without the key never held it
    older = [w for w in warnings if not w.startswith("The run made")]
    assert len(older) == len(warnings) - 1
    assert [w.split(": ", 1)[1] for w in training_warnings(run / "model", "old")] == older
