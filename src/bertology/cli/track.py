"""``bertology track RUN``: analyses of every checkpoint of a fine-tuning run against its base model.

Reads a ``bertology finetune --save-every N`` run folder; writes ``tables/track_<analysis>.parquet``
and ``.csv`` (the analysis's columns plus ``model``, ``checkpoint``, ``step``), ``figures/track_<analysis>.svg``
(each metric over training steps) and one compare run per checkpoint under ``track/`` (reused when the
command is run again).
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from bertology.cli.app import app, console, user_errors
from bertology.study.track import DEFAULT_ANALYSES


@app.command("track")
@user_errors
def track_command(
    run: Path = typer.Argument(..., help="A fine-tuning run folder (bertology finetune --save-every N --out RUN)."),
    analyses: str = typer.Option(",".join(DEFAULT_ANALYSES), "--analyses", help="Comma list of compare analyses to run per checkpoint."),
    data: Optional[str] = typer.Option(None, "--data", help="Corpus to compare on (default: the run's eval data, else its training data)."),
    base: Optional[str] = typer.Option(None, "--base", help="Base model (default: the model the run fine-tuned)."),
    max_examples: int = typer.Option(300, "--max-examples", help="Use the first N examples of the corpus (0 = all).", min=0),
    max_length: int = typer.Option(128, "--max-length", help="Skip examples longer than this many tokens (counted)."),
    batch_size: int = typer.Option(32, "--batch-size", min=1),
    seed: int = typer.Option(0, "--seed"),
    device: str = typer.Option("cpu", "--device"),
    final: bool = typer.Option(True, "--final/--no-final", help="Also the final model when it is not one of the checkpoints."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Recompute every checkpoint (default: reuse those already tracked with the same settings)."),
) -> None:
    """Run analyses for every checkpoint of a fine-tuning run and plot each metric over training steps."""
    from bertology.study.track import track

    names = tuple(a.strip() for a in analyses.split(",") if a.strip())
    result = track(
        run, analyses=names, data=data, base=base, max_examples=max_examples or None, max_length=max_length,
        batch_size=batch_size, seed=seed, device=device, include_final=final, overwrite=overwrite, progress=True,
    )
    steps = ", ".join(f"{c.name}" for c in result.checkpoints)
    console.print(f"tracked {len(result.checkpoints)} checkpoints ({steps})" +
                  (f"; reused {len(result.reused)} finished" if result.reused else ""))
    for name, table in result.tables.items():
        typer.echo(f"tables/track_{name}.parquet: {len(table)} rows over steps {sorted(set(table['step']))}")
    for path in result.figures.values():
        typer.echo(f"figure: {path}")
