"""Bad inputs on every command that takes them: one line naming the file and the fix, exit 2, no traceback.

And the last resort: an unexpected exception (a bug) is one line and exit 1, its traceback only with
``--debug`` (or ``BERTOLOGY_DEBUG=1``).
"""
import argparse
import json
import os
import shutil
from collections.abc import Callable

import pandas as pd
import pytest
import torch
from safetensors.torch import load_file, save_file

from bertology.testing import SENTENCES, save_tiny_bert
from cli_checks import assert_user_error, invoke, runner  # noqa: E402

from bertology.cli import app

GOOD_CONLLU = (
    "# text = the cat sat\n1\tthe\tthe\tDET\tDT\t_\t2\tdet\t_\t_\n2\tcat\tcat\tNOUN\tNN\t_\t3\tnsubj\t_\t_\n"
    "3\tsat\tsit\tVERB\tVBD\t_\t0\troot\t_\t_\n\n"
)
#: The second sentence's heads form a cycle (2 -> 3 -> 2) beside a root.
CYCLE_CONLLU = GOOD_CONLLU + (
    "# text = dogs chase cats now\n1\tdogs\tdog\tNOUN\tNNS\t_\t0\troot\t_\t_\n"
    "2\tchase\tchase\tVERB\tVBP\t_\t3\tdep\t_\t_\n3\tcats\tcat\tNOUN\tNNS\t_\t2\tobj\t_\t_\n"
    "4\tnow\tnow\tADV\tRB\t_\t1\tadvmod\t_\t_\n\n"
)


#: A CoNLL-U file whose second word has no HEAD column left (7 of 10 fields).
BAD_LINE_CONLLU = GOOD_CONLLU.replace("2\tcat\tcat\tNOUN\tNN\t_\t3", "2\tcat\tcat\tNOUN")
#: A HEAD past the last word.
BAD_HEAD_CONLLU = GOOD_CONLLU.replace("NN\t_\t3\tnsubj", "NN\t_\t9\tnsubj")
#: Every HEAD '_' (a tokenised but unparsed file).
NO_HEADS_CONLLU = GOOD_CONLLU.replace("\t2\tdet", "\t_\tdet").replace("\t3\tnsubj", "\t_\tnsubj").replace("\t0\troot", "\t_\troot")

