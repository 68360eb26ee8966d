"""The activation-difference lens's figure: the mean difference's norm by layer, one line per position bucket.

The norm is shown relative to the base model's root mean squared activation norm at the layer (``relative_norm``),
so layers whose scales differ compare; the left panel is the norm, the right the cosine of the mean difference to
the base's mean activation. Returns a :class:`~matplotlib.figure.Figure` on an Agg canvas, like
:mod:`bertology.viz.figures`.
"""
from __future__ import annotations

import matplotlib as mpl
import pandas as pd
from matplotlib.figure import Figure

from bertology.viz.style import _STYLE, _new_figure, _require

__all__ = ["difference_by_layer"]

#: Bucket -> (label, colour, line style).
_BUCKETS = {"content": ("content tokens", "#4c72b0", "-"), "position_0": ("position 0 ([CLS])", "#dd8452", "--"),
            "first": ("first positions", "#55a868", ":"), "rest": ("later positions", "#8172b2", "-.")}


def difference_by_layer(table: pd.DataFrame) -> Figure:
    """Two panels over layers 0..N: ``||mean(tuned - base)|| / base RMS`` and its cosine to the base's mean."""
    _require(table, ["layer", "position", "relative_norm", "cosine_to_base_mean"], "difference_by_layer")
    with mpl.rc_context(_STYLE):
        fig = _new_figure((8.4, 2.8))
        left, right = fig.subplots(1, 2)
        for bucket, (label, colour, style) in _BUCKETS.items():
            part = table[table["position"] == bucket].sort_values("layer")
            if part.empty:
                continue
            left.plot(part["layer"], part["relative_norm"], style, color=colour, marker="o", markersize=3, label=label)
            right.plot(part["layer"], part["cosine_to_base_mean"], style, color=colour, marker="o", markersize=3)
        layers = sorted(int(x) for x in pd.unique(table["layer"]))
        for ax in (left, right):
            ax.set_xticks(layers)
            ax.set_xlabel("layer (0 = embeddings)")
        left.set_ylabel("norm / base RMS")
        left.set_title("mean difference tuned - base")
        right.set_ylabel("cosine")
        right.set_title("cosine to the base's mean activation")
        right.axhline(0, color="0.6", linewidth=0.6)
        right.set_ylim(-1.05, 1.05)
        left.legend(fontsize=7, frameon=False)
    return fig
