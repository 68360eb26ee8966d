"""Static matplotlib figures for the run tables.

Every function here *returns* a :class:`matplotlib.figure.Figure` and has no side effects: figures are
built with the object-oriented API on an Agg canvas (pyplot is never imported, nothing is shown, no
global rcParams are changed), so they are safe in scripts, notebooks, worker threads and the report
renderer alike. :func:`figure_to_svg` (:mod:`bertology.viz.svg`) turns a figure into compact SVG text (text kept as
``<text>``, no embedded glyphs) suitable for inlining into the offline HTML report; the house style and the helpers
every drawing module shares are in :mod:`bertology.viz.style`.

Conventions follow the run-directory contract: attention layers are ``1..N`` and drawn top to bottom,
heads are 0-based, representation layers are ``0`` (embeddings) ``..N``.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import matplotlib as mpl
import numpy as np
import pandas as pd
from matplotlib.colors import Normalize
from matplotlib.figure import Figure

from bertology.viz.style import (
    _MARKERS,
    _SPLIT_STYLE,
    _STYLE,
    METRIC_LABELS,
    _auto_fmt,
    _ink_for,
    _label,
    _new_figure,
    _plain,
    _require,
    _tidy_colorbar,
)
from bertology.viz.svg import figure_to_svg

__all__ = [
    "METRIC_LABELS",
    "ColourScale",
    "CurveStyle",
    "figure_to_svg",
    "head_heatmap",
    "layer_curve",
    "layer_matrix",
    "training_curve",
]


# --------------------------------------------------------------------------------------------- heatmaps


@dataclass(frozen=True)
class ColourScale:
    """How a heatmap's values map to colours: the colormap (None: the figure's own default), limits fixed by the
    caller (None: the data's), and the narrowest span the scale may show (None: any), so differences nobody should
    care about are not magnified."""

    cmap: str | None = None
    vmin: float | None = None
    vmax: float | None = None
    min_span: float | None = None

    def limits(self, values: np.ndarray) -> tuple[float, float]:
        """``(vmin, vmax)`` for ``values``: the fixed limits, else the finite data's; a constant or too narrow range
        widened away from a limit the caller fixed."""
        finite = values[np.isfinite(values)]
        lo = float(np.min(finite)) if finite.size else 0.0
        hi = float(np.max(finite)) if finite.size else 1.0
        fixed_lo, fixed_hi = self.vmin is not None, self.vmax is not None
        vmin = lo if self.vmin is None else self.vmin
        vmax = hi if self.vmax is None else self.vmax
        min_span = self.min_span
        if vmax <= vmin:
            # Constant data (e.g. identical models). Widen away from a limit the caller fixed, so that
            # "all cosine = 1 with vmax=1" is drawn in the colour of 1, not in the middle of the map.
            if fixed_hi and not fixed_lo:
                vmin = vmax - 1.0
            elif fixed_lo and not fixed_hi:
                vmax = vmin + 1.0
            else:
                vmin, vmax = vmin - 0.5, vmax + 0.5
        if min_span is not None and vmax - vmin < min_span:
            # Do not let the colour scale magnify differences nobody should care about (1e-5 in CKA).
            if fixed_hi and not fixed_lo:
                vmin = vmax - min_span
            elif fixed_lo and not fixed_hi:
                vmax = vmin + min_span
            elif not (fixed_lo or fixed_hi):
                mid = (vmin + vmax) / 2
                vmin, vmax = mid - min_span / 2, mid + min_span / 2
        return vmin, vmax


def _grid_heatmap(ax, matrix: pd.DataFrame, scale: ColourScale, *, annotate: bool | None, fmt: str | None,
                  max_annotated: int = 200):
    """``matrix`` as a grid of coloured cells on ``ax`` (first row on top, NaN grey), its values written in the
    cells when ``annotate`` (None: when there are at most ``max_annotated``); returns the mesh (for a colour bar)."""
    values = matrix.to_numpy(dtype=float)
    vmin, vmax = scale.limits(values)
    norm = Normalize(vmin=vmin, vmax=vmax)
    cm = mpl.colormaps[scale.cmap or "viridis"].with_extremes(bad="#eeeeee")
    n_rows, n_cols = values.shape
    mesh = ax.pcolormesh(
        np.ma.masked_invalid(values),
        cmap=cm,
        norm=norm,
        edgecolors="white",
        linewidth=0.6 if max(n_rows, n_cols) <= 16 else (0.3 if max(n_rows, n_cols) <= 32 else 0.0),
    )
    if values.size > 400:
        mesh.set_rasterized(True)  # one small PNG instead of hundreds of SVG paths
    ax.set_xlim(0, n_cols)
    ax.set_ylim(n_rows, 0)  # first row on top
    ax.set_aspect("auto")
    for side in ("top", "right", "left", "bottom"):
        ax.spines[side].set_visible(False)
    ax.tick_params(length=0)
    step_c = max(1, math.ceil(n_cols / 24))
    step_r = max(1, math.ceil(n_rows / 24))
    ax.set_xticks(np.arange(0, n_cols, step_c) + 0.5)
    ax.set_xticklabels([_plain(c) for c in list(matrix.columns)[::step_c]])
    ax.set_yticks(np.arange(0, n_rows, step_r) + 0.5)
    ax.set_yticklabels([_plain(r) for r in list(matrix.index)[::step_r]])
    if annotate is None:
        annotate = values.size <= max_annotated
    if annotate:
        _write_values(ax, values, lambda v: cm(norm(v)), fmt or _auto_fmt(values))
    return mesh


def _write_values(ax, values: np.ndarray, colour_of, fmt: str) -> None:
    """Each finite value written in its cell, in ink that reads on the cell's colour (``colour_of(value)``)."""
    n_rows, n_cols = values.shape
    size = 7.0 if max(n_rows, n_cols) <= 8 else (6.0 if max(n_rows, n_cols) <= 12 else 5.0)
    if n_cols > 8 and fmt.startswith(".3"):
        size -= 0.5
    for i in range(n_rows):
        for j in range(n_cols):
            v = values[i, j]
            if not np.isfinite(v):
                continue
            ax.text(
                j + 0.5,
                i + 0.5,
                format(v, fmt),
                ha="center",
                va="center",
                fontsize=size,
                color=_ink_for(colour_of(v)),
            )


# ------------------------------------------------------------------------------------------- figures
def head_heatmap(
    df: pd.DataFrame,
    value: str = "cosine",
    *,
    title: str | None = None,
    scale: ColourScale = ColourScale(),
    annotate: bool | None = None,
    fmt: str | None = None,
    colorbar_label: str | None = None,
) -> Figure:
    """Heatmap of one per-head quantity: attention layers as rows (1..N, top to bottom), heads as columns.

    Parameters
    ----------
    df
        Long-form table with columns ``layer``, ``head`` and *value* (e.g. ``attention_change``).
        Duplicate ``(layer, head)`` rows are averaged; missing cells are drawn light grey.
    value
        Column to colour by (``"cosine"``, ``"js_divergence"``, ``"importance"``, ...).
    scale
        How values map to colours (:class:`ColourScale`): the Matplotlib colormap (default ``"magma"`` for
        ``cosine``, low = changed = dark, and ``"magma_r"`` otherwise, high = changed = dark); the colour limits
        ``vmin``, ``vmax`` (default: the data range); ``min_span``, the smallest colour range: a free limit is
        widened to reach it, so tiny differences between almost identical models are not drawn as if they were
        large. E.g. ``scale=ColourScale(vmax=1.0, min_span=0.1)``.
    annotate
        Write the value in every cell; default: only when the grid has at most 200 cells.
    fmt
        Format spec for annotations (default chosen from the data's magnitude).
    """
    _require(df, ["layer", "head", value], "head_heatmap")
    matrix = _layer_head_matrix(df, value, "head_heatmap")
    scale = replace(scale, cmap=scale.cmap or ("magma" if value == "cosine" else "magma_r"))

    n_rows, n_cols = matrix.shape
    # Sized to be shown 1:1 in half of the report's column (about 4.8 in); bigger grids shrink.
    width = min(9.0, max(3.8, 0.27 * n_cols + 1.35))
    height = min(9.0, max(2.2, 0.27 * n_rows + 0.95))
    with mpl.rc_context(_STYLE):
        fig, _ = _layer_head_figure(
            matrix, (width, height),
            title=_plain(title) if title is not None else _label(value),
            colorbar_label=_plain(colorbar_label) if colorbar_label else _label(value),
            scale=scale, annotate=annotate, fmt=fmt,
        )
    return fig


def _layer_head_matrix(df: pd.DataFrame, value: str, what: str) -> pd.DataFrame:
    """``value`` as a layer x head grid (duplicate cells averaged) with every layer and head of the range.

    A layer or head missing from the table stays in as a row or column of NaN (drawn grey), so the
    grid never silently skips one. ``what`` names the figure in the error for an empty table.
    """
    matrix = (
        df.pivot_table(index="layer", columns="head", values=value, aggfunc="mean")
        .sort_index(axis=0)
        .sort_index(axis=1)
    )
    if matrix.empty:
        raise ValueError(f"{what}: the table has no rows")
    layers = range(int(matrix.index.min()), int(matrix.index.max()) + 1)
    heads = range(int(matrix.columns.min()), int(matrix.columns.max()) + 1)
    return matrix.reindex(index=list(layers), columns=list(heads))


def _layer_head_figure(
    matrix: pd.DataFrame, size: tuple[float, float], *, title: str, colorbar_label: str, **grid: Any
) -> tuple[Figure, Any]:
    """A layer x head heatmap with its axis labels, title and colour bar; ``grid`` goes to :func:`_grid_heatmap`.

    Call it inside ``rc_context(_STYLE)``. Returns the figure and the heatmap's axes, on which a
    caller may draw more (the ablation heatmap outlines its significant cells).
    """
    fig = _new_figure(size)
    ax = fig.add_subplot()
    mesh = _grid_heatmap(ax, matrix, **grid)
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title(title, loc="left")
    cbar = fig.colorbar(mesh, ax=ax, fraction=0.06, pad=0.02, aspect=25)
    cbar.set_label(colorbar_label)
    _tidy_colorbar(cbar)
    return fig, ax


@dataclass(frozen=True)
class CurveStyle:
    """The axes of a :func:`layer_curve`: labels, y range, reference line, error band limits, order of lines and panels.

    *ylim* fixes the y range; otherwise *min_span* is the smallest y range shown, so near-identical
    models do not look dramatically different. *reference* draws a dashed horizontal line (e.g.
    ``1.0`` for "unchanged"; a mapping gives one value per facet). *err_clip* clips the error band
    (e.g. ``(0, 1)`` for bounded metrics). *sharey*: one y axis for all panels. *hue_order* and
    *facet_order* pick and order the lines and the panels (None: in table order).
    """

    xlabel: str | None = None
    ylabel: str | None = None
    ylim: tuple[float | None, float | None] | None = None
    min_span: float | None = None
    reference: float | Mapping[Any, float] | None = None
    err_clip: tuple[float, float] | None = None
    sharey: bool = False
    hue_order: Sequence[Any] | None = None
    facet_order: Sequence[Any] | None = None


def layer_curve(
    df_by_layer: pd.DataFrame,
    *,
    x: str = "layer",
    y: str = "value",
    hue: str | None = "metric",
    facet: str | None = None,
    err: str | None = None,
    title: str | None = None,
    style: CurveStyle = CurveStyle(),
) -> Figure:
    """Per-layer line plot from a long-form table.

    One line per value of *hue* (e.g. the four similarity metrics on the same-layer diagonal), and
    optionally one panel per value of *facet* (e.g. mean cosine and mean JS per layer side by side,
    which live on different scales). *err* names a column with a symmetric spread (e.g. the std over
    heads) drawn as a light band. *style* sets the axes and the order of lines and panels
    (:class:`CurveStyle`). Duplicate
    ``(facet, hue, x)`` rows are averaged.
    """
    cols = [x, y] + [c for c in (hue, facet, err) if c is not None]
    _require(df_by_layer, cols, "layer_curve")
    if df_by_layer.empty:
        raise ValueError("layer_curve: the table has no rows")
    data = df_by_layer[cols].copy()
    facets: list[Any] = [None]
    if facet is not None:
        facets = list(style.facet_order) if style.facet_order is not None else list(pd.unique(data[facet]))
    n = len(facets)
    width = min(9.6, 3.3 * n + 0.4) if n > 1 else 6.4
    with mpl.rc_context(_STYLE):
        fig = _new_figure((width, 2.9))
        axes = fig.subplots(1, n, squeeze=False, sharey=style.sharey)[0]
        for ax, fv in zip(axes, facets):
            part = data if fv is None else data[data[facet] == fv]
            if hue is None:
                groups: list[tuple[Any, pd.DataFrame]] = [(None, part)]
            else:
                order = list(style.hue_order) if style.hue_order is not None else list(pd.unique(part[hue]))
                groups = [(h, part[part[hue] == h]) for h in order if (part[hue] == h).any()]
            for i, (hv, g) in enumerate(groups):
                _curve_line(ax, g, i, hv, x=x, y=y, err=err, err_clip=style.err_clip)
            ref = style.reference.get(fv) if isinstance(style.reference, Mapping) else style.reference
            if ref is not None:
                ax.axhline(ref, color="#999999", linewidth=0.8, linestyle="--", zorder=0)
            ax.grid(True, axis="y")
            ax.set_xlabel(_plain(style.xlabel) if style.xlabel is not None else _plain(x))
            _integer_xticks(ax, part[x])
            if fv is not None:
                ax.set_title(_label(fv), loc="left")
            if style.ylabel is not None:
                ax.set_ylabel(_plain(style.ylabel))
            ax.ticklabel_format(axis="y", useOffset=False, style="plain")
            _fit_ylim(ax, style, ref)
            if hue is not None and len(groups) > 1:
                # Outside the axes: lines that overlap (e.g. identical models) stay visible.
                ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), handlelength=1.8)
        if title is not None:
            if n == 1 and facets[0] is None:
                axes[0].set_title(_plain(title), loc="left")
            else:
                fig.suptitle(_plain(title), x=0.02, ha="left", fontsize=10, fontweight="bold")
    return fig


