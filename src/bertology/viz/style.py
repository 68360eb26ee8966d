"""The house style of every figure and the small helpers the drawing modules share.

The palette, fonts and sizes (applied only inside our own ``rc_context`` blocks: no global rcParams change),
human-readable metric names, a new figure on an Agg canvas (never a GUI backend), text made safe for matplotlib,
and the checks and formats the figures of :mod:`bertology.viz` have in common.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import matplotlib as mpl
import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.colors import to_rgb
from matplotlib.figure import Figure

#: Human-readable names for the metric identifiers used in the tables.
METRIC_LABELS: dict[str, str] = {
    "cosine": "cosine similarity",
    "js_divergence": "JS divergence (bits)",
    "rsa_pearson": "RSA (Pearson)",
    "rsa_spearman": "RSA (Spearman)",
    "cka_linear": "linear CKA",
    "cka_debiased": "debiased CKA",
    "loss": "loss",
    "accuracy": "accuracy",
    "entity_f1": "entity F1",
    "entity_precision": "entity precision",
    "entity_recall": "entity recall",
    "macro_f1": "macro F1",
    "pearson": "Pearson r",
    "spearman": "Spearman rho",
    "mse": "mean squared error",
    "f1": "F1 (SQuAD)",
    "exact_match": "exact match",
    "uas": "UAS",
    "las": "LAS",
    "uas_argmax": "UAS (per-word argmax)",
    "las_argmax": "LAS (per-word argmax)",
}

# A calm, print-friendly style applied only inside our own rc_context blocks.
_STYLE: dict[str, Any] = {
    "font.family": "sans-serif",
    "font.sans-serif": ["DejaVu Sans", "Helvetica", "Arial"],
    "font.size": 9.0,
    "axes.titlesize": 10.0,
    "axes.titleweight": "bold",
    "axes.labelsize": 9.0,
    "axes.edgecolor": "#444444",
    "axes.linewidth": 0.8,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": False,
    "grid.color": "#e3e3e3",
    "grid.linewidth": 0.6,
    "xtick.labelsize": 8.0,
    "ytick.labelsize": 8.0,
    "xtick.color": "#333333",
    "ytick.color": "#333333",
    "legend.fontsize": 8.0,
    "legend.frameon": False,
    "lines.linewidth": 1.6,
    "lines.markersize": 4.0,
    "figure.dpi": 100,
    "savefig.dpi": 100,
    "svg.fonttype": "none",
    "axes.prop_cycle": mpl.cycler(
        color=["#1f5aa6", "#d1495b", "#2a9d8f", "#e9a23b", "#6c4f9c", "#5c5c5c"]
    ),
}

_MARKERS = ("o", "s", "^", "D", "v", "P")
_SPLIT_STYLE = {"train": {"linestyle": "-", "alpha": 0.55}, "eval": {"linestyle": "-", "marker": "o"}}


def _tidy_colorbar(cbar) -> None:
    cbar.outline.set_visible(False)
    cbar.ax.tick_params(length=2)
    try:
        cbar.ax.ticklabel_format(useOffset=False, style="plain")
    except AttributeError:  # a non-scalar formatter (e.g. log norm): nothing to tidy
        pass


def _new_figure(figsize: tuple[float, float]) -> Figure:
    fig = Figure(figsize=figsize, layout="constrained")
    FigureCanvasAgg(fig)  # Agg canvas: drawing/saving never touches a GUI backend
    return fig


def _plain(text: Any) -> str:
    """Make a data string safe for matplotlib text (no accidental mathtext)."""
    return str(text).replace("$", r"\$")


def scatter_by_layer(ax, frame: pd.DataFrame, x: str, y: str) -> list:
    """Points of ``frame`` (x, y) coloured by layer on the plasma scale, a dashed zero line and a grid; the
    layers drawn (the head scatters of the ablation and changed-vs-needed sections share this look)."""
    cmap = mpl.colormaps["plasma"]
    layers = sorted(frame["layer"].unique())
    for i, layer in enumerate(layers):
        part = frame[frame["layer"] == layer]
        ax.scatter(part[x], part[y], s=16, color=cmap(0.85 * i / max(1, len(layers) - 1)), label=f"L{int(layer)}",
                   zorder=2)
    ax.axhline(0, color="#999999", linewidth=0.8, linestyle="--", zorder=1)
    ax.grid(True)
    return layers


def _label(metric: Any) -> str:
    return _plain(METRIC_LABELS.get(str(metric), str(metric)))


def _require(df: pd.DataFrame, columns: Iterable[str], what: str) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ValueError(f"{what}: missing column(s) {missing}; have {list(df.columns)}")


def _auto_fmt(values: np.ndarray) -> str:
    finite = values[np.isfinite(values)]
    if finite.size == 0:
        return ".2f"
    span = float(np.nanmax(np.abs(finite)))
    if span == 0:
        return ".2f"
    if span < 0.01:
        return ".1e"
    if span < 0.1:
        return ".3f"
    return ".2f"


def _ink_for(rgba: Sequence[float]) -> str:
    r, g, b = to_rgb(rgba)
    luminance = 0.2126 * r + 0.7152 * g + 0.0722 * b
    return "#111111" if luminance > 0.5 else "#ffffff"
