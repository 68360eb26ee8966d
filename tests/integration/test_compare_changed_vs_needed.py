"""Changed vs needed inside ``compare --ablation-mode revert`` on a tiny classifier pair with one planted head."""
import json

import pandas as pd
import pytest

from bertology.testing import SENTENCES, split_classifier, tiny_bert_pair
from cli_checks import invoke, labelled_csv  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

PLANTED = (2, 1)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """One compare run (weight change, attention change, revert ablation, changed vs needed) and its output."""
    folder = tmp_path_factory.mktemp("cvn")
    base, tuned = tiny_bert_pair(folder, planted=PLANTED, classifier=True)
    labels = split_classifier(tuned, SENTENCES * 2)
    data = labelled_csv(folder / "d.csv", SENTENCES * 2, labels)
    out = folder / "run"
    result = invoke("compare", "--base", base, "--tuned", tuned, "--data", data, "--out", out, "--analyses",
                    "attention_change,weight_change,ablation,changed_vs_needed", "--ablation-mode", "revert",
                    "--ablation-bootstrap", 50, "--view-examples", 0)
    assert result.exit_code == 0, result.output
    return out, " ".join(result.output.split())


def test_compare_writes_the_table_and_the_planted_head_is_the_most_changed(run):
    out, _ = run
    links = pd.read_parquet(out / "tables/changed_vs_needed.parquet")
    assert {"level", "change_measure", "needed_measure", "metric", "spearman", "ci_low", "ci_high", "n_units",
            "reason"} <= set(links)
    assert set(links["change_measure"]) == {"weight", "attention_js", "attention_1_minus_cosine"}
    heads = links[links["level"] == "head"]
    assert set(heads["n_units"]) == {8}  # 2 layers x 4 heads
    # a number, or None with the reason: never both, never neither
    assert (heads["spearman"].isna() == heads["reason"].notna()).all()
    units = pd.read_parquet(out / "tables/changed_vs_needed_units.parquet")
    for measure in ("weight", "attention_js"):
        part = units[(units["level"] == "head") & (units["change_measure"] == measure) & (units["metric"] == "accuracy")]
        top = part.sort_values("change", ascending=False).iloc[0]
        assert (int(top["layer"]), int(top["head"])) == PLANTED
        assert (part.drop(top.name)["change"] < top["change"] / 10).all()
    m = json.loads((out / "manifest.json").read_text())
    assert m["analyses"]["changed_vs_needed"]["settings"]["n_bootstrap"] == 50
    assert "optimistic" in m["analyses"]["changed_vs_needed"]["note"]


def test_the_cli_summary_states_the_rank_correlation(run):
    _, text = run
    # only the planted head moved, and only reverting it moves the loss: accuracy ties everywhere (undefined),
    # so the line states the defined loss rho, which is 1
    assert "changed vs needed (heads): Spearman 1.00 [1.00, 1.00] between weight change and revert delta (loss, n=8)" in text
    assert "changed vs needed (layers): undefined (2 units with both measures" in text


def test_it_is_skipped_without_a_revert_ablation_and_refused_when_named(tmp_path):
    base, tuned = tiny_bert_pair(tmp_path / "pair", planted=PLANTED)
    data = tmp_path / "d.txt"
    data.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    ok = invoke("compare", "--base", base, "--tuned", tuned, "--data", data, "--out", tmp_path / "a",
                "--analyses", "weight_change", "--view-examples", 0, "--no-report")
    assert ok.exit_code == 0 and not (tmp_path / "a/tables/changed_vs_needed.parquet").exists()
    named = invoke("compare", "--base", base, "--tuned", tuned, "--data", data, "--out", tmp_path / "b",
                   "--analyses", "weight_change,changed_vs_needed", "--view-examples", 0, "--no-report")
    assert named.exit_code == 2 and "revert mode" in " ".join(named.output.split())


def test_the_report_draws_the_scatter_with_rho_in_the_caption(run):
    out, _ = run
    html = (out / "report.html").read_text(encoding="utf-8")
    section = html[html.index('id="changed-vs-needed"'):]
    assert 'id="fig-changed_vs_needed"' in section and (out / "figures/changed_vs_needed.svg").exists()
    caption = section[section.index("One point per head"):][:600]
    assert "Spearman" in caption or "undefined (" in caption
    assert " nan" not in caption.lower()
