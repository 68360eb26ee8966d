"""Every head of both models on one MDS map of attention distances, and the heads that moved most."""
from __future__ import annotations

import pandas as pd

from bertology.extremes import all_read_the_same, bound_text, decimals_to_tell, fixed
from bertology.report.format import fmt_value, sortable
from bertology.report.sections.base import Figures, Section, SectionInput


def head_map_section(df: pd.DataFrame, figs: Figures, derived: list[dict], headline: bool = True) -> dict:
    """The MDS map of all heads, how far each moved, and the ten that moved most; ``headline``: the overview gets
    the card of the head that moved most (left to the attention-change card when the run has one, so the overview
    names one most changed head, by one measure)."""
    from bertology.analyses.head_map import most_moved
    from bertology.viz.figures import ColourScale, head_heatmap
    from bertology.viz.head_map import head_map_figure

    df = df.copy()
    figures = [figs.make(
        "head_map",
        lambda: head_map_figure(df),
        "Every head of both models placed by multidimensional scaling of the Jensen-Shannon distances between "
        "their attention distributions (Clark et al. 2019, §6): circles are base heads, triangles tuned heads, "
        "colour is the layer; lines join a head's two versions and arrows mark the heads that moved most.",
        "Head map: MDS of head distances, base and tuned",
    )]
    base = df[df["model"] == "base"]
    if len(base):
        figures.append(figs.make(
            "head_moved",
            lambda: head_heatmap(base, value="moved", title="How far each head moved (JS distance)", 
                                 scale=ColourScale("magma_r", vmin=0.0), colorbar_label="JS distance, base → tuned"),
            "Jensen-Shannon distance between each head's base and tuned attention, averaged over the sampled tokens.",
            "Per-head distance between base and tuned attention",
        ))
    ranked = most_moved(df, top=None)
    top = ranked.head(10)
    table = sortable([("label", "Head", "text"), ("layer", "Layer", "num"), ("moved", "JS distance moved", "num")],
                     [[r.label, int(r.layer), r.moved] for r in top.itertuples()])
    if len(top) and headline:
        moved = ranked["moved"].tolist()
        label = "Head that moved most (JS distance, head map)"
        if all_read_the_same(moved):
            derived.append({"label": label, "text": "none stands out",
                            "note": f"all {len(moved):,} heads moved {bound_text(moved, lowest=False)}"})
        else:
            d = decimals_to_tell(moved, 1)
            derived.append({"label": label, "text": str(top.label.iloc[0]),
                            "note": f"JS distance {fixed(moved[0], d)} between its base and tuned attention"
                                    + (f" (next: {ranked.label.iloc[1]}, {fixed(moved[1], d)})" if len(moved) > 1 else "")})
    first = df.iloc[0]
    facts = [("Examples sampled", fmt_value(first.get("n_examples"))), ("Query tokens", fmt_value(first.get("n_tokens"))),
             ("Distance", str(first.get("distance", "js_distance")).replace("_", " ")),
             ("MDS stress-1", fmt_value(first.get("stress")))]
    return {"figures": [f for f in figures if f], "table": table, "facts": facts}


def build(inp: SectionInput) -> dict | None:
    """The section's dict, or None when the run lacks its table."""
    df = inp.table("head_map")
    return None if df is None else head_map_section(df, inp.figures, inp.derived,
                                                     headline=inp.table("attention_change") is None)


SECTION = Section(
    id="head-map",
    title="Head map",
    tables={
        "head_map": ("model", "layer", "head", "x", "y", "moved", "n_examples"),
        "head_distance": ("model_a", "layer_a", "head_a", "model_b", "layer_b", "head_b", "js_divergence"),
    },
    build=build,
    template="sections/head_map.html.j2",
)
