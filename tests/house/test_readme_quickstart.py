"""The README's quickstart runs as written after ``make demo``.

The README opens with exactly two commands (``make demo``, ``make test``). Every command of its command-line
quickstart is parsed by the real CLI (an unknown flag, a missing argument or a value of the wrong type fails
here), and every file or folder a command or the Python quickstart names is one a finished ``make demo`` leaves
(:class:`bertology.demo.DemoPaths` for the demo's own run folder) or one an earlier command of the quickstart
writes (its ``--out``, and ``OUT/model`` for a fine-tune); no hub id, whose download the quickstart cannot
promise. Running ``make demo`` itself takes minutes and needs the model wheel and the data, so this test reads
where the demo writes from the demo's code (and that the Makefile runs it with its default ``--out``);
``tests/unit/test_demo.py`` checks that a demo run leaves those files.
"""
from __future__ import annotations

import ast
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
#: Parameters of the commands that name a file or folder to read (``out`` is a command's own output).
READS = ("data", "model", "base", "tuned", "compare", "train", "test", "dev", "run", "run_dir", "spec", "relations")
#: Names the loaders resolve without a file (built-in models).
BUILTIN = {"minilm"}


def _blocks() -> list[tuple[str, str, str]]:
    """``(section heading, language, body)`` of every fenced block of the README, in order."""
    text = README.read_text(encoding="utf-8")
    out = []
    for match in FENCE.finditer(text):
        heading = ([h for h in re.findall(r"^## (.+)$", text[: match.start()], re.M)] or [""])[-1]
        out.append((heading, match.group(1), match.group(2)))
    return out


def _lines(body: str) -> list[str]:
    return [line.split("#", 1)[0].strip() for line in body.splitlines() if line.split("#", 1)[0].strip()]


def _demo_leaves() -> set[Path]:
    from bertology.demo import DEFAULT_OUT, DemoPaths

    return set(DemoPaths.of(DEFAULT_OUT).made())


def test_the_readme_opens_with_make_demo_and_make_test():
    heading, language, body = _blocks()[0]
    assert language == "bash" and _lines(body) == ["make demo", "make test"]


def test_make_demo_runs_the_demo_with_its_default_folder():
    """``make demo`` is ``bertology demo`` with no ``--out``: the paths below are the demo's defaults, and the
    command's default is the function's."""
    import click
    import typer.main

    from bertology.cli import app
    from bertology.demo import DEFAULT_OUT

    recipe = re.search(r"^demo:.*\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.M).group(1)
    assert "bertology demo" in recipe and "--out" not in recipe
    cmd = typer.main.get_command(app).commands["demo"]
    out = next(p for p in cmd.get_params(click.Context(cmd)) if p.name == "out")
    assert Path(out.default) == Path(DEFAULT_OUT)


def _quickstart_commands() -> list[list[str]]:
    bodies = [body for heading, language, body in _blocks() if heading == "Command line" and language == "bash"]
    assert len(bodies) == 1, "the README has one command-line quickstart block"
    commands = [shlex.split(line) for line in _lines(bodies[0])]
    assert commands[0] == ["source", ".venv/bin/activate"]  # make installed bertology in .venv
    assert all(c[0] == "bertology" for c in commands[1:]) and len(commands) > 2
    return commands[1:]


def _parsed(argv: list[str]) -> tuple[str, dict]:
    """The command's name and its parameters, parsed by the real CLI (flags checked, nothing run)."""
    import typer.main

    from bertology.cli import app

    group = typer.main.get_command(app)
    ctx = group.context_class(group, info_name="bertology")  # the group's own options: none in the quickstart
    name, cmd, rest = group.resolve_command(ctx, list(argv[1:]))
    sub = cmd.make_context(name, rest, parent=ctx)
    return name, dict(sub.params)


def _named(value) -> list[str]:
    values = value if isinstance(value, (list, tuple)) else [value]
    return [str(v) for v in values if v is not None]


def test_every_quickstart_command_parses_and_names_only_what_the_demo_or_an_earlier_command_leaves():
    available = _demo_leaves()
    for argv in _quickstart_commands():
        name, params = _parsed(argv)
        for key in READS:
            for given in _named(params.get(key)):
                if given in BUILTIN:
                    continue
                assert Path(given) in available, (
                    f"README: `{shlex.join(argv)}` names {given}, which neither `make demo` nor an earlier "
                    f"command of the quickstart leaves")
        if params.get("out") is not None:
            out = Path(str(params["out"]))
            available |= {out, *((out / "model",) if name == "finetune" else ())}


def test_the_python_quickstart_names_only_what_the_demo_or_an_earlier_call_leaves():
    bodies = [body for heading, language, body in _blocks() if heading == "Python" and language == "python"]
    assert len(bodies) == 1
    available = _demo_leaves()
    tree = ast.parse(bodies[0])
    calls = [node for node in ast.walk(tree) if isinstance(node, ast.Call)]
    calls.sort(key=lambda node: (node.lineno, node.col_offset))
    named_any = False
    for call in calls:
        for arg in call.args:
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and "/" in arg.value:
                named_any = True
                assert Path(arg.value) in available, f"README's Python names {arg.value!r}, which nothing leaves"
        for kw in call.keywords:
            if kw.arg == "out" and isinstance(kw.value, ast.Constant):
                available |= {Path(kw.value.value), Path(kw.value.value) / "model"}
    assert named_any  # the check read the calls' paths


@pytest.mark.parametrize("path", sorted(str(p) for p in _demo_leaves()))
def test_the_demo_paths_are_under_runs(path):
    """Under ``runs/`` (ignored by git, removed by ``make clean``): nothing the demo leaves is committed."""
    assert Path(path).parts[0] == "runs"
    assert "runs/" in (ROOT / ".gitignore").read_text().split()
