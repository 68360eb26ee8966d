"""Trajectories: run analyses on every checkpoint of a fine-tuning run against its base model.

A run trained with ``save_every`` holds ``checkpoints/step-N/`` model folders. :func:`track` compares
each of them (and the final ``model/`` when its weights are not one of the checkpoints) with the base
model through :func:`bertology.pipeline.compare` (one compare run per checkpoint under
``track/<name>/``, so an interrupted ``track`` resumes: finished checkpoints are reused; other
settings replace them), then
collects each analysis's table across checkpoints into ``tables/track_<analysis>.parquet``/``.csv``
in the run folder, with columns ``model`` (the checkpoint name; a table's own ``base`` rows keep
``base``), ``checkpoint`` and ``step``. :func:`track_figures` plots each metric over training steps.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from bertology.data.corpus import Corpus
from bertology.errors import BertologyError

logger = logging.getLogger(__name__)

DEFAULT_ANALYSES = ("attention_change", "representation_similarity")


@dataclass
class Checkpoint:
    name: str  # "step-N" or "final"
    step: int
    path: Path


@dataclass
class TrackResult:
    run: Path
    checkpoints: list[Checkpoint]
    tables: dict[str, pd.DataFrame]
    figures: dict[str, Path] = field(default_factory=dict)
    reused: list[str] = field(default_factory=list)

    def table(self, analysis: str) -> pd.DataFrame:
        return self.tables[analysis]

    def _repr_html_(self) -> str:
        from html import escape

        names = ", ".join(c.name for c in self.checkpoints)
        return f"<b>TrackResult</b>: {len(self.checkpoints)} checkpoints ({escape(names)}), tables " + ", ".join(
            f"<code>track_{escape(a)}</code>" for a in self.tables
        )


def find_checkpoints(run: str | Path, *, include_final: bool = True) -> list[Checkpoint]:
    """The run's checkpoints by step, plus the final model when it is not byte-identical to one of them."""
    from bertology.models.loading import weights_fingerprint
    from bertology.runs import RunDirectory
    from bertology.training.loop import checkpoints

    run = Path(run)
    found = [Checkpoint(f"step-{s}", s, p) for s, p in checkpoints(run / "checkpoints")]
    final = run / "model"
    if include_final and (final / "config.json").exists():
        manifest = RunDirectory(run).read_manifest() or {}
        result = manifest.get("result", {})
        step = result.get("early_stopping", {}) or {}
        step = step.get("best_step") or result.get("steps_done") or result.get("steps")
        digest = weights_fingerprint(final)
        if not any(weights_fingerprint(c.path) == digest for c in found):
            found.append(Checkpoint("final", int(step) if step is not None else (found[-1].step + 1 if found else 0), final))
    return sorted(found, key=lambda c: (c.step, c.name != "final"))


def _label_rows(table: pd.DataFrame, ckpt: Checkpoint) -> pd.DataFrame:
    t = table.copy()
    if "model" in t.columns:
        t["model"] = t["model"].replace({"tuned": ckpt.name})
    else:
        t.insert(0, "model", ckpt.name)
    t.insert(1, "checkpoint", ckpt.name)
    t.insert(2, "step", ckpt.step)
    return t


