"""Progress bars for work reported in stages: one rich bar per stage, created when the stage first reports.

The long jobs (ablation sweeps, head importance, probe training) call ``on_progress(stage, done,
total)``; :func:`stage_bars` turns those calls into bars, or into nothing when progress is off, so the
CLI commands and ``compare`` share one implementation.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

ProgressFn = Callable[[str, int, int], None]


@contextmanager
def stage_bars(enabled: bool = True, describe: Callable[[str], str] = str, console=None) -> Iterator[ProgressFn | None]:
    """Yield an ``on_progress(stage, done, total)`` callback drawing one bar per stage (``None`` if disabled)."""
    if not enabled:
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    with Progress(TextColumn("[bold]{task.description}[/]"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TimeRemainingColumn(), console=console, transient=False) as bar:
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
