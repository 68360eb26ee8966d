"""Token representations projected to 2-D per layer, base and tuned side by side."""
from __future__ import annotations

import pandas as pd

from bertology.report.sections.base import Figures, Section, SectionInput


def pca_section(df: pd.DataFrame, figs: Figures) -> dict:
    """Token representations projected to 2-D per layer (van Aken et al. 2019), base and tuned side by side."""
    from bertology.viz.geometry import pca_grid

    df = df.copy()
    figures = [figs.make(
        "pca_views_category", lambda: pca_grid(df, fit="shared", color_by="category"),
        "Each row is a layer; one PCA per layer is fitted on the base and the tuned tokens together, so the two "
        "panels share axes. Colour: token category. Percentages: variance explained by the two components.",
        "PCA of token representations per layer, coloured by token category",
    )]
    labels = df["label"].dropna().astype(str)
    labels = labels[labels != ""]
    if labels.nunique() > 1:
        figures.append(figs.make(
            "pca_views_label", lambda: pca_grid(df, fit="shared", color_by="label"),
            "The same projections coloured by the example's label: a task-specific layer separates the labels.",
            "PCA of token representations per layer, coloured by label",
        ))
    n_ex = df["example"].nunique()
    n_tok = len(df[(df["model"] == "base") & (df["fit"] == "shared") & (df["layer"] == df["layer"].min())])
    facts = [("Examples", str(n_ex)), ("Tokens", str(n_tok)), ("Fits", ", ".join(sorted(df["fit"].unique())))]
    return {"figures": [f for f in figures if f], "facts": facts}


def build(inp: SectionInput) -> dict | None:
    """The section's dict, or None when the run lacks its table."""
    df = inp.table("pca_views")
    return None if df is None else pca_section(df, inp.figures)


SECTION = Section(
    id="pca-views",
    title="PCA views of tokens",
    tables={
        "pca_views": ("model", "layer", "fit", "x", "y", "category", "label", "explained_variance"),
    },
    build=build,
    template="sections/pca_views.html.j2",
)
