"""Weight-space change inside ``compare`` and ``compare_many``: on by default, its table, manifest section, summary
line and report section; resumed like any experiment; skipped (or refused when named) in a narrower dtype."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from bertology.config import CompareConfig, DataConfig
from bertology.data.corpus import Corpus
from bertology.errors import BertologyError
from bertology.multicompare import TunedModel, compare_many
from bertology.commands.compare import compare
from bertology.commands.selection import select
from bertology.testing import SENTENCES
from cli_checks import invoke  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


def _config(pair, out, **kw) -> CompareConfig:
    base, tuned = pair
    return CompareConfig(base=str(base), tuned=str(tuned), data=DataConfig(""), out=str(out), view_examples=0, **kw)


def test_weight_change_is_on_by_default():
    assert "weight_change" in select(CompareConfig().analyses).names()  # the default, "all"


def test_compare_finds_the_planted_head_in_the_weights(planted_pair, tmp_path):
    """tiny_bert_pair(planted=(2, 1)) randomises head 1's query and key rows at layer 2: nothing else moved."""
    run = compare(_config(planted_pair, tmp_path / "run", analyses=("weight_change",)), corpus=Corpus.from_list(SENTENCES))
    table = run.table("weight_change")
    moved = table[table["relative_change"] > 0]
    assert {(r.layer, r.module, None if pd.isna(r.head) else r.head) for r in moved.itertuples()} == {
        (2, "query", None), (2, "query", 1), (2, "key", None), (2, "key", 1)}
    section = run.manifest["analyses"]["weight_change"]
    assert section["settings"] == {"singular_values": 3, "intruder_k": 10, "intruder_epsilon": 0.5}
    assert section["not_compared"] == ["pooler.dense.weight", "pooler.dense.bias"]
    assert run.manifest["settings"]["weight_change"]["intruder_k"]["paper"] == "Shuttleworth et al. 2024"
    html = (tmp_path / "run/report.html").read_text(encoding="utf-8")
    assert 'id="weight-change"' in html and 'id="fig-weight_change"' in html and "Most changed weights" in html
    assert (tmp_path / "run/figures/weight_change.svg").exists()
    again = compare(_config(planted_pair, tmp_path / "run", analyses=("weight_change",)), corpus=Corpus.from_list(SENTENCES))
    assert again.resumed == ["weight_change"]
    pd.testing.assert_frame_equal(again.table("weight_change"), table, check_dtype=False)


def test_the_command_line_prints_its_summary_and_takes_its_flags(planted_pair, tmp_path):
    data = tmp_path / "d.txt"
    data.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    base, tuned = planted_pair
    out = tmp_path / "cli"
    result = invoke("compare", "--base", base, "--tuned", tuned, "--data", data, "--analyses", "weight_change",
                    "--intruder-k", 4, "--weight-singular-values", 2, "--out", out, "--no-report")
    assert result.exit_code == 0, result.output
    assert "weight change: largest relative change L2 query" in " ".join(result.output.split())
    table = pd.read_parquet(out / "tables/weight_change.parquet")
    assert "delta_sv_2" in table and "delta_sv_3" not in table and table["top_k"].max() == 4
    assert json.loads((out / "manifest.json").read_text())["config"]["intruder_k"] == 4


def test_a_narrower_dtype_skips_it_with_the_reason_or_refuses_when_named(identical_pair, tmp_path):
    corpus = Corpus.from_list(SENTENCES)
    run = compare(_config(identical_pair, tmp_path / "all", dtype="bfloat16"), corpus=corpus, report=False)  # "all"
    assert "weight_change" not in run.results
    assert any(w.startswith("Weight-space change skipped: the models run in bfloat16") for w in run.manifest["warnings"])
    with pytest.raises(BertologyError, match="Cannot run the weight-space change: the models run in bfloat16"):
        compare(_config(identical_pair, tmp_path / "named", analyses=("weight_change",), dtype="bfloat16"),
                corpus=corpus, report=False)


def test_compare_many_stacks_every_pair_s_table(identical_pair, planted_pair, tmp_path):
    base = identical_pair[0]
    tuned = [TunedModel("same", str(identical_pair[1])), TunedModel("planted", str(planted_pair[1]))]
    run = compare_many(_config((base, ""), tmp_path / "many", analyses=("weight_change",)), tuned,
                       corpus=Corpus.from_list(SENTENCES), report=False)
    table = run.tables["weight_change"]
    assert list(table.columns[:3]) == ["tuned", "task", "seed"]
    moved = table[table["relative_change"] > 0]
    assert set(moved["tuned"]) == {"planted"} and len(table) == 2 * len(run.pairs["same"].results["weight_change"].table)
