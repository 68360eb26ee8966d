"""The crosscoder inside ``compare``: run only when named, its three tables and manifest section, its flags on the
command line, resumed like any experiment; runs that do not name it keep their fingerprint."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from bertology.config import CompareConfig, DataConfig
from bertology.data.corpus import Corpus
from bertology.commands.compare import compare
from bertology.commands.selection import complete_config
from bertology.testing import SENTENCES
from cli_checks import invoke  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
SMALL = dict(crosscoder_latents=16, crosscoder_k=2, crosscoder_steps=20, crosscoder_batch=32, crosscoder_buffer=128)


def _config(pair, out, **kw) -> CompareConfig:
    base, tuned = pair
    return CompareConfig(base=str(base), tuned=str(tuned), data=DataConfig(""), out=str(out), view_examples=0, **kw)


def test_named_it_writes_its_tables_and_resumes(identical_pair, tmp_path):
    config = _config(identical_pair, tmp_path / "run", analyses=("crosscoder",), **SMALL)
    run = compare(config, corpus=Corpus.from_list(SENTENCES))
    assert set(run.table("crosscoder")["layer"]) == {1, 2}
    assert len(run.table("crosscoder_latents")) == 2 * 16
    assert list(run.table("crosscoder_examples").columns)[:7] == ["layer", "latent", "rank", "example", "position",
                                                                  "token", "activation"]
    section = run.manifest["analyses"]["crosscoder"]
    assert section["settings"]["latents"] == 16 and set(section["fit"]) == {"1", "2"}
    again = compare(config, corpus=Corpus.from_list(SENTENCES))
    assert again.resumed == ["crosscoder"]
    pd.testing.assert_frame_equal(again.table("crosscoder_latents"), run.table("crosscoder_latents"), check_dtype=False)


def test_all_does_not_run_it_and_its_settings_leave_other_runs_fingerprints_alone():
    plain = complete_config(CompareConfig(tuned="t")).fingerprint()
    assert complete_config(CompareConfig(tuned="t", crosscoder_k=3)).fingerprint() == plain
    named = complete_config(CompareConfig(tuned="t", analyses=("crosscoder",))).fingerprint()
    assert complete_config(CompareConfig(tuned="t", analyses=("crosscoder",), crosscoder_k=3)).fingerprint() != named


def test_all_skips_it_silently(identical_pair, tmp_path):
    run = compare(_config(identical_pair, tmp_path / "run", analyses=("all",)), corpus=Corpus.from_list(SENTENCES))
    assert "crosscoder_latents" not in run.results
    assert not any("crosscoder" in str(w) for w in run.manifest["warnings"])


def test_the_command_line_takes_its_flags(identical_pair, tmp_path):
    data = tmp_path / "d.txt"
    data.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    base, tuned = identical_pair
    out = tmp_path / "cli"
    flags = [x for k, v in SMALL.items() for x in ("--" + k.replace("_", "-"), v)]
    result = invoke("compare", "--base", base, "--tuned", tuned, "--data", data, "--analyses", "crosscoder",
                    "--crosscoder-layers", "2", *flags, "--out", out, "--no-report")
    assert result.exit_code == 0, result.output
    assert "crosscoder: L2:" in " ".join(result.output.split())
    assert set(pd.read_parquet(out / "tables/crosscoder_latents.parquet")["layer"]) == {2}
    assert json.loads((out / "manifest.json").read_text())["config"]["crosscoder_layers"] == [2]


def test_a_bad_layer_list_is_refused_in_one_line(identical_pair, tmp_path):
    base, tuned = identical_pair
    result = invoke("compare", "--base", base, "--tuned", tuned, "--data", tmp_path / "none.txt", "--analyses",
                    "crosscoder", "--crosscoder-layers", "two", "--out", tmp_path / "x", "--no-report")
    assert result.exit_code != 0 and "--crosscoder-layers" in result.output and "Traceback" not in result.output


def test_the_report_section(identical_pair, tmp_path):
    """The run's report has the crosscoder section with its histogram; the latent table lists confirmed tuned-only
    latents first with their top tokens and best context, shared and dead ones left out."""
    from bertology.report.sections.crosscoder import latent_rows

    run = compare(_config(identical_pair, tmp_path / "run", analyses=("crosscoder",), **SMALL),
                  corpus=Corpus.from_list(SENTENCES))
    html = run.report.read_text(encoding="utf-8")
    assert 'id="crosscoder"' in html and (tmp_path / "run/figures/crosscoder_relative_norm.svg").exists()
    assert "variance explained" in html  # the fit table reached the section
    latents = pd.DataFrame({"layer": [3] * 4, "latent": [0, 1, 2, 3], "relative_norm": [0.9, 0.7, 0.5, 0.8],
                            "kind": ["tuned_only", "tuned_only", "shared", "tuned_only"],
                            "frequency": [0.01, 0.2, 0.5, 0.3], "dead": [False, False, False, True],
                            "tuned_only_verified": pd.array([True, False, pd.NA, False], dtype="boolean")})
    examples = pd.DataFrame({"layer": [3, 3, 3], "latent": [0, 0, 1], "rank": [0, 1, 0], "token": ["film", "film", "a"],
                             "context": ["the [[film]] was", "a [[film]] .", "[[a]] cat"]})
    rows = latent_rows(latents, examples)
    assert [r[1] for r in rows] == [0, 1]  # confirmed first; the shared and the dead latent left out
    assert rows[0][3] == "confirmed" and rows[0][6] == "film" and rows[0][7] == "the [[film]] was"
    assert rows[1][3] == "not confirmed"
