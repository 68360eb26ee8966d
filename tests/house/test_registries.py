"""The registries: every analysis and experiment declares itself once, and a new one is one module + one line.

A toy analysis written to a temporary module and added to the catalog with one line runs through
``compare`` end to end: its table is written, named in the manifest, read back on resume and
summarised on the command line — nothing else in the package had to change.
"""
from __future__ import annotations

import json
import sys
import textwrap

import pandas as pd
import pytest

from bertology.analyses.catalog import ANALYSES
from bertology.config import CompareConfig, DataConfig
from bertology.data.corpus import Corpus
from bertology.data.encode import encode_corpus
from bertology.errors import BertologyError
from bertology.experiments.catalog import EXPERIMENTS
from bertology.models.pair import ModelPair
from bertology.commands.compare import compare
from bertology.commands.selection import build_analyses, complete_config, select, selectable
from bertology.testing import SENTENCES

TOY = '''
"""A toy streaming analysis: how many real tokens each layer's attention saw, per model."""
from collections.abc import Mapping

import pandas as pd

from bertology.analyses.base import Analysis
from bertology.analyses.registry import AnalysisSpec, BuildContext
from bertology.results import Result
from bertology.settings import Setting


class TokenCount(Analysis):
    name = "toy_token_count"
    requires = frozenset({"attentions"})

    def __init__(self, num_layers: int, scale: int = 1, label: str = "tokens") -> None:
        self.num_layers, self.scale, self.label = num_layers, scale, label
        self.tokens = 0

    def params(self) -> dict:
        return {"scale": self.scale, "label": self.label}

    def update(self, batch) -> None:
        self.tokens += int(batch.mask.sum())

    def compute(self) -> Result:
        return Result(self.name, pd.DataFrame({"layer": range(1, self.num_layers + 1), "tokens": self.tokens * self.scale,
                                               "label": self.label}))

    def merge(self, other):
        self.tokens += other.tokens
        return self


def summary(tables: Mapping[str, pd.DataFrame]) -> str:
    return f"toy: {int(tables['toy_token_count']['tokens'].iloc[0])} tokens"


SETTINGS = (
    Setting("toy_scale", 1, "Multiply the token count by this.", minimum=1, paper="Toy et al. 2026"),
    Setting("toy_label", "tokens", "What the count is called.", choices=("tokens", "pieces"), changes_numbers=False),
)

SPEC = AnalysisSpec("toy_token_count", lambda config, ctx: TokenCount(ctx.num_layers, config.toy_scale, config.toy_label),
                    ("toy_token_count",), summary=summary, settings=SETTINGS)
'''


