"""``bertology finetune``: train a sequence classifier and save it where ``compare --tuned`` can read it.

Writes, under ``--out``: ``model/`` (Hugging Face folder, safetensors), ``tables/finetune.parquet`` and
``.csv`` (``step, epoch, split, metric, value``), ``tables/finetune_predictions.parquet``/``.csv``
(held-out predictions) and ``manifest.json``.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from bertology.cli.app import app, console, user_errors
from bertology.config import DataConfig, FinetuneConfig

def _summary(metrics: dict, n_train, model_dir, wall, reused: bool = False) -> str:
    line = (
        f"held-out accuracy {metrics['accuracy']:.4f}, macro-F1 {metrics['macro_f1']:.4f} "
        f"(n={metrics.get('n_eval')}, {n_train} training examples"
    )
    line += ", reused the identical earlier run" if reused else f", {wall:.1f} s"
    return line + f"); model saved to {model_dir}"


@app.command("finetune")
@user_errors
def finetune_command(
    data: str = typer.Option(..., "--data", help="Training data: .txt/.csv/.tsv/.jsonl/.conllu path or hf:NAME[:CONFIG]:SPLIT."),
    model: str = typer.Option("minilm", "--model", help="Model to fine-tune: hub id, local folder, or built-in 'minilm'."),
    text_column: Optional[str] = typer.Option(None, "--text-column", help="Column with the (first) sentence."),
    pair_column: Optional[str] = typer.Option(None, "--pair-column", help="Column with the second sentence of a pair."),
    label_column: Optional[str] = typer.Option(None, "--label-column", help="Column with the label."),
    eval_data: Optional[str] = typer.Option(
        None, "--eval-data", help="Separate held-out data (same columns); default: a stratified split of --data."
    ),
    eval_fraction: float = typer.Option(0.2, "--eval-fraction", help="Held-out fraction of --data when no --eval-data."),
    max_examples: Optional[int] = typer.Option(
        None, "--max-examples", help="Use a seeded, label-stratified sample of this many training examples."
    ),
    max_length: int = typer.Option(128, "--max-length", help="Truncate inputs to this many tokens (counted in the manifest)."),
    epochs: float = typer.Option(2.0, "--epochs", help="Epochs (may be fractional)."),
    batch_size: int = typer.Option(32, "--batch-size", help="Training and evaluation batch size."),
    lr: float = typer.Option(5e-5, "--lr", help="Peak learning rate of AdamW."),
    weight_decay: float = typer.Option(0.01, "--weight-decay", help="AdamW weight decay (not on biases/LayerNorm)."),
    warmup_ratio: float = typer.Option(0.1, "--warmup-ratio", help="Fraction of steps with linear warm-up."),
    seed: int = typer.Option(0, "--seed", help="Seed for the split, head initialisation, shuffling and dropout."),
    device: str = typer.Option("cpu", "--device", help="cpu, cuda, cuda:N, or auto."),
    out: Path = typer.Option(Path("runs/finetune"), "--out", help="Run folder (model/, tables/, manifest.json)."),
    trust_remote_code: bool = typer.Option(False, "--trust-remote-code", help="Allow custom model code from the hub."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace a different run already in --out."),
) -> None:
    """Fine-tune a sequence classifier (single sentences or sentence pairs) and save it with its metrics."""
    from bertology.data.loaders import load_corpus
    from bertology.training.run import finetune_to_dir

    config = FinetuneConfig(
        model=model,
        data=DataConfig(
            path=data,
            text_column=text_column,
            pair_column=pair_column,
            label_column=label_column,
            max_examples=max_examples,
            max_length=max_length,
            overlong="truncate",
        ),
        out=str(out),
        eval_data=eval_data,
        eval_fraction=eval_fraction,
        epochs=epochs,
        batch_size=batch_size,
        learning_rate=lr,
        weight_decay=weight_decay,
        warmup_ratio=warmup_ratio,
        seed=seed,
        device=device,
        trust_remote_code=trust_remote_code,
    )
    columns = dict(text_column=text_column, pair_column=pair_column, label_column=label_column)
    train = load_corpus(data, **columns)
    evaluation = load_corpus(eval_data, **columns) if eval_data else None

    run = finetune_to_dir(config, train, evaluation, overwrite=overwrite, retrain=overwrite, progress=True)
    if run.reused:
        console.print(f"{run.out} already holds this exact run; reusing it (pass --overwrite to train again).")
    for w in run.warnings:
        console.print(f"[yellow]warning:[/] {w}", highlight=False)
    typer.echo(_summary(run.metrics, run.n_train, run.model_dir, run.wall_time_s, reused=run.reused))
