"""Every command is a library function: each ``bertology`` command has its ``bt`` function (the notebook face), or
is listed here with the reason it has none, so a new command cannot be CLI-only by accident."""
from __future__ import annotations

import typer.main

import bertology as bt
from bertology.cli import app

#: command -> its ``bt`` function's name, where the two names differ
FUNCTION = {"report": "render_report"}  # ``bertology.report`` is the report package
#: commands with no ``bt`` function, and why
NO_FUNCTION = {
    "env": "prints this machine's versions and devices: a terminal's question",
    "demo": "`make demo`'s fixed pipeline; its parts are bt.finetune and bt.compare",
    "patterns": "hand-labelling round trip of files (export, label, train); compare's patterns_cnn setting uses the CNN",
}


def test_every_command_has_its_notebook_function():
    commands = sorted(typer.main.get_command(app).commands)
    assert set(NO_FUNCTION) <= set(commands), "a listed command no longer exists"
    missing = [c for c in commands if c not in NO_FUNCTION and not callable(getattr(bt, FUNCTION.get(c, c), None))]
    assert not missing, f"commands without a bt function: {missing}"
    assert set(FUNCTION.get(c, c) for c in commands if c not in NO_FUNCTION) <= set(bt.__all__)
