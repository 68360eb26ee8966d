"""Measure agreement: which attention findings hold under each contribution measure, and which do not."""
from __future__ import annotations

import pandas as pd

from bertology.report.format import sortable
from bertology.report.sections.base import Section, SectionInput

#: The table's columns the section reads.
COLUMNS = ("analysis", "headline", "measure", "model", "level", "layer", "weights_unit", "measure_unit",
           "weights_value", "measure_value", "rank_correlation", "top_k_overlap", "agrees")


def _num(value) -> float | None:
    """A cell's number, None for a missing one."""
    return None if value is None or pd.isna(value) else float(value)


def _text(value) -> str:
    """A cell's text, empty for a missing one."""
    return "" if value is None or pd.isna(value) else str(value)


def _table(rows: pd.DataFrame) -> dict:
    """The headlines (per-layer target rows left out: the figure draws them), each with agrees or disagrees."""
    columns = [("analysis", "Analysis", "text"), ("headline", "Headline", "text"), ("measure", "Measure", "text"),
               ("model", "Model", "text"), ("level", "Compared per", "text"), ("weights_unit", "Weights", "text"),
               ("measure_unit", "Measure", "text"), ("weights_value", "Weights value", "num"),
               ("measure_value", "Measure value", "num"), ("rank_correlation", "Spearman", "num"),
               ("top_k_overlap", "Top-k overlap", "num"), ("agrees", "Verdict", "text")]
    body = [[r.analysis, r.headline, r.measure, _text(r.model), r.level, _text(r.weights_unit),
             _text(r.measure_unit), _num(r.weights_value), _num(r.measure_value), _num(r.rank_correlation),
             _num(r.top_k_overlap), "" if pd.isna(r.agrees) else ("agrees" if r.agrees else "disagrees")]
            for r in rows.itertuples()]
    return sortable(columns, body)


def build(inp: SectionInput) -> dict | None:
    """The section's dict, or None when the run lacks the table."""
    from bertology.viz.agreement import share_by_measure

    table = inp.tables.get("measure_agreement")  # as written: its ``measure`` column names the measure compared
    # with the weights, so the one-measure view of an attention table (``inp.table``) would drop every row
    if table is None or table.empty:
        return None
    figures = []
    for target in ("cls_share", "sep_share"):
        has = (table["headline"] == target) & (table["model"] == "base") & table["layer"].notna()
        if has.any():
            figures.append(inp.figures.make(
                f"measure_agreement_{target}", lambda t=target: share_by_measure(table, t, "base"),
                f"The base model's attention share to {target.removesuffix('_share')} per layer (head mean) under "
                "the weights (black) and each contribution measure. A per-layer measure has one map per layer.",
                f"Line chart of the {target.removesuffix('_share')} share per layer under each measure"))
    headlines = table[table["layer"].isna()]
    known = headlines[headlines["agrees"].notna()]
    inp.derived.append({"label": "Measure agreement", "text": f"{int(known['agrees'].sum())} of {len(known)} "
                        "headlines agree", "note": "weights vs " + ", ".join(table["measure"].unique())})
    return {"figures": [f for f in figures if f], "table": _table(headlines)}


SECTION = Section(
    id="measure-agreement",
    title="Measure agreement",
    tables={"measure_agreement": COLUMNS},
    build=build,
    template="sections/measure_agreement.html.j2",
)
