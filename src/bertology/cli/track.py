"""``bertology track RUN``: analyses of every checkpoint of a fine-tuning run against its base model.

Reads a ``bertology finetune --save-every N`` run folder; writes ``tables/track_<analysis>.parquet``
and ``.csv`` (the analysis's columns plus ``model``, ``checkpoint``, ``step``), ``figures/track_<analysis>.svg``
(each metric over training steps) and one compare run per checkpoint under ``track/`` (reused when the
command is run again). The work is :func:`bertology.study.track.track`.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from bertology.cli.app import app, console, user_errors
from bertology.cli.options import (
    DEVICE_OPT, analyses_option, base_option, batch_size_option, data_option, max_examples_option, max_length_option,
    overwrite_option, seed_option,
)
from bertology.study.track import DEFAULT_ANALYSES


@app.command("track")
@user_errors
def track_command(
    run: Path = typer.Argument(..., help="A fine-tuning run folder (bertology finetune --save-every N --out RUN)."),
    analyses: str = analyses_option(",".join(DEFAULT_ANALYSES), help="Comma list of compare analyses to run per checkpoint."),
    data: Optional[str] = data_option(None, help="Corpus to compare on (default: the run's eval data, else its training data)."),
    base: Optional[str] = base_option(None, help="Base model (default: the model the run fine-tuned)."),
    max_examples: int = max_examples_option(300, help="Use the first N examples of the corpus (0 = all).", min=0),
    max_length: int = max_length_option(128, help="Skip examples longer than this many tokens (counted)."),
    batch_size: int = batch_size_option(32, min=1),
    seed: int = seed_option(),
    device: str = DEVICE_OPT,
    final: bool = typer.Option(True, "--final/--no-final", help="Also the final model when it is not one of the checkpoints."),
    overwrite: bool = overwrite_option(help="Recompute every checkpoint (default: reuse those already tracked with the same settings)."),
) -> None:
    """Run analyses for every checkpoint of a fine-tuning run and plot each metric over training steps."""
    from bertology.study.track import TrackSettings, track

    settings = TrackSettings(analyses=tuple(a.strip() for a in analyses.split(",") if a.strip()),
                             max_examples=max_examples or None, max_length=max_length, batch_size=batch_size, seed=seed,
                             device=device, include_final=final)
    result = track(run, settings, data=data, base=base, overwrite=overwrite, progress=True)
    steps = ", ".join(f"{c.name}" for c in result.checkpoints)
    console.print(f"tracked {len(result.checkpoints)} checkpoints ({escape(str(steps))})" +
                  (f"; reused {len(result.reused)} finished" if result.reused else ""))
    for name, table in result.tables.items():
        typer.echo(f"tables/track_{name}.parquet: {len(table)} rows over steps {sorted(set(table['step']))}")
    for path in result.figures.values():
        typer.echo(f"figure: {path}")
