"""The activation-difference lens inside ``compare``: run only when named, its tables and manifest section, its
flags on the command line, resumed like any experiment; runs that do not name it keep their fingerprint."""
from __future__ import annotations

import pandas as pd
import pytest

from bertology.config import CompareConfig, DataConfig
from bertology.data.corpus import Corpus
from bertology.commands.compare import compare
from bertology.commands.selection import complete_config
from bertology.testing import SENTENCES
from cli_checks import invoke  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
NAME = "activation_difference"


def _config(pair, out, **kw) -> CompareConfig:
    base, tuned = pair
    return CompareConfig(base=str(base), tuned=str(tuned), data=DataConfig(""), out=str(out), view_examples=0, **kw)


def test_named_it_writes_its_tables_and_resumes(planted_pair, tmp_path):
    config = _config(planted_pair, tmp_path / "run", analyses=(NAME,), activation_difference_tokens=3)
    run = compare(config, corpus=Corpus.from_list(SENTENCES))
    table = run.table(NAME)
    assert set(table["layer"]) == {0, 1, 2} and set(table["position"]) == {"content", "position_0", "first", "rest"}
    assert table.query("layer == 0")["norm"].max() == 0  # only a head of layer 2 differs
    assert table.query("layer == 2 and position == 'content'")["norm"].iloc[0] > 0
    assert len(run.table(NAME + "_tokens")) == 3 * 3
    assert "not read" in run.manifest["analyses"][NAME]["readouts"]["classifier"]
    again = compare(config, corpus=Corpus.from_list(SENTENCES))
    assert again.resumed == [NAME]
    pd.testing.assert_frame_equal(again.table(NAME), table, check_dtype=False)


def test_its_settings_leave_other_runs_fingerprints_alone():
    plain = complete_config(CompareConfig(tuned="t")).fingerprint()
    assert complete_config(CompareConfig(tuned="t", activation_difference_first=3)).fingerprint() == plain
    named = complete_config(CompareConfig(tuned="t", analyses=(NAME,))).fingerprint()
    assert complete_config(CompareConfig(tuned="t", analyses=(NAME,), activation_difference_first=3)).fingerprint() \
        != named


def test_the_command_line_takes_its_flags(planted_pair, tmp_path):
    data = tmp_path / "d.txt"
    data.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    base, tuned = planted_pair
    out = tmp_path / "cli"
    result = invoke("compare", "--base", base, "--tuned", tuned, "--data", data, "--analyses", NAME,
                    "--activation-difference-tokens", "2", "--out", out, "--no-report")
    assert result.exit_code == 0, result.output
    assert "activation difference: largest at layer 2" in " ".join(result.output.split())
    assert len(pd.read_parquet(out / "tables/activation_difference_tokens.parquet")) == 3 * 2


def test_the_report_section_shows_the_figure_the_tokens_and_the_classifier_readout(identical_pair, tmp_path):
    from bertology.testing import save_tiny_bert

    base, _ = identical_pair
    tuned = save_tiny_bert(tmp_path / "classifier", seed=1, classifier=True, num_labels=2)
    run = compare(_config((base, tuned), tmp_path / "run", analyses=(NAME,)), corpus=Corpus.from_list(SENTENCES))
    readout = run.table(NAME + "_readout")
    from transformers import AutoConfig

    labels = sorted(map(str, AutoConfig.from_pretrained(tuned).id2label.values()))
    assert sorted(readout["label_or_token"].dropna().unique()) == labels and len(labels) == 2
    html = run.report.read_text(encoding="utf-8")
    section = html[html.index('id="activation-difference"'):]
    section = section[:section.index("</section>")]
    assert (tmp_path / "run/figures/activation_difference_by_layer.svg").exists() and "<svg" in section
    assert "Tokens that moved most" in section and "Read through the heads" in section
    assert "no masked-LM head" in section  # the readout that does not apply says why
