"""Render a run directory into one self-contained, offline HTML report.

``render_report(run_dir)`` reads ``manifest.json`` and the known tables under ``tables/``, draws the
figures (also written to ``figures/<name>.svg``) and writes ``report.html`` atomically. The page
inlines its CSS, JavaScript and SVG figures and references nothing on the network (a
Content-Security-Policy forbids it); every string that comes from data is HTML-escaped by Jinja2's
autoescaping, and data embedded as JSON escapes ``<``, ``>``, ``&`` and ``'``.

The page is the overview followed by ``bertology.report.sections.SECTIONS`` in order; this module
knows no section by name. Sections whose table is absent are left out; a malformed table becomes a
warning in the report rather than a broken page.
"""
from __future__ import annotations

import datetime as _dt
import html as _html
import json
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pandas as pd
from jinja2 import ChoiceLoader, DictLoader, Environment, FileSystemLoader, PackageLoader, StrictUndefined

from bertology.errors import BertologyError
from bertology.report.format import fmt_value, jsonable, mapping
from bertology.report.sections import OVERVIEW, SECTIONS, Figures, Section, SectionInput, known_tables
from bertology.results import atomic_write_text

logger = logging.getLogger(__name__)

__all__ = ["KNOWN_TABLES", "Report", "build_context", "fmt_value", "render_report"]

#: Tables the report knows how to show, with the columns each section needs (declared by the sections).
KNOWN_TABLES: dict[str, tuple[str, ...]] = known_tables(SECTIONS)


# -------------------------------------------------------------------------------------------- input
def _read_manifest(run_dir: Path, warnings: list[str]) -> dict:
    """``manifest.json`` as a dict ({} and a warning when it is missing); invalid JSON is an error."""
    path = run_dir / "manifest.json"
    if not path.exists():
        warnings.append("manifest.json is missing: models, data and settings are unknown for this run.")
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise BertologyError(f"{path} is not valid JSON ({err}); cannot render the report.") from err
    if not isinstance(data, dict):
        raise BertologyError(f"{path} should hold a JSON object, not {type(data).__name__}.")
    return data


def _read_tables(
    run_dir: Path, known: Mapping[str, tuple[str, ...]], warnings: list[str], listed: Sequence[str] | None = None,
) -> tuple[dict[str, pd.DataFrame], list[dict]]:
    """Known tables (validated against ``known``) and a listing of every table file in the run.

    ``listed``: the tables the run's manifest says it wrote; a table file it does not list (left by
    another run, or by hand) is not shown, with a warning, so a section never mixes two runs.
    """
    folder = run_dir / "tables"
    tables: dict[str, pd.DataFrame] = {}
    names = sorted({p.stem for p in folder.glob("*.parquet")} | {p.stem for p in folder.glob("*.csv")})
    foreign = [n for n in names if listed is not None and n not in listed]
    if foreign:
        warnings.append(f"Table(s) {', '.join(foreign)} are in tables/ but not in this run's manifest; not shown.")
    listing: list[dict] = []
    for name in names:
        pq, csv = folder / f"{name}.parquet", folder / f"{name}.csv"
        df = None
        for path, reader in ((pq, pd.read_parquet), (csv, pd.read_csv)):
            if not path.exists():
                continue
            try:
                df = reader(path)
                break
            except Exception as err:  # noqa: BLE001 - any reader failure becomes a warning
                warnings.append(f"Could not read tables/{path.name}: {type(err).__name__}: {err}")
        files = [p.name for p in (pq, csv) if p.exists()]
        entry = {"name": name, "files": files, "rows": None if df is None else len(df), "shown": False}
        listing.append(entry)
        if df is None or name not in known or name in foreign:
            continue
        missing = [c for c in known[name] if c not in df.columns]
        if missing:
            warnings.append(
                f"Table {name!r} lacks column(s) {', '.join(missing)}; its section is left out."
            )
            continue
        if df.empty:
            warnings.append(f"Table {name!r} is empty; its section is left out.")
            continue
        tables[name] = df
        entry["shown"] = True
    return tables, listing



