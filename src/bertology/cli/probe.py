"""``bertology probe``: structural probes (Hewitt & Manning 2019) on every layer of base, tuned and a
random-init control.

Writes, under ``--out``: ``tables/probe`` (``model, layer, probe, split, uuas, dspr, root_acc, nspr`` plus
``loss, n_sentences, rank, epochs, best_epoch, best_dev_loss``), ``figures/probe_distance.svg`` and
``figures/probe_depth.svg`` and ``manifest.json``. Word features and the training state are kept in
``partial/`` while the run lasts: after Ctrl-C or a kill, the same command continues where it
stopped (features are not recomputed, training resumes after the last finished epoch). Different
settings in the same folder are refused unless ``--overwrite``. The word features are held in
``--feature-dtype`` (float32 by default; float16 halves the disk and page cache) and read from those
memory-mapped files during training. The work is :func:`bertology.study.probe.probe`; this module parses
the flags and prints the best layers.
"""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from bertology.cli.app import app, console, user_errors
from bertology.cli.options import (
    DEVICE_OPT, DTYPE_OPT, SPACY_MODEL_OPT, TRUST_REMOTE_CODE_OPT, base_option, batch_size_option, epochs_option, layers_option,
    lr_option, max_length_option, no_report_option, out_option, overwrite_option, seed_option, tuned_option,
)
from bertology.progress import parse_layer_list


def _parse_probes(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


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
    from bertology.study.inputs import Loading
    from bertology.study.probe import ProbeData, ProbeModels, probe

    settings = {
        "rank": rank or None, "layers": parse_layer_list(layers, "layer numbers (0 = embeddings)"), "probes": _parse_probes(probes),
        "epochs": epochs, "batch_size": batch_size, "extract_batch_size": extract_batch_size, "lr": lr, "patience": patience,
        "seed": seed, "device": device, "max_length": max_length, "punctuation": probe_punctuation, "feature_dtype": feature_dtype,
    }
    run = probe(ProbeModels(base, tuned, random_control), ProbeData(train, test, dev, max_sentences, spacy_model), settings,
                conventions=conventions, out=out, loading=Loading(dtype, trust_remote_code), overwrite=overwrite,
                keep_features=keep_features, report=not no_report, progress=True)
    _print_summary(run.table("probe"), run.out)
    if run.report is not None:
        console.print(f"report: [bold]{escape(str(run.report))}[/]")


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
