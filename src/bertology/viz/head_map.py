"""The head map figure: every head of both models as a point of the MDS embedding of their JS distances.

Like :mod:`bertology.viz.figures`, the function returns a :class:`~matplotlib.figure.Figure` built on
an Agg canvas inside the package's own ``rc_context`` (no pyplot, nothing shown, no global state).
"""
from __future__ import annotations

import matplotlib as mpl
import numpy as np
import pandas as pd
from matplotlib.colors import BoundaryNorm
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from bertology.viz.figures import _STYLE, _new_figure, _plain, _require, _tidy_colorbar

__all__ = ["head_map_figure"]

_MARK = {"base": "o", "tuned": "^"}
_DISTANCE = {"js_distance": "JS distance", "js_divergence": "JS divergence"}


def head_map_figure(
    table: pd.DataFrame,
    *,
    top_k: int = 8,
    title: str | None = None,
    cmap: str = "viridis",
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
    norm = BoundaryNorm(np.arange(lo - 0.5, hi + 1.5), mpl.colormaps[cmap].N)
    colormap = mpl.colormaps[cmap]
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
        span = max(np.ptp(table["x"].to_numpy()), np.ptp(table["y"].to_numpy()), 1e-12)
        for rank, key in enumerate(top):
            (x0, y0), (x1, y1) = base.loc[key, ["x", "y"]], tuned.loc[key, ["x", "y"]]
            ax.annotate("", xy=(x1, y1), xytext=(x0, y0), zorder=3,
                        arrowprops=dict(arrowstyle="-|>", color="#d1495b", lw=1.1, shrinkA=2, shrinkB=3,
                                        mutation_scale=9))
            # Label beyond the tuned end, away from the base point.
            dx, dy = x1 - x0, y1 - y0
            norm_len = float(np.hypot(dx, dy)) or 1.0
            off = 0.025 * span
            ax.annotate(_plain(f"L{key[0]}H{key[1]}"), xy=(x1, y1),
                        xytext=(x1 + off * dx / norm_len, y1 + off * dy / norm_len),
                        fontsize=7.5, fontweight="bold" if rank < 3 else "normal", color="#7a1f2b",
                        ha="left" if dx >= 0 else "right", va="bottom" if dy >= 0 else "top", zorder=4)
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
            handles.append(Line2D([], [], color="#d1495b", lw=1.1, label=f"top {len(top)} moved"))
        ax.legend(handles=handles, loc="best", fontsize=7.5)
        if sc is not None:
            cbar = fig.colorbar(sc, ax=ax, fraction=0.05, pad=0.02, aspect=30, ticks=layers)
            cbar.set_label("layer")
            _tidy_colorbar(cbar)
    return fig
