"""The changed-vs-needed scatter: how much each head changed (x) against what reverting it costs the task (y).

Like :mod:`bertology.viz.figures`, it returns a :class:`~matplotlib.figure.Figure` on an Agg canvas inside the
package's own ``rc_context`` (no pyplot, nothing shown).
"""
from __future__ import annotations

import matplotlib as mpl
import pandas as pd
from matplotlib.figure import Figure

from bertology.viz.style import _STYLE, _label, _new_figure, _plain, _require, scatter_by_layer

__all__ = ["changed_needed_scatter"]

#: Axis words per change measure.
CHANGE_LABELS = {"weight": "relative weight change", "attention_js": "attention JS divergence",
                 "attention_1_minus_cosine": "attention 1 − cosine"}


def changed_needed_scatter(units: pd.DataFrame, measure: str, metric: str, *, title: str | None = None) -> Figure:
    """One point per head of ``units`` (the ``changed_vs_needed_units`` table) for one change measure and metric:
    the change on x, the drop in ``metric`` when the head alone is reverted on y, coloured by layer."""
    _require(units, ["level", "layer", "head", "change_measure", "metric", "change", "needed"], "changed_needed_scatter")
    m = units[(units["level"] == "head") & (units["change_measure"] == measure) & (units["metric"] == metric)]
    if m.empty:
        raise ValueError(f"changed_needed_scatter: no heads with {measure} and {metric}")
    with mpl.rc_context(_STYLE):
        fig = _new_figure((4.8, 3.4))
        ax = fig.add_subplot()
        layers = scatter_by_layer(ax, m, "change", "needed")
        ax.set_xlabel(CHANGE_LABELS.get(measure, _plain(measure)))
        ax.set_ylabel(f"{_label(metric)} lost when reverted")
        ax.set_title(_plain(title) if title else "Changed vs needed, per head", loc="left")
        if len(layers) <= 24:
            ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), handletextpad=0.2)
    return fig
