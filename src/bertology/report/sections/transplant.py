"""Transplant: the two layer curves (gain recovered with interval bands), the single units, and the facts."""
from __future__ import annotations

import pandas as pd

from bertology.report.format import fmt_value, sortable
from bertology.report.sections.base import Figures, Section, SectionInput


def _figures(df: pd.DataFrame, figs: Figures) -> list[dict | None]:
    """One curve figure per metric whose gain is defined (the primary metric's and the loss's)."""
    from bertology.tasks.catalog import task_of_table
    from bertology.viz.transplant import transplant_curves

    task = task_of_table(df)
    out = []
    for metric in dict.fromkeys((task.primary, task.loss_metric)):
        sub = df[(df["unit_kind"] == "layers") & (df["metric"] == metric)]
        if len(sub) and sub["gain_recovered"].notna().any():
            out.append(figs.make(
                f"transplant_{metric}", lambda m=metric: transplant_curves(df, m),
                f"Gain recovered in {metric} when the top k (blue) or bottom k (red; with the embeddings) tuned layers "
                "are put into the base encoder under the tuned head: 0 = the head alone, 1 = the tuned model. Bands: "
                "95% paired bootstrap intervals over examples.",
                f"Line chart of the fine-tuning gain recovered in {metric} against the number of transplanted layers"))
    return out


def _units_table(df: pd.DataFrame, metric: str) -> dict:
    """The single units (embeddings, layers, blocks, heads) ranked by gain recovered."""
    units = df[(df["unit_kind"] != "layers") & (df["metric"] == metric)]
    units = units.sort_values("gain_recovered", ascending=False, na_position="last")
    columns = [("label", "Unit", "text"), ("value", metric, "num"), ("gain_recovered", "Gain recovered", "num"),
               ("ci_low", "CI low", "num"), ("ci_high", "CI high", "num"), ("reason", "Note", "text")]
    rows = [[str(r["label"]), r["value"], r["gain_recovered"], r["ci_low"], r["ci_high"], str(r["reason"] or "")]
            for _, r in units.iterrows()]
    return sortable(columns, rows)


def transplant_section(df: pd.DataFrame, figs: Figures, derived: list[dict]) -> dict:
    """Curves, single units and facts; the headline card says the top curve's gain at the middle k."""
    from bertology.tasks.catalog import task_of_table

    metric = task_of_table(df).primary
    m = df[df["metric"] == metric]
    first = m.iloc[0]
    undefined = str(first["reason"]) if m["reason"].astype(bool).all() else ""
    facts = [("Tuned model", fmt_value(first["value_tuned"], 4)),
             ("Head alone (base encoder, tuned head)", fmt_value(first["value_head_alone"], 4)),
             ("Examples", f"{int(first['n_examples']):,}"),
             *([("Gain recovered", f"undefined: {undefined}")] if undefined else [])]
    top = m[(m["unit_kind"] == "layers") & (m["direction"] == "top")].dropna(subset=["gain_recovered"])
    if len(top) > 2:
        mid = top.iloc[len(top) // 2]
        derived.append({"label": "Transplant", "text": f"top {int(mid['k'])} layers: {100 * mid['gain_recovered']:.0f}%",
                        "note": f"of the fine-tuning gain in {metric}"})
    return {"figures": [f for f in _figures(df, figs) if f], "units": _units_table(df, metric), "facts": facts}


def build(inp: SectionInput) -> dict | None:
    """The section's dict, or None when the run lacks its table."""
    df = inp.table("transplant")
    return None if df is None else transplant_section(df, inp.figures, inp.derived)


SECTION = Section(
    id="transplant",
    title="Transplant: how much of the fine-tuning gain each unit carries",
    tables={"transplant": ("unit_kind", "layer", "head", "direction", "k", "label", "metric", "value",
                           "value_head_alone", "value_tuned", "gain_recovered", "ci_low", "ci_high", "reason",
                           "n_examples")},
    build=build,
    template="sections/transplant.html.j2",
)
