"""Ethayarajh (2019) contextuality measures per layer, and the words whose self-similarity moved most."""
from __future__ import annotations

import pandas as pd

from bertology.report.format import fmt_value, sortable
from bertology.report.sections.base import Figures, Section, SectionInput


GEOMETRY_LABELS = {
    "anisotropy": "anisotropy (random token pairs)", "self_similarity": "self-similarity",
    "intra_similarity": "intra-sentence similarity", "mev": "max. explainable variance",
    "mev_baseline": "MEV of random tokens", "self_similarity_adjusted": "self-similarity, adjusted",
    "intra_similarity_adjusted": "intra-sentence similarity, adjusted", "mev_adjusted": "MEV, adjusted",
}


def geometry_section(df: pd.DataFrame, words: pd.DataFrame | None, figs: Figures, derived: list[dict]) -> dict:
    """Ethayarajh (2019) per layer, base vs tuned, and the words whose self-similarity moved most."""
    from bertology.viz.geometry import geometry_figure

    df = df.copy()
    figures = [figs.make(
        "geometry", lambda: geometry_figure(df),
        "Per layer, base (blue) and tuned: top row the raw measures, bottom row adjusted for anisotropy (the "
        "measure minus its random-token baseline at the same layer). Lower adjusted self-similarity means "
        "more context-specific word representations (Ethayarajh 2019).",
        "Embedding geometry per layer, base and tuned",
    )]
    last = int(df["layer"].max())
    rows = []
    for metric in [m for m in GEOMETRY_LABELS if (df["metric"] == m).any()]:
        sub = df[(df["metric"] == metric) & (df["layer"] == last)].set_index("model")["value"]
        b, t = sub.get("base"), sub.get("tuned")
        n = df[(df["metric"] == metric) & (df["layer"] == last)]["n"].max()
        rows.append([GEOMETRY_LABELS[metric], b, t, (t - b) if b is not None and t is not None else None, n])
    table = sortable([("metric", f"Measure (layer {last})", "text"), ("base", "base", "num"), ("tuned", "tuned", "num"),
                      ("change", "change", "num"), ("n", "n", "num")], rows)
    aniso = df[(df["metric"] == "anisotropy") & (df["layer"] == last)].set_index("model")["value"]
    if {"base", "tuned"} <= set(aniso.index):
        derived.append({"label": f"Anisotropy, layer {last}", "text": f"{aniso['base']:.3f} → {aniso['tuned']:.3f}",
                        "note": "mean cosine of random token pairs from different sentences"})
    word_table = None
    if words is not None and len(words):
        w = words[words["layer"] == last].pivot_table(index="word", columns="model", values="self_similarity_adjusted"
                                                      if "self_similarity_adjusted" in words else "self_similarity")
        if {"base", "tuned"} <= set(w.columns):
            w = w.assign(change=w["tuned"] - w["base"]).sort_values("change")
            counts = words[(words["layer"] == last) & (words["model"] == "base")].set_index("word")["n_contexts"]
            pick = pd.concat([w.head(8), w.tail(4)])
            word_table = sortable([("word", "Word", "text"), ("base", "base", "num"), ("tuned", "tuned", "num"),
                                   ("change", "change", "num"), ("n", "contexts", "num")],
                                  [[i, r.base, r.tuned, r.change, counts.get(i)] for i, r in pick.iterrows()])
    aniso_n = df[df["metric"] == "anisotropy"]["n"].max()
    ss_n = df[df["metric"] == "self_similarity"]["n"].max() if (df["metric"] == "self_similarity").any() else None
    facts = [("Random token pairs", fmt_value(aniso_n)), ("Words in several contexts", fmt_value(ss_n)),
             ("Seed", fmt_value(df["seed"].iloc[0]) if "seed" in df else "—")]
    return {"figures": [f for f in figures if f], "table": table, "words": word_table, "facts": facts}


def build(inp: SectionInput) -> dict | None:
    """The section's dict, or None when the run lacks its table."""
    df = inp.table("geometry")
    return None if df is None else geometry_section(df, inp.table("geometry_words"), inp.figures, inp.derived)


SECTION = Section(
    id="geometry",
    title="Embedding geometry",
    tables={
        "geometry": ("model", "layer", "metric", "value", "n"),
        "geometry_words": ("model", "layer", "word", "self_similarity"),
    },
    build=build,
    template="sections/geometry.html.j2",
)
