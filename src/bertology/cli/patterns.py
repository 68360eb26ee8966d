"""``bertology patterns export`` / ``train``: label attention maps by hand, train a CNN on the labels.

``export`` writes thumbnails, ``maps.npz``, ``labels.csv`` (label column empty) and an ``index.html``
contact sheet for labelling; ``train`` cross-validates Kovaleva's small CNN on the labelled rows,
reports macro-F1 and the agreement with the rule classifier, and saves the model, which
``AttentionPatterns(classifier=PatternClassifier.load(DIR))`` can then use instead of the rules. The work
is :mod:`bertology.commands.patterns`; this module parses the flags and prints what was done.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from bertology.cli.app import app, console, user_errors
from bertology.cli.generated import given_settings, settings_command
from bertology.cli.options import (
    DATA_OPT, PAIR_COL, TEXT_COL, TRUST_REMOTE_CODE_OPT, model_option, out_option, overwrite_option,
)

patterns_app = typer.Typer(
    help="Kovaleva's attention pattern classes: export maps for hand labelling, train a CNN on the labels.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(patterns_app, name="patterns")


def export_settings() -> list:
    """The flags ``patterns export`` generates: which maps are exported."""
    from bertology.settings import field_settings
    from bertology.commands.patterns import ExportSettings

    return [("export", field_settings(ExportSettings))]


def train_settings() -> list:
    """The flags ``patterns train`` generates: the CNN's training settings."""
    from bertology.experiments.pattern_cnn import TrainSettings
    from bertology.settings import field_settings

    return [("training", field_settings(TrainSettings))]


@patterns_app.command("export", cls=settings_command(export_settings))
@user_errors
def export_command(
    ctx: typer.Context,
    data: str = DATA_OPT,
    out: Path = out_option(..., help="Folder for maps/, maps.npz, labels.csv, index.html, export.json."),
    model: str = model_option(),
    text_column: Optional[str] = TEXT_COL,
    pair_column: Optional[str] = PAIR_COL,
    overwrite: bool = overwrite_option(help="Replace an earlier export in a non-empty --out."),
    trust_remote_code: bool = TRUST_REMOTE_CODE_OPT,
) -> None:
    """Sample attention maps and write thumbnails plus a labels.csv for a person to label.

    The flags below are generated from the export's declared settings (checked by the library).
    """
    from bertology.commands.inputs import Columns, Loading
    from bertology.commands.patterns import ExportSettings, export_patterns

    settings = ExportSettings(**given_settings(ctx))
    run = export_patterns(model, data, settings, out=out, columns=Columns(text_column, pair_column),
                          loading=Loading(trust_remote_code=trust_remote_code), overwrite=overwrite)
    out, sample, counts = run.out, run.sample, run.counts
    console.print(f"exported {len(sample)} maps of {len(set(sample.example.tolist()))} examples to {escape(str(out))}")
    console.print("rule classifier: " + ", ".join(f"{p} {n}" for p, n in counts.items()), highlight=False)
    console.print(f"label them in {escape(str(out / 'index.html'))} (or the label column of {escape(str(out / 'labels.csv'))}), then run "
                  f"`bertology patterns train {escape(str(out / 'labels.csv'))}`", highlight=False)


@patterns_app.command("train", cls=settings_command(train_settings))
@user_errors
def train_command(
    ctx: typer.Context,
    labels: Path = typer.Argument(..., help="labels.csv from `patterns export`, with the label column filled in."),
    out: Optional[Path] = out_option(None, help="Folder for the model (default: cnn/ beside the CSV)."),
    folds: int = typer.Option(5, "--folds", help="Stratified cross-validation folds (fewer if a class has fewer maps)."),
    overwrite: bool = overwrite_option(help="Replace a model already saved in --out."),
) -> None:
    """Cross-validate a small CNN on the labelled maps, compare it with the rules, and save it.

    The training flags below are generated from its declared settings (checked by the library).
    """
    from bertology.experiments.pattern_cnn import TrainSettings
    from bertology.commands.patterns import train_patterns

    run = train_patterns(labels, TrainSettings(**given_settings(ctx)), out=out, folds=folds, overwrite=overwrite)
    report, folder = run.report, run.out
    console.print(f"{len(run.report.out_of_fold)} labelled maps ({run.n_skipped} rows with an empty label skipped)")
    console.print("labels: " + ", ".join(f"{c} {n}" for c, n in report.label_counts.items()), highlight=False)
    console.print("per-class F1 (out of fold): " + ", ".join(f"{c} {f:.3f}" for c, f in report.per_class_f1.items()),
                  highlight=False)
    console.print(f"macro-F1 over {report.folds} folds: {report.macro_f1:.3f} ± {report.macro_f1_std:.3f} "
                  f"(folds: {' '.join(f'{f:.3f}' for f in report.fold_macro_f1)})", highlight=False)
    agr = report.agreement
    for key, what in (("cnn_vs_labels", "CNN (out of fold) vs labels"), ("rules_vs_labels", "rule classifier vs labels"),
                      ("cnn_vs_rules", "CNN (out of fold) vs rule classifier")):
        console.print(f"{escape(str(what))}: Cohen's kappa {agr[key]['kappa']:.3f}, accuracy {agr[key]['accuracy']:.3f}",
                      highlight=False)
    console.print(_confusion_text(agr["cnn_vs_labels"], "labels", "CNN out of fold"), highlight=False, markup=False)
    console.print(_confusion_text(agr["rules_vs_labels"], "labels", "rules"), highlight=False, markup=False)
    console.print(f"model saved to {escape(str(folder))} (pattern_cnn.safetensors, pattern_cnn.json)", highlight=False)


def _confusion_text(agr: dict, rows: str, cols: str) -> str:
    """A plain-text confusion matrix (rows: ``rows``, columns: ``cols``)."""
    names = agr["labels"]
    short = {"vertical": "vert", "diagonal": "diag", "vertical+diagonal": "v+d", "block": "block", "heterogeneous": "het"}
    width = max(len(short.get(n, n)) for n in names) + 2
    head = f"confusion ({rows} down, {cols} across)\n" + " " * width + "".join(f"{short.get(n, n):>{width}}" for n in names)
    lines = [head]
    for n, row in zip(names, agr["confusion"]):
        lines.append(f"{short.get(n, n):<{width}}" + "".join(f"{v:>{width}}" for v in row))
    return "\n".join(lines)