#: Data files of the bad-input table: name -> bytes.
DATA_FILES = {
    "empty.txt": b"",
    "blank.txt": b"  \n\t\n   \n",
    "binary.txt": bytes(range(256)) * 4,
    "latin1.txt": "caf\xe9 cr\xe8me br\xfbl\xe9e\n".encode("latin-1"),
    "ragged.tsv": b"text\tlabel\nthe cat sat\t1\nthe dog ran\t0\textra\tmore\n",
    "header.csv": b"text,label\n",
    "empty_cells.csv": b"text,label\n,1\n  ,0\n",
    "broken.jsonl": b'{"text": "the cat sat", "label": 1}\n{"text": "the dog ran", "label\n',
    "bad_line.conllu": BAD_LINE_CONLLU.encode(),
    "bad_head.conllu": BAD_HEAD_CONLLU.encode(),
    "no_heads.conllu": NO_HEADS_CONLLU.encode(),
    "no_label.csv": b"text\nthe cat sat\nthe dog ran\n",
    "unseen.csv": b"text,label\nthe cat sat,pos\nthe dog ran,neg\n",
    "unseen_eval.csv": b"text,label\nthe cat sat,2\nthe dog ran,3\n",
}


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """Models (a tiny classifier and broken copies of it, an encoder, GPT-2, T5) and data files, shared by
    every case."""
    from transformers import GPT2Config, GPT2Model, T5Config, T5Model

    root = tmp_path_factory.mktemp("bad")
    good = save_tiny_bert(root / "good", classifier=True)
    save_tiny_bert(root / "encoder")
    pickled = root / "pickled"
    shutil.copytree(good, pickled)
    state = load_file(pickled / "model.safetensors")
    (pickled / "model.safetensors").unlink()
    # training arguments saved beside the weights: torch's weights-only loader refuses such a pickle
    torch.save({**state, "args": argparse.Namespace(lr=1e-3)}, pickled / "pytorch_model.bin")
    for name in ("nan_weights", "wrong_sizes", "no_layers"):
        shutil.copytree(good, root / name)
    state = load_file(root / "nan_weights" / "model.safetensors")
    state[next(k for k in state if k.endswith("query.weight"))][0, 0] = float("nan")
    save_file(state, root / "nan_weights" / "model.safetensors", metadata={"format": "pt"})
    for name, key, value in (("wrong_sizes", "intermediate_size", 2 * 37), ("no_layers", "num_hidden_layers", -1)):
        config = json.loads((root / name / "config.json").read_text(encoding="utf-8"))
        config[key] = value
        (root / name / "config.json").write_text(json.dumps(config), encoding="utf-8")
    corrupt = root / "corrupt"
    shutil.copytree(good, corrupt)
    (corrupt / "model.safetensors").write_bytes(b"not a safetensors file" * 4)
    for name, keep in (("config_only", ("config.json",)), ("no_tokenizer", ("config.json", "model.safetensors"))):
        (root / name).mkdir()
        for f in keep:
            shutil.copy(good / f, root / name / f)
    (root / "no_config").mkdir()
    GPT2Model(GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=20, n_positions=16)).save_pretrained(root / "gpt2")
    T5Model(T5Config(num_layers=1, d_model=8, d_kv=4, d_ff=8, num_heads=2, vocab_size=20)).save_pretrained(root / "t5")
    pd.DataFrame({"text": SENTENCES, "label": [i % 2 for i in range(len(SENTENCES))]}).to_csv(root / "good.csv",
                                                                                             index=False)
    (root / "text.txt").write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    (root / "gold.conllu").write_text(GOOD_CONLLU * 4, encoding="utf-8")
    (root / "cycle.conllu").write_text(CYCLE_CONLLU, encoding="utf-8")
    for name, content in DATA_FILES.items():
        (root / name).write_bytes(content)
    (root / "a_file").write_text("not a folder", encoding="utf-8")
    (root / "a_folder").mkdir()
    (root / "data.csv").mkdir()  # a folder named like a data file
    (root / "photos").mkdir()
    (root / "photos" / "cat.jpg").write_bytes(b"jpg")
    return root


def _read_only_folder(root):
    folder = root / "read_only"
    folder.mkdir(exist_ok=True)
    folder.chmod(0o555)
    return folder


#: Every command that takes an input, with the input in slots: ``model`` (the tuned model, or the only
#: one), ``data`` (the corpus; ``probe``: the training trees; ``view``: the text), ``out``, and ``extra``
#: flags. Missing slots get good values.
COMMANDS = ("compare", "ablate", "probe", "finetune", "view")


def _command(command: str, r, model, data, out, extra) -> list:
    if command == "compare":  # the ablation too, so that label errors are reached
        return ["compare", "--base", r / "good", "--tuned", model or r / "good", "--data", data or r / "good.csv",
                "--analyses", "attention_change,ablation", "--ablation-bootstrap", "10", "--no-report",
                "--out", out, *extra]
    if command == "ablate":
        return ["ablate", "--model", model or r / "good", "--data", data or r / "good.csv", "--bootstrap", "10",
                "--no-report", "--out", out, *extra]
    if command == "probe":
        return ["probe", "--base", model or r / "good", "--train", data or r / "gold.conllu", "--test",
                r / "gold.conllu", "--epochs", "1", "--no-report", "--out", out, *extra]
    if command == "finetune":
        return ["finetune", "--model", model or r / "good", "--data", data or r / "good.csv", "--epochs", "1",
                "--no-report", "--out", out, *extra]
    return ["view", "the cat sat" if data is None else data, "--model", model or r / "good", "--out", out, *extra]


RUNS = ("compare", "ablate", "probe", "finetune")  # the commands that write a run folder
LABELLED = ("compare", "ablate", "finetune")  # the commands that read labels (compare: for its ablation)
PICKLE = ("pickled/pytorch_model.bin", "safetensors", "save_file(")

