"""Fine-tuning on tiny in-process models: it learns, it saves, it is deterministic, it fails clearly."""
from __future__ import annotations

import json
import os
import random

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pandas as pd
import pytest
import torch

from bertology.config import DataConfig, FinetuneConfig
from bertology.data.corpus import Corpus, Example
from bertology.errors import BertologyError
from bertology.models.loading import load_model
from bertology.testing import TINY_WORDS, save_tiny_bert
from bertology.training.finetune import TABLE_COLUMNS, FinetuneResult, finetune

SENTIMENT = {"good", "bad", "great", "awful", "love", "hate", "fun", "funny", "boring", "dull", "not", "no", "never"}
FILLER = [w for w in TINY_WORDS if w not in SENTIMENT]


def polarity_task(n: int = 80, seed: int = 0, n_filler: int = 2) -> tuple[list[str], list[str]]:
    """Sentences of neutral words plus exactly one cue word: "good" -> pos, "bad" -> neg (balanced)."""
    rng = random.Random(seed)
    texts, labels = [], []
    for i in range(n):
        label = "pos" if i % 2 == 0 else "neg"
        words = rng.sample(FILLER, n_filler)
        words.insert(rng.randrange(n_filler + 1), "good" if label == "pos" else "bad")
        texts.append(" ".join(words))
        labels.append(label)
    return texts, labels


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny matrices gain nothing from threads, and on a busy 2-core machine 2 threads are ~5x slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    return str(save_tiny_bert(tmp_path_factory.mktemp("tiny") / "m"))


def fast_config(model: str, out, **overrides) -> FinetuneConfig:
    # 5 epochs of 16 steps at lr 2e-3 learn the polarity task for every tiny-model seed and data seed we
    # tried (32 of 32 reach accuracy 1.0); higher rates sometimes leave the tiny model stuck at chance
    params = dict(model=model, out=str(out), epochs=5, batch_size=4, learning_rate=2e-3, warmup_ratio=0.0, seed=0)
    params.update(overrides)
    return FinetuneConfig(**params)


def test_learns_a_separable_task_and_saves_a_reloadable_classifier(tiny, tmp_path):
    texts, labels = polarity_task()
    result = finetune(fast_config(tiny, tmp_path / "run"), Corpus.from_list(texts, labels=labels))

    assert isinstance(result, FinetuneResult)
    # stratified 80/20 split, recorded
    assert (result.n_train, result.n_eval) == (64, 16)
    assert result.details["split"]["stratified"] is True
    assert result.details["label_counts"]["eval"] == {"neg": 8, "pos": 8}
    assert result.details["training_objective"] == "supervised (cross-entropy)"
    # chance is 0.5; the untrained model sits there (step 0), the trained one must be near perfect
    table = result.table
    start = table.query("split == 'eval' and step == 0 and metric == 'accuracy'")["value"].item()
    assert start <= 0.75
    assert result.metrics["accuracy"] >= 0.8
    assert result.metrics["macro_f1"] >= 0.8
    assert result.metrics["n_eval"] == 16
    assert result.metrics["loss"] < table.query("split == 'eval' and step == 0 and metric == 'loss'")["value"].item()

    # the long-form table: required columns, both splits, eval after every epoch
    assert list(table.columns[:5]) == TABLE_COLUMNS
    assert set(table["split"]) == {"train", "eval"}
    eval_epochs = sorted(set(table.query("split == 'eval'")["epoch"]))
    assert eval_epochs == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    assert {"accuracy", "macro_f1", "loss"} <= set(table.query("split == 'eval'")["metric"])
    assert (table.query("split == 'train' and metric == 'loss'")["value"] > 0).all()
    assert result.label2id == {"neg": 0, "pos": 1}

    # saved folder: safetensors model + tokenizer, reloadable as a classifier with the label names
    model_dir = tmp_path / "run" / "model"
    assert result.model_dir == model_dir
    assert (model_dir / "model.safetensors").exists()
    assert not list((tmp_path / "run").glob(".model*"))  # no temp folder left behind
    reloaded = load_model(model_dir)
    assert reloaded.is_classifier
    assert reloaded.model.config.id2label == {0: "neg", 1: "pos"}
    assert reloaded.model.config.label2id == {"neg": 0, "pos": 1}
    # the reloaded model predicts what the run reported
    preds = result.predictions
    assert preds["correct"].mean() == pytest.approx(result.metrics["accuracy"])
    enc = reloaded.tokenizer(list(preds["text"]), padding=True, return_tensors="pt")
    with torch.inference_mode():
        ids = reloaded.model(**enc).logits.argmax(-1).tolist()
    assert [reloaded.model.config.id2label[i] for i in ids] == list(preds["predicted"])
    json.dumps(result.describe(), default=str)  # manifest-ready


