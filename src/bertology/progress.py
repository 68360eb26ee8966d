"""The package's progress reports, in one place: a single bar, and one bar per stage.

:func:`progress_bar` is one bar over a known amount of work (the extraction loop's examples, the
training loop's steps, with extra fields such as the epoch and the loss). The long jobs reported in
stages (ablation sweeps, head importance, probe training) call ``on_progress(stage, done, total)``;
:func:`stage_bars` turns those calls into one bar per stage. Both give ``None`` when progress is off.

Where the bar's stream is a terminal (or a Jupyter notebook) rich draws it; elsewhere (output piped to a
file, a CI log) each bar is reported as plain lines (:class:`PlainBar`, paced by a :class:`Pace`): label, percent,
done/total, elapsed and time left, one line at most every :data:`LINE_EVERY_S` seconds while the work advances, one at
least every :data:`SILENT_AT_MOST_S` seconds while it does not, and one when the bar ends.
"""
from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

ProgressFn = Callable[[str, int, int], None]
Clock = Callable[[], float]

#: Plain lines: the shortest gap between two lines of one bar while its work advances (seconds) ...
LINE_EVERY_S = 15.0
#: ... and the longest silence, when one unit of work takes longer than that (a line saying where the bar is).
SILENT_AT_MOST_S = 30.0
OFF_VALUES = ("0", "false", "no", "off")
ON_VALUES = ("1", "true", "yes", "on")


def format_duration(seconds: float | None) -> str:
    """``75.2`` -> ``"1:15"``, ``3725`` -> ``"1:02:05"``; ``None`` (not known yet) -> ``"?"``."""
    if seconds is None:
        return "?"
    s = max(0, int(round(seconds)))
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


@dataclass(frozen=True)
class Pace:
    """When a :class:`PlainBar` writes its lines: on ``clock``, at most one every ``every`` seconds while the work
    advances and at least one every ``silent_at_most`` while it does not; ``started`` is when the work began on
    ``clock`` (None: when the bar is made), so a bar's elapsed time and time left count from there."""

    clock: Clock = time.monotonic
    every: float = LINE_EVERY_S
    silent_at_most: float = SILENT_AT_MOST_S
    started: float | None = None


class PlainBar:
    """One bar as plain text lines (for a stream that is not a terminal), throttled by a clock.

    ``update(completed, total, **fields)`` records where the work is and writes a line when
    :data:`LINE_EVERY_S` have passed since the last one (or the work is complete); :meth:`tick` writes one
    when :data:`SILENT_AT_MOST_S` have passed with nothing written (a timer calls it); :meth:`close` writes
    the last line unless the complete one was written. ``describe(fields)`` gives the text after the counts
    (the epoch, the loss); ``pace`` (:class:`Pace`) is the clock, those two gaps and when the work began.
    """

    def __init__(self, label: str, total: int, write: Callable[[str], None], *, completed: int = 0, unit: str = "",
                 describe: Callable[[dict], str] | None = None, fields: dict | None = None, pace: Pace = Pace(),
                 ) -> None:
        self.label, self.total, self.unit, self.write = label, total, unit, write
        self.describe, self.fields = describe, dict(fields or {})
        self.clock, self.every, self.silent_at_most = pace.clock, pace.every, pace.silent_at_most
        self.completed = self.first = completed
        self.started = self.last_line = self.clock() if pace.started is None else pace.started
        self.finished = False
        self.written: tuple[int, int] | None = None  # the count of the last line written
        self.lock = threading.Lock()

    def line(self) -> str:
        """``"fine-tuning: 40% 40/100 steps, epoch 0.40 loss 0.6931, elapsed 1:12, left 1:48"``."""
        elapsed = self.clock() - self.started
        percent = f"{100 * self.completed / self.total:.0f}%" if self.total else "?%"
        count = f"{self.completed}/{self.total}" + (f" {self.unit}" if self.unit else "")
        extra = self.describe(self.fields) if self.describe else ""
        parts = [f"{self.label}: {percent} {count}", *([extra] if extra else []),
                 f"elapsed {format_duration(elapsed)}", f"left {format_duration(self.time_left(elapsed))}"]
        return ", ".join(parts)

    def time_left(self, elapsed: float) -> float | None:
        """Seconds left at the rate since the bar started (``None`` until some work is done)."""
        done = self.completed - self.first
        if self.total and self.completed >= self.total:
            return 0.0
        if done <= 0 or elapsed <= 0 or not self.total:
            return None
        return (self.total - self.completed) * elapsed / done

    def update(self, completed: int, total: int | None = None, **fields: Any) -> None:
        """Record the work done (and the fields); write a line when one is due."""
        with self.lock:
            self.completed = completed
            self.total = self.total if total is None else total
            self.fields.update(fields)
            if self.total and self.completed >= self.total:
                if not self.finished:  # the complete line, once (a stage may report its last count again)
                    self._emit()
                    self.finished = True
                return
            self.finished = False  # more work than the bar knew of (its total grew)
            if self.clock() - self.last_line >= self.every:
                self._emit()

    def tick(self) -> None:
        """Write a line if the bar has been silent for :data:`SILENT_AT_MOST_S` (a unit of work longer than that)."""
        with self.lock:
            if not self.finished and self.clock() - self.last_line >= self.silent_at_most:
                self._emit()

    def close(self) -> None:
        """The bar's last line (where it stopped), unless its last line already said so."""
        with self.lock:
            if not self.finished and self.written != (self.completed, self.total):
                self._emit()
            self.finished = True

    def _emit(self) -> None:
        self.write(self.line())
        self.last_line = self.clock()
        self.written = (self.completed, self.total)


