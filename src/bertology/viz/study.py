"""Figures of a study (one base, several tasks x seeds), drawn from the ``study_*`` tables.

These functions only draw: the means, seed ranges and beyond-noise verdicts come ready from
:mod:`bertology.studies.noise`. Like :mod:`bertology.viz.figures`, each returns a
:class:`~matplotlib.figure.Figure` on an Agg canvas inside the package's ``rc_context``.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import matplotlib as mpl
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle

from bertology.viz.figures import ColourScale, _grid_heatmap
from bertology.viz.style import _STYLE, _ink_for, _label, _new_figure, _plain, _require, _tidy_colorbar
from bertology.viz.patterns import PATTERN_COLORS

__all__ = [
    "heatmap_top",
    "study_ablation_figure",
    "study_layer_curves",
    "study_pattern_shares",
    "task_layer_heatmap",
]

_COLORS = _STYLE["axes.prop_cycle"].by_key()["color"]


def _color(i: int) -> str:
    return _COLORS[i % len(_COLORS)]


def heatmap_top(effects: pd.DataFrame) -> float:
    """The top of :func:`task_layer_heatmap`'s colour scale: the largest ``change_mean`` of the figure (1 when there
    is none above 0). The scale runs from 0 to it, shared by every task of the figure so their rows compare."""
    values = pd.to_numeric(effects["change_mean"], errors="coerce").to_numpy(dtype=float)
    finite = values[np.isfinite(values)]
    top = float(finite.max()) if finite.size else 0.0
    return top if top > 0 else 1.0


def task_layer_heatmap(effects: pd.DataFrame, *, title: str | None = None, colorbar_label: str | None = None) -> Figure:
    """Tasks (rows) x layers (columns) of ``change_mean``; hatched cells are within seed noise.

    ``effects``: rows of ``study_effects`` for one table, metric and level ``layer`` (columns ``task,
    layer, change_mean, beyond_noise``). Cells where ``beyond_noise`` is False are hatched; where it
    is missing (one seed: no noise estimate) a small ``n/a`` is written under the value. The colours run
    from 0 to the figure's largest change (:func:`heatmap_top`), one scale for every task: a fixed scale
    drew changes of 1e-4 and of 1e-3 in one pale colour. The colour bar's ticks state the range.
    """
    _require(effects, ["task", "layer", "change_mean", "beyond_noise"], "task_layer_heatmap")
    if effects.empty:
        raise ValueError("task_layer_heatmap: no rows")
    data = effects.assign(layer=effects["layer"].astype(int))
    matrix = data.pivot_table(index="task", columns="layer", values="change_mean", aggfunc="mean").sort_index(axis=1)
    verdict = data.set_index(["task", "layer"])["beyond_noise"]
    n_rows, n_cols = matrix.shape
    with mpl.rc_context(_STYLE):
        fig = _new_figure((min(9.0, max(4.2, 0.55 * n_cols + 2.2)), min(7.0, max(2.0, 0.42 * n_rows + 1.2))))
        ax = fig.add_subplot()
        top = heatmap_top(data)
        mesh = _grid_heatmap(ax, matrix, ColourScale("magma_r", 0.0, top), annotate=True, fmt=None)
        for i, task in enumerate(matrix.index):
            for j, layer in enumerate(matrix.columns):
                v = verdict.get((task, layer), pd.NA)
                value = matrix.iat[i, j]
                ink = _ink_for(mesh.cmap(mesh.norm(value))) if np.isfinite(value) else "#777777"
                if pd.isna(v):
                    ax.text(j + 0.5, i + 0.85, "n/a", ha="center", va="center", fontsize=5.5, color=ink, alpha=0.8)
                elif not bool(v):
                    ax.add_patch(Rectangle((j, i), 1, 1, fill=False, hatch="////", edgecolor="#9a9a9a",
                                           linewidth=0))
                else:
                    ax.add_patch(Rectangle((j + 0.05, i + 0.05), 0.9, 0.9, fill=False,
                                           edgecolor="#00b4d8", linewidth=2.0))
        ax.set_xlabel("layer")
        ax.set_ylabel("task")
        ax.set_title(_plain(title) if title else "Change per layer", loc="left")
        cbar = fig.colorbar(mesh, ax=ax, fraction=0.06, pad=0.02, aspect=20)
        cbar.set_label(_plain(colorbar_label or "mean change over seeds"))
        _tidy_colorbar(cbar)
        cbar.set_ticks([0.0, top / 2, top], labels=["0", f"{top / 2:.2g}", f"{top:.2g}"])  # the range, end to end
    return fig


def study_layer_curves(
    summary: pd.DataFrame,
    *,
    noise: pd.DataFrame | None = None,
    base: pd.Series | None = None,
    similarity: bool = True,
    ylabel: str = "",
    title: str | None = None,
    task_order: Sequence[str] | None = None,
) -> Figure:
    """One line per task over layers with a band from the seeds' min to max (Merchant et al. Fig. 1).

    ``summary``: ``study_summary`` rows of one table and metric with ``task, layer, mean, min, max``
    (the quantity to plot: the change, or the tuned value). With ``similarity`` the change ``c`` is
    drawn as ``1 - c`` (CKA/RSA of base and tuned). ``noise``: ``study_seed_noise`` rows (``task,
    layer, mean``) drawn dashed in the task's colour (the seed-vs-seed level). ``base``: a per-layer
    Series drawn in black (e.g. the base model's probe score).
    """
    _require(summary, ["task", "layer", "mean", "min", "max"], "study_layer_curves")
    if summary.empty:
        raise ValueError("study_layer_curves: no rows")
    tasks = list(task_order) if task_order is not None else sorted(summary["task"].unique())
    flip = (lambda v: 1.0 - v) if similarity else (lambda v: v)
    with mpl.rc_context(_STYLE):
        fig = _new_figure((6.6, 3.1))
        ax = fig.add_subplot()
        for i, task in enumerate(tasks):
            g = summary[summary["task"] == task].sort_values("layer")
            if g.empty:
                continue
            xs = g["layer"].to_numpy(float)
            ax.plot(xs, flip(g["mean"].to_numpy(float)), marker="o", color=_color(i), label=_plain(task))
            lo, hi = flip(g["min"].to_numpy(float)), flip(g["max"].to_numpy(float))
            ax.fill_between(xs, np.minimum(lo, hi), np.maximum(lo, hi), color=_color(i), alpha=0.18, linewidth=0)
            if noise is not None and not noise.empty:
                n = noise[noise["task"] == task].sort_values("layer")
                if not n.empty:
                    ax.plot(n["layer"].to_numpy(float), flip(n["mean"].to_numpy(float)), linestyle="--",
                            color=_color(i), linewidth=1.0, alpha=0.8)
        if base is not None and len(base):
            ax.plot(base.index.to_numpy(float), base.to_numpy(float), color="#111111", marker="s",
                    markersize=3.5, label="base")
        layers = np.sort(summary["layer"].dropna().astype(int).unique())
        step = max(1, math.ceil(len(layers) / 13))
        ax.set_xticks(layers[::step])
        ax.set_xlabel("layer")
        ax.set_ylabel(_plain(ylabel))
        ax.grid(True, axis="y")
        handles, labels = ax.get_legend_handles_labels()
        if noise is not None and not noise.empty:
            handles.append(Line2D([], [], color="#555555", linestyle="--", linewidth=1.0))
            labels.append("seed vs seed")
        handles.append(Patch(color="#555555", alpha=0.18))
        labels.append("seed min-max")
        ax.legend(handles, labels, loc="center left", bbox_to_anchor=(1.01, 0.5))
        if title:
            ax.set_title(_plain(title), loc="left")
    return fig


def study_pattern_shares(shares: pd.DataFrame, *, title: str | None = None) -> Figure:
    """Stacked bars of the pattern shares (Kovaleva et al. Fig. 2): the base, then each task's tuned models.

    ``shares``: columns ``bar`` (``base`` or a task), ``pattern``, ``fraction`` (mean over heads and
    seeds) and optional ``sd`` (over seeds, written on the bar's right).
    """
    _require(shares, ["bar", "pattern", "fraction"], "study_pattern_shares")
    if shares.empty:
        raise ValueError("study_pattern_shares: no rows")
    bars = list(pd.unique(shares["bar"]))
    patterns = [p for p in PATTERN_COLORS if p in set(shares["pattern"])] + \
        [p for p in pd.unique(shares["pattern"]) if p not in PATTERN_COLORS]
    wide = shares.pivot_table(index="bar", columns="pattern", values="fraction", aggfunc="mean").reindex(
        index=bars, columns=patterns).fillna(0.0)
    with mpl.rc_context(_STYLE):
        fig = _new_figure((6.6, 0.42 * len(bars) + 1.4))
        ax = fig.add_subplot()
        ys = np.arange(len(bars))
        left = np.zeros(len(bars))
        for p in patterns:
            vals = wide[p].to_numpy()
            ax.barh(ys, vals, left=left, height=0.7, color=PATTERN_COLORS.get(p, "#5c5c5c"), label=_plain(p),
                    edgecolor="white", linewidth=0.5)
            for y, lft, v in zip(ys, left, vals):
                if v >= 0.06:
                    ax.text(lft + v / 2, y, f"{100 * v:.0f}%", ha="center", va="center", fontsize=7,
                            color="#ffffff" if p != "heterogeneous" else "#111111")
            left += vals
        ax.set_yticks(ys)
        ax.set_yticklabels([_plain(b) for b in bars])
        ax.invert_yaxis()
        ax.set_xlim(0, 1)
        ax.set_xlabel("share of attention maps (mean over heads and seeds)")
        handles, labels = ax.get_legend_handles_labels()
        fig.legend(handles, labels, loc="outside lower center", ncols=len(patterns))
        if title:
            ax.set_title(_plain(title), loc="left")
    return fig


def study_ablation_figure(heads: pd.DataFrame, *, title: str | None = None) -> Figure:
    """Per task, every head's ablation delta: mean over seeds, seed range as a bar, beyond noise in colour.

    ``heads``: columns ``task, metric, unit, mean, min, max, beyond_noise`` (one row per head and
    task; each task may have its own metric, named under the task); optional ``ci_low, ci_high``
    (the bootstrap interval over examples, mean over seeds) drawn as a wide pale bar on the flagged
    heads; the three largest flagged heads of each task are labelled.
    """
    _require(heads, ["task", "metric", "mean", "min", "max", "beyond_noise"], "study_ablation_figure")
    if heads.empty:
        raise ValueError("study_ablation_figure: no rows")
    tasks = list(pd.unique(heads["task"]))
    rng = np.random.default_rng(0)  # horizontal jitter only, for legibility
    with mpl.rc_context(_STYLE):
        fig = _new_figure((max(4.6, 1.25 * len(tasks) + 2.4), 3.4))
        ax = fig.add_subplot()
        for i, task in enumerate(tasks):
            g = heads[heads["task"] == task]
            x = i + rng.uniform(-0.3, 0.3, size=len(g))
            flag = g["beyond_noise"].fillna(False).astype(bool).to_numpy()
            mean, lo, hi = (g[c].to_numpy(float) for c in ("mean", "min", "max"))
            ax.vlines(x, lo, hi, color="#cccccc", linewidth=0.7, zorder=1)
            if {"ci_low", "ci_high"} <= set(g.columns):  # only where it matters: the flagged heads
                ax.vlines(x[flag], g["ci_low"].to_numpy(float)[flag], g["ci_high"].to_numpy(float)[flag],
                          color="#1f5aa6", linewidth=2.2, alpha=0.35, zorder=1)
            ax.scatter(x[~flag], mean[~flag], s=9, color="#8a919c", zorder=2)
            ax.scatter(x[flag], mean[flag], s=22, color="#d1495b", zorder=3, edgecolor="#111111", linewidth=0.4)
            if "unit" in g:
                top = np.argsort(-np.abs(np.where(flag, mean, 0.0)))[: min(3, int(flag.sum()))]
                for j in top:  # the three largest flagged heads of the task, so labels stay legible
                    ax.annotate(_plain(g["unit"].iloc[j]), (x[j], mean[j]), xytext=(4, 0),
                                textcoords="offset points", fontsize=6.5)
        ax.axhline(0.0, color="#999999", linewidth=0.8, linestyle="--", zorder=0)
        ax.set_xticks(range(len(tasks)))
        metrics = heads.groupby("task", sort=False)["metric"].first()
        ax.set_xticklabels([f"{_plain(t)}\n({_label(metrics[t])})" for t in tasks])
        ax.set_xlim(-0.6, len(tasks) - 0.4)
        ax.set_ylabel("delta when the head is disabled")
        ax.grid(True, axis="y")
        ax.legend([Line2D([], [], marker="o", color="#d1495b", linestyle="", markeredgecolor="#111111"),
                   Line2D([], [], marker="o", color="#8a919c", linestyle=""),
                   Line2D([], [], color="#bbbbbb"), Line2D([], [], color="#1f5aa6", alpha=0.35, linewidth=2.2)],
                  ["beyond seed noise", "within noise / untested", "seed min-max", "CI over examples (flagged)"],
                  loc="center left", bbox_to_anchor=(1.01, 0.5))
        if title:
            ax.set_title(_plain(title), loc="left")
    return fig
