"""Attention change per head: cosine and Jensen-Shannon divergence of base vs tuned attention maps."""
from __future__ import annotations

import pandas as pd

from bertology.extremes import all_read_the_same, bound_text, decimals_to_tell, fixed
from bertology.report.format import fmt_value, sort_key, unique_text
from bertology.report.sections.base import Figures, Section, SectionInput


def most_changed_card(heads: pd.DataFrame) -> dict:
    """The overview's card of the head whose attention changed most, by JS divergence (the measure the section's
    table ranks by and its JS heatmap shows), in the decimals that tell it from the runner-up; "none stands out"
    when every head reads the same at the default decimals."""
    ranked = heads.sort_values(["js_divergence", "cosine", "layer", "head"], ascending=[False, True, True, True])
    js = ranked["js_divergence"].tolist()
    label = "Most changed head (JS divergence)"
    if all_read_the_same(js):
        cos = ranked["cosine"].tolist()
        return {"label": label, "text": "none stands out",
                "note": f"all {len(js):,} heads: JS divergence {bound_text(js, lowest=False)}"
                        + (f", cosine {bound_text(cos, lowest=True)}" if all_read_the_same(cos) else "")}
    first, d = ranked.iloc[0], decimals_to_tell(js, 1)
    note = f"JS divergence {fixed(first['js_divergence'], d)}"
    if len(ranked) > 1:
        second = ranked.iloc[1]
        note += f" (next: L{int(second['layer'])}H{int(second['head'])}, {fixed(second['js_divergence'], d)})"
    return {"label": label, "text": f"L{int(first['layer'])}H{int(first['head'])}",
            "note": note + f"; cosine {fmt_value(first['cosine'], 3)}"}


def attention_section(df: pd.DataFrame, figs: Figures, derived: list[dict]) -> dict:
    """Per-head heatmaps, per-layer curves and the ten most changed heads."""
    heads = per_head(df)
    n_layers, n_heads = heads["layer"].nunique(), heads["head"].nunique()
    figures = _heatmaps(heads, figs)
    curve = _layer_curves(heads, figs)
    table, top = most_changed_table(heads)
    if top:
        derived.append(most_changed_card(heads))
    derived.append({"label": "Mean attention cosine", "text": fmt_value(heads["cosine"].mean()),
                    "note": f"over {n_layers * n_heads:,} heads"})
    modes = unique_text(df["mode"]) if "mode" in df else None
    return {
        "heatmaps": [f for f in figures if f],
        "curve": curve,
        "top": table,
        "facts": [
            ("Layers × heads", f"{n_layers} × {n_heads}"),
            ("Examples", unique_text(df["n_examples"])),
            *([("Mode", modes)] if modes else []),
        ],
    }


def per_head(df: pd.DataFrame) -> pd.DataFrame:
    """One row per head (integer ``layer``, ``head``): the table's numeric columns averaged over its rows."""
    df = df.copy()
    for col in ("layer", "head"):
        df[col] = pd.to_numeric(df[col], errors="coerce")
    df = df.dropna(subset=["layer", "head"])
    df["layer"] = df["layer"].astype(int)
    df["head"] = df["head"].astype(int)
    return df.groupby(["layer", "head"], as_index=False).mean(numeric_only=True)


def _heatmaps(heads: pd.DataFrame, figs: Figures) -> list:
    """The cosine and JS-divergence heatmaps per layer and head."""
    from bertology.viz.figures import ColourScale, head_heatmap

    return [
        figs.make(
            "attention_cosine",
            lambda: head_heatmap(heads, "cosine", title="Cosine similarity",
                                 scale=ColourScale(vmax=1.0 if heads["cosine"].max() <= 1.0 + 1e-6 else None, min_span=0.1)),
            "Cosine similarity between base and tuned attention maps, per head (mean over examples; "
            "1 = unchanged). Darker = changed more.",
            "Heatmap of attention cosine similarity per layer and head",
        ),
        figs.make(
            "attention_js",
            lambda: head_heatmap(heads, "js_divergence", title="JS divergence",
                                 scale=ColourScale(vmin=0.0, min_span=0.05)),
            "Jensen–Shannon divergence (base 2, in bits; 0 = unchanged) between base and tuned attention "
            "distributions of each query, averaged over queries and examples. Darker = changed more. The overview's "
            "most changed head and the table of most changed heads rank the heads by this measure.",
            "Heatmap of attention Jensen-Shannon divergence per layer and head",
        ),
    ]


