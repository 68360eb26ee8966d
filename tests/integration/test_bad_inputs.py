"""Bad inputs on every command that takes them: one line naming the file and the fix, exit 2, no traceback.

And the last resort: an unexpected exception (a bug) is one line and exit 1, its traceback only with
``--debug`` (or ``BERTOLOGY_DEBUG=1``).
"""
import argparse
import json
import os
import shutil

import pytest
import torch
from safetensors.torch import load_file

from bertology.testing import SENTENCES, save_tiny_bert
from cli_checks import invoke, runner  # noqa: E402

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


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """A tiny model, its copy whose only weights are a pickle holding more than tensors, and data files."""
    root = tmp_path_factory.mktemp("bad")
    good = save_tiny_bert(root / "good")
    pickled = root / "pickled"
    shutil.copytree(good, pickled)
    state = load_file(pickled / "model.safetensors")
    (pickled / "model.safetensors").unlink()
    # training arguments saved beside the weights: torch's weights-only loader refuses such a pickle
    torch.save({**state, "args": argparse.Namespace(lr=1e-3)}, pickled / "pytorch_model.bin")
    (root / "text.txt").write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    (root / "gold.conllu").write_text(GOOD_CONLLU * 4, encoding="utf-8")
    (root / "cycle.conllu").write_text(CYCLE_CONLLU, encoding="utf-8")
    (root / "a_file").write_text("not a folder", encoding="utf-8")
    (root / "a_folder").mkdir()
    return root


def _read_only_folder(root):
    folder = root / "read_only"
    folder.mkdir(exist_ok=True)
    folder.chmod(0o555)
    return folder / "view.html"


PICKLE = ("pickled/pytorch_model.bin", "safetensors", "save_file(")
BAD_INPUTS = {
    "view: pickled weights": (
        lambda r, t: ["view", "the cat sat", "--model", r / "pickled", "--out", t / "v.html"], PICKLE),
    "compare: pickled weights": (
        lambda r, t: ["compare", "--base", r / "good", "--tuned", r / "pickled", "--data", r / "text.txt",
                      "--out", t / "run"], PICKLE),
    "probe: pickled weights": (
        lambda r, t: ["probe", "--base", r / "pickled", "--train", r / "gold.conllu", "--test", r / "gold.conllu",
                      "--out", t / "run"], PICKLE),
    "view: --out is a folder": (
        lambda r, t: ["view", "the cat sat", "--model", r / "good", "--out", r / "a_folder"],
        ("--out", "a_folder is a folder", "a_folder/view.html")),
    "view: --out under a file": (
        lambda r, t: ["view", "the cat sat", "--model", r / "good", "--out", r / "a_file" / "v.html"],
        ("Cannot write --out", "a_file is a file, not a folder")),
    "view: --out in a read-only folder": (
        lambda r, t: ["view", "the cat sat", "--model", r / "good", "--out", _read_only_folder(r)],
        ("Cannot write --out", "read_only/view.html", "choose a writable place")),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_a_bad_input_is_one_line_naming_the_file(files, tmp_path, case):
    if "read-only" in case and os.geteuid() == 0:
        pytest.skip("root writes anywhere")
    make_args, fragments = BAD_INPUTS[case]
    result = invoke(*make_args(files, tmp_path))
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.output.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.output  # one line, however long
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


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
    from bertology.pipeline import compare

    if spacy_model_name() is None:
        pytest.skip("no spaCy English pipeline installed")
    run = compare(CompareConfig(base=str(identical_pair[0]), tuned=str(identical_pair[1]), data=DataConfig(path=""),
                                out=str(tmp_path / "run"), analyses=("attention_targets",), view_examples=0),
                  corpus=Corpus.from_list(["the cat sat . the dog ran ."]), report=False)
    assert any("spaCy" in w for w in run.manifest["warnings"])  # it was parsed ...
    assert not any("do not form one tree" in w for w in run.manifest["warnings"])  # ... and not called broken
