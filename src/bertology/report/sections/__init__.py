"""The report's sections, in page order.

To add a section: write ``sections/<id>.py`` ending with ``SECTION = Section(...)`` (its template's text as
``markup=``, or a file ``templates/sections/<id>.html.j2``), and add its module name to ``_MODULES`` below (the page
order).
The overview (``OVERVIEW``) is not listed: it is built after the others, from their headlines, and
always comes first on the page.
"""
from __future__ import annotations

from collections.abc import Iterable
from importlib import import_module

from bertology.report.sections.base import Figures, Section, SectionInput
from bertology.report.sections.overview import OVERVIEW

__all__ = ["OVERVIEW", "SECTIONS", "Figures", "Section", "SectionInput", "known_tables", "sections_of"]

#: Section modules in page order, one line each.
_MODULES = (
    "attention_change",
    "attention_patterns",
    "representation_similarity",
    "attention_targets",
    "relation_heads",
    "absa",
    "head_map",
    "geometry",
    "pca_views",
    "weight_change",
    "probe",
    "token_probe",
    "ablation",
    "revert",
    "transplant",
    "changed_vs_needed",
    "measure_agreement",
    "crosscoder",
    "activation_difference",
    "attention_viewer",
    "tracking",
    "finetune",
)



def sections_of(modules: Iterable[str]) -> tuple[Section, ...]:
    """The ``SECTION`` of each module, in order: a name without a dot is a module of this package (``_MODULES``), a
    dotted or top-level one given as importable (a test's toy section: ``sections_of((*_MODULES, "my_section"))``)."""
    return tuple(import_module(name if "." in name or name not in _MODULES else f"{__name__}.{name}").SECTION
                 for name in modules)


SECTIONS: tuple[Section, ...] = sections_of(_MODULES)


def known_tables(sections: Iterable[Section]) -> dict[str, tuple[str, ...]]:
    """Every table some section reads, with the columns it needs; two sections must agree on a table's columns."""
    known: dict[str, tuple[str, ...]] = {}
    for section in sections:
        for name, columns in section.tables.items():
            if known.setdefault(name, tuple(columns)) != tuple(columns):
                raise ValueError(
                    f"Sections disagree on the columns of table {name!r}: {known[name]} vs {tuple(columns)}."
                )
    return known