@contextmanager
def _ticking(bars: Callable[[], list[PlainBar]], period: float = 1.0) -> Iterator[None]:
    """A daemon thread calling each bar's :meth:`PlainBar.tick` every ``period`` seconds, stopped on exit."""
    stop = threading.Event()

    def run() -> None:
        while not stop.wait(period):
            for bar in bars():
                bar.tick()

    thread = threading.Thread(target=run, name="bertology-progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _console(console=None, stderr: bool = False):
    """The console a bar draws on: the one given, else standard error's or rich's global (standard output) one."""
    if console is not None:
        return console
    if stderr:
        from rich.console import Console

        return Console(stderr=True)
    from rich import get_console

    return get_console()


def _draws_live(console) -> bool:
    """Whether rich can draw a live bar on ``console``: a terminal (not a dumb one) or a Jupyter notebook."""
    return bool(console.is_interactive or console.is_jupyter)


def _writer(console) -> Callable[[str], None]:
    """Write one plain line on ``console`` (no markup, no wrapping), flushed at once so a log file shows it."""
    def write(text: str) -> None:
        console.print(text, markup=False, highlight=False, soft_wrap=True, emoji=False)
        flush = getattr(console.file, "flush", None)
        if flush is not None:
            flush()

    return write


def _plain_text(markup: str) -> str:
    """A rich markup string as plain text (``"[bold]x[/]"`` -> ``"x"``)."""
    from rich.text import Text

    return Text.from_markup(markup).plain


def _describer(template: str) -> Callable[[dict], str] | None:
    """A bar's ``template`` over ``task.fields`` as a function of the fields, for plain lines."""
    if not template:
        return None
    from types import SimpleNamespace

    def describe(fields: dict) -> str:
        try:
            return _plain_text(template.format(task=SimpleNamespace(fields=fields)))
        except (KeyError, ValueError, TypeError, IndexError):  # a field not set yet, or not of the format's kind
            return ""

    return describe


def _columns(label: str, *texts: str) -> list:
    """The columns every bar shows: label, bar, done/total, any ``texts``, elapsed and remaining time."""
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    return [TextColumn(f"[bold]{label}[/]"), BarColumn(), MofNCompleteColumn(), *(TextColumn(t) for t in texts),
            TimeElapsedColumn(), TimeRemainingColumn()]


@dataclass(frozen=True)
class BarText:
    """What a :func:`progress_bar` shows beside its count: the ``unit`` after it (``"examples"``), and a ``template``
    (a rich text column, ``"epoch {task.fields[epoch]:.2f}"``) over the bar's fields, which start at ``fields`` and
    change with each advance."""

    unit: str = ""
    template: str = ""
    fields: Mapping[str, Any] | None = None


@contextmanager
def progress_bar(label: str, total: int, enabled: bool = True, *, text: BarText = BarText(), completed: int = 0,
                 console=None, stderr: bool = False,
                 clock: Clock = time.monotonic) -> Iterator[Callable[..., None] | None]:
    """Yield ``advance(n=1, **fields)`` drawing one bar over ``total`` units of work (``None`` if disabled).

    ``text`` (:class:`BarText`): the unit, the fields and their template shown beside the count; ``completed``:
    the work done before (a resumed run). ``stderr`` draws on standard error (so a command's printed results stay
    clean on standard output). On a stream that is not a terminal the bar is plain lines (:class:`PlainBar`, timed
    by ``clock``).
    """
    if not enabled:
        yield None
        return
    console = _console(console, stderr)
    unit, template, fields = text.unit, text.template, dict(text.fields or {})
    if not _draws_live(console):
        bar = PlainBar(label, total, _writer(console), completed=completed, unit=unit, describe=_describer(template),
                       fields=fields, pace=Pace(clock))

        def advance_plain(n: int = 1, **values) -> None:
            bar.update(bar.completed + n, **values)

        with _ticking(lambda: [bar]):
            try:
                yield advance_plain
            finally:
                bar.close()
        return
    from rich.progress import Progress

    with Progress(*_columns(label, *(t for t in (unit, template) if t)), console=console, transient=False) as live:
        task = live.add_task(label, total=total, completed=completed, **fields)

        def advance(n: int = 1, **values) -> None:
            live.update(task, advance=n, **values)

        yield advance


def progress_wanted(progress: bool | None) -> bool:
    """Whether to draw bars: ``progress`` when given, else ``BERTOLOGY_PROGRESS`` (``0``/``1``) when set, else on in
    an interactive session (a Jupyter kernel with ipywidgets, which rich needs to draw there, or a terminal on
    stderr) and off elsewhere (scripts whose output goes to a file, tests, the docs build)."""
    import sys

    if progress is not None:
        return bool(progress)
    env = progress_setting()
    if env is not None:
        return env
    if "IPython" in sys.modules:
        try:
            shell = sys.modules["IPython"].get_ipython()
        except AttributeError:  # an IPython without get_ipython at the top (not a shell)
            shell = None
        if type(shell).__name__ == "ZMQInteractiveShell":  # a Jupyter kernel: rich draws its bars as a widget,
            import importlib.util                          # and without ipywidgets only warns and draws nothing

            return importlib.util.find_spec("ipywidgets") is not None
    return bool(getattr(sys.stderr, "isatty", lambda: False)())


def progress_setting() -> bool | None:
    """``BERTOLOGY_PROGRESS`` read as a switch (``0``/``off``/``no``/``false`` or ``1``/``on``/``yes``/``true``);
    ``None`` when it is not set (or set to something else)."""
    import os

    env = os.environ.get("BERTOLOGY_PROGRESS", "").strip().lower()
    return True if env in ON_VALUES else False if env in OFF_VALUES else None


def command_progress() -> bool:
    """Whether a ``bertology`` command reports progress: yes (bars in a terminal, plain lines in a log) unless
    ``BERTOLOGY_PROGRESS`` switches it off."""
    return progress_setting() is not False


@contextmanager
def stage_bars(enabled: bool = True, describe: Callable[[str], str] = str, console=None,
               clock: Clock = time.monotonic) -> Iterator[ProgressFn | None]:
    """Yield an ``on_progress(stage, done, total)`` callback drawing one bar per stage (``None`` if disabled); on a
    stream that is not a terminal each stage is plain lines (:class:`PlainBar`, timed by ``clock``)."""
    if not enabled:
        yield None
        return
    console = _console(console)
    if not _draws_live(console):
        bars: dict[str, PlainBar] = {}
        write = _writer(console)
        last_report = [clock()]  # a stage's work began when the one before it last reported (or at the start)
        adding = threading.Lock()  # the timer thread reads the stages while a new one may be added

        def on_plain(stage: str, done: int, total: int) -> None:
            if stage not in bars:
                with adding:
                    bars[stage] = PlainBar(_plain_text(describe(stage)), total, write,
                                           pace=Pace(clock, started=last_report[0]))
            bars[stage].update(done, total)
            last_report[0] = clock()

        def stages() -> list[PlainBar]:
            with adding:
                return list(bars.values())

        with _ticking(stages):
            try:
                yield on_plain
            finally:
                for bar in list(bars.values()):
                    bar.close()
        return
    from rich.progress import Progress

    with Progress(*_columns("{task.description}"), console=console, transient=False) as live:
        tasks: dict[str, int] = {}

        def on_progress(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = live.add_task(describe(stage), total=total)
            live.update(tasks[stage], completed=done, total=total)

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
