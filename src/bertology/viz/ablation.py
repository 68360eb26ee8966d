"""Figures for the ablation sweep and head importance: delta heatmap, layer bars, pruning curve, scatter.

Like :mod:`bertology.viz.figures`, every function returns a :class:`~matplotlib.figure.Figure` on an Agg
canvas inside the package's own ``rc_context`` (no pyplot, nothing shown, no global state). Colours
always mean the same thing: blue = the removal helps the task, red = it hurts, whichever metric
(for loss, a negative delta is drawn blue).
"""
from __future__ import annotations

import math

import matplotlib as mpl
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle

from bertology.experiments.interventions import words_of
from bertology.tasks.catalog import higher_is_better, task_of_table
from bertology.viz.figures import ColourScale, _layer_head_figure, _layer_head_matrix
from bertology.viz.style import _STYLE, _label, _new_figure, _plain, _require, scatter_by_layer

__all__ = ["ablation_figures", "ablation_heatmap", "importance_scatter", "layer_ablation_bars", "pruning_curve_figure"]

_HIGHER_IS_BETTER = higher_is_better()
_ORDER_STYLE = {"importance": ("#1f5aa6", "o", "-"), "random": ("#888888", "s", "--")}


def _one_metric(table: pd.DataFrame, metric: str, target: str) -> pd.DataFrame:
    _require(table, ["target", "layer", "head", "metric", "delta", "helps", "hurts"], "ablation figure")
    sub = table[(table["target"] == target) & (table["metric"] == metric)]
    if sub.empty:
        raise ValueError(f"no {target} rows with metric == {metric!r} in the ablation table")
    return sub


def ablation_heatmap(table: pd.DataFrame, metric: str = "accuracy", *, title: str | None = None) -> Figure:
    """Layer x head heatmap of the single-head ablation delta of ``metric`` (ablated − intact).

    Blue cells: removing the head helps; red: it hurts. Cells whose 95% bootstrap interval excludes 0
    are outlined: solid when the removal helps, dotted when it hurts.
    """
    sub = _one_metric(table, metric, "head")
    matrix = _layer_head_matrix(sub, "delta", "ablation_heatmap")
    layers, heads = list(matrix.index), list(matrix.columns)
    better = _HIGHER_IS_BETTER.get(metric, True)
    span = float(np.nanmax(np.abs(matrix.to_numpy(dtype=float)))) if matrix.notna().any().any() else 0.0
    span = span if span > 0 else 1e-3
    n_rows, n_cols = matrix.shape
    width = min(9.0, max(3.8, 0.34 * n_cols + 1.6))
    height = min(9.0, max(2.2, 0.32 * n_rows + 1.1))
    mode = sub["mode"].iloc[0] if "mode" in sub else ""
    with mpl.rc_context(_STYLE):
        fig, ax = _layer_head_figure(
            matrix, (width, height),
            title=_plain(title) if title else f"Δ {_label(metric)} when one head is {words_of(mode).head.format(mode=mode)}",
            colorbar_label=f"Δ {_label(metric)} (ablated − intact)",
            scale=ColourScale("RdBu" if better else "RdBu_r", -span, span), annotate=None, fmt=None, max_annotated=120,
        )
        flags = sub.set_index(["layer", "head"])
        for (layer, head), row in flags.iterrows():
            if not (row["helps"] or row["hurts"]):
                continue
            i, j = layers.index(int(layer)), heads.index(int(head))
            ax.add_patch(Rectangle(
                (j + 0.06, i + 0.06), 0.88, 0.88, fill=False, edgecolor="#111111",
                linewidth=1.5 if row["helps"] else 1.0, linestyle="-" if row["helps"] else ":",
            ))
        handles = [
            Patch(facecolor="none", edgecolor="#111111", linewidth=1.5, label="helps (95% CI)"),
            Patch(facecolor="none", edgecolor="#111111", linewidth=1.0, linestyle=":", label="hurts (95% CI)"),
        ]
        fig.legend(handles=handles, loc="outside lower left", ncols=2, fontsize=7)
    return fig


def layer_ablation_bars(table: pd.DataFrame, metric: str = "accuracy", *, title: str | None = None,
                        names: dict[str, str] | None = None) -> Figure:
    """Per-layer delta of ``metric`` for each whole-layer ablation (skip / all heads; revert's attention, feed-forward,
    whole layer, embeddings), with 95% intervals; ``names``: legend words for ``layer_mode`` values."""
    sub = _one_metric(table, metric, "layer")
    modes = list(pd.unique(sub["layer_mode"]))
    layers = sorted(int(x) for x in sub["layer"].unique())
    better = _HIGHER_IS_BETTER.get(metric, True)
    colors = ["#1f5aa6", "#e9a23b", "#2a9d8f", "#9b5de5"]
    width = 0.8 / max(1, len(modes))
    with mpl.rc_context(_STYLE):
        fig = _new_figure((min(6.0, max(4.2, 0.3 * len(layers) * max(1, len(modes)) + 2.0)), 3.2))
        ax = fig.add_subplot()
        for k, lm in enumerate(modes):
            part = sub[sub["layer_mode"] == lm].set_index("layer").reindex(layers)
            x = np.arange(len(layers)) + (k - (len(modes) - 1) / 2) * width
            d = part["delta"].to_numpy(dtype=float)
            lo = d - part["ci_low"].to_numpy(dtype=float)
            hi = part["ci_high"].to_numpy(dtype=float) - d
            ax.bar(x, d, width=width * 0.92, color=colors[k % len(colors)], label=_plain((names or {}).get(lm, lm)),
                   zorder=2)
            ax.errorbar(x, d, yerr=[np.clip(lo, 0, None), np.clip(hi, 0, None)], fmt="none",
                        ecolor="#333333", elinewidth=0.8, capsize=2, zorder=3)
            for xi, di, h in zip(x, d, part["helps"].fillna(False).to_numpy()):
                if h:
                    ax.annotate("helps", (xi, di), textcoords="offset points",
                                xytext=(0, 4 if (di >= 0) == better else -10), ha="center", fontsize=6.5)
        ax.axhline(0, color="#666666", linewidth=0.8, zorder=1)
        ax.set_xticks(np.arange(len(layers)))
        ax.set_xticklabels([str(x) for x in layers])
        ax.set_xlabel("layer")
        ax.set_ylabel(f"Δ {_label(metric)}")
        ax.grid(True, axis="y")
        mode = str(sub["mode"].iloc[0]) if "mode" in sub and len(sub) else ""
        ax.set_title(_plain(title) if title else f"Δ {_label(metric)} when a {words_of(mode).layer}", loc="left")
        if len(modes) > 1:
            ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5))
    return fig