def _layer_curves(heads: pd.DataFrame, figs: Figures):
    """Per layer, the heads' mean cosine and JS divergence with a band of one standard deviation across heads."""
    from bertology.viz.figures import CurveStyle, layer_curve

    per_layer = (
        heads.groupby("layer")
        .agg(cosine=("cosine", "mean"), cosine_sd=("cosine", "std"),
             js_divergence=("js_divergence", "mean"), js_sd=("js_divergence", "std"))
        .reset_index()
    )
    long = pd.concat(
        [
            pd.DataFrame({"layer": per_layer["layer"], "metric": "cosine", "value": per_layer["cosine"],
                          "spread": per_layer["cosine_sd"].fillna(0.0)}),
            pd.DataFrame({"layer": per_layer["layer"], "metric": "js_divergence",
                          "value": per_layer["js_divergence"], "spread": per_layer["js_sd"].fillna(0.0)}),
        ],
        ignore_index=True,
    )
    return figs.make(
        "attention_by_layer",
        lambda: layer_curve(long, x="layer", y="value", hue=None, facet="metric", err="spread",
                            style=CurveStyle(xlabel="layer", reference={"cosine": 1.0, "js_divergence": 0.0},
                                             err_clip=(0.0, 1.0), min_span=0.1,
                                             facet_order=["cosine", "js_divergence"])),
        "Mean over the heads of each layer; the band is ±1 standard deviation across heads.",
        "Per-layer mean cosine similarity and Jensen-Shannon divergence",
    )


def most_changed_table(heads: pd.DataFrame) -> tuple[dict, list[dict]]:
    """The table of the ten heads whose attention changed most (by JS divergence), and its rows."""
    ranked = heads.sort_values(["js_divergence", "cosine"], ascending=[False, True]).head(10)
    top = []
    for rank, (_, row) in enumerate(ranked.iterrows(), start=1):
        top.append({
            "rank": rank,
            "label": f"L{int(row['layer'])}H{int(row['head'])}",
            "layer": int(row["layer"]),
            "head": int(row["head"]),
            "cosine": row["cosine"],
            "cosine_std": row.get("cosine_std"),
            "js": row["js_divergence"],
            "n": row.get("n_examples"),
        })
    columns = [
        ("rank", "Rank", "num"), ("label", "Head", "text"), ("layer", "Layer", "num"),
        ("head", "Head index", "num"), ("cosine", "Cosine", "num"), ("cosine_std", "Cosine SD", "num"),
        ("js", "JS divergence", "num"), ("n", "Examples", "num"),
    ]
    if "cosine_std" not in heads:
        columns = [c for c in columns if c[0] != "cosine_std"]
    table = {
        "columns": [{"key": k, "label": lab, "type": t} for k, lab, t in columns],
        "rows": [[{"text": fmt_value(r[k]) if k != "label" else r[k], "value": sort_key(r[k])}
                  for k, _, _ in columns] for r in top],
    }
    return table, top


def build(inp: SectionInput) -> dict | None:
    """The section's dict, or None when the run lacks its table."""
    df = inp.table("attention_change")
    return None if df is None else attention_section(df, inp.figures, inp.derived)


SECTION = Section(
    id="attention-change",
    title="Attention change",
    tables={
        "attention_change": ("layer", "head", "cosine", "js_divergence", "n_examples"),
    },
    build=build,
    template="sections/attention_change.html.j2",
)
