"""``bertology finetune`` lab flags end to end on a tiny model: files, manifest summary, resumption, errors."""
from __future__ import annotations

import json
import os
import random

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pandas as pd
import pytest
from typer.testing import CliRunner

from bertology.models.loading import load_model
from bertology.testing import TINY_WORDS, check_final_intervals, save_tiny_bert

FILLER = [w for w in TINY_WORDS if w not in {"good", "bad", "woman", "girl"}]


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def invoke(args: list[str]):
    import bertology.cli  # noqa: F401  (registers every command)
    from bertology.cli.app import app

    return CliRunner().invoke(app, ["finetune", *args])


def pairs_file(path, n=40, seed=0):
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        lab = "entailment" if i % 2 == 0 else "contradiction"
        who = "woman" if i % 4 == 0 else rng.choice(FILLER)
        rows.append({"premise": f"{who} {'good' if lab == 'entailment' else 'bad'} {rng.choice(FILLER)}",
                     "hypothesis": f"{rng.choice(FILLER)} {rng.choice(FILLER)}", "label": lab})
    pd.DataFrame(rows).to_csv(path, sep="\t", index=False)
    return path


def test_lab_flags_write_a_smaller_model_slices_checkpoints_and_a_summary(tmp_path):
    model = save_tiny_bert(tmp_path / "m", num_hidden_layers=3)
    train, held = pairs_file(tmp_path / "train.tsv"), pairs_file(tmp_path / "dev.tsv", n=16, seed=1)
    words = tmp_path / "words.txt"
    words.write_text("woman\ngirl\n")
    out = tmp_path / "run"
    args = ["--model", str(model), "--data", str(train), "--eval-data", str(held), "--epochs", "1", "--batch-size", "4",
            "--grad-accum", "2", "--lr", "2e-3", "--drop-layers", "3", "--freeze-layers", "1", "--exclude-words", f"@{words}",
            "--save-every", "2", "--max-length", "16", "--out", str(out)]
    result = invoke(args)
    assert result.exit_code == 0, result.output
    assert "dropped 10 of 40 training examples mentioning woman, girl" in result.output
    assert "slice with_words" in result.output and "slice without_words" in result.output
    assert "removed layer(s) 3; 2 remain" in result.output
    assert "training time" in result.output

    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "done"
    html = (out / "report.html").read_text(encoding="utf-8")  # every run command ends with its report
    assert 'id="finetune"' in html and "report: " in result.output
    # the settings section, generated from the declarations, and the report's settings table reading it
    settings = manifest["settings"]
    assert settings["finetune"]["learning_rate"] == {  # given: no "source" (the task's recipe gave the rest)
        "value": 2e-3, "default": None, "flag": "--lr", "help": "Peak learning rate of AdamW for the encoder (default: "
        "the task's recipe).", "paper": "Devlin et al. 2019", "changes_numbers": True}
    assert settings["finetune"]["head_lr"]["value"] == 2e-3  # the classification recipe: the encoder's rate
    assert settings["finetune"]["head_lr"]["source"] == "the classification recipe"
    assert settings["finetune"]["drop_layers"]["value"] == [3] and settings["finetune"]["exclude_words"]["value"] == ["woman", "girl"]
    assert settings["finetune"]["save_every"]["changes_numbers"] is False
    assert settings["data"]["max_length"]["value"] == 16 and settings["data"]["max_examples"]["default"] is None
    assert "Settings: finetune" in html and "<code>--lr</code>" in html and "0.002 (default not given); Devlin et al. 2019" in html
    assert "0.002 (the classification recipe); Dozat &amp; Manning 2017" in html
    ci = check_final_intervals(out, ["accuracy", "macro_f1"])
    assert (ci["n_eval"] == 16).all() and "Final held-out metrics with 95% intervals" in html
    s = manifest["summary"]
    assert s["excluded_words"]["n_dropped"] == 10 and s["n_train"] == 30
    assert s["slices"]["with_words"]["n_eval"] == 4 and s["slices"]["without_words"]["n_eval"] == 12
    assert manifest["config"]["drop_layers"] == [3] and manifest["config"]["grad_accum"] == 2
    assert load_model(out / "model").model.config.num_hidden_layers == 2
    # the base as loaded (3 layers), the saved model as trained (2): the report's tuned column is filled, not "—"
    base, tuned = manifest["models"]["base"], manifest["models"]["tuned"]
    assert base["num_hidden_layers"] == 3 and tuned["num_hidden_layers"] == 2
    assert tuned["path"] == str(out / "model") and tuned["family"] == base["family"] and tuned["is_classifier"]
    assert tuned["name"] == f"{base['name']}, fine-tuned" and tuned["weights_sha256"]
    assert "side by side" not in html and "one fine-tuning run" in html  # its own intro, not the comparison's
    assert "Metrics ›" not in html and "Held-out accuracy" in html and "Layers removed" in html
    table = pd.read_csv(out / "tables" / "finetune.csv")
    assert {"step", "epoch", "split", "metric", "value", "slice"} <= set(table.columns)
    assert set(table["slice"]) == {"all", "with_words", "without_words"}
    steps = sorted(int(p.name.split("-")[1]) for p in (out / "checkpoints").glob("step-*"))
    assert steps == [2, 4]  # 30 examples / (4 x 2) = 4 steps

    # the same data with the full model, reported against the smaller one
    full = invoke(["--model", str(model), "--data", str(train), "--eval-data", str(held), "--epochs", "1",
                   "--batch-size", "8", "--max-length", "16", "--out", str(tmp_path / "full"), "--against", str(out)])
    assert full.exit_code == 0, full.output
    assert "accuracy: " in full.output and f"vs {manifest['summary']['metrics']['accuracy']:.4f} in {out}" in full.output
    assert "training time " in full.output and f"x that of {out}" in full.output
    nothing = invoke(["--model", str(model), "--data", str(train), "--epochs", "1", "--out", str(tmp_path / "x"),
                      "--against", str(tmp_path / "missing")])
    assert nothing.exit_code == 2 and "no finished fine-tuning run" in nothing.output
    assert not (tmp_path / "x").exists()  # refused before training

    # the identical command reuses the run; an unknown column is one clear line
    again = invoke(args)
    assert again.exit_code == 0 and "reus" in again.output
    bad = invoke(["--model", str(model), "--data", str(train), "--label-column", "gold", "--out", str(tmp_path / "bad")])
    assert bad.exit_code == 2 and "Traceback" not in bad.output and "gold" in bad.output


