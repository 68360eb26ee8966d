"""``compare``, ``demo``, ``report`` and ``env``: parse flags into config, call the API, print a summary."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from bertology.cli.app import app, console, user_errors
from bertology.cli.options import (
    DATA_OPT, DEVICE_OPT, DTYPE_OPT, LABEL_COL, PAIR_COL, SPACY_MODEL_OPT, TEXT_COL, TRUST_REMOTE_CODE_OPT, analyses_option,
    base_option, batch_size_option, epochs_option, importance_option, max_examples_option, max_length_option, no_report_option,
    out_option, overwrite_option, seed_option, tuned_option,
)
from bertology.analyses.catalog import ANALYSES
from bertology.analyses.registry import AnalysisSpec
from bertology.config import CompareConfig, DataConfig
from bertology.experiments.catalog import EXPERIMENTS
from bertology.experiments.registry import ExperimentSpec
from bertology.errors import BertologyError


def _parse_pca_examples(text: str) -> tuple[tuple[int, ...] | None, int]:
    """``--pca-examples``: a count ("20": a seeded sample) or a comma list of example indices ("0,4,9")."""
    try:
        if "," not in text:
            n = int(text)
            if n < 1:
                raise ValueError
            return None, n
        idx = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise BertologyError(f"--pca-examples takes a count (e.g. 20) or a comma list of example indices (e.g. 0,4,9), not {text!r}.") from None
    return idx, len(idx)


def _parse_analyses(text: str) -> tuple[str, ...]:
    """``--analyses`` as names; ``compare`` checks them (one place) before anything is loaded."""
    return tuple(a.strip() for a in text.split(",") if a.strip())


@app.command("compare")
@user_errors
def compare_command(
    tuned: list[str] = tuned_option(
        ..., help="Fine-tuned model: hub id, local folder, or 'minilm'. Repeat as --tuned NAME=PATH (NAME may be task/sN, "
                  "e.g. sst2/s0) to compare several with one base in one run (README: Several fine-tunes in one run).",
        metavar="PATH|NAME=PATH"),
    data: str = DATA_OPT,
    base: str = base_option(),
    out: Path = out_option(Path("runs/compare"), help="Run directory to write."),
    analyses: str = analyses_option("all", help=f"Comma list of: {', '.join(ANALYSES.names() + EXPERIMENTS.names())} (or 'all')."),
    text_column: Optional[str] = TEXT_COL,
    pair_column: Optional[str] = PAIR_COL,
    label_column: Optional[str] = LABEL_COL,
    max_examples: int = max_examples_option(1000, help="Use at most this many examples (0 = all)."),
    max_length: int = max_length_option(128, help="Max tokens per example, [CLS]/[SEP] included."),
    overlong: str = typer.Option("skip", "--overlong", help="What to do with longer examples: skip or truncate (counted either way)."),
    batch_size: int = batch_size_option(32, min=1),
    conventions: str = typer.Option("bertology", "--conventions", help="Paper conventions preset: bertology, clark2019, kovaleva2019 or hewitt2019 (README: Paper conventions)."),
    punctuation: Optional[str] = typer.Option(None, "--punctuation", help="Punctuation tokens: unicode (bertology) or clark2019 ('.' and ','); default: the preset's."),
    attention_mode: Optional[str] = typer.Option(None, "--attention-mode", help="cropped: real tokens only (bertology); padded: Kovaleva's fixed-length maps; default: the preset's."),
    word_categories: Optional[str] = typer.Option(None, "--word-categories", help="Word-category targets of attention_targets: bertology (whole words, UPOS) or kovaleva2019 (single pieces matched by string, their tag and negation lists); default: the preset's."),
    probe_punctuation: Optional[str] = typer.Option(None, "--probe-punctuation", help="Words the probes' UUAS and root accuracy leave out: upos (UPOS PUNCT, bertology) or hewitt2019 (their PTB XPOS list); default: the preset's."),
    pad_length: int = typer.Option(200, "--pad-length", help="Length of the padded maps in --attention-mode padded."),
    rsa_tokens: int = typer.Option(2000, "--rsa-tokens", help="Size of the shared token sample for RSA/CKA.", min=4),
    spacy_model: Optional[str] = SPACY_MODEL_OPT,
    relation_min_count: int = typer.Option(20, "--relation-min-count", help="Relation heads: leave out relations with fewer pairs.", min=1),
    relation_word_attention: Optional[str] = typer.Option(
        None, "--relation-word-attention",
        help="Relation heads' word attention: mean (Clark's paper: from = mean of pieces) or clark2019 (their code: first piece, float16 maps); default: the preset's."),
    entropy_smoothing: Optional[str] = typer.Option(
        None, "--entropy-smoothing", help="Attention entropy: none (bertology) or clark2019 (rows smoothed as 0.9999 p + 0.0001/n); default: the preset's."),
    patterns_cnn: Optional[Path] = typer.Option(
        None, "--patterns-cnn", help="Pattern classifier from 'bertology patterns train' (default: the feature rules)."
    ),
    head_map_examples: int = typer.Option(100, "--head-map-examples", help="Head map: examples sampled for the all-pairs head distances.", min=1),
    head_map_distance: Optional[str] = typer.Option(
        None, "--head-map-distance",
        help="Head map distance: js_distance (bertology), js_divergence, or clark2019 (summed smoothed JS, random MDS starts); default: the preset's."),
    view_examples: int = typer.Option(3, "--view-examples", help="Short examples shown in the report's interactive attention viewer (0 = none).", min=0),
    relations: Optional[Path] = typer.Option(
        None, "--relations", help="JSONL of user token relations (text, from span, to spans, relation) scored like relation heads."
    ),
    ood_data: Optional[str] = typer.Option(
        None, "--ood-data", help="A second, out-of-domain corpus: RSA/CKA of base vs tuned on it too (Merchant et al. 2020)."
    ),
    ood_text_column: Optional[str] = typer.Option(None, "--ood-text-column", help="Text column of --ood-data (CSV/TSV/JSONL)."),
    probe_train: Optional[str] = typer.Option(None, "--probe-train", help="Structural probes: training trees (CoNLL-U, or text parsed with spaCy)."),
    probe_dev: Optional[str] = typer.Option(None, "--probe-dev", help="Structural probes: dev trees for early stopping (default: 10% of --probe-train)."),
    probe_test: Optional[str] = typer.Option(None, "--probe-test", help="Structural probes: test trees the scores come from."),
    probe_rank: int = typer.Option(128, "--probe-rank", help="Structural probes: rank of the probe matrix (0 = full).", min=0),
    probe_random_control: bool = typer.Option(True, "--probe-random-control/--no-probe-random-control", help="Structural probes: also a random-init model of the same shape."),
    geometry_pairs: int = typer.Option(1000, "--geometry-pairs", help="Geometry: random token pairs (from different sentences) for the anisotropy baseline.", min=2),
    pca_examples: str = typer.Option("20", "--pca-examples", help="PCA views: a count (seeded sample) or a comma list of example indices, e.g. 0,4,9."),
    ablation_mode: str = typer.Option(
        "uniform", "--ablation-mode", help="Ablation (tuned classifier + labelled data): how a head is disabled: uniform (1/L), zero, or mean."
    ),
    ablation_examples: int = typer.Option(500, "--ablation-examples", help="Ablation: seeded, label-stratified sample of this many examples (0 = all).", min=0),
    ablation_exclude_special: bool = typer.Option(False, "--ablation-exclude-special", help="Ablation, uniform mode: leave [CLS]/[SEP] out of the 1/L average."),
    ablation_bootstrap: int = typer.Option(1000, "--ablation-bootstrap", help="Ablation: bootstrap resamples for the 95% intervals.", min=0),
    importance: bool = importance_option(help="Ablation: also head importance (Michel et al. 2019) and pruning curves."),
    seed: int = seed_option(),
    device: str = DEVICE_OPT,
    dtype: str = DTYPE_OPT,
    store: Optional[Path] = typer.Option(None, "--store", help="Also save hidden states to this folder (safetensors shards)."),
    overwrite: bool = overwrite_option(),
    no_report: bool = no_report_option(help="Write tables only."),
    trust_remote_code: bool = TRUST_REMOTE_CODE_OPT,
) -> None:
    """Compare a base and a fine-tuned model on a corpus: tables, figures and an HTML report."""
    from bertology.models.ablate import check_mode
    from bertology.pipeline import compare

    if overlong not in ("skip", "truncate"):
        raise BertologyError("--overlong must be 'skip' or 'truncate'.")
    check_mode(ablation_mode, "--ablation-mode")
    pca_idx, pca_n = _parse_pca_examples(pca_examples)
    many = len(tuned) > 1 or any("=" in t and not Path(t).expanduser().exists() for t in tuned)
    config = CompareConfig(
        base=base,
        tuned="" if many else tuned[0],
        data=DataConfig(data, text_column, pair_column, label_column, max_examples or None, max_length, overlong),  # type: ignore[arg-type]
        out=str(out),
        analyses=_parse_analyses(analyses),
        batch_size=batch_size,
        seed=seed,
        device=device,
        dtype=dtype,
        conventions=conventions,
        punctuation=punctuation,  # type: ignore[arg-type]
        attention_mode=attention_mode,  # type: ignore[arg-type]
        word_categories=word_categories,  # type: ignore[arg-type]
        probe_punctuation=probe_punctuation,  # type: ignore[arg-type]
        pad_length=pad_length,
        rsa_tokens=rsa_tokens,
        spacy_model=spacy_model,
        relation_min_count=relation_min_count,
        relation_word_attention=relation_word_attention,  # type: ignore[arg-type]
        entropy_smoothing=entropy_smoothing,  # type: ignore[arg-type]
        relations=str(relations) if relations else None,
        head_map_examples=head_map_examples,
        head_map_distance=head_map_distance,  # type: ignore[arg-type]
        patterns_cnn=str(patterns_cnn) if patterns_cnn else None,
        view_examples=view_examples,
        ood_data=ood_data,
        ood_text_column=ood_text_column,
        probe_train=probe_train,
        probe_dev=probe_dev,
        probe_test=probe_test,
        probe_rank=probe_rank,
        probe_random_control=probe_random_control,
        geometry_pairs=geometry_pairs,
        pca_examples=pca_idx,
        pca_n_examples=pca_n,
        ablation_mode=ablation_mode,  # type: ignore[arg-type]
        ablation_examples=ablation_examples,
        ablation_exclude_special=ablation_exclude_special,
        ablation_bootstrap=ablation_bootstrap,
        ablation_importance=importance,
        trust_remote_code=trust_remote_code,
        store=str(store) if store else None,
    )
    if many:
        from bertology.multicompare import compare_many, parse_tuned

        _print_many_summary(compare_many(config, parse_tuned(tuned), overwrite=overwrite, progress=True,
                                         report=not no_report))
        return
    run = compare(config, overwrite=overwrite, progress=True, report=not no_report)
    _print_compare_summary(run)


def _print_many_summary(run) -> None:
    """Per pair: its warnings and where its run is; then the combined tables and the index page."""
    if run.skipped:
        console.print(f"resumed: pairs {', '.join(run.skipped)} were finished in {run.out} and were not run again",
                      markup=False, highlight=False)
    from bertology.pipeline import select

    for name, pair in run.pairs.items():
        console.print(f"[bold]{escape(name)}[/]: {escape(str(pair.out))}")
        for w in pair.manifest.get("warnings", []):
            console.print("[yellow]warning:[/] ", end="")
            console.print(w, markup=False, highlight=False)
        tables = {n: res.table for n, res in pair.results.items()}
        for spec in select(pair.manifest["config"]["analyses"]).analyses:
            _print_summary_of(spec, tables)
    console.print(f"tables (every pair, with tuned/task/seed columns): {escape(str(run.out / 'tables'))}")
    if run.report:
        console.print(f"report: [bold]{escape(str(run.report))}[/]")


def _print_compare_summary(run) -> None:
    """Warnings, then each analysis's and experiment's own summary lines, then where things were written."""
    from bertology.pipeline import select

    if run.resumed:
        console.print(f"resumed: reused {', '.join(run.resumed)} from {run.out}", markup=False, highlight=False)
    for w in run.manifest.get("warnings", []):
        console.print("[yellow]warning:[/] ", end="")
        console.print(w, markup=False, highlight=False)
    tables = {name: res.table for name, res in run.results.items()}
    selection = select(run.manifest["config"]["analyses"])
    for spec in selection.analyses:
        _print_summary_of(spec, tables)
    for spec in selection.experiments:
        _print_summary_of(spec, tables, heading=spec.title.removeprefix("the "))
    console.print(f"tables: {escape(str(run.out / 'tables'))}")
    if run.report:
        console.print(f"report: [bold]{escape(str(run.report))}[/]")


def _print_summary_of(spec: AnalysisSpec | ExperimentSpec, tables: dict, heading: str | None = None) -> None:
    """One spec's summary lines (printed as plain text: tables hold labels like [CLS] that are not markup)."""
    text = spec.summary(tables) if spec.summary is not None and spec.name in tables else None
    if text:
        if heading:
            console.print(f"[bold]{escape(str(heading))}[/]")
        console.print(text, markup=False, highlight=False)


