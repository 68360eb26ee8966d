"""Figures for the ``geometry`` and ``pca_views`` tables.

Like :mod:`bertology.viz.figures`, every function returns a :class:`~matplotlib.figure.Figure` built on
an Agg canvas inside the package's own ``rc_context`` (no pyplot, nothing shown, no global state).
Layers are ``0`` (embeddings) ``..N``.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import matplotlib as mpl
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from bertology.viz.style import _STYLE, _new_figure, _plain, _require

__all__ = ["GEOMETRY_LABELS", "geometry_figure", "pca_grid"]

#: Panel titles for the geometry metrics.
GEOMETRY_LABELS: dict[str, str] = {
    "anisotropy": "anisotropy (random-pair cosine)",
    "mev_baseline": "MEV of random tokens",
    "self_similarity": "self-similarity",
    "intra_similarity": "intra-sentence similarity",
    "mev": "max. explainable variance",
    "self_similarity_adjusted": "self-similarity − anisotropy",
    "intra_similarity_adjusted": "intra-sentence − anisotropy",
    "mev_adjusted": "MEV − random-token MEV",
}
#: Default panels: raw metrics on the first row, their anisotropy-adjusted versions below.
DEFAULT_METRICS = ("anisotropy", "self_similarity", "intra_similarity", "mev",
                   "mev_baseline", "self_similarity_adjusted", "intra_similarity_adjusted", "mev_adjusted")
_MODEL_STYLE = {"base": {"color": "#1f5aa6", "marker": "o"}, "tuned": {"color": "#d1495b", "marker": "s"}}
_OTHER_COLORS = ("#2a9d8f", "#e9a23b", "#6c4f9c", "#5c5c5c")
_CATEGORY_ORDER = ("special", "punct", "noun", "verb", "adj", "adv", "pron", "det", "adp", "conj", "num", "part",
                   "other", "word")


def geometry_figure(
    table: pd.DataFrame,
    *,
    metrics: Sequence[str] | None = None,
    ncols: int = 4,
    title: str | None = None,
    band: bool = False,
    min_span: float | None = 0.05,
) -> Figure:
    """Base vs tuned per layer, one panel per geometry metric (default: raw row, adjusted row).

    ``table`` is the ``geometry`` table (``model, layer, metric, value``; ``sd`` used when ``band``:
    a light band of +- one standard deviation over the averaged units). Models other than base/tuned
    (e.g. checkpoints) get their own colours. Metrics missing from the table are skipped; adjusted
    panels get a dashed zero line. ``min_span`` is the smallest y range drawn, so differences of a few
    thousandths are not blown up to fill a panel.
    """
    _require(table, ["model", "layer", "metric", "value"], "geometry_figure")
    if table.empty:
        raise ValueError("geometry_figure: the table has no rows")
    wanted = list(metrics) if metrics is not None else list(DEFAULT_METRICS)
    present = [m for m in wanted if (table["metric"] == m).any()]
    if not present:
        raise ValueError(f"geometry_figure: none of {wanted} is in the table")
    n = len(present)
    ncols = max(1, min(ncols, n))
    nrows = math.ceil(n / ncols)
    models = list(pd.unique(table["model"]))
    models.sort(key=lambda m: (m not in _MODEL_STYLE, list(_MODEL_STYLE).index(m) if m in _MODEL_STYLE else 0))
    with mpl.rc_context(_STYLE):
        fig = _new_figure((min(12.0, 2.7 * ncols + 0.6), 2.3 * nrows + 0.4))
        axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
        for ax, metric in zip(axes, present):
            part = table[table["metric"] == metric]
            for k, model in enumerate(models):
                g = part[part["model"] == model].groupby("layer", sort=True).mean(numeric_only=True)
                if g.empty:
                    continue
                style = _MODEL_STYLE.get(model, {"color": _OTHER_COLORS[k % len(_OTHER_COLORS)], "marker": "^"})
                xs, ys = g.index.to_numpy(dtype=float), g["value"].to_numpy(dtype=float)
                ax.plot(xs, ys, label=_plain(model), **style)
                if band and "sd" in g:
                    sd = np.nan_to_num(g["sd"].to_numpy(dtype=float))
                    ax.fill_between(xs, ys - sd, ys + sd, color=style["color"], alpha=0.12, linewidth=0)
            if metric.endswith("_adjusted"):
                ax.axhline(0.0, color="#999999", linewidth=0.8, linestyle="--", zorder=0)
            ax.set_title(_plain(GEOMETRY_LABELS.get(metric, metric)), loc="left", fontsize=9)
            ax.grid(True, axis="y")
            layers = np.sort(pd.unique(part["layer"].astype(int)))
            step = max(1, math.ceil(len(layers) / 13))
            ax.set_xticks(layers[::step])
            ax.set_xlabel("layer")
            ax.ticklabel_format(axis="y", useOffset=False, style="plain")
            y0, y1 = ax.get_ylim()
            if min_span is not None and y1 - y0 < min_span:
                mid = (y0 + y1) / 2
                ax.set_ylim(mid - min_span / 2, mid + min_span / 2)
        for ax in axes[n:]:
            ax.set_visible(False)
        handles = [Line2D([], [], label=_plain(m),
                          **_MODEL_STYLE.get(m, {"color": _OTHER_COLORS[k % len(_OTHER_COLORS)], "marker": "^"}))
                   for k, m in enumerate(models)]
        fig.legend(handles=handles, loc="outside upper right", ncols=len(handles))
        if title is not None:
            fig.suptitle(_plain(title), x=0.02, ha="left", fontsize=10, fontweight="bold")
    return fig


def _palette(values: Sequence[str]) -> dict[str, tuple]:
    cmap = mpl.colormaps["tab10" if len(values) <= 10 else "tab20"]
    return {v: cmap(i % cmap.N) for i, v in enumerate(values)}


def pca_grid(
    table: pd.DataFrame,
    *,
    fit: str = "shared",
    color_by: str = "category",
    layers: Sequence[int] | None = None,
    title: str | None = None,
    panel_size: float = 2.4,
    marker_size: float = 14.0,
    rasterize_above: int | None = 10000,
) -> Figure:
    """Grid of PCA views: one row per layer, one column per model (base, tuned), coloured by ``color_by``.

    ``table`` is the ``pca_views`` table; ``fit`` picks ``"shared"`` (both panels of a row share axes,
    so movement between models is visible) or ``"per_layer"`` (each panel its own PCA and axes).
    ``color_by`` is ``"category"`` (special / punctuation / part of speech) or ``"label"`` (the
    example's label); one legend for the whole grid. Panel titles give the explained variance of the
    two components. Above ``rasterize_above`` points in all, the points are drawn as one embedded
    image per panel (axes and text stay vector), which keeps the SVG small for the report.
    """
    _require(table, ["model", "layer", "fit", "x", "y", color_by, "explained_variance"], "pca_grid")
    sub = table[table["fit"] == fit]
    if sub.empty:
        raise ValueError(f"pca_grid: no rows with fit == {fit!r}")
    all_layers = sorted(int(l) for l in pd.unique(sub["layer"]))
    rows = all_layers if layers is None else [int(l) for l in layers if int(l) in all_layers]
    if not rows:
        raise ValueError(f"pca_grid: none of the layers {list(layers or [])} is in the table")
    models = [m for m in ("base", "tuned") if (sub["model"] == m).any()] or list(pd.unique(sub["model"]))
    values = sub[color_by].astype(object).where(sub[color_by].notna(), "none").astype(str)
    present = list(pd.unique(values))
    order = [c for c in _CATEGORY_ORDER if c in present] + sorted(c for c in present if c not in _CATEGORY_ORDER)
    colors = _palette(order)
    raster = rasterize_above is not None and int(sub["layer"].isin(rows).sum()) > rasterize_above
    with mpl.rc_context(_STYLE):
        fig = _new_figure((panel_size * len(models) + 1.4, panel_size * len(rows) + 0.5))
        axes = fig.subplots(len(rows), len(models), squeeze=False)
        for i, layer in enumerate(rows):
            for j, model in enumerate(models):
                ax = axes[i, j]
                mask = (sub["layer"] == layer) & (sub["model"] == model)
                part, vals = sub[mask], values[mask]
                for c in order:
                    sel = (vals == c).to_numpy()
                    if sel.any():
                        ax.scatter(part["x"].to_numpy()[sel], part["y"].to_numpy()[sel], s=marker_size,
                                   color=colors[c], alpha=0.8, linewidths=0, label=_plain(c), rasterized=raster)
                ev = part["explained_variance"].iloc[0] if len(part) else float("nan")
                ax.set_title(f"{_plain(model)} · layer {layer}  ({ev:.0%} var.)", loc="left", fontsize=8.5)
                ax.tick_params(labelsize=6.5, length=2)
                ax.set_aspect("equal", adjustable="box")
            if fit == "shared" and len(models) > 1:
                part = sub[sub["layer"] == layer]
                pad_x = 0.05 * (part["x"].max() - part["x"].min() or 1.0)
                pad_y = 0.05 * (part["y"].max() - part["y"].min() or 1.0)
                for ax in axes[i]:
                    ax.set_xlim(part["x"].min() - pad_x, part["x"].max() + pad_x)
                    ax.set_ylim(part["y"].min() - pad_y, part["y"].max() + pad_y)
        handles = [Line2D([], [], linestyle="", marker="o", color=colors[c], label=_plain(c)) for c in order]
        fig.legend(handles=handles, loc="outside right upper", title=_plain(color_by), fontsize=7.5)
        head = f"PCA of token representations ({'shared fit per layer' if fit == 'shared' else 'one fit per model and layer'})"
        fig.suptitle(_plain(title) if title is not None else head, x=0.02, ha="left", fontsize=10, fontweight="bold")
    return fig
