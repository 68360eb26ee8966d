"""``bertology ablate``: disable every head and layer of a fine-tuned classifier and measure the task.

Writes, under ``--out``: ``tables/ablation`` (intact, every head, every layer: accuracy / macro-F1 / loss
deltas with bootstrap 95% intervals and ``helps`` flags), ``tables/head_importance`` and
``tables/pruning_curve`` (Michel et al. 2019; unless ``--no-importance``), ``figures/*.svg``, ``report.html`` and
``manifest.json``. Finished ablations are kept in ``partial/``: after Ctrl-C or a kill, the same
command continues where it stopped; different settings in the same folder are refused unless
``--overwrite``. The work is :func:`bertology.study.ablate.ablate`; this module parses the flags and
prints the headlines.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from bertology.cli.app import app, console, user_errors
from bertology.cli.options import (
    DATA_FORMATS, DEVICE_OPT, DTYPE_OPT, LABEL_COL, PAIR_COL, TEXT_COL, TRUST_REMOTE_CODE_OPT, batch_size_option,
    importance_option, data_option, layers_option, max_examples_option, max_length_option, model_option, no_report_option,
    out_option, overwrite_option,
    seed_option,
)
from bertology.progress import parse_layer_list


@app.command("ablate")
@user_errors
def ablate_command(
    model: str = model_option(..., help="Fine-tuned classifier, regressor or QA model: local folder or hub id (needs a task head)."),
    data: str = data_option(help=f"A {DATA_FORMATS}; for a question-answering model a SQuAD v1.1/v2.0 JSON file."),
    text_column: Optional[str] = TEXT_COL,
    pair_column: Optional[str] = PAIR_COL,
    label_column: Optional[str] = LABEL_COL,
    mode: str = typer.Option("uniform", "--mode", help="How a head is disabled: uniform (attention 1/L, Kovaleva et al.), zero, or mean."),
    exclude_special: bool = typer.Option(False, "--exclude-special", help="Uniform mode: leave [CLS]/[SEP] out of the 1/L average."),
    layers: Optional[str] = layers_option(help="Comma list of layers (1-based) to ablate; default all."),
    layer_modes: str = typer.Option("skip,heads", "--layer-modes", help="Whole-layer ablations: skip (bypass the block), heads (all heads disabled), or none."),
    importance: bool = importance_option(),
    pruning_step: float = typer.Option(0.1, "--pruning-step", help="Fraction of all heads removed per pruning step."),
    recompute: bool = typer.Option(True, "--recompute/--no-recompute", help="Re-estimate importance after every pruning step (the paper's way)."),
    max_examples: int = max_examples_option(500, help="Seeded, label-stratified sample of this many examples (0 = all)."),
    max_length: int = max_length_option(128, help="Truncate inputs to this many tokens (counted in the manifest)."),
    batch_size: int = batch_size_option(32, min=1),
    bootstrap: int = typer.Option(1000, "--bootstrap", help="Bootstrap resamples of the examples for the 95% intervals (0 = none).", min=0),
    seed: int = seed_option(help="Seed of the sample, the bootstrap and the random pruning order."),
    device: str = DEVICE_OPT,
    dtype: str = DTYPE_OPT,
    out: Path = out_option(Path("runs/ablate"), help="Run folder (tables/, figures/, partial/, manifest.json)."),
    overwrite: bool = overwrite_option(),
    trust_remote_code: bool = TRUST_REMOTE_CODE_OPT,
    no_report: bool = no_report_option(),
    doc_stride: int = typer.Option(128, "--doc-stride", help="QA model: context tokens shared by consecutive windows of a long context.", min=0),
    max_answer_length: int = typer.Option(30, "--max-answer-length", help="QA model: the longest predicted answer, in tokens.", min=1),
    null_threshold: float = typer.Option(
        0.0, "--null-threshold", help="QA model, SQuAD v2.0 data: answer 'no answer' when the null score beats the best span's by more than this."),
) -> None:
    """Disable every head and layer of a fine-tuned classifier, regressor or tagger; report what the task loses (or gains)."""
    from bertology.study.ablate import QaOptions, ablate, parse_layer_modes
    from bertology.study.inputs import Columns, Loading

    settings = {
        "mode": mode, "exclude_special": exclude_special, "layers": parse_layer_list(layers, "layer numbers (1-based)"),
        "layer_modes": parse_layer_modes(layer_modes), "batch_size": batch_size, "n_bootstrap": bootstrap, "seed": seed,
        "device": device, "max_examples": max_examples or None, "max_length": max_length, "importance": importance,
        "pruning_step": pruning_step, "pruning_recompute": recompute,
    }
    run = ablate(model, data, settings, out=out, columns=Columns(text_column, pair_column, label_column),
                 qa=QaOptions(doc_stride, max_answer_length, null_threshold), loading=Loading(dtype, trust_remote_code),
                 overwrite=overwrite, report=not no_report, progress=True)
    console.print(run.summary, markup=False, highlight=False)
    console.print(f"tables: {run.out / 'tables'}", markup=False, highlight=False)
    if run.figures:
        console.print(f"figures: {run.out / 'figures'}", markup=False, highlight=False)
    if run.report is not None:
        console.print(f"figures: {escape(str(run.out / 'figures'))}")
        console.print(f"report: [bold]{escape(str(run.report))}[/]")
