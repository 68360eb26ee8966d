"""The ``bertology`` command line: thin wrappers that parse flags into config and call the API."""
from __future__ import annotations

from bertology.cli.app import app
from bertology.cli import ablate, commands, finetune, patterns, view  # noqa: F401,E402  (register the subcommands on ``app``)
from bertology.cli import track  # noqa: F401,E402  (bertology track)
from bertology.cli import probe  # noqa: F401,E402  (bertology probe)
from bertology.cli import absa  # noqa: F401,E402  (bertology absa)
from bertology.cli import study  # noqa: F401,E402  (bertology study)

__all__ = ["app", "main"]


def main() -> None:
    """Entry point of the console script (the imports above have registered every subcommand on ``app``)."""
    app(prog_name="bertology")