#: case -> (slot, value from the fixture folder, commands, fragments the one error line must hold)
BAD_INPUTS: dict[str, tuple[str, Callable, tuple[str, ...], tuple[str, ...]]] = {
    # the data
    "empty file": ("data", lambda r: r / "empty.txt", RUNS, ("empty.txt", "has no examples")),
    "whitespace-only file": ("data", lambda r: r / "blank.txt", RUNS, ("blank.txt", "has no examples")),
    "binary file": ("data", lambda r: r / "binary.txt", RUNS, ("binary.txt", "not valid UTF-8", "byte 0x80")),
    "non-UTF-8 file": ("data", lambda r: r / "latin1.txt", RUNS, ("latin1.txt", "line 1: byte 0xe9", "as UTF-8")),
    "ragged TSV": ("data", lambda r: r / "ragged.tsv", RUNS, ("ragged.tsv", "cannot read it as TSV", "line 3")),
    "CSV with a header only": ("data", lambda r: r / "header.csv", RUNS, ("header.csv", "has no examples")),
    "CSV with empty texts": ("data", lambda r: r / "empty_cells.csv", RUNS,
                             ("empty_cells.csv", "2 dropped with an empty text")),
    "broken JSONL": ("data", lambda r: r / "broken.jsonl", RUNS, ("broken.jsonl, line 2", "not valid JSON")),
    "malformed CoNLL-U line": ("data", lambda r: r / "bad_line.conllu", RUNS,
                               ("bad_line.conllu, line 3", "expected 10 tab-separated fields")),
    "malformed CoNLL-U heads": ("data", lambda r: r / "bad_head.conllu", RUNS,
                                ("bad_head.conllu, line 3", "HEAD 9 points past the last word")),
    "missing file": ("data", lambda r: r / "missing.txt", RUNS, ("No such file", "missing.txt")),
    "a folder as data": ("data", lambda r: r / "data.csv", RUNS, ("data.csv is a folder", "one file")),
    "malformed hf: id": ("data", lambda r: "hf:glue", RUNS, ("'hf:glue'", "hf:NAME[:CONFIG]:SPLIT")),
    "unknown hf: dataset offline": ("data", lambda r: "hf:no-such-dataset:train", RUNS,
                                    # reached only with `datasets` installed with the project (issue 21)
                                    ("Could not load the Hugging Face dataset 'no-such-dataset'", "split 'train'")),
    "CoNLL-U without heads": ("data", lambda r: r / "no_heads.conllu", ("probe",),
                              ("no_heads.conllu", "no dependency heads", "need gold trees")),
    "empty text": ("data", lambda r: "", ("view",), ("The text to view is empty",)),
    "whitespace-only text": ("data", lambda r: "  \t ", ("view",), ("The text to view is empty",)),
    # labels
    "missing label column": ("data", lambda r: r / "no_label.csv", LABELLED, ("no_label.csv", "--label-column")),
    "unknown --label-column": ("extra", lambda r: ["--label-column", "nope"], LABELLED,
                               ("good.csv", "no label column 'nope'", "['text', 'label']")),
    "unknown --text-column": ("extra", lambda r: ["--text-column", "nope"], LABELLED,
                              ("good.csv", "no text column 'nope'", "['text', 'label']")),
    "labels the model does not know": ("data", lambda r: r / "unseen.csv", ("compare", "ablate"),
                                       ("'neg', 'pos'", "its labels are '0', '1'")),
    "eval labels unseen in training": ("extra", lambda r: ["--eval-data", r / "unseen_eval.csv"], ("finetune",),
                                       ("never seen in training: '2', '3'", "training labels: '0', '1'")),
    # settings that name parts of the model, or a length no input fits (issue 43: a study checks them up front)
    "--freeze-layers beyond the model": ("extra", lambda r: ["--freeze-layers", "9"], ("finetune",),
                                         ("--freeze-layers 9: the model has 2 layers",)),
    "--lora-targets that match no module": ("extra", lambda r: ["--method", "lora", "--lora-targets", "qkv_proj"],
                                            ("finetune",), ("--lora-targets qkv_proj: no module of", "query")),
    "--max-length 0": ("extra", lambda r: ["--max-length", "0"], ("compare", "finetune"),
                       ("--max-length (max_length) must be at least 2, not 0",)),
    # the model
    "missing model folder": ("model", lambda r: r / "missing", COMMANDS, ("Model folder", "missing does not exist")),
    "unknown hub id offline": ("model", lambda r: "nobody/no-such-model", COMMANDS,
                               ("'nobody/no-such-model'", "from the Hugging Face hub", "pass a local folder")),
    "GPT-2": ("model", lambda r: r / "gpt2", COMMANDS, ("model_type 'gpt2'", "bidirectional Transformer encoders")),
    "T5": ("model", lambda r: r / "t5", COMMANDS, ("model_type 't5'", "bidirectional Transformer encoders")),
    "folder without config.json": ("model", lambda r: r / "no_config", COMMANDS, ("no_config has no config.json",)),
    "config without weights": ("model", lambda r: r / "config_only", COMMANDS, ("config_only", "model.safetensors")),
    "pickled weights": ("model", lambda r: r / "pickled", COMMANDS, PICKLE),
    "corrupt safetensors": ("model", lambda r: r / "corrupt", COMMANDS,
                            ("corrupt/model.safetensors", "not a valid safetensors file", "save the model again")),
    "no tokenizer files": ("model", lambda r: r / "no_tokenizer", COMMANDS,
                           ("no_tokenizer has no tokenizer", "tokenizer.save_pretrained")),
    "NaN weights": ("model", lambda r: r / "nan_weights", COMMANDS,
                    ("nan_weights", "NaN or infinite weights", "query.weight")),
    "a config that does not fit its weights": ("model", lambda r: r / "wrong_sizes", COMMANDS,
                                               ("wrong_sizes", "config.json does not fit its weights",
                                                "in the file", "by the config")),
    "num_hidden_layers = -1": ("model", lambda r: r / "no_layers", COMMANDS,
                               ("no_layers", "num_hidden_layers = -1", "at least 1")),
    "a NaN base to revert to": ("extra", lambda r: ["--mode", "revert", "--base", r / "nan_weights"], ("ablate",),
                                ("nan_weights", "NaN or infinite weights")),
    "a negative seed": ("extra", lambda r: ["--seed", "-1"], RUNS, ("--seed", "at least 0", "not -1")),
    "a seed past numpy's range": ("extra", lambda r: ["--seed", str(2**32)], RUNS,
                                  ("--seed", "at most 4294967295", "not 4294967296")),
    "encoder without a classification head": ("model", lambda r: r / "encoder", ("ablate",),
                                              ("encoder", "pass a fine-tuned classifier")),
    # the output
    "--out is a file": ("out", lambda r: r / "a_file", RUNS, ("--out", "a_file is a file, not a folder")),
    "--out under a file": ("out", lambda r: r / "a_file" / "run", COMMANDS, ("a_file", "--out")),
    "--out holds something else": ("out", lambda r: r / "photos", RUNS,
                                   ("photos is not empty and holds no bertology run", "--overwrite")),
    "view --out is a folder": ("out", lambda r: r / "a_folder", ("view",),
                               ("--out", "a_folder is a folder", "a_folder/view.html")),
    "--out in a read-only folder": ("out", lambda r: _read_only_folder(r) / "run", COMMANDS,
                                    ("read_only/run", "writable")),
}
CASES = [(case, command) for case, (_, _, commands, _) in BAD_INPUTS.items() for command in commands]


