"""Figures for the structural probes: per-layer UUAS / DSpr (distance probe) and root accuracy / NSpr
(depth probe), one line per model (base, tuned, random-init control).

Like :mod:`bertology.viz.figures`, every function returns a :class:`~matplotlib.figure.Figure` on an Agg
canvas (no pyplot, nothing shown, no global state). Layers are representation layers, ``0``
(embeddings) ``..N``.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import pandas as pd
from matplotlib.figure import Figure

from bertology.viz.figures import CurveStyle, layer_curve
from bertology.viz.style import _require

__all__ = ["PROBE_METRICS", "probe_figures", "probe_layer_figure"]

#: Table column -> axis title, for the four probe scores.
PROBE_METRICS: dict[str, str] = {
    "uuas": "UUAS (punctuation excluded)",
    "dspr": "DSpr (Spearman, lengths 5-50)",
    "root_acc": "root accuracy",
    "nspr": "NSpr (Spearman, lengths 5-50)",
}
_MODEL_ORDER = ("base", "tuned", "random")


def model_order(models) -> list:
    """The probed models in legend order: base, tuned, the random-init control, then any other, as met."""
    models = list(models)
    return [m for m in _MODEL_ORDER if m in models] + [m for m in models if m not in _MODEL_ORDER]


def probe_layer_figure(
    table: pd.DataFrame,
    metrics: Sequence[str] = ("uuas", "dspr"),
    *,
    split: str = "test",
    title: str | None = None,
    baselines: pd.DataFrame | None = None,
) -> Figure:
    """One panel per metric (default UUAS and DSpr), score against layer, one line per model.

    ``table`` is the ``probe`` table (columns ``model, layer, probe, split`` and the metrics); rows of
    other splits, and NaN cells (metrics of the other probe), are left out. ``baselines`` (the
    ``probe_baseline`` table) draws the linear-chain baseline of the split as a dashed line in each panel.
    """
    _require(table, ["model", "layer", "split", *metrics], "probe_layer_figure")
    bad = [m for m in metrics if m not in PROBE_METRICS]
    if bad:
        raise ValueError(f"probe_layer_figure: unknown metric(s) {bad}; choose from {list(PROBE_METRICS)}")
    sub = table[table["split"] == split]
    long = (
        sub.melt(id_vars=["model", "layer"], value_vars=list(metrics), var_name="metric", value_name="value")
        .dropna(subset=["value"])
    )
    if long.empty:
        raise ValueError(f"probe_layer_figure: no {', '.join(metrics)} values for split {split!r}")
    long["metric"] = long["metric"].map(PROBE_METRICS)
    order = model_order(pd.unique(long["model"]))
    return layer_curve(
        long, x="layer", y="value", hue="model", facet="metric",
        title=title if title is not None else f"Structural probes by layer ({split})",
        style=CurveStyle(xlabel="layer (0 = embeddings)", reference=_baseline_lines(baselines, metrics, split),
                         facet_order=[PROBE_METRICS[m] for m in metrics], hue_order=order,
                         ylim=(min(0.0, math.floor(10 * float(long["value"].min())) / 10), 1.0)),
    )


def _baseline_lines(baselines: pd.DataFrame | None, metrics: Sequence[str], split: str) -> dict[str, float]:
    """Panel title -> the linear-chain baseline's value of that metric on ``split`` (empty: no baseline table)."""
    if baselines is None or baselines.empty:
        return {}
    sub = baselines[(baselines["split"] == split) & (baselines["baseline"] == "linear_chain")]
    out = {}
    for m in metrics:
        values = sub[m].dropna() if m in sub else []
        if len(values):
            out[PROBE_METRICS[m]] = float(values.iloc[0])
    return out


def probe_figures(table: pd.DataFrame, *, split: str = "test", baselines: pd.DataFrame | None = None) -> dict[str, Figure]:
    """Every probe figure the table has data for, keyed by file stem (``figures/<stem>.svg``):
    ``probe_distance`` (UUAS, DSpr) and ``probe_depth`` (root accuracy, NSpr); ``baselines`` as in
    :func:`probe_layer_figure`."""
    out: dict[str, Figure] = {}
    sub = table[table["split"] == split]
    if "distance" in set(sub.get("probe", [])):
        out["probe_distance"] = probe_layer_figure(table, ("uuas", "dspr"), split=split, baselines=baselines,
                                                   title=f"Distance probe by layer ({split})")
    if "depth" in set(sub.get("probe", [])):
        out["probe_depth"] = probe_layer_figure(table, ("root_acc", "nspr"), split=split, baselines=baselines,
                                                title=f"Depth probe by layer ({split})")
    return out
