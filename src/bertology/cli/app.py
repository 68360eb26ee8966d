"""Typer application and the shared error handling of every subcommand."""
from __future__ import annotations

import functools
import logging
import os
import sys
import traceback
from collections.abc import Callable
from typing import NoReturn, TypeVar

import typer
from typer._click.exceptions import ClickException, NoArgsIsHelpError, UsageError  # typer's own click (pinned)
from typer.core import TyperGroup
from typer.exceptions import TyperException
from rich.markup import escape
from rich.console import Console

from bertology.errors import DISK_FULL, BertologyError, disk_full

class OneLineErrors(TyperGroup):
    """The ``bertology`` group: a usage error (an unknown flag, a number that is not one) is one line naming the
    command's help, like every other error of the command line, instead of click's boxed usage block."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):  # noqa: D102
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except NoArgsIsHelpError as err:  # `bertology` or a group alone: its help, as click shows it
            err.show()
            sys.exit(err.exit_code)
        except UsageError as err:
            where = f" (see '{err.ctx.command_path} --help')" if err.ctx is not None else ""
            console.print(f"[bold red]error:[/] {escape(' '.join(err.format_message().split()))}{escape(where)}",
                          highlight=False, soft_wrap=True)
            sys.exit(err.exit_code)
        except ClickException as err:
            err.show()
            sys.exit(err.exit_code)
        except typer.Abort:
            console.print("[yellow]aborted[/]")
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)


app = typer.Typer(
    cls=OneLineErrors,
    name="bertology",
    help="What did fine-tuning change inside my BERT? Attention, representations and more, side by side.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console(stderr=True)
F = TypeVar("F", bound=Callable)
#: Exceptions that are the command line's own way out (``typer.Exit``, usage errors): never bugs.
CLI_EXITS = (typer.Exit, typer.Abort, TyperException)
DEBUG_ENV = "BERTOLOGY_DEBUG"
#: This invocation's global options (set by :func:`main_options`, which runs before every command).
cli_state = {"debug": False}


@app.callback()
def main_options(
    debug: bool = typer.Option(
        False, "--debug", envvar=DEBUG_ENV,
        help=f"Show the full traceback of any error (also: {DEBUG_ENV}=1).",
    ),
) -> None:
    """What did fine-tuning change inside my BERT? Attention, representations and more, side by side."""
    cli_state["debug"] = debug


def debug_requested() -> bool:
    """Whether ``--debug`` (or ``BERTOLOGY_DEBUG=1``) was given to this invocation of ``bertology``."""
    return bool(cli_state["debug"])


def internal_error_line(err: BaseException) -> str:
    """The one line a user sees for a bug: what broke, and what to do about it."""
    message = " ".join(str(err).split())  # one line, however the exception wrote it
    return (f"internal error: {type(err).__name__}: {message} — please report it; "
            "rerun with --debug for the traceback")


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
    """Turn BertologyError into one red line and exit status 2, any other exception (a bug) into one line
    and exit status 1; with ``--debug`` the traceback is printed first."""

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        quiet_libraries()
        try:
            return func(*args, **kwargs)
        except CLI_EXITS:
            raise
        except BertologyError as err:
            _print_traceback_if_debug()
            console.print(f"[bold red]error:[/] {escape(str(err))}", highlight=False, soft_wrap=True)
            raise typer.Exit(code=2) from None
        except KeyboardInterrupt:
            console.print("[yellow]interrupted[/]")
            raise typer.Exit(code=130) from None
        except OSError as err:
            if err.errno not in DISK_FULL:
                _internal(err)
            _print_traceback_if_debug()  # a full disk met outside the run folder's own writes (a cache, a temp file)
            line = str(disk_full(err.filename or "a file", err))
            console.print(f"[bold red]error:[/] {escape(line)}", highlight=False, soft_wrap=True)
            raise typer.Exit(code=2) from None
        except Exception as err:  # noqa: BLE001 - the last resort: a bug, said in one line
            _internal(err)

    return wrapper  # type: ignore[return-value]


def _internal(err: BaseException) -> NoReturn:
    """A bug: its one line, exit status 1 (the traceback with ``--debug``)."""
    _print_traceback_if_debug()
    console.print(f"[bold red]{escape(internal_error_line(err))}[/]", highlight=False, soft_wrap=True)
    raise typer.Exit(code=1) from None


def _print_traceback_if_debug() -> None:
    """With ``--debug``, print the traceback of the exception being handled (plain text, no markup)."""
    if debug_requested():
        typer.echo(traceback.format_exc(), err=True, nl=False)

