"""Figures of the attention pattern classes: class mix per layer (base vs tuned) and map thumbnails.

Like :mod:`bertology.viz.figures`, figure functions return a :class:`~matplotlib.figure.Figure` on an
Agg canvas inside the package's own ``rc_context`` (no pyplot, nothing shown, no global state).
:func:`thumbnail_png` renders one map as PNG bytes for the labelling export (no figure, fast).
"""
from __future__ import annotations

import io
from collections.abc import Sequence

import matplotlib as mpl
import numpy as np
import pandas as pd
from matplotlib.colors import to_rgba
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle

from bertology.metrics.patterns import PATTERNS
from bertology.viz.style import _STYLE, _ink_for, _new_figure, _plain, _require

__all__ = ["PATTERN_COLORS", "map_grid_figure", "pattern_heads_figure", "pattern_mix_figure", "thumbnail_png", "thumbnail_rgb"]

#: One colour per pattern class (colour-blind friendly; heterogeneous in grey).
PATTERN_COLORS: dict[str, str] = {
    "vertical": "#1f5aa6",
    "diagonal": "#d1495b",
    "vertical+diagonal": "#6c4f9c",
    "block": "#e9a23b",
    "heterogeneous": "#b5b5b5",
}
_MODELS = ("base", "tuned")


def pattern_mix_figure(
    table: pd.DataFrame,
    *,
    models: Sequence[str] | None = None,
    title: str | None = None,
    figsize: tuple[float, float] | None = None,
) -> Figure:
    """Stacked bars of the class mix per layer, one panel per model (base and tuned side by side).

    ``table`` is the ``attention_patterns`` table (``model, layer, head, pattern, fraction``; heads are
    averaged) or its :func:`~bertology.analyses.attention_patterns.layer_mix` (``model, layer,
    pattern, fraction``). Layers run bottom (1) to top (N); bars are horizontal and add up to 1.
    """
    _require(table, ["model", "layer", "pattern", "fraction"], "pattern_mix_figure")
    if table.empty:
        raise ValueError("pattern_mix_figure: the table has no rows")
    mix = table.groupby(["model", "layer", "pattern"], as_index=False)["fraction"].mean()
    present = list(pd.unique(mix["model"]))
    if models is None:
        models = [m for m in _MODELS if m in present] + [m for m in present if m not in _MODELS]
    patterns = list(PATTERNS) + [p for p in pd.unique(mix["pattern"]) if p not in PATTERNS]
    layers = np.sort(mix["layer"].unique())
    n = len(models)
    if figsize is None:
        figsize = (3.2 * n + 1.6, 0.32 * len(layers) + 1.3)
    with mpl.rc_context(_STYLE):
        fig = _new_figure(figsize)
        axes = fig.subplots(1, n, sharey=True, squeeze=False)[0]
        for ax, model in zip(axes, models):
            wide = (
                mix[mix["model"] == model]
                .pivot(index="layer", columns="pattern", values="fraction")
                .reindex(index=layers, columns=patterns)
                .fillna(0.0)
            )
            left = np.zeros(len(layers))
            for p in patterns:
                vals = wide[p].to_numpy()
                ax.barh(layers, vals, left=left, height=0.8, color=PATTERN_COLORS.get(p, "#5c5c5c"),
                        label=_plain(p), edgecolor="white", linewidth=0.4)
                left += vals
            ax.set_xlim(0, 1)
            ax.set_title(_plain(model))
            ax.set_xlabel("fraction of maps (mean over heads)")
            ax.set_yticks(layers)
        axes[0].set_ylabel("layer")
        handles, labels = axes[0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="outside lower center", ncols=len(patterns))
        if title:
            fig.suptitle(_plain(title))
    return fig