def test_sentence_pairs_and_an_explicit_eval_set(tiny, tmp_path):
    # label = whether the two sentences share their cue word; labels like "-1"/"1" round-trip as strings
    rng = random.Random(1)
    firsts, seconds, labels = [], [], []
    for i in range(24):
        a = rng.choice(["good", "bad"])
        b = a if i % 2 == 0 else ("bad" if a == "good" else "good")
        firsts.append(f"{rng.choice(FILLER)} {a}")
        seconds.append(f"{b} {rng.choice(FILLER)}")
        labels.append("1" if a == b else "-1")
    train = Corpus.from_list(firsts[:16], pairs=seconds[:16], labels=labels[:16])
    held = Corpus.from_list(firsts[16:], pairs=seconds[16:], labels=labels[16:])
    result = finetune(fast_config(tiny, tmp_path / "pairs", epochs=1), train, held)
    assert (result.n_train, result.n_eval) == (16, 8)
    assert result.details["split"]["source"] == "eval_data"
    assert result.label2id == {"-1": 0, "1": 1}
    assert "text_pair" in result.predictions.columns
    assert set(result.predictions["predicted"]) <= {"-1", "1"}
    assert result.details["tokenisation"]["train"]["n_kept"] == 16
    assert result.details["token_type_ids"] is True  # BERT gets segment ids for the second sentence
    reloaded = load_model(result.model_dir)
    assert reloaded.model.config.id2label == {0: "-1", 1: "1"}


def test_truncation_is_counted(tiny, tmp_path):
    texts, labels = polarity_task(n=20, n_filler=8)
    cfg = fast_config(tiny, tmp_path / "trunc", epochs=0.5, data=DataConfig(max_examples=None, max_length=6, overlong="truncate"))
    result = finetune(cfg, Corpus.from_list(texts, labels=labels))
    tok = result.details["tokenisation"]
    assert tok["train"]["n_truncated"] == 16 and tok["eval"]["n_truncated"] == 4
    # fractional epochs: ceil(0.5 * 4 steps per epoch) = 2 steps, evaluated at the last one
    assert result.details["steps"] == 2
    assert result.table["step"].max() == 2


def test_label_warnings_of_the_data_are_in_the_run_warnings(tiny, tmp_path):
    """The loader's doubts about a label column reach the finetune manifest and the CLI's warnings."""
    from bertology.training.run import finetune_to_dir

    texts, labels = polarity_task(n=16)
    train, evaluation = Corpus.from_list(texts[:12], labels=labels[:12]), Corpus.from_list(texts[12:], labels=labels[12:])
    train.stats["label_warnings"] = ["train.csv: the label column 'id' looks like an ID"]
    run = finetune_to_dir(fast_config(tiny, tmp_path / "run", epochs=0.5), train, evaluation)
    assert "train.csv: the label column 'id' looks like an ID" in run.warnings
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert "train.csv: the label column 'id' looks like an ID" in manifest["warnings"]


def test_same_seed_gives_identical_weights(tiny, tmp_path):
    texts, labels = polarity_task(n=24)
    corpus = Corpus.from_list(texts, labels=labels)
    runs = [finetune(fast_config(tiny, tmp_path / name, epochs=1), corpus) for name in ("a", "b")]
    other = finetune(fast_config(tiny, tmp_path / "c", epochs=1, seed=1), corpus)
    states = [load_model(r.model_dir).model.state_dict() for r in (*runs, other)]
    assert states[0].keys() == states[1].keys()
    for name in states[0]:
        assert torch.equal(states[0][name], states[1][name]), name
    assert not all(torch.equal(states[0][n], states[2][n]) for n in states[0])
    pd.testing.assert_frame_equal(runs[0].table, runs[1].table)


def test_missing_and_unseen_labels_are_clear_errors(tiny, tmp_path):
    texts, labels = polarity_task(n=10)
    unlabelled = Corpus([Example(t, label=(None if i == 3 else lab)) for i, (t, lab) in enumerate(zip(texts, labels))])
    with pytest.raises(BertologyError, match="1 of 10 examples .* have none"):
        finetune(fast_config(tiny, tmp_path / "x"), unlabelled)
    with pytest.raises(BertologyError, match="have none"):
        finetune(fast_config(tiny, tmp_path / "x"), Corpus.from_list(texts))

    train = Corpus.from_list(texts, labels=labels)
    held = Corpus.from_list(["the cat sat", "a dog ran"], labels=["pos", "neutral"])
    with pytest.raises(BertologyError, match="never seen in training: 'neutral'"):
        finetune(fast_config(tiny, tmp_path / "x"), train, held)
    with pytest.raises(BertologyError, match="single label"):
        finetune(fast_config(tiny, tmp_path / "x"), Corpus.from_list(texts, labels=["pos"] * len(texts)))
    with pytest.raises(BertologyError, match="epochs"):
        finetune(fast_config(tiny, tmp_path / "x", epochs=0), train)
    assert not (tmp_path / "x" / "model").exists()  # nothing half-written


