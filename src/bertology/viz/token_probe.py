"""Figures for the token probes: per layer, the probe's accuracy, its control task's, selectivity and (when asked)
the accuracy after LEACE erasure, one line per model (base, tuned, random-init control).

Returns a :class:`~matplotlib.figure.Figure` on an Agg canvas, like :mod:`bertology.viz.figures`. Layers are
representation layers, ``0`` (embeddings) ``..N``; the dashed line in the accuracy panels is the majority rate
(a probe at it has learned nothing).
"""
from __future__ import annotations

import math

import pandas as pd
from matplotlib.figure import Figure

from bertology.viz.figures import CurveStyle, layer_curve
from bertology.viz.style import _require
from bertology.viz.probe import model_order

__all__ = ["TOKEN_PROBE_PANELS", "token_probe_figure"]

#: Table column -> panel title, in panel order.
TOKEN_PROBE_PANELS: dict[str, str] = {
    "accuracy": "probe accuracy",
    "control_accuracy": "control task accuracy",
    "selectivity": "selectivity (task - control)",
    "erased_accuracy": "after LEACE erasure",
}
_ON_MAJORITY = ("accuracy", "control_accuracy", "erased_accuracy")


def token_probe_figure(table: pd.DataFrame, task: str) -> Figure:
    """One panel per score the table has for ``task`` (accuracy, control, selectivity, erased accuracy) against
    layer, one line per model; the majority rate dashed in the accuracy panels."""
    _require(table, ["model", "layer", "probe_task", "accuracy", "majority_rate"], "token_probe_figure")
    sub = table[table["probe_task"] == task]
    if sub.empty:
        raise ValueError(f"token_probe_figure: no rows for probe task {task!r}")
    panels = [c for c in TOKEN_PROBE_PANELS if c in sub and sub[c].notna().any()]
    long = (sub.melt(id_vars=["model", "layer"], value_vars=panels, var_name="panel", value_name="value")
            .dropna(subset=["value"]))
    long["panel"] = long["panel"].map(TOKEN_PROBE_PANELS)
    majority = float(sub["majority_rate"].iloc[0])
    order = model_order(pd.unique(long["model"]))
    return layer_curve(
        long, x="layer", y="value", hue="model", facet="panel",
        title=f"Token probe {task} by layer (test words; dashed: majority rate)",
        style=CurveStyle(xlabel="layer (0 = embeddings)", facet_order=[TOKEN_PROBE_PANELS[p] for p in panels],
                         hue_order=order,
                         reference={TOKEN_PROBE_PANELS[p]: majority for p in panels if p in _ON_MAJORITY},
                         # one scale for every panel: an erased probe on the majority rate must look flat, not zoomed
                         ylim=(min(0.0, math.floor(10 * float(long["value"].min())) / 10), 1.0)),
    )
