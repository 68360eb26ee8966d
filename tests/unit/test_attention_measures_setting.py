"""``attention_measures``: a declared compare setting whose default leaves the fingerprint of earlier runs alone,
and whose bad values are one line naming the flag, from Python as from the command line."""
from __future__ import annotations

import pytest
from typer.testing import CliRunner

from bertology.cli import app
from bertology.config import CompareConfig
from bertology.errors import BertologyError
from bertology.commands.selection import complete_config, make_config

runner = CliRunner()


def _fingerprint(**values) -> str:
    return complete_config(make_config("d.txt", tuned="t", **values)).fingerprint()


def test_the_default_leaves_the_fingerprint_alone(monkeypatch):
    plain = _fingerprint()
    assert complete_config(make_config("d.txt", tuned="t")).to_dict()["attention_measures"] == ("weights",)
    # the fingerprint a run had before the setting existed: the same config without it
    to_dict = CompareConfig.to_dict
    monkeypatch.setattr(CompareConfig, "to_dict", lambda self: {k: v for k, v in to_dict(self).items()
                                                                if k != "attention_measures"})
    assert _fingerprint() == plain
    monkeypatch.undo()
    assert _fingerprint(attention_measures="weights") == plain
    assert _fingerprint(attention_measures=("weights",)) == plain
    assert _fingerprint(attention_measures="weights,norm") != plain  # more than weights changes the numbers
    assert _fingerprint(attention_measures="weights,norm") != _fingerprint(attention_measures="weights,rollout")


def test_a_comma_list_or_a_list_reads_the_same():
    assert make_config("d.txt", tuned="t", attention_measures=" weights, norm ").attention_measures == ("weights", "norm")
    assert make_config("d.txt", tuned="t", attention_measures=["rollout"]).attention_measures == ("rollout",)


@pytest.mark.parametrize(("value", "line"), [
    ("weights,nrom", r"--attention-measures \(attention_measures\) must be one of weights, norm, norm_residual, "
                     r"rollout, value_zeroing, alti, not 'nrom' \(did you mean norm\?\)\."),
    (("norm", "norm"), r"--attention-measures \(attention_measures\) names a measure twice, not 'norm,norm'\."),
    ((), r"--attention-measures \(attention_measures\) must name at least 1 item"),
])
def test_a_bad_measure_is_one_line_from_python(value, line):
    with pytest.raises(BertologyError, match=line):
        make_config("d.txt", tuned="t", attention_measures=value)


def test_a_bad_measure_is_one_line_exit_2_from_the_cli(tmp_path):
    data = tmp_path / "d.txt"
    data.write_text("one sentence.\n")
    out = runner.invoke(app, ["compare", "--tuned", "t", "--data", str(data), "--out", str(tmp_path / "run"),
                              "--attention-measures", "weights,flow"])
    assert out.exit_code == 2
    text = " ".join(out.output.split())
    assert "--attention-measures (attention_measures) must be one of weights, norm, norm_residual, rollout, value_zeroing, alti, not 'flow'" in text
    assert not (tmp_path / "run").exists()
