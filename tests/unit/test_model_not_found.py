"""A model argument that is neither a local folder nor a hub id that loads: when it looks like a path (a separator,
or a leading ``.``, ``/``, ``~``), the error also says there is no local folder of that name, resolved, so a typo in a
local path is seen. Offline (HF_HUB_OFFLINE=1, set by the tests' conftest): the hub lookup fails at once."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from bertology.errors import BertologyError
from bertology.models.loading import load_model, no_local_folder


def test_an_org_name_that_is_no_folder_says_both(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    with pytest.raises(BertologyError) as err:
        load_model("runs/modle")  # a typo for runs/model
    text = str(err.value)
    assert "\n" not in text
    assert text.startswith("Could not load model 'runs/modle' from the Hugging Face hub (")
    assert f"), and there is no local folder {tmp_path.resolve() / 'runs' / 'modle'}. Check the id" in text


def test_a_plain_name_says_only_the_hub(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(BertologyError) as err:
        load_model("no-such-model")
    assert "local folder" not in str(err.value).split(". Check")[0]
    assert str(err.value).endswith("Check the id and your connection, or pass a local folder.")


def test_what_looks_like_a_path():
    home = Path("~").expanduser().resolve()
    assert no_local_folder("~/m") == f", and there is no local folder {home / 'm'}"
    assert no_local_folder("org/name") == f", and there is no local folder {Path.cwd().resolve() / 'org' / 'name'}"
    assert no_local_folder("a\\b").startswith(", and there is no local folder ")
    assert no_local_folder(".hidden").endswith(os.sep + ".hidden")
    assert no_local_folder("bert-base-uncased") == ""