def _curve_line(ax, g: pd.DataFrame, i: int, hv: Any, *, x: str, y: str, err: str | None,
                err_clip: tuple[float, float] | None) -> None:
    """The ``i``-th line of a :func:`layer_curve` panel (hue value ``hv``): mean of ``y`` per ``x``, with its band."""
    agg = g.groupby(x, sort=True).mean(numeric_only=True)
    xs = agg.index.to_numpy(dtype=float)
    ys = agg[y].to_numpy(dtype=float)
    color = _STYLE["axes.prop_cycle"].by_key()["color"][i % 6]
    label = _label(hv) if hv is not None else None
    ax.plot(xs, ys, marker=_MARKERS[i % len(_MARKERS)], color=color, label=label,
            markersize=4.5 if i else 4.0)
    if err is not None and err in agg:
        e = np.nan_to_num(agg[err].to_numpy(dtype=float))
        lo, hi = ys - e, ys + e
        if err_clip is not None:
            lo, hi = np.clip(lo, *err_clip), np.clip(hi, *err_clip)
        ax.fill_between(xs, lo, hi, color=color, alpha=0.15, linewidth=0)


def _integer_xticks(ax, values: pd.Series) -> None:
    """Label integer x values (layers) as integers, at most 13 of them."""
    xs_all = np.sort(pd.unique(values.astype(float)))
    if xs_all.size and np.allclose(xs_all, np.round(xs_all)):
        step = max(1, math.ceil(xs_all.size / 13))
        ticks = xs_all[::step]
        ax.set_xticks(ticks)
        ax.set_xticklabels([str(int(v)) for v in ticks])