def test_flag_errors_are_one_line(tmp_path):
    model = save_tiny_bert(tmp_path / "m")
    train = pairs_file(tmp_path / "train.tsv")
    for extra, needle in ((["--drop-layers", "x"], "comma list"), (["--drop-layers", "7"], "layers 1..2"),
                          (["--objective", "mlm"], "--objective"), (["--exclude-words", ","], "empty")):
        result = invoke(["--model", str(model), "--data", str(train), "--out", str(tmp_path / "o"), *extra])
        assert result.exit_code == 2, (extra, result.output)
        assert needle in result.output and "Traceback" not in result.output


def test_contrastive_objective_from_the_cli(tmp_path):
    model = save_tiny_bert(tmp_path / "m", hidden_dropout_prob=0.1)
    rng = random.Random(2)
    txt = tmp_path / "sentences.txt"
    txt.write_text("\n".join(" ".join(rng.sample(FILLER, 4)) for _ in range(24)) + "\n")
    sts = tmp_path / "sts.tsv"
    pd.DataFrame({"sentence1": [" ".join(rng.sample(FILLER, 3)) for _ in range(10)],
                  "sentence2": [" ".join(rng.sample(FILLER, 3)) for _ in range(10)],
                  "score": [float(i % 5) for i in range(10)]}).to_csv(sts, sep="\t", index=False)
    out = tmp_path / "simcse"
    result = invoke(["--model", str(model), "--data", str(txt), "--objective", "contrastive", "--sts-data", str(sts),
                     "--epochs", "1", "--batch-size", "8", "--anisotropy-sentences", "12", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "spearman" in result.output and "anisotropy_last_layer_base" in result.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["contrastive"] == "unsupervised"  # auto: plain sentences
    assert manifest["result"]["objective"] == "contrastive"
    an = pd.read_csv(out / "tables" / "anisotropy.csv")
    assert set(an["model"]) == {"base", "tuned"} and list(an.columns) == ["model", "layer", "metric", "value", "n"]
    assert not load_model(out / "model").is_classifier
    sts_rows = pd.read_csv(out / "tables" / "finetune.csv").query("split == 'sts'")
    assert sorted(sts_rows["step"]) == [0, 3]


def test_the_command_line_and_python_make_the_same_run_with_the_same_settings_record(tmp_path):
    """The flags are the declarations: the same settings from the CLI and from Python are one run (same fingerprint,
    same table, same ``settings`` and ``config`` in the manifest, up to the run folder's path)."""
    from bertology.config import DataConfig, FinetuneConfig
    from bertology.training.finetune import read_data
    from bertology.training.run import finetune_to_dir

    model = save_tiny_bert(tmp_path / "m")
    train = pairs_file(tmp_path / "train.tsv", n=16)
    cli = invoke(["--model", str(model), "--data", str(train), "--out", str(tmp_path / "cli"), "--epochs", "1",
                  "--batch-size", "8", "--lr", "1e-3", "--eval-slices", "Woman", "--freeze-layers", "1", "--no-report"])
    assert cli.exit_code == 0, cli.output
    config = FinetuneConfig(model=str(model), data=DataConfig(path=str(train), max_examples=None, overlong="truncate"),
                            out=str(tmp_path / "py"), epochs=1.0, batch_size=8, learning_rate=1e-3, slice_words=("woman",),
                            freeze_layers=1)
    finetune_to_dir(config, *read_data(config))
    a, b = (json.loads((tmp_path / d / "manifest.json").read_text()) for d in ("cli", "py"))
    assert a["fingerprint"] == b["fingerprint"]
    assert a["settings"] == b["settings"] and a["settings"]["finetune"]["slice_words"]["flag"] == "--eval-slices"
    assert {**a["config"], "out": None} == {**b["config"], "out": None}
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "cli/tables/finetune.parquet"),
                                  pd.read_parquet(tmp_path / "py/tables/finetune.parquet"))