@pytest.fixture()
def toy_registered(tmp_path, monkeypatch):
    """The toy module on the path and its one catalog line."""
    (tmp_path / "toy_analysis.py").write_text(textwrap.dedent(TOY), encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(ANALYSES.modules, "toy_token_count", "toy_analysis")  # the one registry line
    yield
    sys.modules.pop("toy_analysis", None)


def _config(pair, out, analyses, **kw) -> CompareConfig:
    base, tuned = pair
    return CompareConfig(base=str(base), tuned=str(tuned), data=DataConfig(path=""), out=str(out),
                         analyses=tuple(analyses), view_examples=0, **kw)


def test_a_toy_analysis_is_one_module_and_one_registry_line(toy_registered, identical_pair, tmp_path):
    corpus = Corpus.from_list(SENTENCES)
    run = compare(_config(identical_pair, tmp_path / "run", ["toy_token_count", "attention_change"]), corpus=corpus,
                  report=False)
    table = run.table("toy_token_count")
    encoded_tokens = sum(len(it) for it in encode_corpus(corpus, ModelPair.load(*map(str, identical_pair)).tokenizer,
                                                          128, "skip").items)
    assert list(table["layer"]) == [1, 2] and set(table["tokens"]) == {encoded_tokens}
    assert (tmp_path / "run/tables/toy_token_count.parquet").exists()
    assert "toy_token_count" in run.manifest["tables"] and "toy_token_count" in run.manifest["analyses"]
    assert run.manifest["conventions"]["preset"] == "bertology"  # every run states its conventions
    assert run.manifest["config"]["attention_mode"] == "cropped"  # resolved once, before anything ran
    assert select(["toy_token_count"]).analyses[0].summary({"toy_token_count": table}) == f"toy: {encoded_tokens} tokens"
    # "all" includes it; the same settings again read the toy table back instead of recomputing it
    again = compare(_config(identical_pair, tmp_path / "run", ["toy_token_count", "attention_change"]), corpus=corpus,
                    report=False)
    assert set(again.resumed) == {"toy_token_count", "attention_change"}
    pd.testing.assert_frame_equal(again.table("toy_token_count"), table)
    assert "toy_token_count" in select(["all"]).names()


def test_the_cli_summary_loops_over_the_specs(toy_registered, identical_pair, tmp_path):
    from typer.testing import CliRunner

    from bertology.cli import app

    data = tmp_path / "d.txt"
    data.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    base, tuned = identical_pair
    result = CliRunner().invoke(app, ["compare", "--base", str(base), "--tuned", str(tuned), "--data", str(data),
                                      "--analyses", "toy_token_count", "--out", str(tmp_path / "cli"), "--no-report"])
    assert result.exit_code == 0, result.output
    assert "toy: " in result.output and " tokens" in result.output


@pytest.fixture(scope="module")
def treebank(tmp_path_factory) -> Corpus:
    """Two CoNLL-U sentences: every analysis (relation heads too) has what it needs."""
    from bertology.data.loaders import load_corpus

    rows = ["the cats sat on the mat .".split(), "she liked the dogs and the books .".split()]
    heads = [[2, 3, 0, 6, 6, 3, 3], [2, 0, 4, 2, 7, 7, 4, 2]]
    upos = [["DET", "NOUN", "VERB", "ADP", "DET", "NOUN", "PUNCT"], ["PRON", "VERB", "DET", "NOUN", "CCONJ", "DET", "NOUN", "PUNCT"]]
    rels = [["det", "nsubj", "root", "case", "det", "obl", "punct"], ["nsubj", "root", "det", "obj", "cc", "det", "conj", "punct"]]
    lines = []
    for words, hs, us, rs in zip(rows, heads, upos, rels):
        lines.append("# text = " + " ".join(words))
        lines += [f"{i}\t{w}\t{w}\t{u}\t_\t_\t{h}\t{r}\t_\t_" for i, (w, h, u, r) in enumerate(zip(words, hs, us, rs), 1)]
        lines.append("")
    path = tmp_path_factory.mktemp("ud") / "tiny.conllu"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return load_corpus(str(path))


@pytest.mark.parametrize("name", ANALYSES.names())
def test_every_analysis_builds_and_writes_exactly_its_declared_tables(name, identical_pair, treebank):
    """Conformance: the spec's tables are the tables the analysis computes, its own first."""
    from bertology.activations.extract import run_analyses

    spec = ANALYSES.spec(name)
    assert spec.name == name and spec.tables[0] == name
    pair = ModelPair.load(*map(str, identical_pair))
    corpus = treebank
    encoded = encode_corpus(corpus, pair.tokenizer, 128, "skip")
    config = CompareConfig(base=str(identical_pair[0]), tuned=str(identical_pair[1]), geometry_min_contexts=2,
                           relation_min_count=1, head_map_examples=4, pca_examples=2)
    (analysis,) = build_analyses(config, pair, corpus, encoded, [spec])
    assert analysis.name == name
    run_analyses(pair, encoded, [analysis], batch_size=4)
    assert tuple(r.name for r in analysis.results()) == spec.tables


@pytest.mark.parametrize("name", EXPERIMENTS.names())
def test_every_experiment_declares_its_tables_and_settings(name):
    spec = EXPERIMENTS.spec(name)
    config = complete_config(CompareConfig())  # every declared setting at its default
    assert spec.name == name and spec.tables(config) and spec.tables(config)[0] == name
    assert isinstance(spec.params(config).to_dict(), dict)
    assert spec.refusal("because").startswith("Cannot run ")


def test_a_toy_analysis_s_settings_reach_flags_help_manifest_fingerprint_and_report(toy_registered, identical_pair,
                                                                                 tmp_path):
    """Two settings declared in the toy's spec, nowhere else: they become flags with their help and defaults,
    the library checks them, the manifest records them, the fingerprint follows the one that changes numbers,
    and the report's settings table shows them."""
    from typer.testing import CliRunner

    from bertology.cli import app

    runner = CliRunner()
    help_text = runner.invoke(app, ["compare", "--help"], env={"COLUMNS": "200"}).output
    shown = " ".join(help_text.replace("│", " ").split())  # the help's words, without the panels' borders
    assert "--toy-scale" in shown and "Multiply the token count by this. (Toy et al. 2026) (default: 1)" in shown
    assert "--toy-label [tokens|pieces]" in shown and "What the count is called. (default: tokens)" in shown
    data = tmp_path / "d.txt"
    data.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    base, tuned = identical_pair
    args = ["compare", "--base", str(base), "--tuned", str(tuned), "--data", str(data), "--analyses", "toy_token_count",
            "--view-examples", "0"]
    result = runner.invoke(app, [*args, "--out", str(tmp_path / "cli"), "--toy-scale", "3", "--toy-label", "pieces"])
    assert result.exit_code == 0, result.output
    manifest = json.loads((tmp_path / "cli/manifest.json").read_text(encoding="utf-8"))
    record = manifest["settings"]["toy_token_count"]
    assert record["toy_scale"] == {"value": 3, "default": 1, "flag": "--toy-scale", "help": "Multiply the token count by this.",
                                   "paper": "Toy et al. 2026", "changes_numbers": True}
    assert record["toy_label"]["value"] == "pieces" and record["toy_label"]["changes_numbers"] is False
    assert manifest["config"]["toy_scale"] == 3 and manifest["analyses"]["toy_token_count"] == {"scale": 3, "label": "pieces"}
    # every declared setting of every spec, the run and the data: in --help with its default, and in the manifest
    from bertology.cli.generated import _help
    from bertology.cli.commands import compare_settings

    declared = [(owner, s) for owner, group in compare_settings() for s in group]
    assert {(owner, s.name) for owner, s in declared} == {(o, n) for o, group in manifest["settings"].items() for n in group}
    for owner, s in declared:
        assert s.cli_flag in shown and " ".join(_help(s).split()) in shown, s.name
        assert manifest["settings"][owner][s.name]["flag"] == s.cli_flag
        if s.default is not None and owner != "run":
            assert manifest["settings"][owner][s.name]["default"] == (list(s.default) if isinstance(s.default, tuple)
                                                                       else s.default), s.name
    html = (tmp_path / "cli/report.html").read_text(encoding="utf-8")
    assert "Settings: toy_token_count" in html and "<code>--toy-scale</code>" in html
    assert "3 (default 1); Toy et al. 2026" in html
    # Python and the command line: the same run, the same fingerprint; toy_label does not change the numbers
    config = _config(identical_pair, tmp_path / "py", ["toy_token_count"], toy_scale=3, toy_label="pieces")
    config.data = DataConfig(path=str(data))
    py = compare(config, report=False)
    assert py.manifest["fingerprint"] == manifest["fingerprint"]
    fp = complete_config(_config(identical_pair, tmp_path / "py", ["toy_token_count"], toy_scale=3,
                                 toy_label="pieces")).fingerprint()
    assert complete_config(_config(identical_pair, tmp_path / "py", ["toy_token_count"], toy_scale=3)).fingerprint() == fp
    assert complete_config(_config(identical_pair, tmp_path / "py", ["toy_token_count"], toy_scale=2)).fingerprint() != fp
    # one clear line for a bad value, from the CLI and from Python alike
    bad = runner.invoke(app, [*args, "--out", str(tmp_path / "bad"), "--toy-scale", "0"])
    assert bad.exit_code == 2 and "--toy-scale (toy_scale) must be at least 1, not 0." in bad.output
    with pytest.raises(BertologyError, match="--toy-label \\(toy_label\\) must be one of tokens, pieces, not 'words'"):
        complete_config(_config(identical_pair, tmp_path / "py", ["toy_token_count"], toy_label="words"))
    with pytest.raises(BertologyError, match=r"Unknown setting toy_scal \(did you mean toy_scale\?\) for compare; known: "):
        complete_config(_config(identical_pair, tmp_path / "py", ["toy_token_count"], toy_scal=2))


def test_selection_has_one_source_of_names():
    assert selectable() == ANALYSES.names() + EXPERIMENTS.names()
    assert select(["all"]).names() == selectable() and select(["all"]).named == frozenset()
    assert select(["probe", "attention_change"]).names() == ("attention_change", "probe")  # catalog order
    with pytest.raises(BertologyError, match="Unknown analysis nope; choose from: all, attention_change"):
        select(["nope"])
    with pytest.raises(BertologyError, match=r"Unknown analysis \(none\)"):
        select([" "])