@pytest.mark.parametrize(("case", "command"), CASES, ids=[f"{command}: {case}" for case, command in CASES])
def test_a_bad_input_is_one_line_naming_the_file(files, tmp_path, case, command):
    """Exit status 2, no traceback, one ``error:`` line naming the file or value (and the fix), and no
    run folder left behind where there was none."""
    slot, value, _, fragments = BAD_INPUTS[case]
    if "read-only" in case and os.geteuid() == 0:
        pytest.skip("root writes anywhere")
    given = {"model": None, "data": None, "out": tmp_path / ("v.html" if command == "view" else "run"), "extra": []}
    given[slot] = value(files)
    result = invoke(*_command(command, files, **given))
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.output  # one line, however long
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    if slot == "out":
        return
    if command == "view":
        assert not (tmp_path / "v.html").exists()
    elif (tmp_path / "run").exists():  # refused after the folder was marked: it says so, and holds no table
        manifest = json.loads((tmp_path / "run" / "manifest.json").read_text(encoding="utf-8"))
        assert manifest["status"] == "failed" and manifest["error"], manifest
        assert not list((tmp_path / "run").glob("tables/*"))


def test_compare_names_the_sentences_whose_heads_are_not_a_tree(files, tmp_path):
    out = tmp_path / "run"
    result = invoke("compare", "--base", files / "good", "--tuned", files / "good", "--data", files / "cycle.conllu",
                    "--out", out, "--no-report", "--analyses", "attention_change")
    assert result.exit_code == 0, result.output
    warnings = json.loads((out / "manifest.json").read_text())["warnings"]
    tree = [w for w in warnings if "do not form one tree" in w]
    assert len(tree) == 1 and "1 of 2 sentences" in tree[0] and "cycle.conllu" in tree[0]
    assert "sentence 2: heads contain a cycle" in tree[0]
    assert "do not form one tree" in " ".join(result.output.split())


