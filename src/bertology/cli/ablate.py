"""``bertology ablate``: disable every head and layer of a fine-tuned classifier and measure the task.

Writes, under ``--out``: ``tables/ablation`` (intact, every head, every layer: accuracy / macro-F1 / loss
deltas with bootstrap 95% intervals and ``helps`` flags), ``tables/head_importance`` and
``tables/pruning_curve`` (Michel et al. 2019; unless ``--no-importance``), ``figures/*.svg``, ``report.html`` and
``manifest.json``. Finished ablations are kept in ``partial/``: after Ctrl-C or a kill, the same
command continues where it stopped; different settings in the same folder are refused unless
``--overwrite``.
"""
from __future__ import annotations

import hashlib
import json
import time
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
from bertology.progress import parse_layer_list, stage_bars
from bertology.errors import BertologyError

KIND = "ablate"


def _parse_layer_modes(text: str) -> tuple[str, ...]:
    names = tuple(x.strip() for x in text.split(",") if x.strip())
    if names in ((), ("none",)):
        return ()
    return names


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
    from bertology.models.ablate import check_mode
    from bertology.models.device import resolve_device
    from bertology.models.precision import resolve_dtype

    check_mode(mode, "--mode")
    resolved = resolve_device(device)  # a missing GPU or dtype is an error now, not after loading
    torch_dtype = resolve_dtype(dtype, resolved)
    device = str(resolved)  # "auto" -> what it chose
    from bertology.experiments.ablation import AblationSettings, run_ablation_study, sample_examples
    from bertology.tasks.catalog import task_of_model
    from bertology.data.loaders import load_corpus
    from bertology.models.loading import load_model
    from bertology.results import now_iso, write_table
    from bertology.runs import manifest_header, open_run

    settings = AblationSettings(
        mode=mode,  # type: ignore[arg-type]
        exclude_special=exclude_special,
        layers=parse_layer_list(layers, "layer numbers (1-based)"),
        layer_modes=_parse_layer_modes(layer_modes),
        batch_size=batch_size,
        n_bootstrap=bootstrap,
        seed=seed,
        device=device,
        max_examples=max_examples or None,
        max_length=max_length,
        importance=importance,
        pruning_step=pruning_step,
        pruning_recompute=recompute,
    )
    loaded = load_model(model, kind="auto", trust_remote_code=trust_remote_code, dtype=torch_dtype)
    task = task_of_model(loaded.model, name=f"Model {model!r}")
    encoded = None
    qa: dict = {}
    if task.name == "qa":  # SQuAD JSON: every question cut into windows; the bootstrap resamples questions
        from bertology.data.qa_features import encode_squad
        from bertology.data.squad import read_squad

        corpus = read_squad(data).stratified_sample(settings.max_examples, settings.seed)
        qa = {"doc_stride": doc_stride, "max_answer_length": max_answer_length, "null_threshold": null_threshold}
        encoded = encode_squad(corpus, loaded.tokenizer, max_length, **qa)
    else:
        corpus = load_corpus(data, text_column=text_column, pair_column=pair_column, label_column=label_column)
        # a parser scores trees and a tagger word tags, not sentence labels
        if not task.token_level and not any(ex.label is not None for ex in corpus):
            raise BertologyError(
                f"{data} has no labels; ablation measures a task and needs labelled data. "
                "Name the label column with --label-column."
            )
        task.targets(corpus, loaded.model)
        corpus = sample_examples(corpus, settings.max_examples, settings.seed)

    d = {**settings.to_dict(), **qa}
    d.pop("device")  # results agree across devices to float rounding; a run may resume on another
    weights = loaded.weights_sha256 or loaded.path
    parts = [d, corpus.fingerprint(word_tags=task.token_level), weights]
    parts += [dtype] if dtype != "float32" else []  # float32 runs keep their old fingerprints
    fingerprint = hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]
    with open_run(out, KIND, fingerprint, overwrite=overwrite) as opened:
        run_dir = opened.dir
        if opened.resumed and (run_dir.path / "partial").exists():
            console.print(f"resuming the run in {escape(str(run_dir.path))} (finished ablations are kept)")
        manifest = {
            **manifest_header(KIND, fingerprint, created=opened.previous.get("created")),
            "status": "running",
            "config": {"model": model, "data": data, "text_column": text_column, "pair_column": pair_column,
                       "label_column": label_column, **settings.to_dict(), **qa, "dtype": dtype},
            "seed": seed,
            "device": device,
            "dtype": dtype,
            "attn_implementation": "eager",
            "ablation_mode": mode,
            "task": task.name,
            "models": {"tuned": loaded.describe()},
            "data": corpus.describe(),
        }
        run_dir.write_manifest(manifest)

        t0 = time.perf_counter()
        with stage_bars(describe=lambda s: "ablations" if s == "ablation" else "importance + pruning", console=console) as on_progress:
            try:
                # the report draws every figure (and saves them under figures/); without it the study saves its own
                study = run_ablation_study(loaded.model, loaded.tokenizer, encoded if encoded is not None else corpus,
                                           settings, run_dir.path / "partial", encoded=encoded, on_progress=on_progress)
            except KeyboardInterrupt:
                console.print(f"[yellow]interrupted:[/] finished ablations are saved in {escape(str(run_dir.path / 'partial'))}; "
                              "run the same command again to continue.")
                raise
        for name, table in study.tables.items():
            write_table(run_dir.path, name, table)
        figures = [] if not no_report else _write_figures(study.tables, run_dir.path)
        manifest.update(status="complete", finished=now_iso(), wall_time_s=round(time.perf_counter() - t0, 3),
                        result=study.summary, tables=list(study.tables),
                        figures=[str(p.relative_to(run_dir.path)) for p in figures])
        run_dir.write_manifest(manifest)
    _print_summary(study, run_dir.path, figures)
    if not no_report:
        from bertology.report.render import render_report

        report = render_report(run_dir.path)
        console.print(f"figures: {escape(str(run_dir.path / 'figures'))}")
        console.print(f"report: [bold]{escape(str(report))}[/]")


def _write_figures(tables: dict, out: Path) -> list[Path]:
    """The ablation figures as ``figures/*.svg`` (without a report, which would otherwise draw them)."""
    from bertology.results import atomic_write_text
    from bertology.viz.ablation import ablation_figures
    from bertology.viz.figures import figure_to_svg

    written = []
    figs = ablation_figures(tables["ablation"], tables.get("head_importance"), tables.get("pruning_curve"))
    for stem, fig in figs.items():
        path = out / "figures" / f"{stem}.svg"
        atomic_write_text(path, figure_to_svg(fig))
        written.append(path)
    return written


def _print_summary(study, out: Path, figures: list[Path]) -> None:
    from bertology.experiments.ablation import summary

    resumed = study.ablation.params.get("resumed_units", 0)
    console.print(summary(study.tables, note=f"; {resumed} ablations reused" if resumed else ""), markup=False, highlight=False)
    console.print(f"tables: {out / 'tables'}", markup=False, highlight=False)
    if figures:
        console.print(f"figures: {out / 'figures'}", markup=False, highlight=False)
