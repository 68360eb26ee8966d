"""Tagging end to end through the CLI (issue 15, item 2): finetune on a tiny CoNLL-U (UPOS, XPOS) and a tiny
CoNLL-2003-style BIO file, ablate the tagger, compare it with its base (the ablation runs inside compare),
and the reader's errors for malformed tag files name the file and the line."""
import json

import pandas as pd
import pytest
from transformers import AutoConfig

from bertology.data.loaders import load_corpus
from bertology.errors import BertologyError
from bertology.testing import SENTENCES, check_final_intervals, save_tiny_bert
from cli_checks import assert_user_error, invoke

RULE = {"the": ("DET", "DT"), "a": ("DET", "DT"), ".": ("PUNCT", "."), ",": ("PUNCT", ","), "!": ("PUNCT", "."),
        "was": ("VERB", "VBD"), "saw": ("VERB", "VBD"), "sat": ("VERB", "VBD"), "good": ("ADJ", "JJ")}
PEOPLE = ("john", "mary", "she", "we", "they", "i")


def _sentences():
    for k in range(4):
        for s in SENTENCES:
            yield s.split() if k % 2 == 0 else list(reversed(s.split()))


def _conllu(path):
    """The tiny sentences as CoNLL-U (rule UPOS/XPOS tags), with a multi-word token line and an empty node."""
    lines = []
    for i, words in enumerate(_sentences()):
        lines.append(f"# text = {' '.join(words)}")
        for j, w in enumerate(words, 1):
            if i == 0 and j == 1:
                lines.append(f"1-2\t{w}{words[1]}\t_\t_\t_\t_\t_\t_\t_\t_")  # a multi-word token line: no tag of its own
            u, x = RULE.get(w, ("NOUN", "NN"))
            lines.append(f"{j}\t{w}\t{w}\t{u}\t{x}\t_\t{0 if j == 1 else 1}\t{'root' if j == 1 else 'dep'}\t_\t_")
            if i == 1 and j == 1:
                lines.append("1.1\telided\t_\tVERB\tVB\t_\t_\t_\t0:root\t_")  # an empty node: not a word
        lines.append("")
    path.write_text("\n".join(lines) + "\n")
    return path


def _bio(path):
    lines = ["-DOCSTART- -X- -X- O", ""]
    for words in _sentences():
        for w in words:
            tag = "B-PER" if w in PEOPLE else "B-LOC" if w == "house" else "O"
            lines.append(f"{w} {RULE.get(w, ('NOUN', 'NN'))[1]} O {tag}")
        lines.append("")
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    root = tmp_path_factory.mktemp("tagcli")
    base = save_tiny_bert(root / "base", initializer_range=0.3)
    conllu, bio = _conllu(root / "tiny.conllu"), _bio(root / "tiny.bio")
    ft = invoke("finetune", "--model", base, "--data", conllu, "--epochs", "1", "--batch-size", "8", "--lr", "1e-3",
                "--out", root / "ft", "--no-report")
    assert ft.exit_code == 0, ft.output
    ftbio = invoke("finetune", "--model", base, "--data", bio, "--task", "tagging", "--epochs", "1", "--batch-size", "8",
                   "--lr", "1e-3", "--out", root / "ftbio", "--no-report")
    assert ftbio.exit_code == 0, ftbio.output
    return root, base, conllu, bio, ft, ftbio


def test_finetune_chooses_tagging_and_saves_a_token_classifier(run):
    root, _, conllu, _, ft, _ = run
    assert "held-out word accuracy" in ft.output
    cfg = AutoConfig.from_pretrained(root / "ft" / "model")
    assert cfg.architectures == ["BertForTokenClassification"] and cfg.bertology_tag_field == "upos"
    assert sorted(cfg.label2id) == ["ADJ", "DET", "NOUN", "PUNCT", "VERB"]
    manifest = json.loads((root / "ft" / "manifest.json").read_text())
    r = manifest["result"]
    assert r["task"] == "tagging" and r["task_choice"].startswith("tagging (auto") and r["tag_field"] == "upos"
    assert r["split"]["source"] == "split" and r["split"]["strata"].startswith("none")
    assert r["words"]["eval"]["n_unscored"] == 0 and r["words"]["eval"]["n_scored"] > 0
    table = pd.read_parquet(root / "ft" / "tables" / "finetune.parquet")
    assert {"accuracy", "loss"} == set(table[table["split"] == "eval"]["metric"])
    preds = pd.read_parquet(root / "ft" / "tables" / "finetune_predictions.parquet")
    assert len(preds) == r["words"]["eval"]["n_words"]
    final = table[(table["split"] == "eval") & (table["metric"] == "accuracy")].sort_values("step")["value"].iloc[-1]
    assert preds["correct"].mean() == pytest.approx(final, abs=1e-12)  # the table's accuracy is over these words
    ci = check_final_intervals(root / "ft", ["accuracy"])
    assert ci["n_eval"].iloc[0] == preds["index"].nunique()  # resampled over sentences, not words
    # the multi-word token line and the empty node are not words: the first sentence keeps its own words
    corpus = load_corpus(conllu)
    assert corpus[0].words == tuple(SENTENCES[0].split()) and corpus.stats["n_multiword_tokens"] == 1
    assert corpus.stats["n_empty_nodes"] == 1 and corpus[1].upos[0] == RULE.get(corpus[1].words[0], ("NOUN",))[0]


