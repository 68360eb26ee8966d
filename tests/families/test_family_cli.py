"""The family matrix, end to end through the CLI: compare, ablate (with head importance), probe,
finetune with --drop-layers / --freeze-layers, and track, on a tiny model of every family with a
tokenizer of the family's own kind (WordPiece, byte-level BPE or SentencePiece unigram)."""
from __future__ import annotations

import csv
import json
import os
import sys
from pathlib import Path

import pandas as pd
import pytest

from bertology.testing import FAMILY_CONFIGS, SENTENCES, save_tiny_family
from bertology.testing.tokenizers import tiny_tokenizer

sys.path.insert(0, str(Path(__file__).parents[1] / "integration"))
from cli_checks import assert_user_error, invoke  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

#: The tokenizer kind each family ships with.
TOKENIZER = {
    "bert": "wordpiece", "electra": "wordpiece", "distilbert": "wordpiece", "mpnet": "wordpiece",
    "roberta": "bpe", "modernbert": "bpe", "xlm-roberta": "unigram", "albert": "unigram", "deberta-v2": "unigram",
}
# Cosine of identical maps and CKA of identical features: 1 up to float32 rounding of sums over tokens.
ONE = 1e-5
#: ``BERTOLOGY_TEST_DEVICE=cuda`` runs the commands below on a GPU.
DEV = ("--device", os.environ.get("BERTOLOGY_TEST_DEVICE", "cpu"))


def _conllu(sentences) -> str:
    blocks = []
    for n, s in enumerate(sentences, 1):
        words = s.split()
        lines = [f"# sent_id = s{n}", f"# text = {s}"]
        for i, w in enumerate(words, 1):
            lines.append("\t".join([str(i), w, w, "PUNCT" if w in ".,!?" else "X", "_", "_", str(i - 1),
                                    "root" if i == 1 else "dep", "_", "_"]))
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n\n"


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("family-data")
    labelled = root / "labelled.csv"
    with labelled.open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["text", "label"])
        for i, s in enumerate(SENTENCES * 2):
            w.writerow([s, i % 2])
    trees = root / "trees.conllu"
    trees.write_text(_conllu(SENTENCES), encoding="utf-8")
    return labelled, trees


@pytest.fixture(scope="module", params=list(FAMILY_CONFIGS))
def family(request, tmp_path_factory):
    """(model_type, base encoder folder, classifier folder) with the family's own tokenizer kind."""
    mt = request.param
    root = tmp_path_factory.mktemp(mt)
    tok = tiny_tokenizer(TOKENIZER[mt], root / "tok")
    base = save_tiny_family(root / "base", mt, tokenizer=tok, initializer_range=0.3)
    clf = save_tiny_family(root / "clf", mt, tokenizer=tok, classifier=True, initializer_range=0.3)
    return mt, base, clf


def test_self_compare_gives_cosine_one_and_cka_one(family, data, tmp_path):
    mt, base, _ = family
    out = tmp_path / "cmp"
    result = invoke("compare", "--base", base, "--tuned", base, "--data", data[0], "--out", out, "--no-report", *DEV)
    assert result.exit_code == 0, result.output
    change = pd.read_parquet(out / "tables/attention_change.parquet")
    assert len(change) == FAMILY_CONFIGS[mt][1].get("num_hidden_layers", 2) * 4
    assert (change["cosine"] - 1).abs().max() < ONE
    sim = pd.read_parquet(out / "tables/representation_similarity.parquet")
    diag = sim[(sim.layer_base == sim.layer_tuned) & (sim.metric == "cka_linear")]
    assert len(diag) == change.layer.max() + 1 and (diag["value"] - 1).abs().max() < ONE
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["models"]["base"]["model_type"] == mt


def test_ablate_with_head_importance(family, data, tmp_path):
    mt, _, clf = family
    out = tmp_path / "abl"
    result = invoke("ablate", "--model", clf, "--data", data[0], "--out", out, "--bootstrap", 50, "--no-report", *DEV)
    assert result.exit_code == 0, result.output
    table = pd.read_parquet(out / "tables/ablation.parquet")
    n_layers = FAMILY_CONFIGS[mt][1].get("num_hidden_layers", FAMILY_CONFIGS[mt][1].get("n_layers", 2))
    assert len(table[(table.target == "head") & (table.metric == "accuracy")]) == n_layers * 4
    imp = pd.read_parquet(out / "tables/head_importance.parquet")
    assert len(imp) == n_layers * 4 and imp["importance"].notna().all()