def pattern_heads_figure(
    table: pd.DataFrame,
    *,
    models: Sequence[str] | None = None,
    title: str | None = None,
    figsize: tuple[float, float] | None = None,
) -> Figure:
    """Every head's most frequent pattern, one layers x heads grid per model (base and tuned).

    ``table`` is the ``attention_patterns`` table. A cell's colour is its dominant pattern, its
    opacity and number the percentage of examples with that pattern. In the second and later panels,
    heads whose dominant pattern differs from the first panel's are outlined in black.
    """
    _require(table, ["model", "layer", "head", "pattern", "fraction"], "pattern_heads_figure")
    if table.empty:
        raise ValueError("pattern_heads_figure: the table has no rows")
    order = {p: i for i, p in enumerate(PATTERNS)}
    t = table.assign(_p=table["pattern"].map(order).fillna(len(order)))
    t = t.sort_values(["model", "layer", "head", "fraction", "_p"], ascending=[True, True, True, False, True])
    dom = t.groupby(["model", "layer", "head"], as_index=False).first()
    present = list(pd.unique(dom["model"]))
    if models is None:
        models = [m for m in _MODELS if m in present] + [m for m in present if m not in _MODELS]
    layers = np.sort(dom["layer"].unique())
    heads = np.sort(dom["head"].unique())
    n = len(models)
    if figsize is None:
        figsize = (max(3.0, 0.36 * len(heads) + 0.8) * n + 0.4, 0.36 * len(layers) + 1.5)
    first = dom[dom["model"] == models[0]].set_index(["layer", "head"])["pattern"]
    with mpl.rc_context(_STYLE):
        fig = _new_figure(figsize)
        axes = fig.subplots(1, n, sharey=True, squeeze=False)[0]
        for k, (ax, model) in enumerate(zip(axes, models)):
            d = dom[dom["model"] == model].set_index(["layer", "head"])
            rgba = np.ones((len(layers), len(heads), 4))
            for i, layer in enumerate(layers):
                for j, h in enumerate(heads):
                    if (layer, h) not in d.index:
                        continue
                    row = d.loc[(layer, h)]
                    r, g, b, _ = to_rgba(PATTERN_COLORS.get(row["pattern"], "#5c5c5c"))
                    alpha = 0.25 + 0.75 * float(row["fraction"])
                    rgba[i, j] = (1 - alpha + alpha * r, 1 - alpha + alpha * g, 1 - alpha + alpha * b, 1.0)
                    if len(heads) <= 16:
                        ax.text(j, i, f"{100 * float(row['fraction']):.0f}", ha="center", va="center",
                                fontsize=5.5, color=_ink_for(rgba[i, j]))
                    if k > 0 and (layer, h) in first.index and first.loc[(layer, h)] != row["pattern"]:
                        ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, edgecolor="black", linewidth=1.2))
            ax.imshow(rgba, origin="lower", aspect="equal", interpolation="nearest")
            ax.set_xticks(range(len(heads)), [str(h) for h in heads])
            ax.set_yticks(range(len(layers)), [str(layer) for layer in layers])
            ax.set_xlabel("head")
            ax.set_title(_plain(model))
            ax.tick_params(length=0)
            for side in ("left", "bottom"):
                ax.spines[side].set_visible(False)
        axes[0].set_ylabel("layer")
        handles = [Patch(color=PATTERN_COLORS[p], label=p) for p in PATTERNS]
        fig.legend(handles=handles, loc="outside lower center", ncols=len(PATTERNS))
        if title:
            fig.suptitle(_plain(title))
    return fig


def thumbnail_rgb(image: np.ndarray, *, scale: int = 1, cmap: str = "viridis") -> np.ndarray:
    """RGB ``uint8`` image of one map, coloured from 0 to the map's maximum, each cell ``scale`` px wide."""
    a = np.asarray(image, dtype=np.float64)
    top = float(a.max()) if a.size else 0.0
    norm = a / top if top > 0 else np.zeros_like(a)
    rgb = (mpl.colormaps[cmap](norm)[..., :3] * 255).round().astype(np.uint8)
    if scale > 1:
        rgb = rgb.repeat(scale, 0).repeat(scale, 1)
    return rgb


def thumbnail_png(image: np.ndarray, *, scale: int = 4, cmap: str = "viridis") -> bytes:
    """PNG bytes of :func:`thumbnail_rgb` (for the export's ``maps/<id>.png``)."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(thumbnail_rgb(image, scale=scale, cmap=cmap)).save(buf, format="PNG", optimize=False)
    return buf.getvalue()


def map_grid_figure(
    maps: Sequence[np.ndarray],
    titles: Sequence[str] | None = None,
    *,
    ncols: int = 8,
    cmap: str = "viridis",
    panel: float = 1.3,
    title: str | None = None,
) -> Figure:
    """A grid of attention maps (each coloured 0..its max), e.g. examples of every pattern class."""
    if len(maps) == 0:
        raise ValueError("map_grid_figure: no maps")
    ncols = max(1, min(ncols, len(maps)))
    nrows = -(-len(maps) // ncols)
    with mpl.rc_context(_STYLE):
        fig = _new_figure((panel * ncols, (panel + 0.25) * nrows + (0.3 if title else 0)))
        axes = fig.subplots(nrows, ncols, squeeze=False)
        for i, ax in enumerate(axes.ravel()):
            ax.set_axis_off()
            if i >= len(maps):
                continue
            ax.imshow(thumbnail_rgb(maps[i], cmap=cmap), interpolation="nearest")
            if titles is not None:
                ax.set_title(_plain(titles[i]), fontsize=6.5, fontweight="normal")
        if title:
            fig.suptitle(_plain(title))
    return fig
