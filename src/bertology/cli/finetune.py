"""``bertology finetune``: the fine-tuning lab. Train a sequence classifier (or a SimCSE sentence encoder)
and save it where ``compare --tuned`` can read it.

Writes, under ``--out``: ``model/`` (Hugging Face folder, safetensors), ``tables/finetune.parquet`` and
``.csv`` (``step, epoch, split, metric, value, slice``), ``tables/finetune_predictions.parquet``/``.csv``
(held-out predictions; classification), ``tables/anisotropy`` (contrastive), ``checkpoints/step-N/``
(with ``--save-every``), ``tracking/`` (with ``--track-every``: a run folder of kind ``track``) and
``manifest.json``. Experiments: ``--drop-layers``, ``--freeze-layers``,
``--freeze-embeddings``, ``--exclude-words``, ``--objective contrastive``. An interrupted run with
``--save-every`` continues from its latest checkpoint when the same command is run again.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from bertology.cli.app import app, console, user_errors
from bertology.progress import command_progress
from bertology.cli.generated import given_settings, settings_command
from bertology.cli.options import DATA_FORMATS, data_option, model_option, no_report_option, out_option, overwrite_option
from bertology.config import FINETUNE_DATA_SETTINGS, DataConfig, FinetuneConfig
from bertology.settings import Setting, field_settings


def _summary(metrics: dict, n_train, model_dir, wall, reused: bool = False) -> str:
    if "accuracy" in metrics and "macro_f1" not in metrics:  # a tagger: word accuracy (+ entity F1 for BIO tags)
        entity = f", entity F1 {metrics['entity_f1']:.4f}" if "entity_f1" in metrics else ""
        line = (f"held-out word accuracy {metrics['accuracy']:.4f}{entity} "
                f"(n={metrics.get('n_eval')} sentences, {n_train} training sentences")
    elif "accuracy" in metrics:
        main = "".join(f"{name} {metrics[m]:.4f}, " for m, name in (("mcc", "MCC"), ("f1", "F1")) if m in metrics)
        line = (
            f"held-out {main}accuracy {metrics['accuracy']:.4f}, macro-F1 {metrics['macro_f1']:.4f} "
            f"(n={metrics.get('n_eval')}, {n_train} training examples"
        )
    elif "exact_match" in metrics:  # extractive QA
        line = (
            f"held-out F1 {metrics['f1']:.4f}, exact match {metrics['exact_match']:.4f} "
            f"(n={metrics.get('n_eval')} questions, {n_train} training questions"
        )
    elif "uas" in metrics:  # dependency parsing
        line = (
            f"held-out UAS {metrics['uas']:.4f}, LAS {metrics['las']:.4f} (one-root trees; per-word argmax "
            f"{metrics.get('uas_argmax', float('nan')):.4f} / {metrics.get('las_argmax', float('nan')):.4f}; punctuation excluded; "
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
    if s.get("lora"):
        lo = s["lora"]
        lines.append(f"LoRA r={lo['rank']} alpha={lo['alpha']:g} on {', '.join(lo['targets'])}: "
                     f"{lo['trainable_parameters']:,} of {lo['total_parameters']:,} parameters trained "
                     f"({lo['trainable_percent']:.2f}%)" + (f"; merged model in {lo['merged_model_dir']}"
                                                             if lo.get("merged_model_dir") else ""))
    es = s.get("early_stopping")
    if es and es.get("stopped_early"):
        lines.append(f"early stopping: best {es['metric']} at step {es['best_step']} (weights restored)")
    if s.get("tracking"):
        tr = s["tracking"]
        lines.append(f"tracked against the base every {tr['every']} steps ({', '.join(tr['analyses'])}, gradient "
                     f"norms): {tr['folder']} (bertology report {tr['folder']})")
    if s.get("resumed_from_step") is not None:
        lines.append(f"resumed from the checkpoint at step {s['resumed_from_step']}")
    if s.get("train_time_s") is not None:
        lines.append(f"training time {s['train_time_s']:.1f} s over {s.get('steps')} steps; wall time {s['wall_time_s']:.1f} s")
    return lines


#: ``--help``'s panels for the generated flags (presentation only: a setting not named here is listed under
#: "training"); every flag's name, default, help and checks come from its declaration in FinetuneConfig.
PANELS = (
    ("data", ()),
    ("training", ("eval_fraction", "epochs", "batch_size", "learning_rate", "head_lr", "weight_decay", "warmup_ratio", "seed",
                  "device", "dtype", "trust_remote_code", "objective", "task", "tag_column")),
    ("experiments: layers and biased data", ("drop_layers", "freeze_layers", "freeze_embeddings", "exclude_words",
                                             "slice_words")),
    ("training hygiene", ("grad_accum", "eval_every", "early_stopping", "early_stopping_metric", "save_every",
                          "max_grad_norm")),
    ("contrastive (SimCSE)", ("contrastive", "temperature", "pooling", "positive_label", "negative_label", "sts_data",
                              "anisotropy_sentences", "anisotropy_pairs")),
    ("question answering", ("doc_stride", "max_answer_length", "null_threshold", "qa_split")),
    ("dependency parsing", ("arc_dim", "label_dim")),
    ("parameter-efficient (LoRA)", ("method", "lora_rank", "lora_alpha", "lora_dropout", "lora_targets", "lora_merge")),
    ("tracking while training", ("track_every", "track_analyses", "track_examples")),
)


def finetune_settings() -> list[tuple[str, tuple[Setting, ...]]]:
    """The flags ``finetune`` generates: the data's, then every FinetuneConfig setting, grouped by :data:`PANELS`."""
    declared = {s.name: s for s in field_settings(FinetuneConfig)}
    placed = {name for _, names in PANELS for name in names}
    groups = [(panel, tuple(declared[n] for n in names if n in declared)) for panel, names in PANELS]
    groups[0] = ("data", FINETUNE_DATA_SETTINGS)
    groups[1] = ("training", (*groups[1][1], *(s for n, s in declared.items() if n not in placed)))
    return groups


