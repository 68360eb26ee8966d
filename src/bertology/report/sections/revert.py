"""Revert: the tuned model with one unit put back to the base model's weights (Tamkin et al. 2020), the rows of the
ablation table in mode ``revert``: what the task loses per head, attention block, feed-forward block, layer and the
embeddings. The same shape as the ablation section (:mod:`bertology.report.sections.ablation`), its own words."""
from __future__ import annotations

from bertology.report.sections.ablation import SECTION as ABLATION
from bertology.report.sections.ablation import ablation_section, mode_rows, section_modes
from bertology.report.sections.base import Section, SectionInput


def build(inp: SectionInput) -> dict | None:
    """The section's dict, or None when the run has no revert sweep (the modes whose section is this one)."""
    modes = section_modes(inp.tables, SECTION_ID)
    tables = mode_rows(inp.tables, modes[0]) if modes else None
    return None if tables is None else ablation_section(tables, inp.figures, inp.derived, inp.warnings)


#: This section's id (:attr:`bertology.experiments.interventions.Revert.section` names it).
SECTION_ID = "revert"

SECTION = Section(
    id=SECTION_ID,
    title="Revert: which of the fine-tuning changes the task needs",
    tables={"ablation": ABLATION.tables["ablation"]},
    build=build,
    template="sections/ablation.html.j2",
)