def test_probe(family, data, tmp_path):
    _, base, _ = family
    out = tmp_path / "probe"
    result = invoke("probe", "--base", base, "--random-control", "--train", data[1], "--test", data[1], "--rank", 4, *DEV,
                    "--epochs", 1, "--out", out, "--no-report")
    assert result.exit_code == 0, result.output
    table = pd.read_parquet(out / "tables/probe.parquet")
    distance = table[table.probe == "distance"]
    assert distance["uuas"].between(0, 1).all() and set(distance["layer"]) >= {0, 1, 2}
    assert set(table["model"]) == {"base", "random"}


def test_finetune_drop_and_freeze_then_track(family, data, tmp_path):
    mt, base, _ = family
    out = tmp_path / "ft"
    n = FAMILY_CONFIGS[mt][1].get("num_hidden_layers", 2)
    freeze = n if mt == "albert" else 1  # ALBERT shares its layer: all or nothing
    result = invoke("finetune", "--model", base, "--data", data[0], "--epochs", 1, "--batch-size", 4, *DEV,
                    "--drop-layers", 1, "--freeze-layers", freeze - (mt == "albert"), "--out", out)
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "manifest.json").read_text())
    layers = manifest["result"]["layers"] if "result" in manifest and "layers" in manifest["result"] else manifest["layers"]
    assert layers["after"] == n - 1
    if mt == "albert":
        assert "shares one layer" in layers["note"]
    saved = json.loads((out / "model" / "config.json").read_text())
    assert saved["model_type"] == mt
    out = tmp_path / "ft-checkpoints"
    result = invoke("finetune", "--model", base, "--data", data[0], "--epochs", 1, "--batch-size", 4, *DEV,
                    "--freeze-layers", freeze, "--save-every", 2, "--out", out)
    assert result.exit_code == 0, result.output
    tracked = invoke("track", out, "--max-examples", 8, *DEV)
    assert tracked.exit_code == 0, tracked.output
    change = pd.read_parquet(out / "tables" / "track_attention_change.parquet")
    assert change["cosine"].between(-1, 1 + ONE).all() and change["checkpoint"].nunique() >= 2


def test_albert_partial_freeze_is_refused(tmp_path, data):
    tok = tiny_tokenizer("unigram", tmp_path / "tok")
    base = save_tiny_family(tmp_path / "albert", "albert", tokenizer=tok)
    result = invoke("finetune", "--model", base, "--data", data[0], "--epochs", 1, "--freeze-layers", 1,
                    "--out", tmp_path / "o")
    assert_user_error(result, "shares one layer", "freeze 0 or all 3")


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="this machine has CUDA")
@pytest.mark.parametrize("command", ["compare", "ablate", "probe", "finetune"])
def test_a_missing_gpu_is_one_clear_error(command, data, tmp_path):
    model_flag = {"compare": "--base", "probe": "--base"}.get(command, "--model")
    data_flag = {"probe": "--train"}.get(command, "--data")
    extra = {"probe": ["--test", data[1]], "compare": ["--tuned", tmp_path / "never-loaded"]}.get(command, [])
    result = invoke(command, model_flag, tmp_path / "never-loaded", data_flag, data[0], *extra, "--device", "cuda",
                    "--out", tmp_path / "o")
    assert_user_error(result, "CUDA is not available")


def test_the_position_limit_comes_from_the_model_config(tmp_path):
    """RoBERTa with 20 positions (18 usable after the pad offset): longer inputs are skipped and counted,
    with --max-length 512 too, instead of an index error in the embeddings."""
    tok = tiny_tokenizer("bpe", tmp_path / "tok")
    base = save_tiny_family(tmp_path / "short", "roberta", tokenizer=tok, max_position_embeddings=20)
    data = tmp_path / "data.csv"
    data.write_text("text\nthe movie is just great and the actors were wonderful and we loved every minute of it\n"
                    "a dull film\n", encoding="utf-8")
    out = tmp_path / "o"
    result = invoke("compare", "--base", base, "--tuned", base, "--data", data, "--out", out, "--no-report",
                    "--max-length", 512, "--analyses", "attention_change")
    assert result.exit_code == 0, result.output
    assert "1 of 2 examples were longer than 18 tokens and were skipped" in " ".join(result.output.split())
    encoding = json.loads((out / "manifest.json").read_text())["data"]["encoding"]
    assert encoding["max_length"] == 18 and encoding["n_skipped_overlong"] == 1