@pytest.fixture()
def broken_view(monkeypatch):
    """``view`` with a bug planted: computing the view raises an exception no one expects."""
    import bertology.activations.views as views

    def boom(*args, **kwargs):
        raise RuntimeError("planted [bug]\nsecond line")

    monkeypatch.setattr(views, "view_data", boom)


@pytest.mark.usefixtures("broken_view")
def test_a_bug_is_one_line_and_exit_1_without_debug(files, tmp_path):
    result = invoke("view", "the cat sat", "--model", files / "good", "--out", tmp_path / "v.html")
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    assert result.output.strip() == (
        "internal error: RuntimeError: planted [bug] second line — please report it; rerun with --debug for the traceback"
    )


@pytest.mark.parametrize("how", ["flag", "env"])
@pytest.mark.usefixtures("broken_view")
def test_debug_shows_the_traceback(files, tmp_path, how):
    args = ["view", "the cat sat", "--model", str(files / "good"), "--out", str(tmp_path / "v.html")]
    if how == "flag":
        result = runner.invoke(app, ["--debug", *args])
    else:
        result = runner.invoke(app, args, env={"BERTOLOGY_DEBUG": "1"})
    assert result.exit_code == 1, result.output
    assert "Traceback (most recent call last)" in result.output and "in boom" in result.output
    assert "internal error: RuntimeError" in result.output


def test_debug_keeps_a_user_error_at_exit_2(tmp_path):
    result = invoke("--debug", "view", "the cat sat", "--model", tmp_path / "missing", "--out", tmp_path / "v.html")
    assert result.exit_code == 2, result.output
    assert "error: Model folder" in result.output and "Traceback" in result.output


def test_spacy_parses_of_several_sentences_are_not_reported_as_broken_trees(identical_pair, tmp_path):
    """The tree warning is about the data file's own trees: spaCy's parse of a two-sentence text has two roots."""
    pytest.importorskip("spacy")
    from bertology.assets import spacy_model_name
    from bertology.config import CompareConfig, DataConfig
    from bertology.data.corpus import Corpus
    from bertology.commands.compare import compare

    if spacy_model_name() is None:
        pytest.skip("no spaCy English pipeline installed")
    run = compare(CompareConfig(base=str(identical_pair[0]), tuned=str(identical_pair[1]), data=DataConfig(path=""),
                                out=str(tmp_path / "run"), analyses=("attention_targets",), view_examples=0),
                  corpus=Corpus.from_list(["the cat sat . the dog ran ."]), report=False)
    assert any("spaCy" in w for w in run.manifest["warnings"])  # it was parsed ...
    assert not any("do not form one tree" in w for w in run.manifest["warnings"])  # ... and not called broken


