"""``compare``, ``demo``, ``report`` and ``env``: parse flags into config, call the API, print a summary."""
from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.markup import escape

from bertology.cli.app import app, console, user_errors
from bertology.progress import command_progress
from bertology.cli.generated import given_settings, settings_command
from bertology.cli.options import (
    DATA_OPT, epochs_option, no_report_option, out_option, overwrite_option, seed_option, tuned_option,
)
from bertology.config import CompareConfig, DataConfig
from bertology.errors import BertologyError
from bertology.settings import Setting, field_settings


def compare_settings() -> list[tuple[str, tuple[Setting, ...]]]:
    """The flags ``compare`` generates: the run's, the data's, then each analysis's and experiment's (catalog order)."""
    from bertology.commands.selection import declared_settings

    declared, owners = declared_settings()
    groups: dict[str, list[Setting]] = {}
    for name, s in declared.items():
        groups.setdefault(owners[name], []).append(s)
    return [("run", field_settings(CompareConfig)), ("data", field_settings(DataConfig)),
            *((owner, tuple(group)) for owner, group in groups.items())]


@app.command("compare", cls=settings_command(compare_settings))
@user_errors
def compare_command(
    ctx: typer.Context,
    tuned: list[str] = tuned_option(
        ..., help="Fine-tuned model: hub id, local folder, or 'minilm'. Repeat as --tuned NAME=PATH (NAME may be task/sN, "
                  "e.g. sst2/s0) to compare several with one base in one run (docs: studies).",
        metavar="PATH|NAME=PATH"),
    data: str = DATA_OPT,
    out: Path = out_option(Path("runs/compare"), help="Run directory to write."),
    overwrite: bool = overwrite_option(),
    no_report: bool = no_report_option(help="Write tables only."),
) -> None:
    """Compare a base and a fine-tuned model on a corpus: tables, figures and an HTML report.

    Every analysis's settings are flags below, grouped by analysis (generated from their declarations).
    """
    from bertology.commands.compare import compare
    from bertology.commands.selection import make_config

    many = len(tuned) > 1 or any("=" in t and not Path(t).expanduser().exists() for t in tuned)
    config = make_config(data, tuned="" if many else tuned[0], out=str(out), **given_settings(ctx))
    if many:
        from bertology.multicompare import compare_many, parse_tuned

        _print_many_summary(compare_many(config, parse_tuned(tuned), overwrite=overwrite, progress=command_progress(),
                                         report=not no_report))
        return
    run = compare(config, overwrite=overwrite, progress=command_progress(), report=not no_report)
    _print_compare_summary(run)


def _print_many_summary(run) -> None:
    """Per pair: its warnings and where its run is; then the combined tables and the index page."""
    if run.skipped:
        console.print(f"resumed: pairs {', '.join(run.skipped)} were finished in {run.out} and were not run again",
                      markup=False, highlight=False)
    from bertology.api import summary_blocks

    for name, pair in run.pairs.items():
        console.print(f"[bold]{escape(name)}[/]: {escape(str(pair.out))}")
        for w in pair.manifest.get("warnings", []):
            console.print("[yellow]warning:[/] ", end="")
            console.print(w, markup=False, highlight=False)
        tables = {n: res.table for n, res in pair.results.items()}
        _print_blocks(summary_blocks(pair.manifest["config"]["analyses"], tables, experiments=False))
    console.print(f"tables (every pair, with tuned/task/seed columns): {escape(str(run.out / 'tables'))}")
    if run.report:
        console.print(f"report: [bold]{escape(str(run.report))}[/]")


def _print_compare_summary(run) -> None:
    """Warnings, then each analysis's and experiment's own summary lines, then where things were written."""
    from bertology.api import summary_blocks

    if run.resumed:
        console.print(f"resumed: reused {', '.join(run.resumed)} from {run.out}", markup=False, highlight=False)
    for w in run.manifest.get("warnings", []):
        console.print("[yellow]warning:[/] ", end="")
        console.print(w, markup=False, highlight=False)
    tables = {name: res.table for name, res in run.results.items()}
    _print_blocks(summary_blocks(run.manifest["config"]["analyses"], tables))
    console.print(f"tables: {escape(str(run.out / 'tables'))}")
    if run.report:
        console.print(f"report: [bold]{escape(str(run.report))}[/]")


