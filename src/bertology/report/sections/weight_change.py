"""Weight-space change: relative change per layer and module, per head, intruder dimensions, the most moved units."""
from __future__ import annotations

import numpy as np
import pandas as pd

from bertology.extremes import significant_to_tell
from bertology.report.format import fmt_value, mapping, sortable
from bertology.report.sections.base import Figures, Section, SectionInput

#: The attention projections whose per-head slices make up a head.
HEAD_MODULES = ("query", "key", "value", "attention_output")


def head_change(df: pd.DataFrame) -> pd.DataFrame:
    """Per layer and head, the relative change of the head's four projections together:
    ``sqrt(sum ||D||_F^2) / sqrt(sum ||W_b||_F^2)`` over its query, key and value rows and output columns."""
    heads = df[df["head"].notna() & df["module"].isin(HEAD_MODULES)].dropna(subset=["delta_norm", "base_norm"])
    squares = heads.assign(d2=heads["delta_norm"] ** 2, b2=heads["base_norm"] ** 2)
    out = squares.groupby(["layer", "head"], as_index=False)[["d2", "b2"]].sum()
    out["relative_change"] = np.sqrt(out["d2"]) / np.sqrt(out["b2"]).where(out["b2"] > 0)
    return out.astype({"layer": int, "head": int})[["layer", "head", "relative_change"]]


def _figures(units: pd.DataFrame, df: pd.DataFrame, figs: Figures) -> list[dict | None]:
    """The layer x module heatmaps (relative change; intruders when any) and the per-head heatmap."""
    from bertology.viz.figures import ColourScale, head_heatmap
    from bertology.viz.weights import module_heatmap

    out = [figs.make(
        "weight_change", lambda: module_heatmap(units, "relative_change", title="Relative weight change",
                                                colorbar_label="relative change"),
        "Relative Frobenius change ||W_tuned − W_base||_F / ||W_base||_F of each weight matrix (LayerNorms: their "
        "gain vector), per layer and module; 0 = unchanged, darker = moved more. Layer 0 holds the embeddings; "
        "grey cells are modules a layer does not have.",
        "Heatmap of relative weight change per layer and module")]
    matrices = units.dropna(subset=["intruders"])
    if len(matrices) and matrices["intruders"].max() > 0:
        k = int(matrices["top_k"].max())
        out.append(figs.make(
            "weight_intruders", lambda: module_heatmap(matrices.astype({"intruders": float}), "intruders",
                                                       title="Intruder dimensions", colorbar_label="count", fmt=".0f"),
            f"Intruder dimensions (Shuttleworth et al. 2024) among each tuned matrix's top {k} left singular vectors: "
            "vectors whose largest |cosine| with every base singular vector is below the threshold.",
            "Heatmap of intruder dimension counts per layer and module"))
    heads = head_change(df)
    if len(heads):
        out.append(figs.make(
            "weight_change_heads", lambda: head_heatmap(heads, "relative_change", title="Relative change per head",
                                                        scale=ColourScale(vmin=0.0), colorbar_label="relative change"),
            "Per head: the relative change of its query, key and value rows and its output-projection columns "
            "together (square root of the summed squared changes over that of the summed squared base norms).",
            "Heatmap of relative weight change per attention head"))
    return out


def _top_table(units: pd.DataFrame) -> dict:
    """The ten units that moved most, with their spectrum and intruders (and a note column when any unit has one)."""
    top = units.dropna(subset=["relative_change"]).sort_values("relative_change", ascending=False).head(10)
    columns = [("layer", "Layer", "num"), ("module", "Module", "text"), ("shape", "Shape", "text"),
               ("relative_change", "Relative change", "num"), ("stable_rank", "Stable rank of change", "num"),
               ("delta_sv_1", "σ₁ of change", "num"), ("intruders", "Intruders", "num")]
    notes = "note" in top and top["note"].fillna("").astype(bool).any()
    rows = [[int(r["layer"]), str(r["module"]), str(r["shape"]), r["relative_change"], r.get("stable_rank"),
             r.get("delta_sv_1"), None if pd.isna(r["intruders"]) else int(r["intruders"]),
             *([str(r["note"] or "")] if notes else [])] for _, r in top.iterrows()]
    return sortable(columns + ([("note", "Note", "text")] if notes else []), rows)


def weight_section(df: pd.DataFrame, manifest: dict, figs: Figures, derived: list[dict]) -> dict:
    """Heatmaps, the ten most changed units and the facts (what was compared, what was left out)."""
    df = df.copy()
    df["head"] = pd.to_numeric(df["head"], errors="coerce")
    units = df[df["head"].isna()]
    info = mapping(mapping(manifest.get("analyses")).get("weight_change"))
    settings = mapping(info.get("settings"))
    matrices = units.dropna(subset=["intruders"])
    ranked = units.dropna(subset=["relative_change"]).sort_values("relative_change", ascending=False)
    if len(ranked):
        first = ranked.iloc[0]
        changes = ranked["relative_change"].tolist()
        sig = significant_to_tell(changes, 1)  # as many digits as tell the first from the runner-up
        runner = (f" (next: L{int(ranked.iloc[1]['layer'])} {ranked.iloc[1]['module']}, {fmt_value(changes[1], sig)})"
                  if len(changes) > 1 else "")
        derived.append({"label": "Most changed weights", "text": f"L{int(first['layer'])} {first['module']}",
                        "note": f"relative change {fmt_value(first['relative_change'], sig)}{runner}"})
    shared = units[units["shared_by"] > 1] if "shared_by" in units else units.iloc[0:0]
    facts = [
        ("Units compared", f"{int(units['relative_change'].notna().sum()):,} of {len(units):,}"),
        ("Intruder dimensions", f"{int(matrices['intruders'].sum()):,} in {len(matrices):,} matrices"),
        ("Intruder k, ε", f"{settings.get('intruder_k', '—')}, {settings.get('intruder_epsilon', '—')}"),
        *([("Shared blocks", f"one block run at {int(shared['shared_by'].max())} depths (ALBERT): shown once, "
            "at its first layer")] if len(shared) else []),
        *([("Not compared", ", ".join(map(str, info["not_compared"])))] if info.get("not_compared") else []),
        *[("Note", str(n)) for n in info.get("notes") or []],
    ]
    main, *others = _figures(units, df, figs)
    return {"main": main, "figures": [f for f in others if f], "top": _top_table(units), "facts": facts}


def build(inp: SectionInput) -> dict | None:
    """The section's dict, or None when the run lacks its table."""
    df = inp.table("weight_change")
    return None if df is None else weight_section(df, dict(inp.manifest), inp.figures, inp.derived)


SECTION = Section(
    id="weight-change",
    title="Weight-space change",
    tables={"weight_change": ("layer", "module", "head", "relative_change", "delta_norm", "base_norm", "intruders",
                              "top_k")},
    build=build,
    template="sections/weight_change.html.j2",
)