# --------------------------------------------------------------------------------------------------
# over-long inputs: the limit is the model's, whatever --max-length says (issue 19, first row)

#: Position table sizes of the tiny models: BERT uses all 64 rows, RoBERTa reserves the rows up to its
#: pad id (1), so both take at most 64 tokens.
POSITIONS = {"bert": 64, "roberta": 66}
LIMIT = 64
N_LONG = 2


def _flat_conllu(sentences) -> str:
    """Each word headed by the one before (a chain): a valid tree for any sentence."""
    blocks = []
    for s in sentences:
        rows = [f"# text = {s}"] + ["\t".join([str(i), w, w, "X", "_", "_", str(i - 1), "root" if i == 1 else "dep",
                                               "_", "_"]) for i, w in enumerate(s.split(), 1)]
        blocks.append("\n".join(rows))
    return "\n\n".join(blocks) + "\n\n"


@pytest.fixture(scope="module", params=list(POSITIONS))
def short_model(request, tmp_path_factory):
    """(family, classifier folder whose position table holds 64 usable rows, labelled CSV, CoNLL-U), with
    ``N_LONG`` examples of each file longer than 64 tokens."""
    from bertology.testing import TINY_WORDS, save_tiny_family
    from bertology.testing.tokenizers import tiny_tokenizer

    family = request.param
    root = tmp_path_factory.mktemp(f"short-{family}")
    tok = tiny_tokenizer("bpe", root / "tok") if family == "roberta" else None
    model = save_tiny_family(root / "model", family, tokenizer=tok, classifier=True,
                             max_position_embeddings=POSITIONS[family])
    long = [" ".join(TINY_WORDS[k : k + 70]) for k in range(N_LONG)]  # > 70 tokens with either tokenizer
    texts = list(SENTENCES) + long
    data = root / "d.csv"
    pd.DataFrame({"text": texts, "label": [i % 2 for i in range(len(texts))]}).to_csv(data, index=False)
    trees = root / "t.conllu"
    trees.write_text(_flat_conllu(texts), encoding="utf-8")
    return family, model, data, trees


def _limit_and_count(command: str, manifest: dict) -> tuple[list[int], int]:
    """The limits the run used (one per encoding) and how many examples it skipped or truncated."""
    if command == "compare":
        enc = [manifest["data"]["encoding"]]
        return [e["max_length"] for e in enc], sum(e["n_skipped_overlong"] + e["n_truncated"] for e in enc)
    if command == "ablate":
        enc = [manifest["result"]["tokenisation"]]
        return [e["max_length"] for e in enc], sum(e["n_truncated"] for e in enc)
    if command == "finetune":
        enc = list(manifest["result"]["tokenisation"].values())
        return [e["max_length"] for e in enc], sum(e["n_truncated"] for e in enc)
    splits = manifest["probe"]["data"]
    # train and dev come from one file (dev held out of train), the test split is the same file again
    return [s["max_length"] for s in splits.values()], sum(s["n_over_max_length"] for s in splits.values())


OVERLONG_RUNS = {
    "compare": lambda m, d, t: ["compare", "--base", m, "--tuned", m, "--data", d, "--no-report",
                                "--analyses", "attention_change,ablation", "--ablation-bootstrap", "10"],
    "ablate": lambda m, d, t: ["ablate", "--model", m, "--data", d, "--no-report", "--bootstrap", "10"],
    "probe": lambda m, d, t: ["probe", "--base", m, "--train", t, "--test", t, "--no-report", "--epochs", "1",
                              "--no-random-control"],
    "finetune": lambda m, d, t: ["finetune", "--model", m, "--data", d, "--no-report", "--epochs", "1"],
}


