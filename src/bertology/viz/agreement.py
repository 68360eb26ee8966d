"""The measure-agreement figure: a target's attention share per layer under the weights and under each measure.

Like :mod:`bertology.viz.figures`, it returns a :class:`~matplotlib.figure.Figure` on an Agg canvas inside the
package's own ``rc_context`` (no pyplot, nothing shown).
"""
from __future__ import annotations

import matplotlib as mpl
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from bertology.viz.style import _STYLE, _new_figure, _require

__all__ = ["share_by_measure"]


def share_by_measure(table: pd.DataFrame, headline: str = "cls_share", model: str = "base") -> Figure:
    """One line per measure (``weights`` first) of ``headline``'s share per layer, from the ``measure_agreement``
    table's per-layer ``attention_targets`` rows of ``model`` (a per-head measure: its head mean)."""
    _require(table, ["analysis", "headline", "measure", "model", "layer", "weights_value", "measure_value"],
             "share_by_measure")
    rows = table[(table["analysis"] == "attention_targets") & (table["headline"] == headline)
                 & (table["model"] == model) & table["layer"].notna()]
    if rows.empty:
        raise ValueError(f"share_by_measure: no per-layer {headline} rows for {model}")
    with mpl.rc_context(_STYLE):
        fig = _new_figure((4.8, 3.2))
        ax = fig.add_subplot()
        first = rows[rows["measure"] == rows["measure"].iloc[0]].sort_values("layer")
        ax.plot(first["layer"].astype(int), first["weights_value"], marker="o", label="weights", color="black")
        for measure, group in rows.groupby("measure", sort=False):
            group = group.sort_values("layer")
            ax.plot(group["layer"].astype(int), group["measure_value"], marker="o", label=str(measure))
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # layers are whole numbers
        ax.set_xlabel("layer")
        ax.set_ylabel(f"share to {headline.removesuffix('_share')} ({model})")
        ax.set_title("Attention share by measure", loc="left")
        ax.legend(loc="best")
    return fig