def track(
    run: str | Path,
    *,
    analyses: Sequence[str] = DEFAULT_ANALYSES,
    corpus: Corpus | None = None,
    data: str | None = None,
    base: str | None = None,
    max_examples: int | None = 300,
    max_length: int = 128,
    batch_size: int = 32,
    seed: int = 0,
    device: str = "cpu",
    include_final: bool = True,
    overwrite: bool = False,
    progress: bool = False,
    figures: bool = True,
) -> TrackResult:
    """Compare every checkpoint of the fine-tuning run in ``run`` with its base model (see module docs).

    ``base`` defaults to the run's ``config.model``; the corpus to ``corpus``, else ``data``, else the run's
    eval data (or its training data), with the run's column settings; the first ``max_examples`` examples
    are used. Returns the collected tables by analysis name.
    """
    from bertology.config import CompareConfig, DataConfig
    from bertology.data.loaders import load_corpus
    from bertology.models.loading import load_model
    from bertology.models.pair import ModelPair
    from bertology.pipeline import compare, select
    from bertology.results import atomic_write_text, now_iso, write_table
    from bertology.runs import RunDirectory

    run = Path(run).expanduser()
    run_dir = RunDirectory(run)
    manifest = run_dir.read_manifest()
    if manifest is None or manifest.get("kind") != "finetune":
        raise BertologyError(f"{run} is not a fine-tuning run folder (no finetune manifest.json).")
    cfg = manifest.get("config", {})
    if cfg.get("drop_layers") and base is None:
        raise BertologyError(
            f"{run} removed layer(s) {cfg['drop_layers']} before training, so its checkpoints have fewer layers than "
            "the base model and cannot be compared layer by layer; pass --base with a model of the same depth."
        )
    ckpts = find_checkpoints(run, include_final=include_final)
    if not ckpts:
        raise BertologyError(
            f"{run} has no checkpoints (checkpoints/step-N/) and no final model; train with --save-every N."
        )
    base = base or cfg.get("model")
    data_cfg = cfg.get("data", {}) or {}
    columns = {k: data_cfg.get(k) for k in ("text_column", "pair_column", "label_column")}
    if corpus is None:
        data = data or cfg.get("eval_data") or data_cfg.get("path")
        if not data:
            raise BertologyError("No data to compare on: pass --data.")
        try:
            corpus = load_corpus(data, **columns)
        except BertologyError:
            corpus = load_corpus(data)
    corpus = corpus.head(max_examples)
    analyses = select(analyses).names()  # unknown names fail before any checkpoint is compared

    if overwrite:
        import shutil

        shutil.rmtree(run / "track", ignore_errors=True)
    base_model = load_model(base)
    collected: dict[str, list[pd.DataFrame]] = {a: [] for a in analyses}
    reused: list[str] = []
    for ckpt in ckpts:
        logger.info("track: %s (step %d) against %s", ckpt.name, ckpt.step, base)
        tuned = load_model(ckpt.path)
        pair = ModelPair(base_model, tuned)
        config = CompareConfig(
            base=str(base), tuned=str(ckpt.path),
            data=DataConfig(path=data or corpus.source, max_examples=max_examples, max_length=max_length, **columns),
            out=str(run / "track" / ckpt.name), analyses=tuple(analyses), batch_size=batch_size, seed=seed,
            device=device, view_examples=0,
        )
        # track/ belongs to track: a sub-run with other settings is replaced, an identical one resumed
        result = compare(config, corpus=corpus, pair=pair, overwrite=True, progress=progress, report=False)
        if len(result.resumed) == len(analyses):
            reused.append(ckpt.name)
        for a in analyses:
            if a in result.results:
                collected[a].append(_label_rows(result.results[a].table, ckpt))

    tables = {a: pd.concat(parts, ignore_index=True) for a, parts in collected.items() if parts}
    for a, t in tables.items():
        write_table(run, f"track_{a}", t)
    written: dict[str, Path] = {}
    if figures:
        from bertology.viz.figures import figure_to_svg

        for a, fig in track_figures(tables).items():
            path = run / "figures" / f"track_{a}.svg"
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(path, figure_to_svg(fig, id_prefix=f"track-{a}"))
            written[a] = path
    # record what was tracked in the run's manifest (its fine-tuning entries are left as they were)
    manifest = run_dir.read_manifest() or manifest
    manifest["track"] = {
        "created": now_iso(),
        "base": str(base),
        "analyses": list(analyses),
        "checkpoints": [{"name": c.name, "step": c.step, "path": str(c.path)} for c in ckpts],
        "data": corpus.describe(),
        "max_examples": max_examples,
        "max_length": max_length,
        "tables": [f"track_{a}" for a in tables],
        "figures": [str(p.relative_to(run)) for p in written.values()],
    }
    # the run's table list names every table in its folder (the report shows only those)
    manifest["tables"] = sorted(set(manifest.get("tables") or []) | {f"track_{a}" for a in tables})
    run_dir.write_manifest(manifest)
    return TrackResult(run, ckpts, tables, written, reused)


# --------------------------------------------------------------------------------------------------
# Figures
# --------------------------------------------------------------------------------------------------


def _summaries(analysis: str, table: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """Per metric: a ``step x series`` frame of values to draw as lines."""
    t = table[table["model"] != "base"] if "model" in table.columns else table
    if analysis == "attention_change":
        out = {}
        for metric, label in (("cosine", "mean attention cosine (base vs checkpoint)"),
                              ("js_divergence", "mean attention JS divergence")):
            if metric in t.columns:
                out[label] = t.pivot_table(index="step", columns="layer", values=metric, aggfunc="mean").rename(columns=lambda c: f"layer {c}")
        return out
    if analysis == "representation_similarity":
        diag = t[t["layer_base"] == t["layer_tuned"]]
        return {
            f"{metric} (same layer)": g.pivot_table(index="step", columns="layer_base", values="value", aggfunc="mean").rename(columns=lambda c: f"layer {c}")
            for metric, g in diag.groupby("metric")
        }
    if {"metric", "value"} <= set(t.columns):
        by = "layer" if "layer" in t.columns else None
        out = {}
        for metric, g in t.groupby("metric"):
            if by:
                out[str(metric)] = g.pivot_table(index="step", columns=by, values="value", aggfunc="mean").rename(columns=lambda c: f"layer {c}")
            else:
                out[str(metric)] = g.groupby("step")["value"].mean().to_frame(str(metric))
        return out
    numeric = [c for c in t.select_dtypes("number").columns if c not in ("step", "layer", "head")]
    return {c: t.groupby("step")[c].mean().to_frame(c) for c in numeric}


def track_figures(tables: dict[str, pd.DataFrame]) -> dict[str, "object"]:
    """One matplotlib Figure per analysis: each metric (one panel) over training steps, a line per layer."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figs = {}
    for analysis, table in tables.items():
        panels = {k: v for k, v in _summaries(analysis, table).items() if not v.empty}
        if not panels:
            continue
        fig = Figure(figsize=(4.2 * len(panels), 3.2), layout="constrained")
        FigureCanvasAgg(fig)
        axes = fig.subplots(1, len(panels), squeeze=False)[0]
        for ax, (label, frame) in zip(axes, panels.items()):
            colors = _colors(frame.shape[1])
            for color, col in zip(colors, frame.columns):
                ax.plot(frame.index, frame[col], marker="o", ms=3, lw=1.2, color=color, label=str(col))
            ax.set_xlabel("training step")
            ax.set_title(label, fontsize=9)
            ax.grid(alpha=0.3)
        axes[-1].legend(fontsize=7, frameon=False, loc="best")
        fig.suptitle(f"{analysis} over training", fontsize=10)
        figs[analysis] = fig
    return figs


def _colors(n: int) -> list:
    from matplotlib import colormaps

    cmap = colormaps["viridis"]
    return [cmap(x) for x in np.linspace(0.05, 0.9, max(n, 1))]
