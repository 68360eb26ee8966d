"""The figures of a tracked run: each analysis's metrics over training steps, a line per layer.

Drawn for ``bertology track``, ``bertology finetune --track-every`` and
:class:`~bertology.integrations.BertologyCallback` run folders (saved as ``figures/track_*.svg``) and by the
report's tracking section.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

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
        ncols = min(2, len(panels))  # two panels a row: four side by side are unreadable in a report's column
        nrows = -(-len(panels) // ncols)
        fig = Figure(figsize=(4.2 * ncols, 3.2 * nrows), layout="constrained")
        FigureCanvasAgg(fig)
        grid = fig.subplots(nrows, ncols, squeeze=False).ravel()
        for ax in grid[len(panels):]:
            ax.set_visible(False)
        axes = grid[:len(panels)]
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
