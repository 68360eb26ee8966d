"""Command-line flags generated from :class:`~bertology.settings.Setting` declarations.

A command made with ``cls=settings_command(source)`` gets one flag per setting that ``source()``
returns, grouped in ``--help`` by the spec that declares it. ``source`` runs the first time the
command's parameters are needed (parsing its flags or printing its help), never when the program
starts, so ``bertology --help`` and the other commands do not import torch to list the analyses.

Every generated flag defaults to "not given": the library fills in the declared default and checks
the value (:meth:`Setting.check`), so the command line and the Python API accept and refuse the same
values with the same one-line message. ``--help`` shows the declared default.
"""
from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any, Optional

import typer
from typer.core import TyperCommand

from bertology.settings import Setting

#: Where the flags the user gave are left for the command's function (``ctx.meta``).
GIVEN = "bertology.settings_given"
#: A spec's settings as ``(panel title, settings)``; the panel groups them in ``--help``.
Source = Callable[[], Sequence[tuple[str, Sequence[Setting]]]]


def _metavar(s: Setting) -> str | None:
    if s.metavar:
        return s.metavar
    if s.choices:
        return "[" + "|".join(s.choices) + "]"
    return {int: "INTEGER", float: "FLOAT", tuple: "A,B,..", str: "TEXT"}.get(s.kind)  # type: ignore[arg-type]


def _help(s: Setting) -> str:
    """The declaration's help, its paper, and its default (shown by us: typer would show None, the "not given")."""
    text = s.help + (f" ({s.paper})" if s.paper and s.paper not in s.help else "")
    if s.default is None or s.default is False or s.default == ():  # nothing / off / an empty list: not shown
        return text
    default = ",".join(map(str, s.default)) if isinstance(s.default, tuple) else s.default
    return f"{text} (default: {s.cli_flag if default is True else default})"


def _parameter(s: Setting, panel: str) -> inspect.Parameter:
    """One generated flag as a typer parameter: typed but unchecked (the library checks), default "not given"."""
    if s.kind is bool:
        flag = s.cli_flag if not s.default else f"{s.cli_flag}/--no-{s.cli_flag[2:]}"
        info = typer.Option(None, flag, help=_help(s), show_default=False, rich_help_panel=panel)
        return inspect.Parameter(s.name, inspect.Parameter.KEYWORD_ONLY, default=info, annotation=Optional[bool])
    kind = {int: int, float: float}.get(s.kind, str)  # type: ignore[arg-type]
    info = typer.Option(None, s.cli_flag, help=_help(s), show_default=False, metavar=_metavar(s), rich_help_panel=panel)
    return inspect.Parameter(s.name, inspect.Parameter.KEYWORD_ONLY, default=info, annotation=Optional[kind])


def options(source: Source) -> list[Any]:
    """The click options of every setting ``source()`` declares, built by typer itself (so ``--help`` renders them
    as it renders hand-written ones): a throwaway command whose signature is generated."""
    def generated(**_: Any) -> None:  # pragma: no cover - never called; only its signature is read
        pass

    generated.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
        [_parameter(s, panel) for panel, group in source() for s in group])
    holder = typer.Typer(add_completion=False)
    holder.command()(generated)
    return list(typer.main.get_command(holder).params)


def settings_command(source: Source) -> type[TyperCommand]:
    """A typer command class whose extra flags come from ``source()``, added when first needed."""

    class SettingsCommand(TyperCommand):
        _generated: list[Any] = []
        _declared: tuple = ()

        def _options(self) -> list[Any]:
            declared = tuple((panel, tuple(group)) for panel, group in source())
            if declared != self._declared:  # first use, or a catalog that changed since (a test's toy analysis)
                self.params = [p for p in self.params if p not in self._generated]
                self._generated = options(lambda: declared)
                self._declared = declared
                self.params.extend(self._generated)
            return self._generated

        def get_params(self, ctx: Any) -> list[Any]:
            self._options()
            return super().get_params(ctx)

        def invoke(self, ctx: Any) -> Any:
            given = {}
            for opt in self._options():
                value = ctx.params.pop(opt.name, None)  # type: ignore[arg-type]
                if value is not None:
                    given[opt.name] = value
            ctx.meta[GIVEN] = given
            return super().invoke(ctx)

    return SettingsCommand


def given_settings(ctx: typer.Context) -> dict[str, Any]:
    """The generated flags the user gave to the running command (``ctx``: typer's), by setting name, as typed."""
    return dict(ctx.meta.get(GIVEN, {}))
