"""Interactive attention views that ``compare`` saved under ``views/`` (base, tuned and their difference)."""
from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from markupsafe import Markup

from bertology.report.sections.base import Section, SectionInput


def viewer_section(run_dir: Path, manifest: Mapping[str, Any], warnings: list[str]) -> dict | None:
    """The views listed in the manifest as inline viewer fragments; None when there is none to show."""
    from bertology.viz.viewer import render_fragment

    names = [n for n in manifest.get("views") or [] if isinstance(n, str)]
    fragments = []
    for i, name in enumerate(names):
        path = run_dir / name
        try:
            view = json.loads(path.read_text(encoding="utf-8"))
            fragments.append({"text": view.get("text", ""), "text_pair": view.get("text_pair"),
                              "html": Markup(render_fragment(view, f"bertology-view-{i}"))})
        except (OSError, ValueError, KeyError, TypeError) as err:
            warnings.append(f"Attention view {name} could not be shown: {err}")
    if not fragments:
        return None
    return {"views": fragments}


def build(inp: SectionInput) -> dict | None:
    """The section's dict, or None when the run saved no views (it reads the manifest, not a table)."""
    return viewer_section(inp.run_dir, inp.manifest, inp.warnings)


SECTION = Section(
    id="attention-viewer",
    title="Attention viewer",
    tables={},
    build=build,
    template="sections/attention_viewer.html.j2",
)
