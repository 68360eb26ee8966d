"""``bertology probe``: structural probes (Hewitt & Manning 2019) on every layer of base, tuned and a
random-init control.

Writes, under ``--out``: ``tables/probe`` (``model, layer, probe, split, uuas, dspr, root_acc, nspr`` plus
``loss, n_sentences, rank, epochs, best_epoch, best_dev_loss``), ``figures/probe_distance.svg`` and
``figures/probe_depth.svg`` and ``manifest.json``. Word features and the training state are kept in
``partial/`` while the run lasts: after Ctrl-C or a kill, the same command continues where it
stopped (features are not recomputed, training resumes after the last finished epoch). Different
settings in the same folder are refused unless ``--overwrite``. The word features are held in
``--feature-dtype`` (float32 by default; float16 halves the disk and page cache) and read from those
memory-mapped files during training.
"""
from __future__ import annotations

import hashlib
import json
import shutil
import time
from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from bertology.cli.app import app, console, user_errors
from bertology.cli.options import (
    DEVICE_OPT, DTYPE_OPT, SPACY_MODEL_OPT, TRUST_REMOTE_CODE_OPT, base_option, batch_size_option, epochs_option, layers_option,
    lr_option, max_length_option, no_report_option, out_option, overwrite_option, seed_option, tuned_option,
)
from bertology.progress import parse_layer_list, stage_bars

KIND = "probe"