def _print_blocks(blocks: list[tuple[str | None, str]]) -> None:
    """Summary blocks (:func:`bertology.api.summary_blocks`), each under its heading when it has one (printed as
    plain text: tables hold labels like [CLS] that are not markup)."""
    for heading, text in blocks:
        if heading:
            console.print(f"[bold]{escape(str(heading))}[/]")
        console.print(text, markup=False, highlight=False)


@app.command("report")
@user_errors
def report_command(run_dir: Path = typer.Argument(..., help="A run directory written by bertology.")) -> None:
    """Re-render report.html from a run directory's tables."""
    from bertology.report.rerender import rerender

    problems: list[str] = []
    try:
        path = rerender(run_dir, problems)
    finally:  # the warnings first, also when some tables could not be read (then the error follows)
        for w in problems:
            console.print("[yellow]warning:[/] ", end="")
            console.print(w, markup=False, highlight=False, soft_wrap=True)
    console.print(f"report: [bold]{escape(str(path))}[/]")


@app.command("env")
@user_errors
def env_command(as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Show versions, devices and where the offline assets are."""
    import torch

    from bertology.assets import cache_dir, polarity_path, spacy_model_name
    from bertology.models.loading import builtin_model_path
    from bertology.results import package_versions

    try:
        minilm = str(builtin_model_path("minilm"))
    except BertologyError as err:
        minilm = f"missing ({err})"
    info = {
        "packages": package_versions(),
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.is_available(),
        "mps": bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()),
        "builtin_model_minilm": minilm,
        "spacy_model": spacy_model_name() or "none installed",
        "cache_dir": str(cache_dir()),
        "demo_data": str(polarity_path()) + ("" if polarity_path().exists() else " (not fetched yet)"),
    }
    if as_json:
        typer.echo(json.dumps(info, indent=2))
        return
    for key, value in info.items():
        if isinstance(value, dict):
            value = ", ".join(f"{k} {v}" for k, v in value.items())
        console.print(f"[bold]{escape(str(key))}[/]: {escape(str(value))}", highlight=False)


@app.command("demo")
@user_errors
def demo_command(
    out: Path = out_option(Path("runs/demo"), help="Run directory; the fine-tuned model is cached in OUT-model."),
    full: bool = typer.Option(
        False, "--full", help="The full demo: fine-tune on the whole training split, and run the ablation, revert and "
        "transplant sweeps and head importance on 500 held-out sentences (tens of minutes on a CPU). Without it: a "
        "smaller fine-tune and short sweeps on a small stratified sample, no head importance (minutes)."),
    epochs: float = epochs_option(1.0, help="Fine-tuning epochs (1 keeps the demo within minutes on a CPU)."),
    compare_examples: int = typer.Option(500, "--compare-examples", help="Held-out sentences to compare base and tuned on."),
    seed: int = seed_option(),
    overwrite: bool = overwrite_option(),
) -> None:
    """Fine-tune minilm on sentence polarity, compare it with the base model, and write the report."""
    from bertology.demo import SEED_NOTE, run_demo, sample_note

    result = run_demo(out, full=full, epochs=epochs, compare_examples=compare_examples, seed=seed,
                      progress=command_progress(), overwrite=overwrite)
    if result.reused_model:
        console.print(f"reused the fine-tuned model in {escape(str(result.model_dir))}")
    _print_compare_summary(result.run)
    m = result.heldout_metrics
    typer.echo(f"held-out accuracy: {m.get('accuracy', float('nan')):.4f} (macro-F1 {m.get('macro_f1', float('nan')):.4f}, n={m.get('n_eval', '?')})")
    summary = result.run.manifest.get("summary", {})
    typer.echo(f"demo ({result.plan.name}): {sample_note(result.plan, summary.get('compared_examples', compare_examples))}")
    typer.echo(SEED_NOTE)
    paths = result.paths
    typer.echo(f"the demo's split, to try the other commands on: {paths.train}, {paths.heldout} (README: quickstart)")
    typer.echo(f"report: {result.run.report}")
