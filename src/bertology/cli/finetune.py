"""``bertology finetune``: the fine-tuning lab. Train a sequence classifier (or a SimCSE sentence encoder)
and save it where ``compare --tuned`` can read it.

Writes, under ``--out``: ``model/`` (Hugging Face folder, safetensors), ``tables/finetune.parquet`` and
``.csv`` (``step, epoch, split, metric, value, slice``), ``tables/finetune_predictions.parquet``/``.csv``
(held-out predictions; classification), ``tables/anisotropy`` (contrastive), ``checkpoints/step-N/``
(with ``--save-every``) and ``manifest.json``. Experiments: ``--drop-layers``, ``--freeze-layers``,
``--freeze-embeddings``, ``--exclude-words``, ``--objective contrastive``. An interrupted run with
``--save-every`` continues from its latest checkpoint when the same command is run again.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from bertology.cli.app import app, console, user_errors
from bertology.cli.options import (
    DATA_FORMATS, DEVICE_OPT, DTYPE_OPT, LABEL_COL, PAIR_COL, TEXT_COL, TRUST_REMOTE_CODE_OPT, batch_size_option, data_option,
    epochs_option, lr_option, max_examples_option, max_length_option, model_option, out_option, overwrite_option,
    no_report_option, seed_option,
)
from bertology.config import DataConfig, FinetuneConfig
from bertology.errors import BertologyError


def _summary(metrics: dict, n_train, model_dir, wall, reused: bool = False) -> str:
    if "accuracy" in metrics and "macro_f1" not in metrics:  # a tagger: word accuracy (+ entity F1 for BIO tags)
        entity = f", entity F1 {metrics['entity_f1']:.4f}" if "entity_f1" in metrics else ""
        line = (f"held-out word accuracy {metrics['accuracy']:.4f}{entity} "
                f"(n={metrics.get('n_eval')} sentences, {n_train} training sentences")
    elif "accuracy" in metrics:
        line = (
            f"held-out accuracy {metrics['accuracy']:.4f}, macro-F1 {metrics['macro_f1']:.4f} "
            f"(n={metrics.get('n_eval')}, {n_train} training examples"
        )
    elif "exact_match" in metrics:  # extractive QA
        line = (
            f"held-out F1 {metrics['f1']:.4f}, exact match {metrics['exact_match']:.4f} "
            f"(n={metrics.get('n_eval')} questions, {n_train} training questions"
        )
    elif "uas" in metrics:  # dependency parsing
        line = (
            f"held-out UAS {metrics['uas']:.4f}, LAS {metrics['las']:.4f} (punctuation excluded; "
            f"n={metrics.get('n_eval')} sentences, {n_train} training sentences"
        )
    elif "pearson" in metrics:  # regression
        line = (
            f"held-out Pearson {metrics['pearson']:.4f}, Spearman {metrics['spearman']:.4f}, MSE {metrics['mse']:.4f} "
            f"(n={metrics.get('n_eval')}, {n_train} training examples"
        )
    else:  # contrastive: STS Spearman when STS data was given, else the held-out contrastive loss
        shown = ", ".join(f"{k} {v:.4f}" for k, v in metrics.items() if isinstance(v, float))
        line = f"{shown} ({n_train} training examples"
    line += ", reused the identical earlier run" if reused else f", {wall:.1f} s"
    return line + f"); model saved to {model_dir}"


def _details(manifest: dict) -> list[str]:
    """Extra summary lines: slices, dropped examples, removed/frozen layers, early stopping, resumption."""
    s = manifest.get("summary") or {}
    lines = []
    ci = s.get("intervals") or {}
    shown = [(m, ci[m]) for m in ("accuracy", "macro_f1", "entity_f1", "f1", "exact_match", "uas", "las", "pearson",
                                   "spearman", "mse") if m in ci]
    if shown:
        lines.append(f"95% bootstrap intervals (resampling the {ci['n_eval']} held-out {ci['unit']}): "
                     + ", ".join(f"{m} [{lo:.4f}, {hi:.4f}]" for m, (lo, hi) in shown))
    if s.get("excluded_words"):
        ex = s["excluded_words"]
        lines.append(f"dropped {ex['n_dropped']} of {ex['n_before']} training examples mentioning {', '.join(ex['words'])}")
    for name, m in (s.get("slices") or {}).items():
        main = next(k for k in ("accuracy", "uas", "pearson") if k in m)
        lines.append(f"  slice {name}: {main} {m[main]:.4f} (n={m['n_eval']})")
    if s.get("layers"):
        lines.append(f"removed layer(s) {', '.join(map(str, s['layers']['dropped']))}; {s['layers']['remaining']} remain")
    if s.get("frozen"):
        f = s["frozen"]
        lines.append(f"frozen: {f['layers']} bottom layer(s){' + embeddings' if f['embeddings'] else ''} "
                     f"({f['parameters']['frozen']:,} of {f['parameters']['total']:,} parameters)")
    es = s.get("early_stopping")
    if es and es.get("stopped_early"):
        lines.append(f"early stopping: best {es['metric']} at step {es['best_step']} (weights restored)")
    if s.get("resumed_from_step") is not None:
        lines.append(f"resumed from the checkpoint at step {s['resumed_from_step']}")
    if s.get("train_time_s") is not None:
        lines.append(f"training time {s['train_time_s']:.1f} s over {s.get('steps')} steps; wall time {s['wall_time_s']:.1f} s")
    return lines


def parse_layers(text: str | None, flag: str = "--drop-layers") -> tuple[int, ...]:
    """``"11,12"`` -> ``(11, 12)``; empty/None -> ``()``."""
    if text is None or not text.strip():
        return ()
    try:
        return tuple(sorted({int(x) for x in text.replace(" ", "").split(",") if x}))
    except ValueError:
        raise BertologyError(f"{flag} takes a comma list of layer numbers (1-based), not {text!r}.") from None


@app.command("finetune")
@user_errors
def finetune_command(
    data: str = data_option(help=f"Training data: a {DATA_FORMATS}; with --task qa a SQuAD v1.1/v2.0 JSON file."),
    model: str = model_option(help="Model to fine-tune: hub id, local folder, or built-in 'minilm'."),
    text_column: Optional[str] = TEXT_COL,
    pair_column: Optional[str] = PAIR_COL,
    label_column: Optional[str] = LABEL_COL,
    eval_data: Optional[str] = typer.Option(
        None, "--eval-data", help="Separate held-out data (same columns); default: a stratified split of --data."
    ),
    eval_fraction: float = typer.Option(0.2, "--eval-fraction", help="Held-out fraction of --data when no --eval-data."),
    max_examples: Optional[int] = max_examples_option(
        None, help="Use a seeded, label-stratified sample of this many training examples."
    ),
    max_length: int = max_length_option(128, help="Truncate inputs to this many tokens (counted in the manifest)."),
    epochs: float = epochs_option(2.0, help="Epochs (may be fractional)."),
    batch_size: int = batch_size_option(32, help="Training and evaluation batch size."),
    lr: float = lr_option(5e-5, help="Peak learning rate of AdamW."),
    weight_decay: float = typer.Option(0.01, "--weight-decay", help="AdamW weight decay (not on biases/LayerNorm)."),
    warmup_ratio: float = typer.Option(0.1, "--warmup-ratio", help="Fraction of steps with linear warm-up."),
    seed: int = seed_option(help="Seed for the split, head initialisation, shuffling and dropout."),
    device: str = DEVICE_OPT,
    dtype: str = typer.Option(
        "float32", "--dtype",
        help="float32, or mixed precision: the training forward under autocast in bfloat16 or float16 (with a loss scaler); weights stay float32."),
    out: Path = out_option(Path("runs/finetune"), help="Run folder (model/, tables/, manifest.json)."),
    trust_remote_code: bool = TRUST_REMOTE_CODE_OPT,
    overwrite: bool = overwrite_option(help="Replace a different run already in --out (or retrain this one from scratch)."),
    drop_layers: Optional[str] = typer.Option(None, "--drop-layers", help="Remove these transformer layers (comma list, 1-based) before training."),
    freeze_layers: int = typer.Option(0, "--freeze-layers", help="Freeze the bottom K transformer layers.", min=0),
    freeze_embeddings: bool = typer.Option(False, "--freeze-embeddings", help="Freeze the embedding layer."),
    exclude_words: Optional[str] = typer.Option(
        None, "--exclude-words",
        help="Drop training examples containing any of these words (comma list or @FILE; whole word, case-insensitive, "
             "either text of a pair); eval is also reported on the slices with / without them.",
    ),
    eval_slices: Optional[str] = typer.Option(
        None, "--eval-slices",
        help="Also report eval on the examples with / without these words (comma list or @FILE), dropping nothing "
             "(the control of an --exclude-words run; default: the excluded words).",
    ),
    objective: str = typer.Option(
        "supervised", "--objective",
        help="supervised (a head for --task; the old name 'classification' means the same), or contrastive (SimCSE; "
             "saves an encoder without a head)."),
    task: str = typer.Option(
        "auto", "--task",
        help="The head's task: classification, regression (one output, MSE; Pearson/Spearman), tagging (one tag per "
             "word on its first piece; accuracy, and entity F1 for BIO tags), qa (extractive question answering on "
             "SQuAD v1.1/v2.0 JSON; F1 / exact match), parsing (a biaffine dependency parser on a CoNLL-U file's trees; "
             "UAS/LAS without punctuation), or auto (regression for numeric labels with decimals or more than 20 "
             "values, e.g. GLUE STS-B's score; tagging for data with word tags and no sentence labels: a .conllu or a "
             ".conll/.bio/.iob tag file).",
    ),
    tag_column: str = typer.Option(
        "upos", "--tag-column",
        help="Tagging on CoNLL-U: learn the upos or xpos column. (A .conll/.bio/.iob tag file brings its own tags: "
             "the last column, or the 0-based column given by --label-column.)",
    ),
    doc_stride: int = typer.Option(128, "--doc-stride", help="QA: context tokens shared by consecutive windows of a long context.", min=0),
    max_answer_length: int = typer.Option(30, "--max-answer-length", help="QA: the longest predicted answer, in tokens.", min=1),
    null_threshold: float = typer.Option(
        0.0, "--null-threshold", help="QA, SQuAD v2.0: answer 'no answer' when the null score beats the best span's by more than this."),
    qa_split: str = typer.Option("article", "--qa-split", help="QA without --eval-data: hold out whole articles (article) or questions (question)."),
    contrastive: str = typer.Option(
        "auto", "--contrastive",
        help="Contrastive flavour: unsupervised (same sentence twice, dropout positives), supervised (NLI pairs: "
             "entailment positive, contradiction hard negative), or auto (supervised when the data has pairs and labels).",
    ),
    temperature: float = typer.Option(0.05, "--temperature", help="Contrastive: temperature of the cosine similarities."),
    pooling: str = typer.Option("cls", "--pooling", help="Contrastive: sentence embedding = cls token or mean of tokens."),
    sts_data: Optional[str] = typer.Option(None, "--sts-data", help="Contrastive: STS-B-format file (sentence1, sentence2, score) for Spearman."),
    anisotropy_sentences: int = typer.Option(500, "--anisotropy-sentences", help="Contrastive: sentences sampled for anisotropy per layer (0 = skip).", min=0),
    grad_accum: int = typer.Option(1, "--grad-accum", help="Micro-batches of --batch-size per optimiser step.", min=1),
    eval_every: Optional[int] = typer.Option(None, "--eval-every", help="Also evaluate every N optimiser steps (always at each epoch end).", min=1),
    early_stopping: Optional[int] = typer.Option(None, "--early-stopping", help="Stop after PATIENCE evaluations without improvement; keep the best weights.", min=1),
    early_stopping_metric: Optional[str] = typer.Option(None, "--early-stopping-metric", help="Metric watched by --early-stopping (default: the task's first metric, accuracy or pearson; contrastive: spearman or loss)."),
    against: Optional[Path] = typer.Option(
        None, "--against", help="A finished finetune run (e.g. the full model) to report accuracy and time against."
    ),
    save_every: Optional[int] = typer.Option(None, "--save-every", help="Keep checkpoints/step-N/ every N steps (resume after an interruption; bertology track).", min=1),
    no_report: bool = no_report_option("Write the model, tables and manifest only, no report.html."),
) -> None:
    """Fine-tune a head (classification, regression, tagging, parsing, QA) or a contrastive encoder, with layer
    removal, freezing, biased-data filters, checkpoints and resumption."""
    from bertology.training.data import parse_word_list
    from bertology.training.finetune import read_data
    from bertology.training.run import finetune_to_dir

    words = parse_word_list(exclude_words)
    if exclude_words is not None and not words:
        raise BertologyError("--exclude-words is empty.")
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
        dtype=dtype,
        trust_remote_code=trust_remote_code,
        objective=objective,  # type: ignore[arg-type]
        contrastive=contrastive,  # type: ignore[arg-type]
        task=task,  # type: ignore[arg-type]
        tag_column=tag_column,  # type: ignore[arg-type]
        temperature=temperature,
        pooling=pooling,  # type: ignore[arg-type]
        sts_data=sts_data,
        anisotropy_sentences=anisotropy_sentences,
        drop_layers=parse_layers(drop_layers),
        freeze_layers=freeze_layers,
        freeze_embeddings=freeze_embeddings,
        exclude_words=words,
        slice_words=parse_word_list(eval_slices),
        grad_accum=grad_accum,
        eval_every=eval_every,
        early_stopping=early_stopping,
        early_stopping_metric=early_stopping_metric,
        save_every=save_every,
        doc_stride=doc_stride,
        max_answer_length=max_answer_length,
        null_threshold=null_threshold,
        qa_split=qa_split,  # type: ignore[arg-type]
    )
    if against is not None:
        from bertology.training.run import finished_summary

        finished_summary(against)  # refuse before training, not after
    train, evaluation = read_data(config)  # checks the settings, then reads with the reader the task needs
    run = finetune_to_dir(config, train, evaluation, overwrite=overwrite, retrain=overwrite, progress=True)
    _print_run(run, against, no_report)


def _print_run(run, against: Path | None, no_report: bool) -> None:
    """The command's output: reuse note, warnings, the summary lines, the comparison with ``--against``, the report."""
    if run.reused:
        console.print(f"{escape(str(run.out))} already holds this exact run; reusing it (pass --overwrite to train again).")
    for w in run.warnings:
        console.print(f"[yellow]warning:[/] {escape(str(w))}", highlight=False)
    typer.echo(_summary(run.metrics, run.n_train, run.model_dir, run.wall_time_s, reused=run.reused))
    from bertology.runs import RunDirectory

    for line in _details(RunDirectory(run.out).read_manifest() or {}):
        typer.echo(line)
    if against is not None:
        from bertology.training.run import compare_runs

        c = compare_runs(run.out, against)
        for name, m in c["metrics"].items():
            typer.echo(f"{name}: {m['run']:.4f} vs {m['against']:.4f} in {against} ({m['delta']:+.4f})")
        if "train_time_ratio" in c:
            typer.echo(f"training time {c['train_time_ratio']:.2f}x that of {against}")
    if not no_report:  # every run command ends with its report, as compare does
        from bertology.report.render import render_report

        console.print(f"report: [bold]{escape(str(render_report(run.out)))}[/]")
