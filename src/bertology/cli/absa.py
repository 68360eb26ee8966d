"""``bertology absa``: the aspect-based sentiment study end to end (SemEval-2014 XML -> pairs -> fine-tune
-> aspect / opinion / other-aspect / no-op heads -> report). See :mod:`bertology.study.absa`."""
from __future__ import annotations

from typing import Optional

import typer
from rich.markup import escape

from bertology.cli.app import app, console, user_errors
from bertology.cli.options import (
    DEVICE_OPT, SPACY_MODEL_OPT, base_option, batch_size_option, epochs_option, lr_option, max_length_option,
    no_report_option, out_option, overwrite_option, seed_option, tuned_option,
)


@app.command("absa")
@user_errors
def absa_command(
    data: str = typer.Option(..., "--data", help="A SemEval-2014 Task 4 XML file (restaurants or laptops)."),
    out: str = out_option("runs/absa", help="Run folder: finetune/ (the tuned model) and study/ (tables, report.html)."),
    base: str = base_option(),
    tuned: Optional[str] = tuned_option(None, help="A model already fine-tuned on these pairs (skips fine-tuning)."),
    style: str = typer.Option("qa_m", "--style", help="Auxiliary sentence: qa_m, nli_m (categories) or term_qa_m, term_nli_m (terms; laptops)."),
    conflict: str = typer.Option("keep", "--conflict", help="keep or drop the items labelled conflict (counted either way)."),
    max_sentences: int = typer.Option(0, "--max-sentences", min=0, help="A seeded sample of this many sentences (0 = all)."),
    eval_fraction: float = typer.Option(0.2, "--eval-fraction", help="Share of the sentences held out (their pairs are analysed)."),
    analysis_pairs: int = typer.Option(0, "--analysis-pairs", min=0, help="Analyse at most this many held-out pairs (0 = all)."),
    epochs: float = epochs_option(1.0, help="Fine-tuning epochs."),
    batch_size: int = batch_size_option(32, min=1),
    learning_rate: float = lr_option(5e-5, help="Fine-tuning learning rate."),
    max_length: int = max_length_option(128, help="Truncate pairs to this many tokens (counted)."),
    seed: int = seed_option(),
    device: str = DEVICE_OPT,
    spacy_model: Optional[str] = SPACY_MODEL_OPT,
    opinions: bool = typer.Option(True, "--opinions/--no-opinions", help="Score the aspect_opinion relation (needs spaCy)."),
    view_examples: int = typer.Option(3, "--view-examples", min=0, help="Pairs shown in the report's attention viewer."),
    overwrite: bool = overwrite_option(),
    no_report: bool = no_report_option(),
) -> None:
    """Which heads fine-tuning created for aspect-based sentiment: pairs from SemEval-2014 XML, fine-tune, measure."""
    from bertology.study.absa import AbsaConfig, run_absa

    config = AbsaConfig(data=data, out=out, base=base, tuned=tuned, style=style, conflict=conflict,
                        max_sentences=max_sentences or None, eval_fraction=eval_fraction,
                        analysis_pairs=analysis_pairs or None, epochs=epochs, batch_size=batch_size,
                        learning_rate=learning_rate, max_length=max_length, seed=seed, device=device,
                        spacy_model=spacy_model, opinions=opinions, view_examples=view_examples, report=not no_report)
    run = run_absa(config, overwrite=overwrite, progress=True)
    held = run.counts["held_out"]
    if "accuracy" in run.metrics:
        console.print(f"held-out accuracy {run.metrics['accuracy']:.4f}, macro-F1 {run.metrics['macro_f1']:.4f} "
                      f"({held['n_pairs']} pairs of {held['n_sentences']} held-out sentences)")
    from bertology.analyses.absa_heads import top_heads

    best = top_heads(run.tables["absa_heads"], 1)
    for r in best.itertuples():
        typer.echo(f"{r.model:5s} {r.relation:14s} L{r.layer}H{r.head} {r.direction}: {r.accuracy:.3f} "
                   f"(best baseline {r.best_baseline:.3f}; n={r.n})")
    for w in run.warnings:
        console.print(f"[yellow]warning:[/] {escape(w)}")
    typer.echo(f"tables: {run.out / 'tables'}")
    if run.report is not None:
        typer.echo(f"report: {run.report}")
