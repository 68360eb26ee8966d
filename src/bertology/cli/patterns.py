"""``bertology patterns export`` / ``train``: label attention maps by hand, train a CNN on the labels.

``export`` writes thumbnails, ``maps.npz``, ``labels.csv`` (label column empty) and an ``index.html``
contact sheet for labelling; ``train`` cross-validates Kovaleva's small CNN on the labelled rows,
reports macro-F1 and the agreement with the rule classifier, and saves the model, which
``AttentionPatterns(classifier=PatternClassifier.load(DIR))`` can then use instead of the rules. The work
is :mod:`bertology.study.patterns`; this module parses the flags and prints what was done.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from bertology.cli.app import app, console, user_errors
from bertology.cli.options import (
    DATA_OPT, DEVICE_OPT, PAIR_COL, TEXT_COL, TRUST_REMOTE_CODE_OPT, batch_size_option, epochs_option, lr_option,
    max_length_option, model_option, out_option, overwrite_option, seed_option,
)

patterns_app = typer.Typer(
    help="Kovaleva's attention pattern classes: export maps for hand labelling, train a CNN on the labels.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.add_typer(patterns_app, name="patterns")


@patterns_app.command("export")
@user_errors
def export_command(
    data: str = DATA_OPT,
    out: Path = out_option(..., help="Folder for maps/, maps.npz, labels.csv, index.html, export.json."),
    model: str = model_option(),
    examples: int = typer.Option(20, "--examples", help="How many examples to sample (seeded)."),
    heads: str = typer.Option("all", "--heads", help="'all' or comma-separated L<layer>H<head> / L<layer> (layers 1..N)."),
    limit: int = typer.Option(400, "--limit", help="At most this many maps (Kovaleva labelled ~400); sampled when more."),
    size: int = typer.Option(32, "--size", help="Side of the resized map images the CNN will see (multiple of 8)."),
    seed: int = seed_option(help="Seed for the choice of examples and maps."),
    max_length: int = max_length_option(128, help="Skip examples longer than this many tokens (counted)."),
    text_column: Optional[str] = TEXT_COL,
    pair_column: Optional[str] = PAIR_COL,
    batch_size: int = batch_size_option(16, help="Examples per forward pass."),
    device: str = DEVICE_OPT,
    overwrite: bool = overwrite_option(help="Replace an earlier export in a non-empty --out."),
    trust_remote_code: bool = TRUST_REMOTE_CODE_OPT,
) -> None:
    """Sample attention maps and write thumbnails plus a labels.csv for a person to label."""
    from bertology.study.inputs import Columns, Loading
    from bertology.study.patterns import ExportSettings, export_patterns

    settings = ExportSettings(examples=examples, heads=heads, limit=limit, size=size, seed=seed, max_length=max_length,
                              batch_size=batch_size, device=device)
    run = export_patterns(model, data, settings, out=out, columns=Columns(text_column, pair_column),
                          loading=Loading(trust_remote_code=trust_remote_code), overwrite=overwrite)
    out, sample, counts = run.out, run.sample, run.counts
    console.print(f"exported {len(sample)} maps of {len(set(sample.example.tolist()))} examples to {escape(str(out))}")
    console.print("rule classifier: " + ", ".join(f"{p} {n}" for p, n in counts.items()), highlight=False)
    console.print(f"label them in {escape(str(out / 'index.html'))} (or the label column of {escape(str(out / 'labels.csv'))}), then run "
                  f"`bertology patterns train {escape(str(out / 'labels.csv'))}`", highlight=False)


@patterns_app.command("train")
@user_errors
def train_command(
    labels: Path = typer.Argument(..., help="labels.csv from `patterns export`, with the label column filled in."),
    out: Optional[Path] = out_option(None, help="Folder for the model (default: cnn/ beside the CSV)."),
    folds: int = typer.Option(5, "--folds", help="Stratified cross-validation folds (fewer if a class has fewer maps)."),
    epochs: int = epochs_option(40, help="Training epochs per fit."),
    batch_size: int = batch_size_option(32, help="Maps per training step."),
    lr: float = lr_option(1e-3, help="Adam learning rate."),
    seed: int = seed_option(help="Seed for the folds, initialisation and shuffling."),
    overwrite: bool = overwrite_option(help="Replace a model already saved in --out."),
) -> None:
    """Cross-validate a small CNN on the labelled maps, compare it with the rules, and save it."""
    from bertology.experiments.pattern_cnn import TrainSettings
    from bertology.study.patterns import train_patterns

    run = train_patterns(labels, TrainSettings(epochs=epochs, batch_size=batch_size, lr=lr, seed=seed), out=out,
                         folds=folds, overwrite=overwrite)
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
