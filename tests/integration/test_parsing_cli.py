"""Dependency parsing end to end through the CLI (issue 15): finetune --task parsing on a tiny treebank, with
the lab's flags; ablate the parser; compare its encoder with the base (the ablation runs inside compare);
malformed trees are one user error naming file and line."""
import json

import pandas as pd
import pytest
from transformers import AutoConfig

from bertology.models.loading import load_model
from bertology.models.parser import HEAD_CONFIG, HEAD_WEIGHTS, BiaffineParser
from bertology.testing import check_final_intervals, save_tiny_bert
from cli_checks import assert_user_error, invoke

TREES = [
    [("the", "DET", 2, "det"), ("cat", "NOUN", 3, "nsubj"), ("sat", "VERB", 0, "root"), ("on", "ADP", 6, "case"),
     ("the", "DET", 6, "det"), ("mat", "NOUN", 3, "obl"), (".", "PUNCT", 3, "punct")],
    [("john", "PROPN", 2, "nsubj"), ("saw", "VERB", 0, "root"), ("mary", "PROPN", 2, "obj"), (".", "PUNCT", 2, "punct")],
    [("the", "DET", 2, "det"), ("dog", "NOUN", 3, "nsubj"), ("ran", "VERB", 0, "root"), ("fast", "ADV", 3, "advmod")],
    [("i", "PRON", 2, "nsubj"), ("like", "VERB", 0, "root"), ("the", "DET", 4, "det"), ("movie", "NOUN", 2, "obj")],
    [("she", "PRON", 2, "nsubj"), ("read", "VERB", 0, "root"), ("a", "DET", 5, "det"), ("good", "ADJ", 5, "amod"),
     ("book", "NOUN", 2, "obj"), (".", "PUNCT", 2, "punct")],
]


def write_conllu(path, sentences):
    lines = []
    for s in sentences:
        lines.append("# text = " + " ".join(w for w, *_ in s))
        lines += ["\t".join([str(i), w, w, u, "_", "_", str(h), d, "_", "_"]) for i, (w, u, h, d) in enumerate(s, 1)]
        lines.append("")
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("parsecli")
    base = save_tiny_bert(root / "base", initializer_range=0.3)
    data = write_conllu(root / "train.conllu", TREES * 6)
    ft = invoke("finetune", "--task", "parsing", "--model", base, "--data", data, "--epochs", "2", "--batch-size", "8",
                "--lr", "1e-3", "--out", root / "ft", "--no-report")
    assert ft.exit_code == 0, ft.output
    return root, base, data, ft


def test_finetune_trains_a_parser_and_reports_uas_las(run):
    root, _, _, ft = run
    assert "held-out UAS" in ft.output and "LAS" in ft.output
    model_dir = root / "ft" / "model"
    assert (model_dir / HEAD_WEIGHTS).exists() and (model_dir / HEAD_CONFIG).exists()
    assert AutoConfig.from_pretrained(model_dir).architectures == ["BertModel"]  # an ordinary encoder folder
    manifest = json.loads((root / "ft" / "manifest.json").read_text())
    assert manifest["result"]["task"] == "parsing" and manifest["config"]["task"] == "parsing"
    assert manifest["result"]["split"]["source"] == "split" and manifest["result"]["split"]["n_eval"] == 6
    assert manifest["result"]["parser"]["decoding"].startswith("the best one-root tree")
    # the flags given win; the rest comes from the parsing recipe, and the manifest says which
    settings = manifest["settings"]["finetune"]
    assert settings["learning_rate"]["value"] == 1e-3 and "source" not in settings["learning_rate"]
    assert settings["head_lr"]["value"] == 2e-3 and settings["head_lr"]["source"] == "the parsing recipe"
    assert manifest["result"]["recipe"]["from_recipe"]["arc_dim"]["value"] == manifest["result"]["parser"]["arc_dim"]
    assert set(manifest["result"]["recipe"]["from_recipe"]) == {"head_lr", "warmup_ratio", "arc_dim", "label_dim"}
    table = pd.read_parquet(root / "ft" / "tables" / "finetune.parquet")
    ev = table[table["split"] == "eval"]
    assert {"uas", "las", "loss", "uas_argmax", "las_argmax"} == set(ev["metric"]) and sorted(ev["step"].unique())[0] == 0
    final = ev[ev["step"] == ev["step"].max()].set_index("metric")["value"]
    assert final["uas"] == pytest.approx(manifest["metrics"]["uas"]) and final["las"] <= final["uas"]
    preds = pd.read_parquet(root / "ft" / "tables" / "finetune_predictions.parquet")
    assert len(preds) == 6 and (preds["correct"] <= preds["n_scored"]).all()
    assert preds["correct"].sum() / preds["n_scored"].sum() == pytest.approx(final["uas"])
    assert (check_final_intervals(root / "ft", ["uas", "las"])["n_eval"] == 6).all()  # over sentences