def test_a_checkpoint_head_of_another_size_is_replaced(tmp_path):
    from bertology.training.finetune import _load_classifier

    three = save_tiny_bert(tmp_path / "c3", classifier=True, num_labels=3)
    # loading keeps every encoder weight of the checkpoint and puts a fresh 2-label head on top
    loaded, label2id, reused = _load_classifier(fast_config(str(three), tmp_path / "x"), ["neg", "pos"])
    original = load_model(three).model.state_dict()
    for name, tensor in loaded.model.state_dict().items():
        if not name.startswith("classifier."):
            assert torch.equal(tensor, original[name]), name
    assert loaded.model.classifier.weight.shape == (2, 32) and not reused
    assert label2id == {"neg": 0, "pos": 1}

    texts, labels = polarity_task(n=12)
    result = finetune(fast_config(str(three), tmp_path / "run", epochs=0.5), Corpus.from_list(texts, labels=labels))
    reloaded = load_model(result.model_dir)
    assert reloaded.model.config.num_labels == 2
    assert reloaded.model.config.id2label == {0: "neg", 1: "pos"}


def test_a_checkpoint_head_with_our_labels_keeps_its_mapping(tmp_path):
    # a classifier saved with labels {0: "pos", 1: "neg"} (not sorted order) keeps that mapping
    first = tmp_path / "first"
    texts, labels = polarity_task(n=12)
    finetune(fast_config(save_tiny_bert(tmp_path / "m"), first, epochs=0.5), Corpus.from_list(texts, labels=labels))
    model = load_model(first / "model")
    model.model.config.id2label = {0: "pos", 1: "neg"}
    model.model.config.label2id = {"pos": 0, "neg": 1}
    model.model.save_pretrained(tmp_path / "flipped")
    model.tokenizer.save_pretrained(tmp_path / "flipped")
    result = finetune(fast_config(str(tmp_path / "flipped"), tmp_path / "second", epochs=0.5), Corpus.from_list(texts, labels=labels))
    assert result.label2id == {"pos": 0, "neg": 1}
    assert result.details["reused_checkpoint_head"] is True
    assert load_model(result.model_dir).model.config.id2label == {0: "pos", 1: "neg"}


def _invoke(args: list[str]):
    from typer.testing import CliRunner

    import bertology.cli.finetune  # noqa: F401  (registers the command)
    from bertology.cli.app import app

    # typer runs a lone command without its name; with several (the usual case) name ours
    if len(app.registered_commands) > 1 or app.registered_callback is not None:
        args = ["finetune", *args]
    return CliRunner().invoke(app, args)


def test_cli_writes_model_tables_and_manifest(tiny, tmp_path):
    texts, labels = polarity_task(n=40)
    csv = tmp_path / "train.csv"
    pd.DataFrame({"sentence": texts, "label": labels}).to_csv(csv, index=False)
    out = tmp_path / "run"
    args = [
        "--model", tiny, "--data", str(csv), "--text-column", "sentence", "--label-column", "label",
        "--epochs", "1", "--batch-size", "8", "--lr", "5e-3", "--out", str(out),
    ]
    result = _invoke(args)
    assert result.exit_code == 0, result.output
    assert "held-out accuracy" in result.output and "macro-F1" in result.output
    table = pd.read_parquet(out / "tables" / "finetune.parquet")
    assert set(TABLE_COLUMNS) <= set(table.columns)
    assert set(pd.read_csv(out / "tables" / "finetune.csv").columns) >= set(TABLE_COLUMNS)
    assert (out / "tables" / "finetune_predictions.csv").exists()
    assert (out / "model" / "config.json").exists()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["kind"] == "finetune"
    assert manifest["seed"] == 0
    assert {"torch", "transformers", "bertology"} <= set(manifest["packages"])
    assert manifest["metrics"]["n_eval"] == 8
    assert manifest["config"]["learning_rate"] == 5e-3
    assert manifest["models"]["tuned"]["weights_sha256"]
    assert manifest["data"]["train"]["n_examples"] == 40

    # the identical run is reused; a different config into the same folder is refused, then allowed
    again = _invoke(args)
    assert again.exit_code == 0 and "reus" in again.output
    # a finished run whose weights were lost is trained again (same seed: the same weights), not reused
    weights = out / "model" / "model.safetensors"
    sha = manifest["models"]["tuned"]["weights_sha256"]
    weights.write_bytes(weights.read_bytes()[:100])
    retrained = _invoke(args)
    assert retrained.exit_code == 0 and "reus" not in retrained.output, retrained.output
    assert json.loads((out / "manifest.json").read_text())["models"]["tuned"]["weights_sha256"] == sha
    changed = [*args[:-2], "--seed", "1", "--out", str(out)]
    refused = _invoke(changed)
    assert refused.exit_code == 2
    assert "--overwrite" in refused.output
    assert json.loads((out / "manifest.json").read_text())["seed"] == 0  # untouched
    forced = _invoke([*changed, "--overwrite"])
    assert forced.exit_code == 0, forced.output
    assert json.loads((out / "manifest.json").read_text())["seed"] == 1


def test_cli_reports_a_missing_label_column_without_traceback(tiny, tmp_path):
    csv = tmp_path / "nolabels.csv"
    pd.DataFrame({"sentence": ["the cat sat", "a dog ran", "the man read"]}).to_csv(csv, index=False)
    result = _invoke(["--model", tiny, "--data", str(csv), "--out", str(tmp_path / "run")])
    assert result.exit_code == 2
    assert "Traceback" not in result.output
    assert "label" in result.output.lower()