def make_config(data: str, model: str, out: str, eval_data: str | None, given: dict) -> FinetuneConfig:
    """The run's settings from the command line: the generated flags the user gave (by setting name, checked by
    their declarations when the config is made), the rest their declared defaults."""
    data_names = {s.name for s in FINETUNE_DATA_SETTINGS}
    data_config = DataConfig(path=data, overlong="truncate", max_examples=given.get("max_examples"),
                             **{k: v for k, v in given.items() if k in data_names and k != "max_examples"})
    return FinetuneConfig(model=model, data=data_config, out=out, eval_data=eval_data,
                          **{k: v for k, v in given.items() if k not in data_names})


@app.command("finetune", cls=settings_command(finetune_settings))
@user_errors
def finetune_command(
    ctx: typer.Context,
    data: str = data_option(help=f"Training data: a {DATA_FORMATS}; with --task qa a SQuAD v1.1/v2.0 JSON file."),
    model: str = model_option(help="Model to fine-tune: hub id, local folder, or built-in 'minilm'."),
    eval_data: Optional[str] = typer.Option(
        None, "--eval-data", help="Separate held-out data (same columns); default: a stratified split of --data."
    ),
    out: Path = out_option(Path("runs/finetune"), help="Run folder (model/, tables/, manifest.json)."),
    overwrite: bool = overwrite_option(help="Replace a different run already in --out (or retrain this one from scratch)."),
    against: Optional[Path] = typer.Option(
        None, "--against", help="A finished finetune run (e.g. the full model) to report accuracy and time against."
    ),
    no_report: bool = no_report_option("Write the model, tables and manifest only, no report.html."),
) -> None:
    """Fine-tune a head (classification, regression, tagging, parsing, QA) or a contrastive encoder, with layer
    removal, freezing, biased-data filters, checkpoints and resumption.

    Every setting below is generated from its declaration (bertology.config.FinetuneConfig), so Python and the
    command line accept and refuse the same values."""
    from bertology.training.finetune import read_data
    from bertology.training.run import finetune_to_dir

    config = make_config(data, model, str(out), eval_data, given_settings(ctx))
    if against is not None:
        from bertology.training.run import finished_summary

        finished_summary(against)  # refuse before training, not after
    train, evaluation = read_data(config)  # checks the settings, then reads with the reader the task needs
    from bertology.integrations.tracker import finetune_tracker

    run = finetune_to_dir(config, train, evaluation, overwrite=overwrite, retrain=overwrite, progress=command_progress(),
                          tracker=finetune_tracker)
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
