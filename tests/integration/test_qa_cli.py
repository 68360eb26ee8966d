"""Extractive QA end to end through the CLI (issue 15, item 4): finetune --task qa on a SQuAD v2.0 fixture (with
the lab's flags), ablate the QA model on a SQuAD file, and the reports speak F1 / exact match."""
import json

import pandas as pd
import pytest
from transformers import AutoConfig

from bertology.testing import check_final_intervals, save_tiny_qa, squad_fixture
from cli_checks import assert_user_error, invoke

QA_FLAGS = ("--max-length", "40", "--doc-stride", "12")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("qacli")
    base = save_tiny_qa(root / "base", qa_head=False)
    data = root / "train.json"
    data.write_text(json.dumps(squad_fixture("v2.0", copies=3)))
    ft = invoke("finetune", "--task", "qa", "--model", base, "--data", data, *QA_FLAGS, "--epochs", "2",
                "--batch-size", "4", "--grad-accum", "2", "--lr", "1e-3", "--freeze-embeddings", "--drop-layers", "2",
                "--early-stopping", "3", "--eval-every", "2", "--save-every", "3", "--out", root / "ft")
    assert ft.exit_code == 0, ft.output
    return root, base, data, ft


def test_finetune_trains_a_qa_head_and_holds_out_whole_articles(run):
    root, _, _, ft = run
    assert "held-out F1" in ft.output and "exact match" in ft.output
    cfg = AutoConfig.from_pretrained(root / "ft" / "model")
    assert cfg.architectures == ["BertForQuestionAnswering"] and cfg.num_hidden_layers == 1
    manifest = json.loads((root / "ft" / "manifest.json").read_text())
    result = manifest["result"]
    assert result["task"] == "qa" and result["split"]["unit"] == "article"
    assert manifest["summary"]["objective"] == "supervised (start + end cross-entropy)"
    assert result["effective_batch_size"] == 8 and result["early_stopping"]["metric"] == "f1"
    assert result["tokenisation"]["train"]["doc_stride"] == 12 and manifest["config"]["doc_stride"] == 12
    assert manifest["data"]["train"]["n_unanswerable"] == 9 and manifest["data"]["train"]["n_skipped_no_answer"] == 0
    assert (root / "ft" / "checkpoints").is_dir()
    table = pd.read_parquet(root / "ft" / "tables" / "finetune.parquet")
    assert {"f1", "exact_match", "loss"} <= set(table[table["split"] == "eval"]["metric"])
    preds = pd.read_parquet(root / "ft" / "tables" / "finetune_predictions.parquet")
    assert len(preds) == result["split"]["n_eval"] and {"id", "prediction", "answers", "f1", "exact_match"} <= set(preds)
    # article split: every held-out question's article has no question in training (ids are c{copy}a{article}...)
    held = {i.split("q")[0].split("x")[0] for i in preds["id"]}
    assert result["split"]["n_articles_eval"] == len(held)
    assert result["split"]["n_train"] + result["split"]["n_eval"] == 27
    html = (root / "ft" / "report.html").read_text()
    ci = check_final_intervals(root / "ft", ["f1", "exact_match"])
    assert (ci["n_eval"] == len(preds)).all()  # resampled over questions, not windows
    assert "F1 (SQuAD)" in html and "Final held-out metrics with 95% intervals" in html
    assert f"over {len(preds):,} questions" in html


def test_ablate_scores_the_qa_model_over_questions(run):
    root, _, data, _ = run
    out = root / "ablate"
    res = invoke("ablate", "--model", root / "ft" / "model", "--data", data, *QA_FLAGS, "--out", out,
                 "--bootstrap", "50", "--max-examples", "20")
    assert res.exit_code == 0, res.output
    assert "intact: F1" in res.output, res.output
    t = pd.read_parquet(out / "tables" / "ablation.parquet")
    assert set(t["metric"]) == {"f1", "exact_match", "loss"} and set(t["task"]) == {"qa"}
    assert set(t["n_examples"]) == {20}  # questions, not windows
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["task"] == "qa" and manifest["result"]["degenerate"]["metric"] == "f1"
    assert manifest["config"]["doc_stride"] == 12 and manifest["result"]["tokenisation"]["n_questions"] == 20
    assert manifest["result"]["tokenisation"]["n_features"] > 20
    html = (out / "report.html").read_text()
    assert "Intact SQuAD F1" in html and "Intact accuracy" not in html


def test_qa_flags_are_refused_with_a_clear_error(run, tmp_path):
    _, base, data, _ = run
    res = invoke("finetune", "--task", "qa", "--model", base, "--data", data, "--max-length", "4",
                 "--out", tmp_path / "x", "--no-report")
    assert_user_error(res, "for the context", "raise --max-length")
    res = invoke("finetune", "--task", "qa", "--model", base, "--data", data, *QA_FLAGS, "--early-stopping-metric",
                 "accuracy", "--out", tmp_path / "y", "--no-report")
    assert_user_error(res, "is not a metric of the qa task")
    res = invoke("finetune", "--model", base, "--data", data, "--out", tmp_path / "w", "--no-report")
    assert_user_error(res, "is a SQuAD .json file", "pass --task qa")
    bad = tmp_path / "bad.json"
    doc = squad_fixture("v2.0")
    doc["data"][0]["paragraphs"][0]["qas"][0]["answers"][0]["text"] = "the rug"
    bad.write_text(json.dumps(doc))
    res = invoke("finetune", "--task", "qa", "--model", base, "--data", bad, *QA_FLAGS, "--out", tmp_path / "z")
    assert_user_error(res, str(bad), "'c0a0q0'", "'the rug'")


def test_compare_reads_the_squad_file_and_leaves_the_qa_ablation_to_ablate(run):
    root, base, data, _ = run
    out = root / "compare"
    tuned = save_tiny_qa(root / "tuned_qa", seed=5)  # the fine-tuned run dropped a layer: another depth than base
    res = invoke("compare", "--base", base, "--tuned", tuned, "--data", data, "--out", out,
                 "--analyses", "attention_change", "--max-length", "128", "--no-report")
    assert res.exit_code == 0, res.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["data"]["format"] == "squad" and manifest["data"]["n_examples"] == 27
    assert (out / "tables" / "attention_change.parquet").exists()
    res = invoke("compare", "--base", base, "--tuned", tuned, "--data", data, "--out", root / "compare2",
                 "--analyses", "ablation", "--max-length", "128", "--no-report")
    assert_user_error(res, "head (qa) is ablated by `bertology ablate`", "SQuAD JSON file")


def test_finetune_qa_trains_at_its_own_defaults(run, tmp_path):
    """--max-length 128 and --doc-stride 128 (the defaults) once refused every question; the stride is now capped at
    half a window's context room and the manifest says for how many questions."""
    _, base, data, _ = run
    res = invoke("finetune", "--task", "qa", "--model", base, "--data", data, "--epochs", "1", "--batch-size", "8",
                 "--out", tmp_path / "ft", "--no-report")
    assert res.exit_code == 0, res.output
    tokenised = json.loads((tmp_path / "ft" / "manifest.json").read_text())["result"]["tokenisation"]["train"]
    assert tokenised["doc_stride"] == 128 and tokenised["max_length"] == 128
    assert tokenised["n_questions_with_a_capped_stride"] == tokenised["n_questions"] > 0
