"""Several ablation modes in one ``compare`` (``--ablation-mode uniform,revert,transplant``): each mode's rows equal a
run of that mode alone, and the report and the summary show each."""
import json

import pandas as pd
import pytest
from pandas.testing import assert_frame_equal

from bertology.testing import SENTENCES, split_classifier, tiny_bert_pair
from cli_checks import invoke, labelled_csv  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

COMMON = ("--ablation-bootstrap", 30, "--view-examples", 0)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The three modes in one run, and each mode alone, on one tiny classifier pair."""
    folder = tmp_path_factory.mktemp("modes")
    base, tuned = tiny_bert_pair(folder, planted=(2, 1), classifier=True)
    labels = split_classifier(tuned, SENTENCES * 2)
    data = labelled_csv(folder / "d.csv", SENTENCES * 2, labels)
    out = {}
    for name, modes in (("all", "uniform,revert,transplant"), ("uniform", "uniform"), ("revert", "revert"),
                        ("transplant", "transplant")):
        result = invoke("compare", "--base", base, "--tuned", tuned, "--data", data, "--out", folder / name,
                        "--ablation-mode", modes, *COMMON, "--analyses",
                        "weight_change,ablation" + (",changed_vs_needed" if "revert" in modes else ""), *(("--no-report",) if name != "all" else ()))
        assert result.exit_code == 0, result.output
        out[name] = (folder / name, " ".join(result.output.split()))
    out["inputs"] = (base, tuned, data)
    return out


def _table(run, name: str) -> pd.DataFrame:
    return pd.read_parquet(run / "tables" / f"{name}.parquet")


def test_each_mode_s_rows_equal_that_mode_run_alone(runs):
    together = _table(runs["all"][0], "ablation")
    assert list(dict.fromkeys(together["mode"])) == ["uniform", "revert"]
    for mode in ("uniform", "revert"):
        alone = _table(runs[mode][0], "ablation")
        rows = together[together["mode"] == mode].reset_index(drop=True)
        assert_frame_equal(rows, alone)
    for name in ("transplant", "weight_change"):
        assert_frame_equal(_table(runs["all"][0], name), _table(runs["transplant"][0], name))
    # head importance goes with the head mode, as in a uniform run
    assert_frame_equal(_table(runs["all"][0], "head_importance"), _table(runs["uniform"][0], "head_importance"))
    assert_frame_equal(_table(runs["all"][0], "changed_vs_needed"), _table(runs["revert"][0], "changed_vs_needed"))


def test_the_manifest_keeps_each_mode_s_section(runs):
    m = json.loads((runs["all"][0] / "manifest.json").read_text())
    section = m["experiments"]["ablation"] if "experiments" in m else m["analyses"]["ablation"]
    assert list(section["by_mode"]) == ["uniform", "revert", "transplant"]
    assert section["settings"]["mode"] == "uniform" and section["by_mode"]["revert"]["settings"]["mode"] == "revert"
    assert m["config"]["ablation_mode"] == ["uniform", "revert", "transplant"]


def test_the_summary_and_the_report_say_each_mode(runs):
    run, text = runs["all"]
    assert "mode uniform" in text and "mode revert" in text and "revert hurts beyond the 95% CI" in text
    assert "transplant" in text and "changed vs needed (heads)" in text
    html = (run / "report.html").read_text(encoding="utf-8")
    for section in ('id="ablation"', 'id="revert"', 'id="transplant"', 'id="changed-vs-needed"'):
        assert section in html, section
    revert = html[html.index('<section id="revert"'):html.index('<section id="transplant"')]
    assert "Reverts that matter most" in revert and "fig-revert_heads_accuracy" in revert
    assert "head_importance" not in revert  # importance belongs to the head mode's section
    ablation = html[html.index('<section id="ablation"'):html.index('<section id="revert"')]
    assert "fig-ablation_heads_accuracy" in ablation and "fig-head_importance" in ablation


def test_a_mode_named_twice_runs_once_and_an_unknown_one_is_one_line(runs, tmp_path):
    from bertology.config import CompareConfig
    from bertology.experiments.ablation import modes_of

    assert modes_of(CompareConfig(base="minilm", tuned="minilm", ablation_mode="revert,uniform,revert")) == ("revert", "uniform")
    bad = invoke("compare", "--base", "minilm", "--tuned", "minilm", "--data", "x.txt", "--out", tmp_path / "b",
                 "--ablation-mode", "uniform,half")
    assert bad.exit_code == 2 and "--ablation-mode (ablation_mode) must be one of uniform, zero, mean, revert, transplant, not 'half'" in " ".join(bad.output.split())


def test_one_mode_keeps_the_fingerprint_it_had_as_a_plain_name():
    """Runs (and study jobs) made when the mode was one name stay cached: ("revert",) fingerprints as "revert"."""

    import dataclasses

    from bertology.config import CompareConfig, DataConfig
    from bertology.commands.selection import complete_config

    config = complete_config(CompareConfig(base="minilm", tuned="t", data=DataConfig(path="d.txt"), ablation_mode="revert"))
    assert config.ablation_mode == ("revert",)
    assert "ablation_units_per_forward" in config.not_fingerprinted  # a speed setting: no numbers of its own
    # how the value was stored before lists were allowed (the same completed config otherwise: what it leaves out of
    # the fingerprint, e.g. ablation_units_per_forward, is left out of both)
    as_before = dataclasses.replace(config, settings={**config.settings, "ablation_mode": "revert"})
    assert config.fingerprint() == as_before.fingerprint()
    both = complete_config(CompareConfig(base="minilm", tuned="t", data=DataConfig(path="d.txt"),
                                         ablation_mode="uniform,revert"))
    assert both.fingerprint() != config.fingerprint()


def test_two_head_modes_are_never_drawn_as_one(runs, tmp_path):
    """uniform and zero in one run: the report's ablation section draws the first (head importance's mode) and names
    the other in a warning; the summary states both."""
    base, tuned, data = runs["inputs"]
    result = invoke("compare", "--base", base, "--tuned", tuned, "--data", data, "--out", tmp_path / "two",
                    "--ablation-mode", "zero,uniform", *COMMON, "--analyses", "ablation", "--no-importance")
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "mode zero" in text and "mode uniform" in text
    html = (tmp_path / "two" / "report.html").read_text(encoding="utf-8")
    section = html[html.index('<section id="ablation"'):]
    section = section[:section.index("</section>")]
    assert "<dt>Mode</dt><dd>zero</dd>" in section and "<dd>uniform</dd>" not in section
    assert "the rows of mode(s) uniform are in tables/ablation" in " ".join(html.split())
