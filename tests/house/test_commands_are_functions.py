"""Every command is a library function: each ``bertology`` command has its ``bt`` function (the notebook face), or
is listed here with the reason it has none, so a new command cannot be CLI-only by accident."""
from __future__ import annotations

import inspect

import pytest
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


#: CLI parameters whose notebook keyword is spelled otherwise, per command ("*": every command)
RENAMED = {"*": {"no_report": "report"}, "report": {"run_dir": "run"}}
#: CLI parameters with no notebook keyword, and why
CLI_ONLY = {
    ("finetune", "against"): "prints a comparison with another run; in Python compare the two runs' tables",
    ("finetune", "no_report"): "bt.finetune(report=True) asks for the report the command writes by default",
}
#: a stand-in for each command's required arguments: a model or file that does not exist, so a call that got past
#: the keywords fails at once on loading, before any work
MISSING = "/nonexistent/bertology-house-check"


def _arguments(command: str) -> tuple:
    return {"view": ("a text",), "track": (MISSING,), "report": (MISSING,), "study": (MISSING,), "absa": (MISSING,),
            "compare": (MISSING, MISSING, MISSING), "probe": (MISSING, MISSING, MISSING)}.get(command,
                                                                                                 (MISSING, MISSING))


@pytest.mark.parametrize("command", sorted(set(typer.main.get_command(app).commands) - set(NO_FUNCTION)))
def test_every_command_parameter_is_a_keyword_of_its_function(command, tmp_path, monkeypatch):
    """Each flag of the command (its own and the generated settings) is taken by the bt function under its Python
    name: a keyword of its signature, or a setting its ``**settings`` takes (the function called with it never
    answers "Unknown setting"; it fails on the missing model instead)."""
    import click

    monkeypatch.chdir(tmp_path)  # whatever a call might write stays in the test's folder

    cmd = typer.main.get_command(app).commands[command]
    function = getattr(bt, FUNCTION.get(command, command))
    signature = inspect.signature(function).parameters
    renamed = {**RENAMED["*"], **RENAMED.get(command, {})}
    refused = []
    for param in cmd.get_params(click.Context(cmd)):
        name = renamed.get(param.name, param.name)
        if param.name == "help" or (command, param.name) in CLI_ONLY or name in signature:
            continue
        if not any(p.kind is p.VAR_KEYWORD for p in signature.values()):
            refused.append(f"{param.name} (no such keyword, and no **settings)")
            continue
        value = param.default if isinstance(param.default, (bool, int, float, str)) else "1"  # parsed as the flag is
        try:
            function(*_arguments(command), **{name: value})
        except TypeError as err:
            if "unexpected keyword" in str(err):
                refused.append(f"{param.name} ({err})")
        except Exception as err:  # noqa: BLE001 - any other failure is past the keywords (the model is missing)
            if "Unknown setting" in str(err) or "has no setting" in str(err):
                refused.append(f"{param.name}: {err}"[:200])
    assert not refused, f"bt.{function.__name__} does not take: {refused}"
