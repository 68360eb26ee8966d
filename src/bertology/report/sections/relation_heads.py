"""The best head per dependency (or user-given) relation against the best fixed-offset baseline."""
from __future__ import annotations

import pandas as pd

from bertology.extremes import decimals_to_tell, fixed, ties
from bertology.report.format import sortable, slug
from bertology.report.sections.base import Figures, Section, SectionInput


def relations_section(df: pd.DataFrame, figs: Figures, derived: list[dict]) -> dict:
    """Best head per relation vs the offset baseline, and per-head accuracy heatmaps."""
    from bertology.analyses.relation_heads import best_heads
    from bertology.viz.figures import ColourScale, head_heatmap

    df = df.copy()
    if "kind" not in df.columns:
        df["kind"] = "dependency"
    kind_of = df.groupby("relation")["kind"].first().to_dict()
    best = best_heads(df, by_direction=False)
    rels = sorted(set(best["relation"]), key=lambda r: (kind_of.get(r) == "span", r != "all",
                                                        -int(best.loc[best.relation == r, "n"].max()), r))
    rows = []
    for rel in rels:
        b = best[(best.relation == rel) & (best.model == "base")]
        t = best[(best.relation == rel) & (best.model == "tuned")]
        first = b if len(b) else t
        rows.append([
            rel, "yours" if kind_of.get(rel) == "span" else "syntax", int(first["n"].iloc[0]),
            f"{b.head_label.iloc[0]} ({b.direction.iloc[0]})" if len(b) else "—", b.accuracy.iloc[0] if len(b) else None,
            f"{t.head_label.iloc[0]} ({t.direction.iloc[0]})" if len(t) else "—", t.accuracy.iloc[0] if len(t) else None,
            first.baseline_accuracy.iloc[0], f"{int(first.baseline_offset.iloc[0]):+d}",
        ])
    table = sortable([("relation", "Relation", "text"), ("kind", "Kind", "text"), ("n", "Pairs", "num"), ("bhead", "base best head", "text"),
                      ("bacc", "base accuracy", "num"), ("thead", "tuned best head", "text"),
                      ("tacc", "tuned accuracy", "num"), ("bl", "best offset accuracy", "num"),
                      ("off", "offset", "text")], rows)
    heatmaps = []
    for model in ("base", "tuned"):
        sub = df[(df.relation == "all") & (df.direction == "dep->head") & (df.model == model)]
        if len(sub):
            heatmaps.append(figs.make(
                f"relation_all_{model}",
                lambda sub=sub, model=model: head_heatmap(sub, value="accuracy", title=f"All relations, dependent → head ({model})",
                                                         scale=ColourScale("viridis", vmin=0.0), colorbar_label="accuracy"),
                f"Share of dependents whose most-attended word is their syntactic head, per head ({model}).",
                f"Relation-head accuracy per head, {model}",
            ))
    span_rels = [r for r in rels if kind_of.get(r) == "span"][:4]
    for rel in span_rels:
        for model in ("base", "tuned"):
            sub = df[(df.relation == rel) & (df.direction == "from->to") & (df.model == model)]
            if len(sub):
                heatmaps.append(figs.make(
                    f"relation_user_{slug(rel)}_{model}",
                    lambda sub=sub, model=model, rel=rel: head_heatmap(
                        sub, value="accuracy", title=f"{rel}: from span → to span ({model})",
                        scale=ColourScale("viridis", vmin=0.0), colorbar_label="accuracy"),
                    f"Your relation “{rel}”: share of instances whose span attends most to a target span, per head ({model}).",
                    f"Accuracy per head for the relation {rel}, {model}",
                ))
    overall = best[(best.relation == "all") & (best.model == "tuned")]
    if len(overall):
        # every tuned head's best accuracy over all relations (either direction), best first: the runner-up decides
        # the decimals, and a tie is said
        heads = (df[(df.relation == "all") & (df.model == "tuned")].groupby(["layer", "head"])["accuracy"].max()
                 .sort_values(ascending=False).tolist())
        d, tied = decimals_to_tell(heads, 1), ties(heads)
        acc = float(overall.accuracy.iloc[0])
        note = f"all relations {fixed(acc, d)} vs offset {fixed(float(overall.baseline_accuracy.iloc[0]), d)}"
        if tied:
            note += f"; tied with {tied} other head{'s' if tied > 1 else ''} (the lowest layer shown)"
        elif len(heads) > 1 and d > 3:
            note += f"; next head {fixed(heads[1], d)}"
        derived.append({"label": "Best syntactic head (tuned)", "text": str(overall.head_label.iloc[0]), "note": note})
    return {"table": table,
            "heatmaps": [h for h in heatmaps if h],
            "facts": [("Relations", str(len(rels))), ("Directions", "dependent → head, head → dependent")]
            + ([("Your relations", f"{len([r for r in rels if kind_of.get(r) == 'span'])} (directions from → to, to → from)")]
               if "span" in kind_of.values() else [])}


def build(inp: SectionInput) -> dict | None:
    """The section's dict, or None when the run lacks its table."""
    df = inp.table("relation_heads")
    return None if df is None else relations_section(df, inp.figures, inp.derived)


SECTION = Section(
    id="relation-heads",
    title="Relation heads",
    tables={
        "relation_heads": ("model", "relation", "direction", "layer", "head", "accuracy", "baseline_offset",
                           "baseline_accuracy", "n"),
    },
    build=build,
    template="sections/relation_heads.html.j2",
)
