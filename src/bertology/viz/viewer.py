"""Interactive attention viewer: head view, model view and base/tuned/diff, as one offline HTML file.

In the spirit of bertviz, but self-contained: the page inlines its own vanilla JS and CSS (no CDN, no
``eval``), so it runs from ``file://``, inside the report (CSP ``script-src 'unsafe-inline'``) and in
notebooks (``_repr_html_``).

This module only draws: it takes a *view* (the JSON-ready dict described in
:mod:`bertology.view_format`), computed by :func:`bertology.activations.views.compute_view` or read
from a run's ``views/*.json``, and renders it. It never loads or runs a model.
"""
from __future__ import annotations

import html
import json
import os
import re
import uuid
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np

from bertology.errors import BertologyError
from bertology.results import atomic_write_text
from bertology.view_format import DECIMALS, FORMAT, VERSION
#: The report's Content-Security-Policy; the standalone page uses the same one.
CSP = (
    "default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'; "
    "base-uri 'none'; form-action 'none'"
)
_ID = re.compile(r"^[A-Za-z][A-Za-z0-9_-]{0,63}$")
_SCRIPT_ESCAPES = {"<": "\\u003c", ">": "\\u003e", "&": "\\u0026", "\u2028": "\\u2028", "\u2029": "\\u2029"}
_SCRIPT_ESCAPE_RE = re.compile("[<>&\u2028\u2029]")


# ------------------------------------------------------------------------------------------- render
def json_for_script(obj: Any) -> str:
    """JSON that is safe inside ``<script>``: ``<``, ``>``, ``&``, U+2028/9 become ``\\uXXXX`` escapes.

    A token such as ``</script>`` therefore cannot close the script element, and ``JSON.parse`` still
    returns the original strings.
    """
    text = json.dumps(obj, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return _SCRIPT_ESCAPE_RE.sub(lambda m: _SCRIPT_ESCAPES[m.group(0)], text)


@lru_cache(maxsize=None)
def _asset(name: str) -> str:
    return resources.files("bertology.viz").joinpath("viewer_assets", name).read_text(encoding="utf-8")


def _check_view(view: dict) -> None:
    if not isinstance(view, dict) or view.get("format") != FORMAT:
        raise BertologyError("Not an attention view (expected a dict from compute_view).")


def render_fragment(view: dict, element_id: str) -> str:
    """An embeddable HTML fragment: container div, scoped CSS, the data as JSON, and the inline script.

    Several fragments can share a page as long as their ``element_id`` differ: the script defines
    ``window.BertologyViewer`` once and each fragment mounts itself on its own container.
    """
    _check_view(view)
    if not _ID.match(element_id):
        raise ValueError(f"element_id must match {_ID.pattern} (letters, digits, _ and -); got {element_id!r}")
    return (
        f'<div class="bv" id="{element_id}" data-bertology-view="{VERSION}">'
        '<p class="bv-fallback">The attention viewer needs JavaScript.</p></div>\n'
        f"<style>{_asset('viewer.css')}</style>\n"
        f'<script type="application/json" id="{element_id}-data">{json_for_script(view)}</script>\n'
        f"<script>\n{_asset('viewer.js')}\nwindow.BertologyViewer.mount({json.dumps(element_id)});\n</script>\n"
    )


_PAGE_CSS = """
body { margin: 0; color: #1c1e21; background: #fff;
  font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, "Liberation Sans", sans-serif; }
.bv-page { max-width: 1320px; margin: 0 auto; padding: 22px 28px 36px; }
.bv-page h1 { margin: 0 0 4px; font-size: 22px; font-weight: 650; overflow-wrap: anywhere; }
.bv-page .bv-text { margin: 0 0 14px; color: #5d6470; font-size: 14px; overflow-wrap: anywhere; }
.bv-page .bv-text b { color: #1c1e21; font-weight: 600; }
.bv-page footer { margin-top: 14px; color: #8a919c; font-size: 12.5px; }
"""


def render_page(view: dict, title: str | None = None) -> str:
    """A complete standalone HTML page around one fragment; works opened from disk (no CDN)."""
    _check_view(view)
    names = [m["name"] for m in view["models"]]
    if title is None:
        title = "Attention: " + " vs ".join(m["model"] for m in view["models"])
    esc = html.escape
    lines = [f"<b>A</b> {esc(view['text'])}"]
    if view.get("text_pair") is not None:
        lines.append(f"<b>B</b> {esc(view['text_pair'])}")
    diff = f" Diff = {esc(names[1])} − {esc(names[0])}." if len(names) == 2 else ""
    return (
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">\n'
        '<meta name="generator" content="bertology">\n<link rel="icon" href="data:,">\n'
        f"<title>{esc(title)}</title>\n<style>{_PAGE_CSS}</style>\n</head>\n<body>\n<main class=\"bv-page\">\n"
        f"<h1>{esc(title)}</h1>\n<p class=\"bv-text\">{'<br>'.join(lines)}</p>\n"
        f"{render_fragment(view, 'bertology-view')}"
        f"<footer>Layers 1…{view['n_layers']}, heads 0…{view['n_heads'] - 1} (labels L{{layer}}H{{head}}); "
        f"weights rounded to {view.get('decimals', DECIMALS)} decimals.{diff}</footer>\n"
        "</main>\n</body>\n</html>\n"
    )


# -------------------------------------------------------------------------------------------- object
class AttentionView:
    """A computed view: renders as a page, an embeddable fragment, or inline in a notebook."""

    def __init__(self, data: dict[str, Any]) -> None:
        _check_view(data)
        self.data = data

    @classmethod
    def load(cls, path: str | os.PathLike) -> AttentionView:
        """Read a view saved as JSON (e.g. a run's ``views/*.json``)."""
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise BertologyError(f"Cannot read attention view {path}: {err}") from err
        return cls(data)

    @property
    def names(self) -> list[str]:
        return [m["name"] for m in self.data["models"]]

    @property
    def tokens(self) -> list[str]:
        return list(self.data["tokens"])

    def attention(self, name: str | None = None) -> np.ndarray:
        """Weights of one model (default: the first) as ``[layers, heads, query, key]``."""
        return np.asarray(self.data["attention"][name or self.names[0]], dtype=np.float64)

    def diff(self) -> np.ndarray:
        """Second model minus first, ``[layers, heads, query, key]`` (what diff mode shows)."""
        if len(self.names) != 2:
            raise BertologyError("This view holds one model; diff needs two.")
        return self.attention(self.names[1]) - self.attention(self.names[0])

    def to_json(self) -> str:
        return json.dumps(self.data, ensure_ascii=False, allow_nan=False, separators=(",", ":"))

    def html(self, title: str | None = None) -> str:
        """The standalone page."""
        return render_page(self.data, title)

    def fragment(self, element_id: str | None = None) -> str:
        """An embeddable fragment (a fresh unique element id unless one is given)."""
        return render_fragment(self.data, element_id or f"bertology-view-{uuid.uuid4().hex[:12]}")

    def save(self, path: str | os.PathLike) -> Path:
        """Write atomically: ``.json`` saves the data, anything else the standalone HTML page."""
        path = Path(path)
        atomic_write_text(path, self.to_json() if path.suffix.lower() == ".json" else self.html())
        return path

    def _repr_html_(self) -> str:
        return self.fragment()

