"""``bertology probe``: structural probes (Hewitt & Manning 2019) on every layer of base, tuned and a
random-init control.

Writes, under ``--out``: ``tables/probe`` (``model, layer, probe, split, uuas, dspr, root_acc, nspr`` plus
``loss, n_sentences, rank, epochs, best_epoch, best_dev_loss``), ``figures/probe_distance.svg`` and
``figures/probe_depth.svg`` and ``manifest.json``. Word features and the training state are kept in
``partial/`` while the run lasts: after Ctrl-C or a kill, the same command continues where it
stopped (features are not recomputed, training resumes after the last finished epoch). Different
settings in the same folder are refused unless ``--overwrite``. The word features are held in
``--feature-dtype`` (float32 by default; float16 halves the disk and page cache) and read from those
memory-mapped files during training. The work is :func:`bertology.commands.probe.probe`; this module parses
the flags and prints the best layers.
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
    base_option, no_report_option, out_option, overwrite_option, tuned_option,
)


def probe_settings() -> list:
    """The flags ``probe`` generates: the probes' settings, how the tree files are read, the run's options and how
    the models load."""
    from bertology.experiments.probe import ProbeSettings
    from bertology.experiments.token_probe import TokenProbeSettings
    from bertology.settings import field_settings
    from bertology.commands.inputs import Loading
    from bertology.commands.probe import ProbeData, ProbeOptions

    return [("probes", field_settings(ProbeSettings)), ("token probes", field_settings(TokenProbeSettings)),
            ("data", field_settings(ProbeData)),
            ("options", field_settings(ProbeOptions)), ("loading", field_settings(Loading))]


@app.command("probe", cls=settings_command(probe_settings))
@user_errors
def probe_command(
    ctx: typer.Context,
    base: str = base_option(),
    tuned: Optional[str] = tuned_option(None, help="Fine-tuned model (a classifier's encoder is used)."),
    random_control: bool = typer.Option(False, "--random-control/--no-random-control",
                                        help="Also probe a model of the base's config with seeded random weights (named 'random')."),
    train: str = typer.Option(..., "--train", help="Training sentences: .conllu with gold trees, or text (.txt/.csv/...) parsed with spaCy."),
    dev: Optional[str] = typer.Option(None, "--dev", help="Dev sentences (early stopping); default: a seeded 10%% of --train."),
    test: str = typer.Option(..., "--test", help="Test sentences (the scores), same formats as --train."),
    out: Path = out_option(Path("runs/probe"), help="Run folder (tables/, figures/, partial/, manifest.json)."),
    overwrite: bool = overwrite_option(),
    no_report: bool = no_report_option(),
) -> None:
    """Structural probes (distance and depth) on every layer: how much syntax each model keeps.

    The probes' flags below are generated from their declared settings (checked by the library).
    """
    from bertology.experiments.token_probe import TokenProbeSettings
    from bertology.settings import field_settings
    from bertology.commands.inputs import Loading
    from bertology.commands.probe import ProbeData, ProbeModels, ProbeOptions, probe

    settings = given_settings(ctx)
    reading, options, loading, token = ({s.name: settings.pop(s.name) for s in field_settings(cls) if s.name in settings}
                                        for cls in (ProbeData, ProbeOptions, Loading, TokenProbeSettings))
    options = ProbeOptions(**options)
    run = probe(ProbeModels(base, tuned, random_control), ProbeData(train, test, dev, **reading), settings,
                conventions=options.conventions, out=out, loading=Loading(**loading), overwrite=overwrite,
                keep_features=options.keep_features, report=not no_report, progress=command_progress(), token=token)
    if (structural := run.tables.get("probe")) is not None:
        _print_summary(structural, run.tables.get("probe_baseline"))
    if (tokens := run.tables.get("token_probe")) is not None:
        from bertology.experiments.token_probe import summary_lines

        for line in summary_lines(tokens):
            console.print(escape(line), highlight=False)
    if (effect := run.tables.get("ablation")) is not None:
        from bertology.experiments.task_erasure import task_erasure_line

        line = task_erasure_line(effect, run.manifest.get("token_probe", {}).get("task_erasure", {}).get("concept", ""))
        if line:
            console.print(escape(line), highlight=False)
    if run.out is not None:
        console.print(f"tables: {escape(str(run.out / 'tables'))}")
        if run.figures:
            console.print(f"figures: {escape(str(run.out / 'figures'))}")
    for warning in run.manifest.get("warnings", []):
        console.print(f"[yellow]warning:[/] {escape(warning)}", highlight=False)
    if run.report is not None:
        console.print(f"report: [bold]{escape(str(run.report))}[/]")


def _print_summary(table, baselines=None) -> None:
    from bertology.experiments.probe import chain_line

    t = table[table["split"] == "test"]
    for model, part in t.groupby("model", sort=False):
        bits = []
        for probe, metrics in (("distance", ("uuas", "dspr")), ("depth", ("root_acc", "nspr"))):
            sub = part[part["probe"] == probe]
            if sub.empty:
                continue
            for m in metrics:
                best = sub.loc[sub[m].idxmax()] if sub[m].notna().any() else None
                if best is not None:
                    bits.append(f"{m} {best[m]:.3f} (L{int(best['layer'])})")
        console.print(f"{escape(str(model))}: best test " + ", ".join(bits), highlight=False)
    if (chain := chain_line(baselines)) is not None:
        console.print(escape(chain), highlight=False)
