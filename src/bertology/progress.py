"""The package's progress bars (rich), in one place: a single bar, and one bar per stage.

:func:`progress_bar` is one bar over a known amount of work (the extraction loop's examples, the
training loop's steps, with extra fields such as the epoch and the loss). The long jobs reported in
stages (ablation sweeps, head importance, probe training) call ``on_progress(stage, done, total)``;
:func:`stage_bars` turns those calls into one bar per stage. Both give ``None`` when progress is off.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

ProgressFn = Callable[[str, int, int], None]


def _columns(label: str, *texts: str) -> list:
    """The columns every bar shows: label, bar, done/total, any ``texts``, elapsed and remaining time."""
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    return [TextColumn(f"[bold]{label}[/]"), BarColumn(), MofNCompleteColumn(), *(TextColumn(t) for t in texts),
            TimeElapsedColumn(), TimeRemainingColumn()]


@contextmanager
def progress_bar(label: str, total: int, enabled: bool = True, *, unit: str = "", fields: dict | None = None,
                 template: str = "", completed: int = 0, console=None, stderr: bool = False,
                 ) -> Iterator[Callable[..., None] | None]:
    """Yield ``advance(n=1, **fields)`` drawing one bar over ``total`` units of work (``None`` if disabled).

    ``unit`` is shown after the count (``"examples"``); ``template`` is a rich text column over the bar's
    ``fields`` (``"epoch {task.fields[epoch]:.2f}"``), which start at ``fields`` and change with each advance.
    ``stderr`` draws on standard error (so a command's printed results stay clean on standard output).
    """
    if not enabled:
        yield None
        return
    from rich.progress import Progress

    if stderr and console is None:
        from rich.console import Console

        console = Console(stderr=True)

    with Progress(*_columns(label, *(t for t in (unit, template) if t)), console=console, transient=False) as bar:
        task = bar.add_task(label, total=total, completed=completed, **(fields or {}))

        def advance(n: int = 1, **values) -> None:
            bar.update(task, advance=n, **values)

        yield advance


def progress_wanted(progress: bool | None) -> bool:
    """Whether to draw bars: ``progress`` when given, else ``BERTOLOGY_PROGRESS`` (``0``/``1``) when set, else on in
    an interactive session (a Jupyter kernel with ipywidgets, which rich needs to draw there, or a terminal on
    stderr) and off elsewhere (scripts whose output goes to a file, tests, the docs build)."""
    import os
    import sys

    if progress is not None:
        return bool(progress)
    env = os.environ.get("BERTOLOGY_PROGRESS", "").strip().lower()
    if env in ("0", "1", "false", "true", "no", "yes", "off", "on"):
        return env in ("1", "true", "yes", "on")
    if "IPython" in sys.modules:
        try:
            shell = sys.modules["IPython"].get_ipython()
        except AttributeError:  # an IPython without get_ipython at the top (not a shell)
            shell = None
        if type(shell).__name__ == "ZMQInteractiveShell":  # a Jupyter kernel: rich draws its bars as a widget,
            import importlib.util                          # and without ipywidgets only warns and draws nothing

            return importlib.util.find_spec("ipywidgets") is not None
    return bool(getattr(sys.stderr, "isatty", lambda: False)())


@contextmanager
def stage_bars(enabled: bool = True, describe: Callable[[str], str] = str, console=None) -> Iterator[ProgressFn | None]:
    """Yield an ``on_progress(stage, done, total)`` callback drawing one bar per stage (``None`` if disabled)."""
    if not enabled:
        yield None
        return
    from rich.progress import Progress

    with Progress(*_columns("{task.description}"), console=console, transient=False) as bar:
        tasks: dict[str, int] = {}

        def on_progress(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = bar.add_task(describe(stage), total=total)
            bar.update(tasks[stage], completed=done, total=total)

        yield on_progress


def parse_layer_list(text: str | None, what: str = "layer numbers") -> tuple[int, ...] | None:
    """``"1,3, 5"`` -> ``(1, 3, 5)``; empty or ``all`` -> ``None`` (every layer). One clear error otherwise."""
    from bertology.errors import BertologyError

    if text is None or text.strip().lower() in ("", "all"):
        return None
    try:
        return tuple(sorted({int(x) for x in text.replace(" ", "").split(",") if x}))
    except ValueError:
        raise BertologyError(f"--layers takes a comma list of {what} or 'all', not {text!r}.") from None
