"""A study spec as a dict (a notebook's spec) is the TOML spec it stands for: the same StudySpec (relative paths
from the working directory), the same study tables, and its TOML kept as the study's study.toml."""
from __future__ import annotations

import sys
import tomllib
from pathlib import Path

import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from study_helpers import tiny_study  # noqa: E402

import bertology as bt  # noqa: E402
from bertology.errors import BertologyError  # noqa: E402
from bertology.studies.spec import load_spec  # noqa: E402


def test_a_dict_spec_is_its_toml(tmp_path, monkeypatch):
    path = tiny_study(tmp_path / "s", seeds=(0,))
    raw = tomllib.loads(path.read_text(encoding="utf-8"))
    monkeypatch.chdir(path.parent)  # the TOML's paths are relative to its folder; a dict's to the working directory
    from_toml, from_dict = load_spec(path), load_spec({**raw, "base": Path("base")})
    assert from_dict.path is None and tomllib.loads(from_dict.text) == {**raw, "base": "base"}
    for field in ("base", "tasks", "compare", "lab", "out", "device"):
        assert getattr(from_dict, field) == getattr(from_toml, field), field
    done = bt.study({**raw, "out": "out-dict"})
    assert all(j["status"] == "done" for j in done.manifest["jobs"]), done.manifest["jobs"]
    kept = tomllib.loads((tmp_path / "s" / "out-dict" / "study.toml").read_text(encoding="utf-8"))
    assert kept == {**raw, "out": "out-dict"} and done.manifest["spec"] == "a dict (study.toml holds it)"
    reference = bt.study(path)
    assert set(done.tables) == set(reference.tables) and reference.tables
    for name, table in reference.tables.items():
        pd.testing.assert_frame_equal(done.tables[name], table, check_dtype=False)


def test_model_seeds_may_be_ints_and_data_must_be_files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m0").mkdir()
    (tmp_path / "d.txt").write_text("a sentence\n", encoding="utf-8")
    spec = load_spec({"task": [{"name": "t", "models": {0: "m0"}}], "compare": {"data": "d.txt"}})
    assert spec.tasks[0].models == {0: str(tmp_path / "m0")} and spec.tasks[0].seeds == (0,)
    with pytest.raises(BertologyError, match="holds what TOML cannot .*give files by path"):
        load_spec({"task": [{"name": "t", "data": pd.DataFrame({"text": ["a"]})}]})
    with pytest.raises(BertologyError, match=r"Unknown key 'sed' \(did you mean seeds\?\) in the top level of the "
                                             r"study spec \(a dict\)"):
        load_spec({"sed": [0]})


@pytest.mark.parametrize("spec", [None, 3, b"STUDY.toml"])
def test_a_spec_that_is_neither_a_path_nor_a_dict_is_one_line(spec):
    with pytest.raises(BertologyError, match=r"A study spec is the path of a STUDY.toml or a dict of its tables, not "):
        bt.study(spec)
