"""The shape every report section shares: what it reads (``SectionInput``) and what it declares (``Section``).

A section module builds one dict for its template from the run's tables and ends with
``SECTION = Section(...)``; the registry (``bertology.report.sections``) lists them in page order.
"""
from __future__ import annotations

import html as _html
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
from markupsafe import Markup

from bertology.results import atomic_write_text, weights_rows

logger = logging.getLogger(__name__)

__all__ = ["Figures", "Section", "SectionInput"]


class Figures:
    """Builds figures, writes ``figures/<name>.svg`` and keeps the inline SVG for the page."""

    def __init__(self, run_dir: Path, warnings: list[str]):
        self.dir = run_dir / "figures"
        self.warnings = warnings
        self.written: list[str] = []

    def make(self, name: str, build: Callable[[], Any], caption: str, alt: str) -> dict | None:
        """Draw ``build()``, save it, and return the template's figure dict (None, with a warning, if it fails)."""
        from bertology.viz.figures import figure_to_svg

        try:
            fig = build()
            svg = figure_to_svg(fig, id_prefix=name)
        except Exception as err:  # noqa: BLE001 - a bad figure must not sink the report
            logger.warning("figure %s failed: %s", name, err, exc_info=True)
            self.warnings.append(f"Figure {name!r} could not be drawn: {type(err).__name__}: {err}")
            return None
        atomic_write_text(self.dir / f"{name}.svg", svg)
        self.written.append(name)
        inline = svg[svg.find("<svg"):]
        # role/aria-label for screen readers; the label is our own text, escaped anyway.
        inline = inline.replace(
            "<svg ", f'<svg role="img" aria-label="{_html.escape(alt, quote=True)}" ', 1
        )
        return {"name": name, "svg": Markup(inline), "caption": caption, "file": f"figures/{name}.svg"}


@dataclass(frozen=True)
class SectionInput:
    """What a section builder may read, and the two lists it may append to.

    ``tables`` holds only the run's tables that some section declared and that passed validation
    (columns present, not empty). ``derived`` collects the overview's headline cards, in page order;
    ``warnings`` the problems shown at the top of the page.
    """

    tables: Mapping[str, pd.DataFrame]
    figures: Figures
    derived: list[dict]
    run_dir: Path
    manifest: Mapping[str, Any]
    warnings: list[str]
    listing: list[dict]

    def table(self, name: str) -> pd.DataFrame | None:
        """The validated table ``name``, or None when the run lacks it; an attention analysis's table of a run with
        several ``--attention-measures`` as under ``weights`` (:func:`bertology.results.weights_rows`)."""
        table = self.tables.get(name)
        return None if table is None else weights_rows(table)


@dataclass(frozen=True)
class Section:
    """One part of the page.

    ``tables`` maps each table the section reads to the columns it needs (the report validates them
    before any builder runs); ``build`` returns the template's dict, or None to leave the section
    out; ``template`` is the Jinja2 include that draws it, with the dict bound to ``s``: a file under
    ``templates/``, or the template's text given in the module as ``markup`` (then ``template`` is only its name), so a
    section can be one module. The page adds ``id`` and ``title`` to the dict, so builders do not repeat them.
    """

    id: str
    title: str
    tables: Mapping[str, tuple[str, ...]]
    build: Callable[[SectionInput], dict | None]
    template: str
    markup: str | None = None
