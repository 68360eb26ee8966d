"""Changed vs needed: per head, its change against the task's loss when it is reverted, and the rank correlations."""
from __future__ import annotations

import pandas as pd

from bertology.experiments.changed_vs_needed import MEASURE_WORDS, describe_link, headline
from bertology.report.format import sortable
from bertology.report.sections.base import Section, SectionInput


def _scatter(inp: SectionInput, units: pd.DataFrame, row: pd.Series) -> dict | None:
    """The per-head scatter for the headline's change measure and metric, its rho and interval in the caption."""
    from bertology.viz.changed import changed_needed_scatter

    measure, metric = str(row["change_measure"]), str(row["metric"])
    return inp.figures.make(
        "changed_vs_needed", lambda: changed_needed_scatter(units, measure, metric),
        f"One point per head: its {MEASURE_WORDS.get(measure, measure)} (x) against the drop in {metric} when that "
        f"head alone is put back to the base weights (y; above the dashed line = the task needs the change). "
        f"{describe_link(row)} over {int(row['n_units'])} heads (95% bootstrap interval over heads, optimistic: "
        "heads of one layer are not independent).",
        "Scatter of per-head change against the metric drop when the head is reverted")


def _table(links: pd.DataFrame) -> dict:
    """Every rho of the run: level, change measure, metric, rho and interval (or why it is undefined), units."""
    columns = [("level", "Unit", "text"), ("change_measure", "Change", "text"), ("metric", "Metric", "text"),
               ("spearman", "Spearman", "num"), ("ci_low", "CI low", "num"), ("ci_high", "CI high", "num"),
               ("n_units", "Units", "num"), ("reason", "Why undefined", "text")]
    rows = [[str(r.level), MEASURE_WORDS.get(r.change_measure, r.change_measure), str(r.metric),
             None if pd.isna(r.spearman) else float(r.spearman), None if pd.isna(r.ci_low) else float(r.ci_low),
             None if pd.isna(r.ci_high) else float(r.ci_high), int(r.n_units),
             "" if r.reason is None or pd.isna(r.reason) else str(r.reason)] for r in links.itertuples()]
    return sortable(columns, rows)


def build(inp: SectionInput) -> dict | None:
    """The section's dict, or None when the run lacks the table."""
    links = inp.table("changed_vs_needed")
    if links is None:
        return None
    row = headline(links, "head")
    units = inp.table("changed_vs_needed_units")
    scatter = _scatter(inp, units, row) if row is not None and units is not None else None
    if row is not None:
        inp.derived.append({"label": "Changed vs needed (heads)", "text": describe_link(row),
                            "note": f"{MEASURE_WORDS.get(row['change_measure'], row['change_measure'])} vs revert drop"})
    return {"figures": [scatter] if scatter else [], "table": _table(links)}


SECTION = Section(
    id="changed-vs-needed",
    title="Changed vs needed",
    tables={"changed_vs_needed": ("level", "change_measure", "metric", "spearman", "ci_low", "ci_high", "n_units",
                                  "reason"),
            "changed_vs_needed_units": ("level", "layer", "head", "change_measure", "metric", "change", "needed")},
    build=build,
    template="sections/changed_vs_needed.html.j2",
)
