"""Figures to SVG text for the offline report: text kept as ``<text>``, ids prefixed, deterministic output."""
from __future__ import annotations

import io
import re
from collections.abc import Mapping
from typing import Any

import matplotlib as mpl
from matplotlib.figure import Figure

from bertology.viz.style import _STYLE

_PROLOG = re.compile(r"^\s*<\?xml[^>]*\?>\s*(<!DOCTYPE[^>]*>\s*)?", re.DOTALL)
_ID = re.compile(r'\bid="([^"]+)"')
_REF = re.compile(r'(url\(#|href="#)([^")]+)')
_NO_ROTATE = re.compile(r' transform="rotate\(-?0 [-0-9.e]+ [-0-9.e]+\)"')
_GEOM_ATTR = re.compile(r'(\s(?:d|x|y|x1|x2|y1|y2|width|height|transform|points)=")([^"]*)"')
_DECIMALS = re.compile(r"(\d\.\d{2})\d+")
_SAFE_PREFIX = re.compile(r"[^A-Za-z0-9_-]+")


def figure_to_svg(
    fig: Figure,
    *,
    id_prefix: str | None = None,
    standalone: bool = True,
    metadata: Mapping[str, Any] | None = None,
) -> str:
    """Serialise *fig* to SVG text and close it.

    Text stays text (``svg.fonttype='none'``), so files are small and searchable. With *id_prefix*
    every element id (and every reference to it) is prefixed, so several SVGs can be inlined into one
    HTML document without id clashes, and the output is deterministic (no random hash salt, no date).
    With ``standalone=False`` the XML prolog and DOCTYPE are dropped (what HTML inlining wants).
    """
    # Fonts are resolved at save time: use our short family list, not matplotlib's long default.
    rc = {"svg.fonttype": "none", "font.sans-serif": _STYLE["font.sans-serif"]}
    if id_prefix is not None:
        rc["svg.hashsalt"] = id_prefix  # deterministic clip-path/marker ids
    meta = {"Date": None, "Creator": None, "Format": None, "Type": None}
    if metadata:
        meta.update(metadata)
    buf = io.StringIO()
    try:
        with mpl.rc_context(rc):
            # dpi only affects rasterised parts (colour bars, very large grids): keep them crisp.
            fig.savefig(buf, format="svg", metadata=meta, dpi=200)
    finally:
        _close(fig)
    svg = _NO_ROTATE.sub("", buf.getvalue())
    # 0.01 pt is far below what any screen or printer resolves; trims ~25% off the file.
    svg = _GEOM_ATTR.sub(lambda m: m.group(1) + _DECIMALS.sub(r"\1", m.group(2)) + '"', svg)
    if id_prefix is not None:
        prefix = _SAFE_PREFIX.sub("-", id_prefix).strip("-") or "fig"
        svg = _ID.sub(lambda m: f'id="{prefix}-{m.group(1)}"', svg)
        svg = _REF.sub(lambda m: f"{m.group(1)}{prefix}-{m.group(2)}", svg)
    if not standalone:
        svg = _PROLOG.sub("", svg, count=1)
    return svg


def _close(fig: Figure) -> None:
    """Release *fig*; only touches pyplot if the figure is managed by it."""
    if getattr(fig.canvas, "manager", None) is not None:
        import matplotlib.pyplot as plt  # already imported by whoever created a managed figure

        plt.close(fig)
    else:
        fig.clear()
