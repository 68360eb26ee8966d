"""The notebook API's progress bars: on by default where someone watches (Jupyter, IPython, a terminal), off where
output goes to a file; an explicit argument, then BERTOLOGY_PROGRESS, decide first."""
from __future__ import annotations

import io
import sys
import types

import pytest

from bertology.progress import progress_wanted


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture
def quiet(monkeypatch):
    """No IPython shell, stderr a file, no BERTOLOGY_PROGRESS."""
    monkeypatch.delenv("BERTOLOGY_PROGRESS", raising=False)
    monkeypatch.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=lambda: None))
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    return monkeypatch


def test_off_for_a_script_writing_to_a_file(quiet):
    assert progress_wanted(None) is False
    assert progress_wanted(True) is True


def test_on_in_a_terminal_or_a_notebook(quiet):
    quiet.setattr(sys, "stderr", _Tty())
    assert progress_wanted(None) is True
    assert progress_wanted(False) is False
    quiet.setattr(sys, "stderr", io.StringIO())
    kernel = type("ZMQInteractiveShell", (), {})()  # a Jupyter kernel's shell
    quiet.setitem(sys.modules, "IPython", types.SimpleNamespace(get_ipython=lambda: kernel))
    import importlib.util

    has_widgets = importlib.util.find_spec("ipywidgets") is not None
    assert progress_wanted(None) is has_widgets  # rich draws bars in a notebook only through ipywidgets
    quiet.setattr(importlib.util, "find_spec", lambda name: object() if name == "ipywidgets" else None)
    assert progress_wanted(None) is True


@pytest.mark.parametrize("value, wanted", [("0", False), ("off", False), ("1", True), ("yes", True)])
def test_the_environment_decides_for_every_call(quiet, value, wanted):
    quiet.setenv("BERTOLOGY_PROGRESS", value)
    quiet.setattr(sys, "stderr", _Tty())
    assert progress_wanted(None) is wanted
    assert progress_wanted(not wanted) is (not wanted)  # an explicit argument still wins
