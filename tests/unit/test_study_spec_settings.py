"""A study's [compare] table takes every setting ``bertology compare`` declares, checked when the spec is read."""
from __future__ import annotations

import pytest

from bertology.errors import BertologyError
from bertology.studies.jobs import CompareJob
from bertology.studies.spec import load_spec


def _spec(tmp_path, compare_lines: str):
    (tmp_path / "shared.txt").write_text("one sentence .\nanother one .\n", encoding="utf-8")
    (tmp_path / "STUDY.toml").write_text(
        'base = "minilm"\nseeds = [0]\n[[task]]\nname = "t"\nmodels = { 0 = "minilm" }\n'
        f'[compare]\ndata = "shared.txt"\n{compare_lines}\n', encoding="utf-8")
    return load_spec(tmp_path / "STUDY.toml")


def test_a_declared_compare_setting_reaches_the_job_s_config(tmp_path):
    spec = _spec(tmp_path, 'rsa_tokens = 50\nablation_mode = "zero"\npca_examples = [0, 1]')
    # a comma-list setting given as one word is read as the list of that one word
    assert dict(spec.compare.settings) == {"rsa_tokens": 50, "ablation_mode": ("zero",), "pca_examples": (0, 1)}
    job = CompareJob("j", "compare", "minilm", (), spec.compare, "cpu", str(tmp_path / "out"), "fp")
    config = job.config()
    assert config.rsa_tokens == 50 and config.ablation_mode == ("zero",) and config.pca_examples == (0, 1)


@pytest.mark.parametrize(("line", "message"), [
    ("rsa_tokens = 2", r"\[compare\]: --rsa-tokens \(rsa_tokens\) must be at least 4, not 2\."),
    ('ablation_mode = "half"', r"\[compare\]: --ablation-mode \(ablation_mode\) must be one of uniform, zero, mean"),
    ("rsa_tokenz = 5", r"Unknown key 'rsa_tokenz' \(did you mean rsa_tokens\?\) in \[compare\]"),
])
def test_a_bad_compare_setting_is_refused_when_the_spec_is_read(tmp_path, line, message):
    with pytest.raises(BertologyError, match=message):
        _spec(tmp_path, line)
