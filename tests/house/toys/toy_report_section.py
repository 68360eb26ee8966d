"""A toy report section in one module: its template's text is ``markup`` (no file under templates/). Registered by
``tests/house/test_extension_points.py`` as the one line a section takes in ``report/sections/__init__.py``."""
from __future__ import annotations

from bertology.report.sections.base import Section, SectionInput

TABLE = "toy_counts"


def build(inp: SectionInput) -> dict | None:
    table = inp.table(TABLE)
    if table is None:
        return None
    return {"rows": table.to_dict("records"), "total": int(table["count"].sum())}


MARKUP = """<section id="{{ s.id }}"><h2>{{ s.title }}</h2>
<p class="toy-total">{{ s.total }} counted</p>
<ul>{% for r in s.rows %}<li>{{ r.word }}: {{ r.count }}</li>{% endfor %}</ul>
</section>
"""

SECTION = Section("toy_section", "Toy counts", {TABLE: ("word", "count")}, build, "toy_section.inline", markup=MARKUP)