def _fit_ylim(ax, style: CurveStyle, ref: float | None) -> None:
    """Set ``style.ylim``, or widen a y range narrower than ``style.min_span`` (towards the reference line)."""
    if style.ylim is not None:
        ax.set_ylim(*style.ylim)
    elif style.min_span is not None:
        min_span = style.min_span
        y0, y1 = ax.get_ylim()
        if y1 - y0 < min_span:
            pad = 0.04 * min_span
            if ref is not None and ref >= y1 - pad:  # data hangs below the reference
                ax.set_ylim(ref - min_span, ref + pad)
            elif ref is not None and ref <= y0 + pad:  # data sits above the reference
                ax.set_ylim(ref - pad, ref + min_span)
            else:
                mid = (y0 + y1) / 2
                ax.set_ylim(mid - min_span / 2, mid + min_span / 2)


def layer_matrix(
    df: pd.DataFrame,
    metric: str,
    *,
    title: str | None = None,
    scale: ColourScale = ColourScale("viridis"),
    annotate: bool | None = None,
    fmt: str | None = None,
    axis_labels: tuple[str, str] = ("base layer", "tuned layer"),
) -> Figure:
    """``layer_base`` x ``layer_tuned`` heatmap of one metric from ``representation_similarity``.

    Rows are base layers (0 = embeddings, top), columns are tuned layers; the diagonal is
    "same layer". Duplicate cells (e.g. several seeds) are averaged. *axis_labels*: the rows' and
    the columns' axis titles. *scale* (:class:`ColourScale`; colormap ``"viridis"`` unless it names one),
    *annotate* and *fmt* as in :func:`head_heatmap`.
    """
    _require(df, ["layer_base", "layer_tuned", "metric", "value"], "layer_matrix")
    sub = df[df["metric"] == metric]
    if sub.empty:
        raise ValueError(f"layer_matrix: no rows with metric == {metric!r}")
    matrix = (
        sub.pivot_table(index="layer_base", columns="layer_tuned", values="value", aggfunc="mean")
        .sort_index(axis=0)
        .sort_index(axis=1)
    )
    n_rows, n_cols = matrix.shape
    side = min(4.1, max(3.0, 0.36 * max(n_rows, n_cols) + 1.2))
    with mpl.rc_context(_STYLE):
        fig = _new_figure((side + 0.75, side))
        ax = fig.add_subplot()
        mesh = _grid_heatmap(ax, matrix, replace(scale, cmap=scale.cmap or "viridis"), annotate=annotate, fmt=fmt,
                             max_annotated=170)
        ax.set_aspect("equal")
        ax.set_xlabel(_plain(axis_labels[1]))
        ax.set_ylabel(_plain(axis_labels[0]))
        ax.set_title(_plain(title) if title is not None else _label(metric), loc="left")
        cbar = fig.colorbar(mesh, ax=ax, fraction=0.05, pad=0.03, aspect=25, shrink=0.9)
        cbar.set_label(_label(metric))
        _tidy_colorbar(cbar)
    return fig


