"""Typer application and the shared error handling of every subcommand."""
from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable
from typing import TypeVar

import typer
from rich.markup import escape
from rich.console import Console

from bertology.errors import BertologyError

app = typer.Typer(
    name="bertology",
    help="What did fine-tuning change inside my BERT? Attention, representations and more, side by side.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console(stderr=True)
F = TypeVar("F", bound=Callable)


def quiet_libraries() -> None:
    """Silence transformers' load reports and hub chatter; our own logging stays at INFO."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    from rich.logging import RichHandler

    # Log through the same console as the progress bars so lines never print over a bar.
    logging.basicConfig(
        level=logging.INFO,
        format="%(message)s",
        handlers=[RichHandler(console=console, show_path=False, show_time=False, markup=False)],
        force=True,
    )


def user_errors(func: F) -> F:
    """Turn BertologyError into one red line and exit status 2, with no traceback."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        quiet_libraries()
        try:
            return func(*args, **kwargs)
        except BertologyError as err:
            console.print(f"[bold red]error:[/] {escape(str(err))}", highlight=False, soft_wrap=True)
            raise typer.Exit(code=2) from None
        except KeyboardInterrupt:
            console.print("[yellow]interrupted[/]")
            raise typer.Exit(code=130) from None

    return wrapper  # type: ignore[return-value]

