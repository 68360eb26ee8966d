"""``bertology absa`` end to end on a tiny SemEval-style file and a tiny BERT: pairs, fine-tune, ABSA heads, report."""
import json
import sys
from pathlib import Path

import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from absa_fixture import write_absa  # noqa: E402

from bertology.analyses.absa_heads import top_heads  # noqa: E402
from bertology.testing import save_tiny_bert  # noqa: E402
from cli_checks import assert_user_error, invoke  # noqa: E402


@pytest.fixture(scope="module")
def study(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("absa")
    data = write_absa(tmp / "rest.xml")
    base = save_tiny_bert(tmp / "base")
    out = tmp / "run"
    result = invoke("absa", "--data", data, "--base", base, "--out", out, "--epochs", 1, "--batch-size", 8,
                    "--eval-fraction", 0.4, "--seed", 0)
    assert result.exit_code == 0, result.output
    return out, result.output


def test_tables_hold_base_and_tuned_side_by_side(study):
    out, output = study
    tables = out / "study" / "tables"
    heads = pd.read_parquet(tables / "absa_heads.parquet")
    assert set(heads.model) == {"base", "tuned"}
    assert {"aspect", "other_aspect"} <= set(heads.relation)
    change = pd.read_parquet(tables / "absa_head_change.parquet")
    assert {"base", "tuned", "delta", "best_baseline", "created"} <= set(change.columns)
    # the side-by-side table is the long one pivoted
    b = heads[(heads.model == "base")].set_index(["relation", "direction", "layer", "head"]).accuracy
    t = heads[(heads.model == "tuned")].set_index(["relation", "direction", "layer", "head"]).accuracy
    c = change.set_index(["relation", "direction", "layer", "head"])
    assert c.base.sort_index().tolist() == b.sort_index().tolist()
    assert c.tuned.sort_index().tolist() == t.sort_index().tolist()
    sep = pd.read_parquet(tables / "absa_sep_share.parquet")
    assert set(sep.model) == {"base", "tuned"} and (sep.n_absent > 0).all() and (sep.n_present > 0).all()
    assert (out / "finetune" / "model" / "config.json").exists()
    manifest = json.loads((out / "study" / "manifest.json").read_text())
    assert manifest["absa"]["held_out"]["style"] == "qa_m" and "n_conflict" in manifest["absa"]["train"]
    assert manifest["views"], "the report shows example maps"
    assert "held-out accuracy" in output and "report:" in output


def test_report_names_the_top_heads(study):
    out, _ = study
    html = (out / "study" / "report.html").read_text()
    assert 'id="absa"' in html and "Aspect-based sentiment heads" in html
    heads = pd.read_parquet(out / "study" / "tables" / "absa_heads.parquet")
    best = top_heads(heads, 1)
    for r in best[best.model == "tuned"].itertuples():
        assert f"L{r.layer}H{r.head}" in html
    assert 'id="attention-viewer"' in html


def test_offset_mismatch_is_a_user_error(tmp_path):
    data = write_absa(tmp_path / "bad.xml", bad_offset="4")
    result = invoke("absa", "--data", data, "--out", tmp_path / "run")
    assert_user_error(result, "bad.xml", "sentence 4", "'price'")
