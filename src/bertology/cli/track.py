"""``bertology track RUN``: analyses of every checkpoint of a fine-tuning run against its base model.

Reads a ``bertology finetune --save-every N`` run folder; writes ``tables/track_<analysis>.parquet``
and ``.csv`` (the analysis's columns plus ``model``, ``checkpoint``, ``step``), ``figures/track_<analysis>.svg``
(each metric over training steps) and one compare run per checkpoint under ``track/`` (reused when the
command is run again). The work is :func:`bertology.commands.track.track`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from bertology.cli.app import app, console, user_errors
from bertology.progress import command_progress
from bertology.cli.generated import given_settings, settings_command
from bertology.cli.options import base_option, data_option, overwrite_option


def track_settings() -> list:
    """The flags ``track`` generates: what is computed per checkpoint."""
    from bertology.settings import field_settings
    from bertology.commands.track import TrackSettings

    return [("track", field_settings(TrackSettings))]


@app.command("track", cls=settings_command(track_settings))
@user_errors
def track_command(
    ctx: typer.Context,
    run: Path = typer.Argument(..., help="A fine-tuning run folder (bertology finetune --save-every N --out RUN)."),
    data: Optional[str] = data_option(None, help="Corpus to compare on (default: the run's eval data, else its training data)."),
    base: Optional[str] = base_option(None, help="Base model (default: the model the run fine-tuned)."),
    overwrite: bool = overwrite_option(help="Recompute every checkpoint (default: reuse those already tracked with the same settings)."),
) -> None:
    """Run analyses for every checkpoint of a fine-tuning run and plot each metric over training steps.

    The flags below are generated from track's declared settings (checked by the library).
    """
    from bertology.commands.track import track

    result = track(run, data=data, base=base, overwrite=overwrite, progress=command_progress(), **given_settings(ctx))
    steps = ", ".join(f"{c.name}" for c in result.checkpoints)
    console.print(f"tracked {len(result.checkpoints)} checkpoints ({escape(str(steps))})" +
                  (f"; reused {len(result.reused)} finished" if result.reused else ""))
    for name, table in result.tables.items():
        typer.echo(f"tables/track_{name}.parquet: {len(table)} rows over steps {sorted(set(table['step']))}")
    for path in result.figures.values():
        typer.echo(f"figure: {path}")
