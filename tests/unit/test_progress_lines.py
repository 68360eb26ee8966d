"""Progress where no terminal watches (a log file, CI): plain lines with percent, elapsed and time left, at most one
every LINE_EVERY_S seconds while the work advances, at least one every SILENT_AT_MOST_S, and one at the end. A fake
clock drives the timing: no test sleeps."""
from __future__ import annotations

import io

import pytest
from rich.console import Console

from bertology.progress import (
    LINE_EVERY_S, SILENT_AT_MOST_S, BarText, Pace, PlainBar, command_progress, format_duration, progress_bar,
    stage_bars,
)


class FakeClock:
    """A clock the test moves by hand."""

    def __init__(self, now: float = 100.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _file_console() -> tuple[Console, io.StringIO]:
    """A rich console writing to a string, as to a file (not a terminal)."""
    out = io.StringIO()
    return Console(file=out, force_terminal=False, force_jupyter=False, width=60), out


def test_format_duration():
    assert [format_duration(s) for s in (0, 9.6, 75.2, 3725, None)] == ["0:00", "0:10", "1:15", "1:02:05", "?"]


def test_a_line_has_percent_count_fields_elapsed_and_time_left():
    clock, lines = FakeClock(), []
    bar = PlainBar("fine-tuning", 100, lines.append, unit="steps", pace=Pace(clock),
                   describe=lambda f: f"loss {f['loss']}", fields={"loss": "-"})
    clock.now += 72
    bar.update(40, loss="0.6931")
    assert lines == ["fine-tuning: 40% 40/100 steps, loss 0.6931, elapsed 1:12, left 1:48"]


def test_time_left_is_unknown_before_any_work_and_counts_from_a_resumed_start():
    clock, lines = FakeClock(), []
    bar = PlainBar("sweep", 10, lines.append, completed=4, pace=Pace(clock))  # resumed at 4 of 10
    clock.now += SILENT_AT_MOST_S
    bar.tick()
    assert lines[-1] == "sweep: 40% 4/10, elapsed 0:30, left ?"
    bar.update(6)  # 2 units in 30 s since the start: 4 left take 60 s
    assert bar.line().endswith("left 1:00")


def test_lines_are_throttled_while_work_advances():
    clock, lines = FakeClock(), []
    bar = PlainBar("extracting", 1000, lines.append, pace=Pace(clock))
    times = []
    for done in range(1, 1000):  # one unit every 0.5 s, 500 s in all
        clock.now += 0.5
        before = len(lines)
        bar.update(done)
        if len(lines) > before:
            times.append(clock.now)
    gaps = [b - a for a, b in zip([100.0, *times], times)]
    assert len(times) == int(499.5 // LINE_EVERY_S)
    assert all(LINE_EVERY_S <= g < LINE_EVERY_S + 0.5 for g in gaps)


def test_a_silent_bar_still_says_where_it_is_every_30_s():
    clock, lines = FakeClock(), []
    bar = PlainBar("head importance", 3, lines.append, pace=Pace(clock))
    written_at = []
    for _ in range(100):  # the timer thread ticks each second; one unit of work takes longer than a minute
        clock.now += 1
        bar.tick()
        if len(lines) > len(written_at):
            written_at.append(clock.now)
    assert written_at == [130.0, 160.0, 190.0]
    assert lines[0] == "head importance: 0% 0/3, elapsed 0:30, left ?"


def test_the_complete_line_is_written_once_and_close_adds_none_after_it():
    clock, lines = FakeClock(), []
    bar = PlainBar("weight change", 3, lines.append, pace=Pace(clock))
    for done in (1, 2, 3, 3):
        clock.now += 0.1
        bar.update(done)
    bar.close()
    assert lines == ["weight change: 100% 3/3, elapsed 0:00, left 0:00"]


def test_close_says_where_an_unfinished_bar_stopped():
    clock, lines = FakeClock(), []
    bar = PlainBar("fine-tuning", 10, lines.append, pace=Pace(clock))
    clock.now += 5
    bar.update(4)  # early stopping at step 4
    bar.close()
    assert lines == ["fine-tuning: 40% 4/10, elapsed 0:05, left 0:08"]


def test_progress_bar_writes_plain_lines_on_a_file_console():
    console, out = _file_console()
    clock = FakeClock()
    text = BarText(unit="steps", template="epoch {task.fields[epoch]:.2f}", fields={"epoch": 0.0})
    with progress_bar("fine-tuning", 4, True, text=text, console=console, clock=clock) as advance:
        for step in range(1, 5):
            clock.now += LINE_EVERY_S / 2
            advance(1, epoch=step / 4)
    assert out.getvalue().splitlines() == [
        "fine-tuning: 50% 2/4 steps, epoch 0.50, elapsed 0:15, left 0:15",
        "fine-tuning: 100% 4/4 steps, epoch 1.00, elapsed 0:30, left 0:00",
    ]
    assert "\x1b" not in out.getvalue()  # no terminal codes in a log


def test_stage_bars_write_one_plain_bar_per_stage_without_markup():
    console, out = _file_console()
    clock = FakeClock()
    with stage_bars(True, lambda s: f"[bold]ablations[/] ({s})", console=console, clock=clock) as on_progress:
        clock.now += 20
        on_progress("uniform", 1, 2)
        clock.now += 20
        on_progress("uniform", 2, 2)
        clock.now += 5
        on_progress("revert", 1, 4)  # stopped by an error, say: the context's end says where it was
    assert out.getvalue().splitlines() == [
        "ablations (uniform): 50% 1/2, elapsed 0:20, left 0:20",
        "ablations (uniform): 100% 2/2, elapsed 0:40, left 0:00",
        "ablations (revert): 25% 1/4, elapsed 0:05, left 0:15",
    ]


def test_off_prints_nothing(capsys):
    with progress_bar("x", 3, False) as advance, stage_bars(False) as on_progress:
        assert advance is None and on_progress is None
    assert capsys.readouterr() == ("", "")


@pytest.mark.parametrize("value, wanted", [(None, True), ("0", False), ("off", False), ("1", True), ("junk", True)])
def test_commands_report_progress_unless_the_environment_says_no(monkeypatch, value, wanted):
    if value is None:
        monkeypatch.delenv("BERTOLOGY_PROGRESS", raising=False)
    else:
        monkeypatch.setenv("BERTOLOGY_PROGRESS", value)
    assert command_progress() is wanted
