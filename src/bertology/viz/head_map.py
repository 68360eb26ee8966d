"""The head map figure: every head of both models as a point of the MDS embedding of their JS distances.

Like :mod:`bertology.viz.figures`, the function returns a :class:`~matplotlib.figure.Figure` built on
an Agg canvas inside the package's own ``rc_context`` (no pyplot, nothing shown, no global state).
"""
from __future__ import annotations

import matplotlib as mpl
import numpy as np
import pandas as pd
from matplotlib.colors import BoundaryNorm, ListedColormap
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from bertology.viz.style import _STYLE, _new_figure, _plain, _require, _tidy_colorbar

__all__ = ["head_map_figure"]

_MARK = {"base": "o", "tuned": "^"}
_DISTANCE = {"js_distance": "JS distance", "js_divergence": "JS divergence",
             "clark2019": "summed smoothed JS divergence, Clark et al."}


def head_map_figure(
    table: pd.DataFrame,
    *,
    top_k: int = 8,
    title: str | None = None,
    cmap: str = "plasma",
    figsize: tuple[float, float] = (6.4, 5.4),
) -> Figure:
    """Scatter of the ``head_map`` table: base heads as circles, tuned heads as triangles, coloured by layer.

    A thin line joins each head's base and tuned points; the ``top_k`` heads with the largest ``moved``
    (only those that moved at all) get an arrow and an ``L{layer}H{head}`` label. Axes are equal, so
    on-screen distance is map distance.
    """
    _require(table, ["model", "layer", "head", "x", "y", "moved"], "head_map_figure")
    if table.empty:
        raise ValueError("head_map_figure: the table has no rows")
    layers = np.sort(table["layer"].unique())
    lo, hi = int(layers.min()), int(layers.max())
    norm = BoundaryNorm(np.arange(lo - 0.5, hi + 1.5), hi - lo + 1)
    # Sequential colours without the lightest end, which vanishes on white.
    colormap = ListedColormap(mpl.colormaps[cmap](np.linspace(0.0, 0.85, hi - lo + 1)))
    base = table[table["model"] == "base"].set_index(["layer", "head"]).sort_index()
    tuned = table[table["model"] == "tuned"].set_index(["layer", "head"]).sort_index()
    both = base.index.intersection(tuned.index)
    moved = base.loc[both, "moved"].sort_values(ascending=False, kind="stable")
    top = [key for key in moved.index[:top_k] if moved[key] > 0]

    with mpl.rc_context(_STYLE):
        fig = _new_figure(figsize)
        ax = fig.add_subplot()
        # Base -> tuned segments first, under the points.
        for key in both:
            (x0, y0), (x1, y1) = base.loc[key, ["x", "y"]], tuned.loc[key, ["x", "y"]]
            ax.plot([x0, x1], [y0, y1], color="#9a9a9a", lw=0.6, alpha=0.7, zorder=1)
        sc = None
        for model, part in (("base", base), ("tuned", tuned)):
            if part.empty:
                continue
            sc = ax.scatter(part["x"], part["y"], c=part.index.get_level_values("layer"), cmap=colormap, norm=norm,
                            marker=_MARK[model], s=30 if model == "base" else 38, edgecolors="white",
                            linewidths=0.5, alpha=0.9, zorder=2)
        for key in top:
            (x0, y0), (x1, y1) = base.loc[key, ["x", "y"]], tuned.loc[key, ["x", "y"]]
            ax.annotate("", xy=(x1, y1), xytext=(x0, y0), zorder=3,
                        arrowprops=dict(arrowstyle="-|>", color="#1a1a1a", lw=1.0, shrinkA=2, shrinkB=3,
                                        mutation_scale=9))
        ax.set_aspect("equal", adjustable="datalim")
        ax.set_xlabel("MDS 1")
        ax.set_ylabel("MDS 2")
        ax.tick_params(labelsize=7)
        if title is None:
            dist = _DISTANCE.get(str(table["distance"].iloc[0]), "JS distance") if "distance" in table else "JS distance"
            title = f"Head map ({dist}, MDS"
            if "stress" in table:
                title += f", stress {float(table['stress'].iloc[0]):.2f}"
            title += ")"
        ax.set_title(_plain(title), loc="left")
        handles = [Line2D([], [], ls="", marker=_MARK[m], color="#555555", markersize=6, label=m) for m in ("base", "tuned")]
        if top:
            handles.append(Line2D([], [], color="#1a1a1a", lw=1.0, label=f"top {len(top)} moved"))
        ax.legend(handles=handles, loc="best", fontsize=7.5)
        if top:
            _place_labels(fig, ax, table[["x", "y"]].to_numpy(),
                          [(f"L{key[0]}H{key[1]}", tuned.loc[key, ["x", "y"]].to_numpy(float),
                            base.loc[key, ["x", "y"]].to_numpy(float)) for key in top])
        if sc is not None:
            cbar = fig.colorbar(sc, ax=ax, fraction=0.05, pad=0.02, aspect=30, ticks=layers)
            cbar.set_label("layer")
            _tidy_colorbar(cbar)
    return fig


def _place_labels(fig: Figure, ax, points: np.ndarray, labels: list[tuple[str, np.ndarray, np.ndarray]]) -> None:
    """Put each label next to its point where it covers no other label and as few points as possible.

    Greedy, in display space (after one draw so the axes are final): eight positions around the point,
    the one pointing away from the base point tried first.
    """
    fig.canvas.draw()
    to_px = ax.transData.transform
    pts = to_px(points)
    r_pt = fig.dpi / 72.0  # pixels per point
    placed: list[tuple[float, float, float, float]] = []
    directions = [(np.cos(a), np.sin(a)) for a in np.deg2rad(np.arange(0, 360, 45))]
    for rank, (text, xy, start) in enumerate(labels):
        px, away = to_px(xy), to_px(xy) - to_px(start)
        w, h = (len(text) * 4.6 + 4) * r_pt, 10 * r_pt
        order = sorted(directions, key=lambda d: -(d[0] * away[0] + d[1] * away[1]))
        best, best_cost = None, None
        for dx, dy in order:
            off = 7 * r_pt
            cx, cy = px[0] + dx * (off + w / 2), px[1] + dy * (off + h / 2)
            box = (cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2)
            clash = sum(not (box[2] < b[0] or box[0] > b[2] or box[3] < b[1] or box[1] > b[3]) for b in placed)
            covered = int(np.sum((pts[:, 0] > box[0] - 3) & (pts[:, 0] < box[2] + 3) & (pts[:, 1] > box[1] - 3)
                                 & (pts[:, 1] < box[3] + 3)))
            cost = 100 * clash + covered
            if best_cost is None or cost < best_cost:
                best, best_cost = (dx, dy, box, cx, cy), cost
            if cost == 0:
                break
        dx, dy, box, cx, cy = best
        placed.append(box)
        ax.annotate(_plain(text), xy=tuple(xy), xytext=((cx - px[0]) / r_pt, (cy - px[1]) / r_pt),
                    textcoords="offset points", ha="center", va="center", fontsize=7.5,
                    fontweight="bold" if rank < 3 else "normal", color="#111111", zorder=4,
                    bbox=dict(boxstyle="round,pad=0.15", fc="white", ec="none", alpha=0.75))