# ------------------------------------------------------------------------------------------- render
def _environment(template_dirs: Sequence[str | Path] = (), inline: Mapping[str, str] | None = None) -> Environment:
    """The page's Jinja2 environment: the package's templates first, then ``template_dirs`` (extra sections), then
    ``inline`` (name -> the text of a section's template written in its module, ``Section.markup``)."""
    loader = PackageLoader("bertology.report", "templates")
    if template_dirs or inline:
        loader = ChoiceLoader([loader, FileSystemLoader([str(Path(d)) for d in template_dirs]), DictLoader(dict(inline or {}))])
    env = Environment(
        loader=loader,
        autoescape=True,  # every {{ }} is HTML-escaped unless explicitly Markup
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    env.filters["num"] = fmt_value
    return env


def _build_sections(sections: Iterable[Section], inp: SectionInput) -> list[dict]:
    """Each section's dict, headed by its id and title, in order; sections that return None are left out."""
    built = []
    for section in sections:
        body = section.build(inp)
        if body is not None:
            built.append({"id": section.id, "title": section.title, **body})
    return built


def _subtitle(manifest: Mapping, run_dir: Path) -> str:
    """``base → tuned`` from the manifest's model names, else whichever is known, else the folder name."""
    models = mapping(manifest.get("models"))
    base_name = mapping(models.get("base")).get("name")
    tuned_name = mapping(models.get("tuned")).get("name")
    if base_name and tuned_name:
        return f"{base_name} → {tuned_name}"
    return str(base_name or tuned_name or run_dir.name)


def build_context(run_dir: str | Path, sections: Sequence[Section] = SECTIONS) -> dict:
    """Everything the template needs (also writes the figures). Exposed for testing and reuse.

    ``sections`` is the page's sections in order (default: the registry); pass another tuple to
    add or drop sections without touching the registry.
    """
    run_dir = Path(run_dir).expanduser()
    if not run_dir.is_dir():
        raise BertologyError(f"Run directory {run_dir} does not exist or is not a folder.")
    warnings: list[str] = []
    manifest = _read_manifest(run_dir, warnings)
    listed = manifest.get("tables") if isinstance(manifest.get("tables"), list) else None
    tables, listing = _read_tables(run_dir, known_tables(sections), warnings, listed)
    if not manifest and not listing:
        raise BertologyError(
            f"{run_dir} holds neither manifest.json nor tables/; is it a bertology run directory?"
        )
    figs = Figures(run_dir, warnings)
    inp = SectionInput(tables=tables, figures=figs, derived=[], run_dir=run_dir, manifest=manifest,
                       warnings=warnings, listing=listing)
    built = _build_sections(sections, inp)
    overview = OVERVIEW.build(inp)  # last: it shows the headlines the sections derived
    toc = [{"id": OVERVIEW.id, "title": OVERVIEW.title}] + [{"id": s["id"], "title": s["title"]} for s in built]
    from bertology import __version__

    return {
        "title": "bertology report",
        "subtitle": _subtitle(manifest, run_dir),
        "run_dir": str(run_dir),
        "created": manifest.get("created"),
        "rendered": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "run_version": manifest.get("bertology_version"),
        "version": __version__,
        "overview": overview,
        "overview_template": OVERVIEW.template,
        "sections": {s["id"]: s for s in built},
        "layout": [{"id": s.id, "template": s.template} for s in sections],
        "toc": toc,
        "manifest_pretty": json.dumps(jsonable(manifest), indent=2, sort_keys=False),
        "manifest_json": jsonable(manifest),
        "figures_written": figs.written,
    }


def render_report(
    run_dir: str | Path, sections: Sequence[Section] = SECTIONS, template_dirs: Sequence[str | Path] = (),
    warnings: list[str] | None = None,
) -> Path:
    """Render ``run_dir/report.html`` (and ``run_dir/figures/*.svg``) from a run directory.

    Returns the path of the report. The HTML is written atomically (temp file in the same folder,
    then ``os.replace``), so a reader never sees a half-written page. Raises
    :class:`~bertology.errors.BertologyError` when ``run_dir`` is not a run directory.
    ``sections`` and ``template_dirs`` (where their templates live, beside the package's) let a
    caller add sections of its own. ``warnings``, when given, receives the problems the page shows at its top
    (an unreadable table, a figure that failed), so a command can say them too.
    """
    run_dir = Path(run_dir).expanduser()
    context = build_context(run_dir, sections)
    if warnings is not None:
        warnings.extend(context["overview"]["warnings"])
    inline = {s.template: s.markup for s in sections if s.markup is not None}
    page = _environment(template_dirs, inline).get_template("report.html.j2").render(**context)
    out = run_dir / "report.html"
    atomic_write_text(out, page)
    logger.info("wrote %s (%d figures)", out, len(context["figures_written"]))
    return out


class Report:
    """A rendered run report, displayable in Jupyter.

    ``Report(run_dir).path`` is ``run_dir/report.html``; ``.html()`` returns the page (rendering it
    first if it does not exist yet); ``.render()`` re-renders. In a notebook the report is shown in a
    sandboxed ``<iframe srcdoc=...>`` so its styles and script cannot touch the notebook page.
    """

    def __init__(self, run_dir: str | Path):
        self.run_dir = Path(run_dir).expanduser()

    @property
    def path(self) -> Path:
        return self.run_dir / "report.html"

    def render(self) -> Path:
        return render_report(self.run_dir)

    def html(self) -> str:
        if not self.path.exists():
            self.render()
        return self.path.read_text(encoding="utf-8")

    def _repr_html_(self) -> str:
        doc = _html.escape(self.html(), quote=True)
        return (
            f'<iframe srcdoc="{doc}" sandbox="allow-scripts" title="bertology report" '
            'style="width:100%;height:760px;border:1px solid #ddd;border-radius:4px"></iframe>'
        )

    def __repr__(self) -> str:
        return f"Report({str(self.run_dir)!r})"


class _KeptFigures(Figures):
    """Figures drawn and kept as matplotlib objects (by name, with their captions) instead of written as SVG."""

    def __init__(self, warnings: list[str]):
        super().__init__(Path("."), warnings)
        self.kept: dict[str, tuple[Any, str, str]] = {}

    def make(self, name: str, build: Callable[[], Any], caption: str, alt: str) -> dict | None:
        try:
            self.kept[name] = (build(), caption, alt)
        except Exception as err:  # noqa: BLE001 - one figure that fails must not hide the others
            self.warnings.append(f"Figure {name!r} could not be drawn: {type(err).__name__}: {err}")
        return None


def section_figures(tables: Mapping[str, pd.DataFrame], manifest: Mapping[str, Any],
                    sections: Sequence[Section] = SECTIONS) -> dict[str, tuple[tuple[str, ...], Any, str]]:
    """Every figure the report would draw from these in-memory tables: ``name -> (names, Figure, caption)``,
    ``names`` being the section's id and the tables it reads.

    The notebook API's ``plot`` reads it, so a plot in a notebook is the report's figure, drawn by the same
    section code. Tables that lack a section's columns, or are empty, are left out as the report leaves them.
    """
    known = known_tables(sections)
    valid = {n: df for n, df in tables.items()
             if n in known and not df.empty and all(c in df.columns for c in known[n])}
    warnings: list[str] = []
    out: dict[str, tuple[tuple[str, ...], Any, str]] = {}
    for section in sections:
        if not any(n in valid for n in section.tables):
            continue
        figs = _KeptFigures(warnings)
        inp = SectionInput(tables=valid, figures=figs, derived=[], run_dir=Path("."), manifest=manifest,
                           warnings=warnings, listing=[])
        try:
            section.build(inp)
        except Exception as err:  # noqa: BLE001 - as in the report: one broken section must not hide the others
            logger.warning("section %s failed: %s", section.id, err)
        names = (section.id, *section.tables)
        out.update({name: (names, fig, caption) for name, (fig, caption, _) in figs.kept.items()})
    return out
