"""``bertology ablate``: disable every head and layer of a fine-tuned classifier and measure the task.

Writes, under ``--out``: ``tables/ablation`` (intact, every head, every layer: accuracy / macro-F1 / loss
deltas with bootstrap 95% intervals and ``helps`` flags), ``tables/head_importance`` and
``tables/pruning_curve`` (Michel et al. 2019; unless ``--no-importance``), ``figures/*.svg``, ``report.html`` and
``manifest.json``. Finished ablations are kept in ``partial/``: after Ctrl-C or a kill, the same
command continues where it stopped; different settings in the same folder are refused unless
``--overwrite``. The work is :func:`bertology.commands.ablate.ablate`; this module parses the flags and
prints the headlines.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from bertology.cli.app import app, console, user_errors
from bertology.progress import command_progress
from bertology.cli.generated import given_settings, settings_command
from bertology.cli.options import (
    DATA_FORMATS, LABEL_COL, PAIR_COL, TEXT_COL, base_option, data_option, model_option, no_report_option, out_option,
    overwrite_option,
)


def ablate_settings() -> list:
    """The flags ``ablate`` generates: the ablation's settings, the question-answering ones, how the model loads."""
    from bertology.experiments.ablation import AblationSettings
    from bertology.settings import field_settings
    from bertology.commands.ablate import QaOptions
    from bertology.commands.inputs import Loading

    return [("ablation", field_settings(AblationSettings)), ("question answering", field_settings(QaOptions)),
            ("loading", field_settings(Loading))]


@app.command("ablate", cls=settings_command(ablate_settings))
@user_errors
def ablate_command(
    ctx: typer.Context,
    model: str = model_option(..., help="Fine-tuned classifier, regressor or QA model: local folder or hub id (needs a task head)."),
    data: str = data_option(help=f"A {DATA_FORMATS}; for a question-answering model a SQuAD v1.1/v2.0 JSON file."),
    text_column: Optional[str] = TEXT_COL,
    pair_column: Optional[str] = PAIR_COL,
    label_column: Optional[str] = LABEL_COL,
    out: Path = out_option(Path("runs/ablate"), help="Run folder (tables/, figures/, partial/, manifest.json)."),
    overwrite: bool = overwrite_option(),
    no_report: bool = no_report_option(),
    base: Optional[str] = base_option(
        None, help="With --mode revert: the pretrained model the tuned one was fine-tuned from (hub id, local folder, or 'minilm')."),
) -> None:
    """Disable every head and layer of a fine-tuned classifier, regressor or tagger; report what the task loses (or gains).

    The ablation's flags below are generated from its declared settings (checked by the library).
    """
    from bertology.settings import field_settings
    from bertology.commands.ablate import QaOptions, ablate
    from bertology.commands.inputs import Columns, Loading

    settings = given_settings(ctx)
    qa = {s.name: settings.pop(s.name) for s in field_settings(QaOptions) if s.name in settings}
    loading = {s.name: settings.pop(s.name) for s in field_settings(Loading) if s.name in settings}
    run = ablate(model, data, settings, out=out, columns=Columns(text_column, pair_column, label_column),
                 qa=QaOptions(**qa), loading=Loading(**loading),
                 overwrite=overwrite, report=not no_report, progress=command_progress(), base=base)
    console.print(run.summary, markup=False, highlight=False)
    console.print(f"tables: {run.out / 'tables'}", markup=False, highlight=False)
    if run.figures:
        console.print(f"figures: {run.out / 'figures'}", markup=False, highlight=False)
    if run.report is not None:
        console.print(f"figures: {escape(str(run.out / 'figures'))}")
        console.print(f"report: [bold]{escape(str(run.report))}[/]")