def _parse_probes(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def _load_split(path: str, what: str, limit: int | None, spacy_model: str | None, nlp_cache: dict):
    from bertology.experiments.probe import ensure_trees
    from bertology.data.annotate import load_spacy
    from bertology.data.loaders import load_corpus

    corpus = load_corpus(path, limit=limit, name=what)
    if not corpus.has_trees and not corpus.has_pairs and not any(ex.words is not None for ex in corpus):
        if "nlp" not in nlp_cache:
            nlp_cache["nlp"] = load_spacy(spacy_model)
        return ensure_trees(corpus, nlp=nlp_cache["nlp"])
    return ensure_trees(corpus, spacy_model=spacy_model)


@app.command("probe")
@user_errors
def probe_command(
    base: str = base_option(),
    tuned: Optional[str] = tuned_option(None, help="Fine-tuned model (a classifier's encoder is used)."),
    random_control: bool = typer.Option(False, "--random-control/--no-random-control",
                                        help="Also probe a model of the base's config with seeded random weights (named 'random')."),
    train: str = typer.Option(..., "--train", help="Training sentences: .conllu with gold trees, or text (.txt/.csv/...) parsed with spaCy."),
    dev: Optional[str] = typer.Option(None, "--dev", help="Dev sentences (early stopping); default: a seeded 10%% of --train."),
    test: str = typer.Option(..., "--test", help="Test sentences (the scores), same formats as --train."),
    rank: int = typer.Option(128, "--rank", help="Probe rank (0 = full rank, the hidden size); Hewitt & Manning saturate at 64-128.", min=0),
    layers: Optional[str] = layers_option(help="Comma list of layers (0 = embeddings) or 'all' (default)."),
    probes: str = typer.Option("distance,depth", "--probes", help="Which probes: distance, depth, or both."),
    epochs: int = epochs_option(30, help="Most epochs; each probe stops early on its own dev loss.", min=1),
    patience: int = typer.Option(5, "--patience", help="Stop a probe after this many epochs without dev improvement.", min=1),
    batch_size: int = batch_size_option(20, help="Sentences per training step (Hewitt & Manning: 20).", min=1),
    extract_batch_size: int = typer.Option(32, "--extract-batch-size", help="Sentences per forward pass.", min=1),
    lr: float = lr_option(1e-3, help="Adam learning rate (divided by 10 on a dev plateau)."),
    max_length: int = max_length_option(512, help="Skip sentences longer than this many tokens (counted)."),
    max_sentences: int = typer.Option(0, "--max-sentences", help="Use at most the first N sentences of each file (0 = all).", min=0),
    spacy_model: Optional[str] = SPACY_MODEL_OPT,
    seed: int = seed_option(help="Seed of the dev split, probe initialisation, batch order and the random control."),
    device: str = DEVICE_OPT,
    dtype: str = DTYPE_OPT,
    out: Path = out_option(Path("runs/probe"), help="Run folder (tables/, figures/, partial/, manifest.json)."),
    overwrite: bool = overwrite_option(),
    conventions: str = typer.Option("bertology", "--conventions", help="Paper conventions preset: bertology, clark2019, kovaleva2019 or hewitt2019 (docs: Paper conventions); only probe_punctuation applies here."),
    probe_punctuation: Optional[str] = typer.Option(None, "--probe-punctuation", help="Words UUAS and root accuracy leave out: upos (UPOS PUNCT, bertology) or hewitt2019 (their PTB XPOS list); default: the preset's."),
    feature_dtype: str = typer.Option(
        "float32", "--feature-dtype",
        help="How word features are held (memory-mapped from the run's partial/ folder): float32, or float16 for half the disk "
             "and page cache (each value within 2^-11 relative; probe scores move by about half of what another seed does). "
             "Probes train in float32 either way."),
    keep_features: bool = typer.Option(False, "--keep-features", help="Keep the word features (partial/features/*.safetensors) after the run."),
    trust_remote_code: bool = TRUST_REMOTE_CODE_OPT,
    no_report: bool = no_report_option(),
) -> None:
    """Structural probes (distance and depth) on every layer: how much syntax each model keeps."""
    from bertology.models.device import resolve_device
    from bertology.models.precision import resolve_dtype

    resolved = resolve_device(device)  # a missing GPU or dtype is an error now, not after loading
    torch_dtype = resolve_dtype(dtype, resolved)
    device = str(resolved)  # "auto" -> what it chose
    from bertology.conventions import choose, record
    from bertology.experiments.probe import ProbeSettings, random_init_model, run_probes
    from bertology.models.loading import load_model
    from bertology.results import now_iso, read_table, write_table
    from bertology.runs import manifest_header, open_run

    settings = ProbeSettings(
        rank=rank or None, layers=parse_layer_list(layers, "layer numbers (0 = embeddings)"), probes=_parse_probes(probes), epochs=epochs,
        batch_size=batch_size, extract_batch_size=extract_batch_size, lr=lr, patience=patience,
        seed=seed, device=device, max_length=max_length,
        punctuation=choose(conventions, "probe_punctuation", probe_punctuation), feature_dtype=feature_dtype,
    )
    limit = max_sentences or None
    nlp_cache: dict = {}
    corpora = {"train": _load_split(train, "train", limit, spacy_model, nlp_cache)}
    if dev is not None:
        corpora["dev"] = _load_split(dev, "dev", limit, spacy_model, nlp_cache)
    corpora["test"] = _load_split(test, "test", limit, spacy_model, nlp_cache)

    models = {"base": load_model(base, kind="auto", trust_remote_code=trust_remote_code, dtype=torch_dtype)}
    if tuned is not None:
        models["tuned"] = load_model(tuned, kind="auto", trust_remote_code=trust_remote_code, dtype=torch_dtype)
    if random_control:
        models["random"] = random_init_model(models["base"], seed)

    d = settings.to_dict()
    d.pop("device")
    if d["feature_dtype"] == "float32":
        d.pop("feature_dtype")  # runs made before the option held float32 features: they keep their fingerprint
    ids = {name: (m.weights_sha256 or m.path) for name, m in models.items() if name != "random"}
    fingerprint = hashlib.sha256(json.dumps(
        [d, {k: c.fingerprint() for k, c in corpora.items()}, ids, random_control] + ([dtype] if dtype != "float32" else []),
        sort_keys=True, default=str
    ).encode()).hexdigest()[:16]
    with open_run(out, KIND, fingerprint, overwrite=overwrite) as opened:
        run_dir, resumed, old = opened.dir, opened.resumed, opened.previous
        partial = run_dir.path / "partial"
        if resumed and old.get("status") == "complete" and run_dir.has_table("probe"):
            console.print(f"{escape(str(run_dir.path))} already holds this finished run; nothing to do")
            _print_summary(read_table(run_dir.path, "probe"), run_dir.path)
            return
        if resumed and partial.exists():
            console.print(f"resuming the run in {escape(str(run_dir.path))} (cached features and finished epochs are kept)")
        manifest = {
            **manifest_header(KIND, fingerprint, created=old.get("created")),
            "status": "running",
            "config": {"base": base, "tuned": tuned, "random_control": random_control, "train": train, "dev": dev,
                       "test": test, "max_sentences": max_sentences, "spacy_model": spacy_model, **settings.to_dict(),
                       "dtype": dtype},
            "conventions": record(conventions, {"probe_punctuation": settings.punctuation}),
            "seed": seed,
            "device": device,
            "dtype": dtype,
            "attn_implementation": "eager",
            "pooling": "mean of sub-word pieces",
            "feature_dtype": settings.feature_dtype,
            "models": {name: {**m.describe(), **({"seed": seed} if name == "random" else {})} for name, m in models.items()},
            "data": {k: c.describe() for k, c in corpora.items()},
        }
        run_dir.write_manifest(manifest)

        t0 = time.perf_counter()
        with stage_bars(describe=lambda s: "training (epochs)" if s == "training" else s, console=console) as on_progress:
            try:
                result = run_probes(models, corpora["train"], corpora.get("dev"), corpora["test"], settings,
                                    on_progress=on_progress, work_dir=partial)
            except KeyboardInterrupt:
                console.print(f"[yellow]interrupted:[/] features and finished epochs are saved in {escape(str(partial))}; "
                              "run the same command again to continue.")
                raise
        write_table(run_dir.path, "probe", result.table)
        from bertology.results import atomic_write_text
        from bertology.viz.figures import figure_to_svg
        from bertology.viz.probe import probe_figures

        figures = []
        for stem, fig in probe_figures(result.table).items():
            path = run_dir.path / "figures" / f"{stem}.svg"
            atomic_write_text(path, figure_to_svg(fig))
            figures.append(str(path.relative_to(run_dir.path)))
        manifest.update(status="complete", finished=now_iso(), wall_time_s=round(time.perf_counter() - t0, 3),
                        probe=result.params, tables=["probe"], figures=figures)
        run_dir.write_manifest(manifest)
    if not keep_features:
        shutil.rmtree(partial, ignore_errors=True)
    _print_summary(result.table, run_dir.path)
    if not no_report:
        from bertology.report.render import render_report

        console.print(f"report: [bold]{escape(str(render_report(run_dir.path)))}[/]")


def _print_summary(table, out: Path) -> None:
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
    console.print(f"tables: {escape(str(out / 'tables'))}")
    console.print(f"figures: {escape(str(out / 'figures'))}")
