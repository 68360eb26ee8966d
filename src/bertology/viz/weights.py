"""Figures for the weight-space change: a layer x module heatmap (and per-head grids via ``head_heatmap``).

Like :mod:`bertology.viz.figures`, every function returns a :class:`~matplotlib.figure.Figure` on an Agg
canvas (no pyplot, nothing shown, no global state). Rows are layers, ``0`` (embeddings) on top to ``N``.
"""
from __future__ import annotations

from collections.abc import Sequence

import matplotlib as mpl
import pandas as pd
from matplotlib.figure import Figure

from bertology.viz.figures import ColourScale, _grid_heatmap
from bertology.viz.style import _STYLE, _new_figure, _plain, _require, _tidy_colorbar

__all__ = ["MODULE_LABELS", "module_heatmap", "module_matrix"]

#: Short column labels for the canonical module names (others are shown as they are).
MODULE_LABELS: dict[str, str] = {
    "word_embeddings": "word emb", "position_embeddings": "pos emb", "token_type_embeddings": "type emb",
    "embedding_norm": "emb norm", "embedding_projection": "emb proj", "relative_embeddings": "rel emb",
    "relative_embedding_norm": "rel norm", "relative_attention_bias": "rel bias",
    "query": "query", "key": "key", "value": "value", "position_query": "pos query", "position_key": "pos key",
    "attention_output": "attn out", "attention_norm": "attn norm", "ffn_in": "FFN in", "ffn_out": "FFN out",
    "ffn_norm": "FFN norm", "final_norm": "final norm",
}


def module_matrix(df: pd.DataFrame, value: str, order: Sequence[str] | None = None) -> pd.DataFrame:
    """``value`` of the units' own rows (``head`` null) as a layer x module grid, modules in ``order`` (default:
    first appearance) with their short labels; a module a layer lacks is NaN (drawn grey)."""
    _require(df, ["layer", "module", value], "module_matrix")
    rows = df[df["head"].isna()] if "head" in df else df
    modules = list(order) if order is not None else list(pd.unique(rows["module"]))
    matrix = rows.pivot_table(index="layer", columns="module", values=value, aggfunc="mean", dropna=False)
    if matrix.empty:
        raise ValueError("module_matrix: the table has no rows")
    matrix = matrix.reindex(columns=[m for m in modules if m in matrix.columns]).sort_index()
    matrix.columns = [MODULE_LABELS.get(m, m) for m in matrix.columns]
    return matrix


def module_heatmap(df: pd.DataFrame, value: str = "relative_change", *, title: str | None = None,
                   colorbar_label: str | None = None, cmap: str = "magma_r", vmin: float | None = 0.0,
                   annotate: bool | None = None, fmt: str | None = None) -> Figure:
    """Heatmap of one per-unit quantity of ``weight_change``: layers as rows (0 = embeddings, top), modules as
    columns in the table's order. Darker = changed more (``magma_r``); missing cells are light grey."""
    matrix = module_matrix(df, value)
    n_rows, n_cols = matrix.shape
    width = min(9.0, max(4.2, 0.55 * n_cols + 1.6))
    height = min(9.0, max(2.4, 0.3 * n_rows + 1.3))
    with mpl.rc_context(_STYLE):
        fig = _new_figure((width, height))
        ax = fig.add_subplot()
        mesh = _grid_heatmap(ax, matrix, ColourScale(cmap, vmin, None), annotate=annotate, fmt=fmt,
                             max_annotated=220)
        ax.tick_params(axis="x", labelrotation=40)
        for label in ax.get_xticklabels():
            label.set_horizontalalignment("right")
        ax.set_xlabel("module")
        ax.set_ylabel("layer (0 = embeddings)")
        ax.set_title(_plain(title) if title is not None else _plain(value.replace("_", " ")), loc="left")
        cbar = fig.colorbar(mesh, ax=ax, fraction=0.05, pad=0.02, aspect=25)
        cbar.set_label(_plain(colorbar_label or value.replace("_", " ")))
        _tidy_colorbar(cbar)
    return fig
