"""Revert: the tuned model with one unit put back to the base model's weights (Tamkin et al. 2020), the rows of the
ablation table in mode ``revert``: what the task loses per head, attention block, feed-forward block, layer and the
embeddings. The same shape as the ablation section (:mod:`bertology.report.sections.ablation`), its own words."""
from __future__ import annotations

from bertology.report.sections.ablation import SECTION as ABLATION
from bertology.report.sections.ablation import ablation_section, mode_rows
from bertology.report.sections.base import Section, SectionInput


def build(inp: SectionInput) -> dict | None:
    """The section's dict, or None when the run has no revert sweep."""
    tables = mode_rows(inp.tables, "revert")
    return None if tables is None else ablation_section(tables, inp.figures, inp.derived, inp.warnings)


SECTION = Section(
    id="revert",
    title="Revert: which of the fine-tuning changes the task needs",
    tables={"ablation": ABLATION.tables["ablation"]},
    build=build,
    template="sections/ablation.html.j2",
)
