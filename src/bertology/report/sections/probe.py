"""Hewitt & Manning's structural probes per layer: base, tuned and the random-init control."""
from __future__ import annotations

import pandas as pd

from bertology.report.format import fmt_value, sortable
from bertology.report.sections.base import Figures, Section, SectionInput


def probe_section(df: pd.DataFrame, figs: Figures, derived: list[dict], baselines: pd.DataFrame | None = None) -> dict:
    """Hewitt & Manning's distance and depth probes per layer: base, tuned, the random-init control and (when the
    run has it) the linear-chain baseline."""
    from bertology.viz.probe import probe_layer_figure

    df = df.copy()
    split = "test" if (df["split"] == "test").any() else str(df["split"].iloc[0])
    chain = _chain(baselines, split)
    dashed = (" The dashed line is the linear-chain baseline (each word attached to the next; no model read)."
              if chain else "")
    figures = [
        figs.make("probe_distance", lambda: probe_layer_figure(df, ("uuas", "dspr"), split=split, baselines=baselines),
                  f"Distance probe on the {split} trees: UUAS (the minimum spanning tree of the predicted distances "
                  "against the gold edges, punctuation excluded) and DSpr (Spearman of predicted and gold distances, "
                  "averaged per sentence length over lengths 5-50), per layer and model." + dashed,
                  "Distance probe scores per layer"),
        figs.make("probe_depth", lambda: probe_layer_figure(df, ("root_acc", "nspr"), split=split, baselines=baselines),
                  f"Depth probe on the {split} trees: root accuracy (the least deep word is the root) and NSpr "
                  "(Spearman of predicted and gold depths)." + dashed,
                  "Depth probe scores per layer"),
    ]
    sub = df[df["split"] == split]
    rows = []
    for model, part in sub.groupby("model", sort=False):
        dist, depth = part[part["probe"] == "distance"], part[part["probe"] == "depth"]
        cells = [model]
        for frame, metric in ((dist, "uuas"), (dist, "dspr"), (depth, "root_acc"), (depth, "nspr")):
            frame = frame.dropna(subset=[metric])
            if len(frame):
                best = frame.loc[frame[metric].idxmax()]
                cells += [best[metric], int(best["layer"])]
            else:
                cells += [None, None]
        rows.append(cells)
    if chain:
        rows.append(["linear chain (baseline)", *(v for m in ("uuas", "dspr", "root_acc", "nspr") for v in (chain.get(m), None))])
    table = sortable([("model", "Model", "text"), ("uuas", "best UUAS", "num"), ("uuas_l", "layer", "num"),
                      ("dspr", "best DSpr", "num"), ("dspr_l", "layer", "num"), ("root", "best root acc.", "num"),
                      ("root_l", "layer", "num"), ("nspr", "best NSpr", "num"), ("nspr_l", "layer", "num")], rows)
    best = {r[0]: r[1] for r in rows if r[1] is not None}
    if {"base", "tuned"} <= set(best):
        controls = ([f"random init {best['random']:.3f}"] if "random" in best else []) + \
                   ([f"linear chain {chain['uuas']:.3f}"] if chain.get("uuas") is not None else [])
        derived.append({"label": "Best UUAS, base → tuned", "text": f"{best['base']:.3f} → {best['tuned']:.3f}",
                        "note": "; ".join(["structural distance probe", *controls])})
    first = sub.iloc[0]
    facts = [("Split scored", split), ("Sentences scored", fmt_value(first.get("n_sentences")) if "n_sentences" in df else "—"),
             ("Probe rank", fmt_value(first.get("rank")) if "rank" in df else "—"),
             ("Models", ", ".join(pd.unique(df["model"])))]
    return {"figures": [f for f in figures if f], "table": table, "facts": facts}


def _chain(baselines: pd.DataFrame | None, split: str) -> dict[str, float]:
    """The linear-chain baseline's scores on ``split`` by metric (empty: the run has no baseline table)."""
    if baselines is None:
        return {}
    sub = baselines[(baselines["split"] == split) & (baselines["baseline"] == "linear_chain")]
    return {m: float(v.iloc[0]) for m in ("uuas", "dspr", "root_acc", "nspr") if len(v := sub[m].dropna())}


def build(inp: SectionInput) -> dict | None:
    """The section's dict, or None when the run lacks its table."""
    df = inp.table("probe")
    return None if df is None else probe_section(df, inp.figures, inp.derived, inp.table("probe_baseline"))


SECTION = Section(
    id="probe",
    title="Structural probes",
    tables={
        "probe": ("model", "layer", "probe", "split", "uuas", "dspr", "root_acc", "nspr"),
        "probe_baseline": ("baseline", "probe", "split", "uuas", "dspr", "root_acc", "nspr"),
    },
    build=build,
    template="sections/probe.html.j2",
)