def pruning_curve_figure(curve: pd.DataFrame, metric: str = "accuracy", *, title: str | None = None) -> Figure:
    """``metric`` against the fraction of heads removed, by importance (Michel et al.) and at random."""
    _require(curve, ["order", "fraction_removed", "metric", "value"], "pruning_curve_figure")
    sub = curve[curve["metric"] == metric]
    if sub.empty:
        raise ValueError(f"no pruning-curve rows with metric == {metric!r}")
    with mpl.rc_context(_STYLE):
        fig = _new_figure((5.6, 3.0))
        ax = fig.add_subplot()
        for order, part in sub.groupby("order", sort=False):
            color, marker, ls = _ORDER_STYLE.get(str(order), ("#d1495b", "^", "-"))
            part = part.sort_values("fraction_removed")
            label = "by importance" if order == "importance" else ("random order" if order == "random" else str(order))
            ax.plot(100 * part["fraction_removed"], part["value"], marker=marker, linestyle=ls, color=color, label=label)
        ax.set_xlabel("heads removed (%)")
        ax.set_ylabel(_label(metric))
        ax.grid(True, axis="y")
        mode = sub["mode"].iloc[0] if "mode" in sub else ""
        ax.set_title(_plain(title) if title else f"Pruning curve ({mode} ablation)", loc="left")
        ax.legend(loc="best")
    return fig


def importance_scatter(importance: pd.DataFrame, table: pd.DataFrame, metric: str = "loss", *, title: str | None = None) -> Figure:
    """Each head's importance (x) against its single-head ablation delta (y), coloured by layer."""
    _require(importance, ["layer", "head", "importance"], "importance_scatter")
    heads = _one_metric(table, metric, "head")[["layer", "head", "delta"]]
    m = importance.merge(heads, on=["layer", "head"])
    if m.empty:
        raise ValueError("importance_scatter: no heads in common")
    cmap = mpl.colormaps["plasma"]
    with mpl.rc_context(_STYLE):
        fig = _new_figure((4.8, 3.4))
        ax = fig.add_subplot()
        layers = scatter_by_layer(ax, m, "importance", "delta")
        ax.set_xlabel("importance (per-layer normalised)")
        ax.set_ylabel(f"Δ {_label(metric)} when removed")
        rho = m["importance"].rank().corr(m["delta"].rank())
        sign = 1 if not _HIGHER_IS_BETTER.get(metric, True) else -1
        ax.set_title(_plain(title) if title else f"Importance vs ablation (Spearman {sign * rho:+.2f})", loc="left")
        ncol = 1 if len(layers) <= 12 else math.ceil(len(layers) / 12)
        ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), ncols=ncol, handletextpad=0.2,
                  handles=[Line2D([], [], marker="o", linestyle="", color=cmap(0.85 * i / max(1, len(layers) - 1)),
                                  label=f"L{layer}") for i, layer in enumerate(layers)])
    return fig


def ablation_figures(
    table: pd.DataFrame,
    importance: pd.DataFrame | None = None,
    curve: pd.DataFrame | None = None,
    *,
    metric: str | None = None,
) -> dict[str, Figure]:
    """Every ablation figure a run has data for, keyed by file stem (``figures/<stem>.svg``).

    ``metric`` defaults to the task's primary metric (accuracy, Pearson); the importance scatter uses its loss.
    """
    task = task_of_table(table)
    metric = metric or task.primary
    out: dict[str, Figure] = {}
    if ((table["target"] == "head") & (table["metric"] == metric)).any():
        out[f"ablation_heads_{metric}"] = ablation_heatmap(table, metric)
    if ((table["target"] == "layer") & (table["metric"] == metric)).any():
        out[f"ablation_layers_{metric}"] = layer_ablation_bars(table, metric)
    if curve is not None and not curve.empty:
        out[f"pruning_curve_{metric}"] = pruning_curve_figure(curve, metric)
    if importance is not None and not importance.empty and ((table["target"] == "head")).any():
        out["importance_vs_ablation"] = importance_scatter(importance, table, task.loss_metric)
    return out
