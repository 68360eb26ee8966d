"""The public functions' signatures list every declared keyword with its declared default, from a generated file
that must match the declarations (so a new setting cannot be left out of help() and IDEs), at no import cost."""
import inspect
import subprocess
import sys

import pytest

import bertology as bt
from bertology.config import CompareConfig, DataConfig
from bertology.errors import BertologyError
from bertology.settings import field_settings
from bertology.signatures import public_keywords, render


@pytest.fixture(scope="module")
def fresh():
    return public_keywords()


def test_the_generated_keywords_are_current(fresh):
    from bertology.signatures import KEYWORDS_FILE

    assert KEYWORDS_FILE.read_text(encoding="utf-8") == render(fresh), (
        "src/bertology/keywords.py is out of date: run `python -m bertology.signatures`")


def test_compare_lists_every_declared_setting_with_its_default():
    from bertology.commands.selection import declared_settings

    params = inspect.signature(bt.compare).parameters
    declared = [*field_settings(CompareConfig), *field_settings(DataConfig), *declared_settings()[0].values()]
    shown = {s.name: s.default for s in declared if s.name not in ("base", "analyses", "data", "out", "tuned")}
    assert {n: params[n].default for n in shown} == shown
    assert "settings" not in params and params["analyses"].default == "all"


def test_ablate_takes_the_column_keywords_by_the_names_it_accepts():
    params = inspect.signature(bt.ablate).parameters
    assert {"text_column", "pair_column", "label_column", "mode", "n_bootstrap"} <= set(params)
    assert "text" not in params


def test_every_public_function_has_no_var_keyword(fresh):
    for name in fresh:
        kinds = [p.kind for p in inspect.signature(getattr(bt, name)).parameters.values()]
        assert inspect.Parameter.VAR_KEYWORD not in kinds, name


def test_an_unknown_keyword_is_still_refused():
    with pytest.raises(BertologyError, match="Unknown setting"):
        bt.ablate("minilm", ["a b"], no_such_setting=1)


def test_signing_imports_no_torch():
    code = "import sys, inspect, bertology as bt; inspect.signature(bt.compare); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "False"
