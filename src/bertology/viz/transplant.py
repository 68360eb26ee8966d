"""The transplant layer curves: gain recovered against k, the top-k and bottom-k layers transplanted, with bands."""
from __future__ import annotations

import matplotlib as mpl
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from bertology.viz.style import _STYLE, _label, _new_figure, _plain, _require

__all__ = ["transplant_curves", "transplant_figures"]

_DIRECTION_STYLE = {"top": ("#1f5aa6", "o", "top k layers"), "bottom": ("#d1495b", "s", "bottom k layers (+ embeddings)")}


def transplant_curves(table: pd.DataFrame, metric: str, *, title: str | None = None) -> Figure:
    """Gain recovered (0 = head alone, 1 = tuned) against k for the two curves, with their 95% interval bands.

    Rows whose gain is undefined (``reason``) are left out: the caller says why in words.
    """
    _require(table, ["unit_kind", "direction", "k", "metric", "gain_recovered", "ci_low", "ci_high"], "transplant_curves")
    sub = table[(table["unit_kind"] == "layers") & (table["metric"] == metric)]
    if sub.empty or sub["gain_recovered"].isna().all():
        raise ValueError(f"no defined transplant curve rows with metric == {metric!r}")
    with mpl.rc_context(_STYLE):
        fig = _new_figure((5.6, 3.2))
        ax = fig.add_subplot()
        for direction, (color, marker, label) in _DIRECTION_STYLE.items():
            part = sub[sub["direction"] == direction].sort_values("k")
            ax.plot(part["k"], part["gain_recovered"], marker=marker, color=color, label=label)
            if part["ci_low"].notna().any():
                ax.fill_between(part["k"].to_numpy(), part["ci_low"].to_numpy(dtype=float),
                                part["ci_high"].to_numpy(dtype=float), color=color, alpha=0.18, linewidth=0)
        ax.axhline(0.0, color="#888888", linewidth=0.8, linestyle=":")
        ax.axhline(1.0, color="#888888", linewidth=0.8, linestyle=":")
        ax.set_xticks(np.arange(int(sub["k"].max()) + 1))
        ax.set_xlabel("k (tuned layers transplanted into the base encoder)")
        ax.set_ylabel(f"gain recovered ({_label(metric)})")
        ax.grid(True, axis="y")
        ax.set_title(_plain(title) if title else "Transplant: fine-tuning gain recovered", loc="left")
        ax.legend(loc="best")
    return fig


def transplant_figures(table: pd.DataFrame) -> dict[str, Figure]:
    """The curves of the task's primary metric and of its loss (``transplant_<metric>``), where the gain is defined."""
    from bertology.tasks.catalog import task_of_table

    task = task_of_table(table)
    out = {}
    for metric in dict.fromkeys((task.primary, task.loss_metric)):
        sub = table[(table["unit_kind"] == "layers") & (table["metric"] == metric)]
        if len(sub) and sub["gain_recovered"].notna().any():
            out[f"transplant_{metric}"] = transplant_curves(table, metric)
    return out
