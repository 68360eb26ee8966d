"""``bertology absa``: the aspect-based sentiment study end to end (SemEval-2014 XML -> pairs -> fine-tune
-> aspect / opinion / other-aspect / no-op heads -> report). See :mod:`bertology.commands.absa`."""
from __future__ import annotations

from typing import Optional

import typer
from rich.markup import escape

from bertology.cli.app import app, console, user_errors
from bertology.progress import command_progress
from bertology.cli.generated import given_settings, settings_command
from bertology.cli.options import base_option, no_report_option, out_option, overwrite_option, tuned_option


def absa_settings() -> list:
    """The flags ``absa`` generates: the study's settings."""
    from bertology.settings import field_settings
    from bertology.commands.absa import AbsaConfig

    return [("absa", field_settings(AbsaConfig))]


@app.command("absa", cls=settings_command(absa_settings))
@user_errors
def absa_command(
    ctx: typer.Context,
    data: str = typer.Option(..., "--data", help="A SemEval-2014 Task 4 XML file (restaurants or laptops)."),
    out: str = out_option("runs/absa", help="Run folder: finetune/ (the tuned model) and study/ (tables, report.html)."),
    base: str = base_option(),
    tuned: Optional[str] = tuned_option(None, help="A model already fine-tuned on these pairs (skips fine-tuning)."),
    overwrite: bool = overwrite_option(),
    no_report: bool = no_report_option(),
) -> None:
    """Which heads fine-tuning created for aspect-based sentiment: pairs from SemEval-2014 XML, fine-tune, measure.

    The study's flags below are generated from its declared settings (checked by the library).
    """
    from bertology.commands.absa import AbsaConfig, run_absa

    config = AbsaConfig(data=data, out=out, base=base, tuned=tuned, report=not no_report, **given_settings(ctx))
    run = run_absa(config, overwrite=overwrite, progress=command_progress())
    held = run.counts["held_out"]
    if "accuracy" in run.metrics:
        console.print(f"held-out accuracy {run.metrics['accuracy']:.4f}, macro-F1 {run.metrics['macro_f1']:.4f} "
                      f"({held['n_pairs']} pairs of {held['n_sentences']} held-out sentences)")
    from bertology.analyses.absa_heads import top_heads

    heads = run.tables["absa_heads"]  # with --attention-measures: one block of rows per measure, each shown
    for measure, table in (heads.groupby("measure", sort=False) if "measure" in heads else [("", heads)]):
        for r in top_heads(table, 1).itertuples():
            unit = f"L{r.layer}" if r.head < 0 else f"L{r.layer}H{r.head}"  # a per-layer measure's head is -1
            typer.echo(f"{measure + ' ' if measure else ''}{r.model:5s} {r.relation:14s} {unit} {r.direction}: "
                       f"{r.accuracy:.3f} (best baseline {r.best_baseline:.3f}; n={r.n})")
    for w in run.warnings:
        console.print(f"[yellow]warning:[/] {escape(w)}")
    typer.echo(f"tables: {run.out / 'tables'}")
    if run.report is not None:
        typer.echo(f"report: {run.report}")