def training_curve(
    df_finetune: pd.DataFrame,
    *,
    metrics: Sequence[str] | None = None,
    x: str = "step",
    title: str | None = None,
) -> Figure:
    """Fine-tuning curves: one panel per metric, one line per split (train faint, eval with markers).

    *df_finetune* has columns ``step, epoch, split, metric, value``. *metrics* picks and orders the
    panels (default: ``loss`` first, then the rest in table order; at most six).
    """
    _require(df_finetune, [x, "split", "metric", "value"], "training_curve")
    if df_finetune.empty:
        raise ValueError("training_curve: the table has no rows")
    present = list(pd.unique(df_finetune["metric"]))
    if metrics is None:
        metrics = (["loss"] if "loss" in present else []) + [m for m in present if m != "loss"]
    metrics = [m for m in metrics if m in present][:6]
    if not metrics:
        raise ValueError("training_curve: none of the requested metrics are in the table")
    n = len(metrics)
    ncols = min(n, 3)
    nrows = math.ceil(n / ncols)
    with mpl.rc_context(_STYLE):
        fig = _new_figure((min(9.6, 3.0 * ncols + 0.4), 2.6 * nrows))
        axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
        colors = {"train": "#1f5aa6", "eval": "#d1495b"}
        for ax, metric in zip(axes, metrics):
            part = df_finetune[df_finetune["metric"] == metric]
            for k, split in enumerate(pd.unique(part["split"])):
                g = part[part["split"] == split].groupby(x, sort=True)["value"].mean()
                style = dict(_SPLIT_STYLE.get(str(split), {"linestyle": "--"}))
                ax.plot(
                    g.index.to_numpy(dtype=float),
                    g.to_numpy(dtype=float),
                    color=colors.get(str(split), _STYLE["axes.prop_cycle"].by_key()["color"][(k + 2) % 6]),
                    label=_plain(split),
                    **style,
                )
            ax.set_title(_label(metric), loc="left")
            ax.set_xlabel(_plain(x))
            ax.grid(True, axis="y")
            if part["split"].nunique() > 1 or ax is axes[0]:
                ax.legend(loc="best")
        for ax in axes[n:]:
            ax.set_visible(False)
        if title is not None:
            fig.suptitle(_plain(title), x=0.02, ha="left", fontsize=10, fontweight="bold")
    return fig
