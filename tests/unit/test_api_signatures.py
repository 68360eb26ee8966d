"""The public functions' generated signatures list every declared setting with its declared default."""
import inspect

import pytest

import bertology as bt
from bertology import api
from bertology.config import CompareConfig, DataConfig
from bertology.errors import BertologyError
from bertology.settings import field_settings


@pytest.fixture(scope="module")
def signed():
    api.sign()
    return api.signatures()


def test_compare_lists_every_declared_setting_with_its_default(signed):
    from bertology.pipeline import declared_settings

    params = inspect.signature(bt.compare).parameters
    declared = [*field_settings(CompareConfig), *field_settings(DataConfig), *declared_settings()[0].values()]
    shown = {s.name: s.default for s in declared if s.name not in ("base", "analyses")}
    assert {n: params[n].default for n in shown} == shown
    assert "settings" not in params and params["analyses"].default == "all"


def test_every_public_function_has_no_var_keyword(signed):
    for name in signed:
        kinds = [p.kind for p in inspect.signature(getattr(bt, name)).parameters.values()]
        assert inspect.Parameter.VAR_KEYWORD not in kinds, name


def test_an_unknown_keyword_is_still_refused(signed):
    with pytest.raises(BertologyError, match="Unknown setting"):
        bt.ablate("minilm", ["a b"], no_such_setting=1)
