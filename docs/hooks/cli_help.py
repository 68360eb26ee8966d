"""mkdocs hook: replace ``<!-- bertology-help: CMD [SUB] -->`` with that command's ``--help``, run at build time.

The CLI reference is generated from the code, so it cannot drift from the flags the commands take.
"""
from __future__ import annotations

import re

MARKER = re.compile(r"<!--\s*bertology-help:\s*([a-z][a-z _-]*?)\s*-->")
WIDTH = 100


def _help(args: list[str]) -> str:
    from typer.testing import CliRunner

    from bertology.cli import app

    result = CliRunner().invoke(app, [*args, "--help"], terminal_width=WIDTH,
                                env={"COLUMNS": str(WIDTH), "NO_COLOR": "1", "TERM": "dumb"})
    if result.exit_code != 0:
        raise RuntimeError(f"bertology {' '.join(args)} --help exited {result.exit_code}: {result.output}")
    lines = [line.rstrip() for line in result.output.strip("\n").splitlines()]
    return "\n".join(lines).strip("\n")


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ARG001 (mkdocs hook signature)
    def replace(match: re.Match) -> str:
        return "```text\n" + _help(match.group(1).split()) + "\n```"

    return MARKER.sub(replace, markdown)