def test_ablate_scores_the_parser_in_uas_and_las(run):
    root, _, data, _ = run
    out = root / "ablate"
    res = invoke("ablate", "--model", root / "ft" / "model", "--data", data, "--out", out, "--bootstrap", "30")
    assert res.exit_code == 0, res.output
    t = pd.read_parquet(out / "tables" / "ablation.parquet")
    assert set(t["metric"]) == {"uas", "las", "loss", "uas_argmax", "las_argmax"} and set(t["task"]) == {"parsing"}
    assert (out / "tables" / "head_importance.parquet").exists()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["task"] == "parsing" and manifest["result"]["degenerate"]["metric"] == "uas"
    assert "Intact UAS" in (out / "report.html").read_text()


def test_compare_loads_the_parser_encoder_and_runs_the_parsing_ablation(run):
    root, base, data, _ = run
    out = root / "compare"
    res = invoke("compare", "--base", base, "--tuned", root / "ft" / "model", "--data", data, "--out", out,
                 "--analyses", "attention_change,ablation", "--ablation-bootstrap", "20", "--no-importance")
    assert res.exit_code == 0, res.output
    assert "intact: uas" in res.output
    assert set(pd.read_parquet(out / "tables" / "ablation.parquet")["task"]) == {"parsing"}
    assert len(pd.read_parquet(out / "tables" / "attention_change.parquet")) == 2 * 4


def test_the_lab_flags_work_on_the_parser(run, tmp_path):
    root, base, data, _ = run
    evald = write_conllu(tmp_path / "eval.conllu", TREES[:2])
    out = tmp_path / "lab"
    res = invoke("finetune", "--task", "parsing", "--model", base, "--data", data, "--eval-data", evald,
                 "--drop-layers", "2", "--freeze-layers", "1", "--grad-accum", "2", "--batch-size", "4", "--epochs", "2",
                 "--early-stopping", "1", "--early-stopping-metric", "las", "--save-every", "2", "--lr", "1e-3",
                 "--out", out, "--no-report")
    assert res.exit_code == 0, res.output
    manifest = json.loads((out / "manifest.json").read_text())["result"]
    assert manifest["split"]["source"] == "eval_data" and manifest["layers"]["after"] == 1
    assert manifest["frozen"]["layers"] == 1 and manifest["effective_batch_size"] == 8
    assert manifest["early_stopping"]["metric"] == "las"
    step = sorted((out / "checkpoints").glob("step-*"))[0]
    ckpt = load_model(step)  # a checkpoint is a loadable parser folder (bertology track reads them)
    assert isinstance(ckpt.model, BiaffineParser) and ckpt.model.config.num_hidden_layers == 1


def test_finetune_refuses_malformed_trees_naming_file_and_line(run, tmp_path):
    _, base, _, _ = run
    bad = tmp_path / "bad.conllu"
    bad.write_text("# text = the cat\n1\tthe\tthe\tDET\t_\t_\t2\tdet\t_\t_\n2\tcat\tcat\tNOUN\t_\t_\t9\troot\t_\t_\n\n")
    res = invoke("finetune", "--task", "parsing", "--model", base, "--data", bad, "--out", tmp_path / "x", "--no-report")
    assert_user_error(res, "bad.conllu, line 3", "HEAD 9 points past the last word")
    plain = tmp_path / "plain.txt"
    plain.write_text("the cat sat\nthe dog ran\n")
    res = invoke("finetune", "--task", "parsing", "--model", base, "--data", plain, "--out", tmp_path / "y", "--no-report")
    assert_user_error(res, "Parsing needs gold trees")
