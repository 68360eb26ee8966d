"""``bertology finetune``: train a sequence classifier and save it where ``compare --tuned`` can read it.

Writes, under ``--out``: ``model/`` (Hugging Face folder, safetensors), ``tables/finetune.parquet`` and
``.csv`` (``step, epoch, split, metric, value``), ``tables/finetune_predictions.parquet``/``.csv``
(held-out predictions) and ``manifest.json``.
"""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Optional

import typer

from bertology.cli.app import app, console, user_errors
from bertology.config import DataConfig, FinetuneConfig

KIND = "finetune"


def run_fingerprint(config: FinetuneConfig, train, evaluation=None) -> str:
    """Identity of a run: every setting that changes the numbers (not ``out``), the data and the base weights.

    Equal fingerprints mean the run in ``--out`` can be reused instead of trained again.
    """
    from bertology.models.loading import resolve_model, weights_fingerprint

    d = config.to_dict()
    d.pop("out", None)
    source, where = resolve_model(config.model)
    weights = weights_fingerprint(where) if source != "hub" else None
    parts = [d, train.fingerprint(), evaluation.fingerprint() if evaluation is not None else None, weights or where]
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _device_info(device: str) -> dict:
    import torch

    info = {"requested": device, "cuda_available": torch.cuda.is_available(), "torch_threads": torch.get_num_threads()}
    if torch.cuda.is_available():
        info["cuda_device"] = torch.cuda.get_device_name(0)
    return info


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
    from bertology.models.loading import weights_fingerprint
    from bertology.results import RunDirectory, now_iso, package_versions, write_table
    from bertology.training.finetune import finetune

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

    run_dir = RunDirectory(out)
    fingerprint = run_fingerprint(config, train, evaluation)
    identical = run_dir.prepare(KIND, fingerprint, overwrite=overwrite)
    if identical and not overwrite:
        old = run_dir.read_manifest() or {}
        model_dir = run_dir.path / "model"
        if (model_dir / "config.json").exists() and run_dir.has_table(KIND) and old.get("metrics"):
            console.print(f"{run_dir.path} already holds this exact run; reusing it (pass --overwrite to train again).")
            typer.echo(_summary(old["metrics"], old.get("result", {}).get("n_train"), model_dir, 0.0, reused=True))
            return

    result = finetune(config, train, evaluation, progress=True)
    write_table(run_dir.path, KIND, result.table)
    tables = [KIND]
    if result.predictions is not None:
        write_table(run_dir.path, "finetune_predictions", result.predictions)
        tables.append("finetune_predictions")

    details = result.describe()
    tokenisation = details.get("tokenisation", {})
    warnings = [
        f"{enc['n_truncated']} of {enc['n_input']} {split} examples were truncated to {enc['max_length']} tokens."
        for split, enc in tokenisation.items()
        if enc.get("n_truncated")
    ]
    manifest = {
        "kind": KIND,
        "fingerprint": fingerprint,
        "bertology_version": package_versions().get("bertology"),
        "created": now_iso(),
        "command": " ".join(sys.argv) if sys.argv else None,
        "config": config.to_dict(),
        "seed": seed,
        "device": _device_info(device),
        "dtype": "float32",
        "attn_implementation": "eager",
        "packages": package_versions(),
        "models": {
            "base": details.pop("base_model", None),
            "tuned": {"path": str(result.model_dir), "weights_sha256": weights_fingerprint(result.model_dir)},
        },
        "data": {"train": train.describe(), "eval": evaluation.describe() if evaluation is not None else None},
        "result": details,
        "metrics": result.metrics,
        "tables": tables,
        "warnings": warnings,
        "wall_time_s": round(result.wall_time_s, 3),
    }
    run_dir.write_manifest(manifest)
    for w in warnings:
        console.print(f"[yellow]warning:[/] {w}", highlight=False)
    typer.echo(_summary(result.metrics, result.n_train, result.model_dir, result.wall_time_s))