def test_xpos_is_learnt_with_tag_column(run, tmp_path):
    root, base, conllu, *_ = run
    res = invoke("finetune", "--model", base, "--data", conllu, "--tag-column", "xpos", "--epochs", "0.3",
                 "--batch-size", "8", "--out", tmp_path / "x", "--no-report")
    assert res.exit_code == 0, res.output
    cfg = AutoConfig.from_pretrained(tmp_path / "x" / "model")
    assert cfg.bertology_tag_field == "xpos" and "VBD" in cfg.label2id
    assert json.loads((tmp_path / "x" / "manifest.json").read_text())["config"]["tag_column"] == "xpos"


def test_bio_file_trains_a_bio_tagger_with_entity_scores(run):
    root, _, _, _, _, ftbio = run
    assert "entity F1" in ftbio.output
    manifest = json.loads((root / "ftbio" / "manifest.json").read_text())
    assert manifest["result"]["task"] == "bio_tagging" and manifest["result"]["tag_field"] == "tags"
    assert manifest["summary"]["objective"] == "supervised (cross-entropy per word)"
    table = pd.read_parquet(root / "ftbio" / "tables" / "finetune.parquet")
    assert {"entity_f1", "entity_precision", "entity_recall"} <= set(table["metric"])
    assert manifest["data"]["train"]["n_docstart_lines"] == 1
    check_final_intervals(root / "ftbio", ["entity_f1", "accuracy"])


@pytest.mark.parametrize("which", ["ft", "ftbio"])
def test_ablate_scores_the_tagger_in_its_own_metrics(run, which):
    root, _, conllu, bio, *_ = run
    data = conllu if which == "ft" else bio
    out = root / f"ablate-{which}"
    res = invoke("ablate", "--model", root / which / "model", "--data", data, "--out", out, "--bootstrap", "30",
                 "--mode", "zero")
    assert res.exit_code == 0, res.output
    t = pd.read_parquet(out / "tables" / "ablation.parquet")
    task = "tagging" if which == "ft" else "bio_tagging"
    assert set(t["task"]) == {task}
    assert ("entity_f1" in set(t["metric"])) == (which == "ftbio")
    assert (pd.read_parquet(out / "tables" / "head_importance.parquet")["importance_raw"] > 0).all()
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["task"] == task and "predicted_tags" in manifest["result"]["degenerate"]
    html = (out / "report.html").read_text()
    assert "Intact accuracy" in html and ("entity F1 CI low" in html) == (which == "ftbio")


def test_compare_runs_the_tagger_ablation(run):
    root, base, conllu, *_ = run
    out = root / "compare"
    res = invoke("compare", "--base", base, "--tuned", root / "ft" / "model", "--data", conllu, "--out", out,
                 "--analyses", "attention_change,ablation", "--ablation-bootstrap", "20")
    assert res.exit_code == 0, res.output
    assert "intact: accuracy " in res.output
    t = pd.read_parquet(out / "tables" / "ablation.parquet")
    assert set(t["task"]) == {"tagging"} and (t["target"] == "head").sum() == 8 * 2


def test_a_tagger_on_data_without_its_tags_is_a_clear_error(run, tmp_path):
    root, *_ = run
    txt = tmp_path / "plain.txt"
    txt.write_text("the cat sat .\nthe dog ran .\n")
    assert_user_error(invoke("ablate", "--model", root / "ft" / "model", "--data", txt, "--out", tmp_path / "a"),
                      "no upos tags for example 1")


def test_ragged_tag_file_names_file_and_line(tmp_path):
    bad = tmp_path / "bad.bio"
    bad.write_text("John NNP B-PER\nsaw VBD O\n\nMary B-PER\n")
    with pytest.raises(BertologyError, match=r"bad\.bio, line 4: ragged columns: found 2 .* line 1 has 3"):
        load_corpus(bad)
    one = tmp_path / "one.conll"
    one.write_text("John\nsaw\n")
    with pytest.raises(BertologyError, match=r"one\.conll, line 1: a tag file needs a word and a tag column"):
        load_corpus(one)
    res = invoke("finetune", "--model", "minilm", "--data", bad, "--out", tmp_path / "o", "--no-report")
    assert_user_error(res, "bad.bio, line 4", "ragged columns")


def test_tag_file_columns_by_flag(tmp_path):
    f = tmp_path / "c.conll"
    f.write_text("-DOCSTART- -X- O O\n\nEU NNP B-NP B-ORG\nrejects VBZ B-VP O\n\nPeter NNP B-NP B-PER\n")
    c = load_corpus(f)
    assert [ex.tags for ex in c] == [("B-ORG", "O"), ("B-PER",)] and c[0].text == "EU rejects"
    chunks = load_corpus(f, label_column="2")
    assert chunks[0].tags == ("B-NP", "B-VP") and chunks.stats["columns"]["tags"] == 2
    with pytest.raises(BertologyError, match=r"--label-column 7 is outside the file's 4 columns"):
        load_corpus(f, label_column="7")


def test_unseen_eval_tags_name_the_tags_left_after_exclude_words(run, tmp_path):
    """'good' is the only ADJ: excluding it from training leaves ADJ unseen, and the error lists what training kept."""
    root, base, conllu, *_ = run
    res = invoke("finetune", "--model", base, "--data", conllu, "--eval-data", conllu, "--exclude-words", "good",
                 "--epochs", "1", "--out", tmp_path / "x", "--no-report")
    n_good = sum("good" in words for words in _sentences())
    assert_user_error(res, f"never seen in training once --exclude-words removed {n_good} training sentences: 'ADJ'")
    listed = res.output.split("(training tags:")[1]
    assert "'ADJ'" not in listed and "'DET'" in listed and "'NOUN'" in listed