@app.command("report")
@user_errors
def report_command(run_dir: Path = typer.Argument(..., help="A run directory written by bertology.")) -> None:
    """Re-render report.html from a run directory's tables."""
    from bertology.report.render import render_report

    if not (run_dir / "manifest.json").exists():
        raise BertologyError(f"{run_dir} is not a bertology run directory (no manifest.json).")
    manifest = json.loads((run_dir / "manifest.json").read_text(encoding="utf-8"))
    if isinstance(manifest, dict) and manifest.get("kind") == "compare_many":  # the index page, then each pair's report
        from bertology.report.many import render_many_index
        from bertology.results import read_table

        for pair in manifest.get("pairs", []):
            render_report(run_dir / pair["dir"])
        manifest["pairs"] = [{**p, "report": f"{p['dir']}/report.html"} for p in manifest.get("pairs", [])]
        tables = {name: read_table(run_dir, name) for name in manifest.get("tables", [])}
        console.print(f"report: [bold]{escape(str(render_many_index(run_dir, manifest, tables)))}[/]")
        return
    console.print(f"report: [bold]{escape(str(render_report(run_dir)))}[/]")


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
    epochs: float = epochs_option(1.0, help="Fine-tuning epochs (1 keeps the demo within minutes on a CPU)."),
    compare_examples: int = typer.Option(500, "--compare-examples", help="Held-out sentences to compare base and tuned on."),
    seed: int = seed_option(),
    overwrite: bool = overwrite_option(),
) -> None:
    """Fine-tune minilm on sentence polarity, compare it with the base model, and write the report."""
    from bertology.demo import run_demo

    result = run_demo(out, epochs=epochs, compare_examples=compare_examples, seed=seed, progress=True, overwrite=overwrite)
    if result.reused_model:
        console.print(f"reused the fine-tuned model in {escape(str(result.model_dir))}")
    _print_compare_summary(result.run)
    m = result.heldout_metrics
    typer.echo(f"held-out accuracy: {m.get('accuracy', float('nan')):.4f} (macro-F1 {m.get('macro_f1', float('nan')):.4f}, n={m.get('n_eval', '?')})")
    typer.echo(f"report: {result.run.report}")
