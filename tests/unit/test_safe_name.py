"""``safe_name``: the one check of every name that becomes a file or folder name (tasks, tuned models, tables)."""
from __future__ import annotations

import re

import pytest

from bertology.errors import NAME_LIMIT, BertologyError, safe_name
from bertology.multicompare import TunedModel, parse_tuned


@pytest.mark.parametrize("value", ["sst2", "a", "mnli-m", "task_1.v2", "my model", "x" * NAME_LIMIT, "a..b"])
def test_a_name_that_stays_inside_its_folder_passes_unchanged(value):
    assert safe_name("task name", value) == value


@pytest.mark.parametrize(("value", "rule"), [
    ("..", "names a folder itself"),
    (".", "names a folder itself"),
    ("a/b", "holds a path separator"),
    ("a\\b", "holds a path separator"),
    ("/etc", "holds a path separator"),
    (".hidden", "starts with '.'"),
    ("-rf", "starts with '-'"),
    ("a\0b", "holds a NUL or other control character"),
    ("line\nbreak", "holds a NUL or other control character"),
    ("tab\there", "holds a NUL or other control character"),
    ("x" * (NAME_LIMIT + 1), f"is {NAME_LIMIT + 1} characters long, more than {NAME_LIMIT}"),
    ("", "is not a non-empty string"),
    (3, "is not a non-empty string"),
])
def test_a_name_that_would_leave_its_folder_is_one_line_naming_kind_value_and_rule(value, rule):
    with pytest.raises(BertologyError) as caught:
        safe_name("task name", value)
    line = str(caught.value)
    assert "\n" not in line  # one line: the value is shown as repr writes it (a newline as \\n)
    assert line.startswith(f"The task name {value!r} {rule}"), line


@pytest.mark.parametrize("name", ["../x", "a/..", ".", "a//b", "-x/s0", "sst2/.s0"])
def test_a_tuned_model_name_is_checked_part_by_part(name):
    with pytest.raises(BertologyError, match=rf"^Tuned model {re.escape(repr(name))}: The tuned model name"):
        TunedModel(name, "minilm")


def test_task_and_seed_names_of_tuned_models_still_pass():
    assert TunedModel("sst2/s0", "minilm").task == "sst2"
    assert [t.name for t in parse_tuned(["a/s0=minilm", "b=minilm"])] == ["a/s0", "b"]


@pytest.mark.parametrize("name", ["../outside", ".hidden", "a/b"])
def test_a_table_name_that_would_leave_tables_is_refused_and_nothing_is_written(tmp_path, name):
    import pandas as pd

    from bertology.results import read_table, write_table

    with pytest.raises(BertologyError, match="The table name"):
        write_table(tmp_path / "run", name, pd.DataFrame({"x": [1]}))
    with pytest.raises(BertologyError, match="The table name"):
        read_table(tmp_path / "run", name)
    assert not (tmp_path / "run").exists() and not list(tmp_path.iterdir())
