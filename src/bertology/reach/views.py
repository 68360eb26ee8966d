"""How the built-in tables show beyond their own run: a many-model run's side-by-side (``many_view=ManyView(caption,
view)``: one row per layer, one column per tuned model, :mod:`bertology.report.many`) and tracking's scalars
(``track=Track(scalars)``: ``bertology/<metric>/layer_<l>``, :mod:`bertology.integrations.tracker`). The tables'
specs declare them; pure pandas, no model.
"""
from __future__ import annotations

import pandas as pd


def attention_change_view(t: pd.DataFrame) -> pd.DataFrame:
    """Mean 1 - cosine(base, tuned) over the heads of each layer, per tuned model."""
    return t.assign(change=1 - t["cosine"]).pivot_table(index="layer", columns="tuned", values="change", aggfunc="mean",
                                                        sort=False)


def representation_similarity_view(t: pd.DataFrame) -> pd.DataFrame:
    """Linear CKA of base and tuned at the same layer, per tuned model."""
    same = t[(t["layer_base"] == t["layer_tuned"]) & (t["metric"] == "cka_linear")]
    return same.pivot_table(index="layer_base", columns="tuned", values="value", aggfunc="mean", sort=False)


def representation_similarity_scalars(table: pd.DataFrame) -> dict[str, float]:
    """CKA and RSA (Pearson) of the same layer."""
    t = table[(table["layer_base"] == table["layer_tuned"]) & table["metric"].isin(["cka_linear", "rsa_pearson"])]
    return {f"bertology/{r.metric}/layer_{r.layer_base}": float(r.value) for r in t.itertuples()}


def attention_change_scalars(table: pd.DataFrame) -> dict[str, float]:
    """Each layer's mean attention cosine and JS divergence."""
    means = table.groupby("layer")[["cosine", "js_divergence"]].mean()
    return {f"bertology/attention_{m}/layer_{layer}": float(v) for layer, row in means.iterrows() for m, v in row.items()}


def geometry_scalars(table: pd.DataFrame) -> dict[str, float]:
    """The tuned model's anisotropy per layer."""
    t = table[(table["model"] != "base") & (table["metric"] == "anisotropy")]
    return {f"bertology/anisotropy/layer_{r.layer}": float(r.value) for r in t.itertuples()}