@pytest.mark.parametrize("max_length", [None, 512], ids=["default", "max-length-512"])
@pytest.mark.parametrize("command", list(OVERLONG_RUNS))
def test_over_long_inputs_follow_the_model_position_limit(short_model, command, max_length, tmp_path):
    """Inputs longer than the model's 64 positions are skipped or truncated by the command's policy and
    counted, with the 64 in the manifest, under the default --max-length and under 512: no index error."""
    family, model, data, trees = short_model
    out = tmp_path / "run"
    extra = [] if max_length is None else ["--max-length", max_length]
    result = invoke(*OVERLONG_RUNS[command](model, data, trees), "--out", out, *extra)
    assert result.exit_code == 0, result.output
    limits, n_counted = _limit_and_count(command, json.loads((out / "manifest.json").read_text()))
    assert set(limits) == {LIMIT}
    assert n_counted == (2 * N_LONG if command == "probe" else N_LONG)


def test_compare_truncates_over_long_inputs_to_the_model_limit_when_asked(short_model, tmp_path):
    _, model, data, _ = short_model
    out = tmp_path / "run"
    result = invoke("compare", "--base", model, "--tuned", model, "--data", data, "--no-report", "--out", out,
                    "--analyses", "attention_change", "--max-length", 512, "--overlong", "truncate")
    assert result.exit_code == 0, result.output
    encoding = json.loads((out / "manifest.json").read_text())["data"]["encoding"]
    assert (encoding["max_length"], encoding["n_truncated"], encoding["n_skipped_overlong"]) == (LIMIT, N_LONG, 0)
    assert encoding["n_kept"] == len(SENTENCES) + N_LONG


def test_view_refuses_a_text_beyond_the_model_position_limit(short_model, tmp_path):
    """A text just over the usable positions (RoBERTa: within max_position_embeddings, past the pad offset)."""
    from transformers import AutoTokenizer

    family, model, _, _ = short_model
    tok = AutoTokenizer.from_pretrained(model)
    words = " ".join(SENTENCES * 3).split()
    text = next(t for t in (" ".join(words[:n]) for n in range(1, len(words)))
                if LIMIT < len(tok(t)["input_ids"]) <= LIMIT + 2)  # RoBERTa: <= its 66 max_position_embeddings
    n = len(tok(text)["input_ids"])
    for extra in ([], ["--max-length", 512]):
        result = invoke("view", text, "--model", model, "--out", tmp_path / "v.html", *extra)
        assert_user_error(result, f"The text is {n} tokens long", f"accepts at most {LIMIT} (its position limit)")
        assert not (tmp_path / "v.html").exists()


def test_an_ablation_whose_outputs_are_nan_is_refused_not_reported(files, tmp_path, monkeypatch):
    """Logits that turn NaN (a float16 overflow, a broken head) give no ablation number with an interval."""
    import numpy as np

    from bertology.tasks.classification import Classification

    original = Classification.record

    def nan_loss(self, logits, targets):
        records = original(self, logits, targets)
        return {**records, "loss": np.full_like(records["loss"], np.nan)}

    monkeypatch.setattr(Classification, "record", nan_loss)
    out = tmp_path / "run"
    result = invoke("ablate", "--model", files / "good", "--data", files / "good.csv", "--bootstrap", "10",
                    "--no-report", "--out", out)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "NaN or infinite on 10 of 10 examples under" in lines[0], result.output
    assert not list(out.glob("tables/ablation*"))


def test_a_full_disk_is_one_line_naming_the_file(files, tmp_path, monkeypatch):
    """ENOSPC while a table is written: the file named, no temp file left, exit 2 (a rerun resumes)."""
    import errno

    def no_space(self, path, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(pd.DataFrame, "to_parquet", no_space)
    out = tmp_path / "run"
    result = invoke("compare", "--base", files / "good", "--tuned", files / "good", "--data", files / "good.csv",
                    "--analyses", "attention_change", "--no-report", "--out", out)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "No space left on the device writing" in lines[0], result.output
    assert str(out / "tables") in lines[0] and ".parquet" in lines[0]
    assert not list(out.glob("tables/.*.tmp"))


def test_a_truncated_manifest_given_to_report_is_one_line(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "manifest.json").write_text('{"kind": "compare", "sta', encoding="utf-8")
    result = invoke("report", run)
    assert result.exit_code == 2, result.output
    line = next(x for x in result.output.splitlines() if x.startswith("error:"))
    assert "manifest.json is not a valid manifest" in line and "rerun the command" in line
