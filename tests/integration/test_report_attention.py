"""A real ``compare`` run on the planted tiny pair: pattern, head-map and viewer sections in the report."""
import json
import re
import sys
from pathlib import Path

import pandas as pd
from typer.testing import CliRunner

from bertology.cli import app
from bertology.testing import SENTENCES

sys.path.insert(0, str(Path(__file__).parent))
from test_report import chromium_page, parse  # noqa: E402

runner = CliRunner()


def _run(planted_pair, tmp_path) -> Path:
    data = tmp_path / "sentences.txt"
    data.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    base, tuned = planted_pair
    out = tmp_path / "run"
    result = runner.invoke(app, [str(a) for a in (
        "compare", "--base", base, "--tuned", tuned, "--data", data, "--out", out,
        "--analyses", "attention_change,attention_patterns,head_map", "--head-map-examples", 6, "--view-examples", 2)])
    assert result.exit_code == 0, result.output
    assert "head map: heads that moved most (JS distance) L2H1" in " ".join(result.output.split())
    return out


def test_compare_writes_patterns_head_map_and_views(planted_pair, tmp_path):
    out = _run(planted_pair, tmp_path)
    patterns = pd.read_parquet(out / "tables/attention_patterns.parquet")
    assert {"model", "layer", "head", "pattern", "fraction"} <= set(patterns.columns)
    sums = patterns.groupby(["model", "layer", "head"])["fraction"].sum()
    assert ((sums - 1).abs() < 1e-9).all()
    head_map = pd.read_parquet(out / "tables/head_map.parquet")
    assert len(head_map) == 2 * 2 * 4 and head_map["n_examples"].iloc[0] == 6
    top = head_map.sort_values("moved", ascending=False).iloc[0]
    assert (top.layer, top["head"]) == (2, 1)  # the planted head moved most
    assert (out / "tables/head_distance.parquet").is_file()
    manifest = json.loads((out / "manifest.json").read_text())
    assert len(manifest["views"]) == 2 and all((out / v).is_file() for v in manifest["views"])
    html = (out / "report.html").read_text(encoding="utf-8")
    page = parse(html)
    for sid in ("attention-patterns", "head-map", "attention-viewer"):
        assert sid in page.section_ids
    assert not re.search(r"(src|href|url)\s*[=(]\s*[\"']?https?:", html)  # nothing fetched from the network


def test_viewer_in_the_report_reacts_to_a_click(planted_pair, tmp_path):
    out = _run(planted_pair, tmp_path)
    with chromium_page(out / "report.html") as (page, errors):
        viewers = page.locator("#attention-viewer .bv")
        assert viewers.count() == 2
        root = "#bertology-view-0"
        assert page.locator(f"{root} [data-role=thumb]").count() == 2 * 4
        # a compare view opens in diff mode on the head that changed most: the planted one
        assert page.get_attribute(root, "data-selected") == "L2H1"
        page.click(f"{root} [data-role=thumb][data-layer='1'][data-head='3']")
        assert page.get_attribute(root, "data-selected") == "L1H3"
        assert page.get_attribute("#bertology-view-1", "data-selected") == "L2H1"  # the other view is untouched
        page.locator("#attention-viewer").screenshot(path=str(tmp_path / "viewer.png"))
    assert errors == [], errors


def test_resumed_run_keeps_the_head_distance_table(planted_pair, tmp_path):
    out = _run(planted_pair, tmp_path)
    out = _run(planted_pair, tmp_path)  # the same command again resumes
    manifest = json.loads((out / "manifest.json").read_text())
    assert set(manifest["resumed_tables"]) == {"attention_change", "attention_patterns", "head_map"}
    assert "head_distance" in manifest["tables"]
