"""The index page of a many-model run (``compare --tuned NAME=PATH ...``): links to each pair's report and
a compact side-by-side per table (rows: layers, columns: tuned models).

Offline and escaped like the pair reports (inline CSS, a Content-Security-Policy, Jinja2 autoescaping).
The richer study report (seed spread, task vs task) is the ``studies`` room's; this page only points the way.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import pandas as pd
from jinja2 import Environment, PackageLoader, StrictUndefined

from bertology.reach import declared
from bertology.results import atomic_write_text, weights_rows


def views() -> dict[str, tuple[str, Callable[[pd.DataFrame], pd.DataFrame]]]:
    """Table -> (caption, the side-by-side it is shown as), for each table whose spec declares ``many_view``
    (:class:`bertology.reach.ManyView`); tables without one are linked, not shown."""
    return {table: (v.caption, v.view) for table, v in declared("many_view").items()}


def side_by_side(tables: Mapping[str, pd.DataFrame]) -> list[dict]:
    """The compact views of the tables that have one: caption, column names, rows of formatted numbers."""
    out = []
    for name, (caption, view) in views().items():
        if name not in tables or tables[name].empty:
            continue
        wide = view(weights_rows(tables[name]))  # several --attention-measures: the side-by-side is of the weights
        rows = [[str(idx), *(f"{v:.4f}" if pd.notna(v) else "" for v in row)] for idx, row in zip(wide.index, wide.to_numpy())]
        out.append({"table": name, "caption": caption, "index": wide.index.name, "columns": [str(c) for c in wide.columns],
                    "rows": rows})
    return out


def render_many_index(out: str | Path, manifest: Mapping, tables: Mapping[str, pd.DataFrame]) -> Path:
    """Write ``out/report.html``: the base, each pair (task, seed, model, link to its report), the side-by-sides."""
    env = Environment(loader=PackageLoader("bertology.report", "templates"), autoescape=True, undefined=StrictUndefined)
    html = env.get_template("many.html.j2").render(
        manifest=manifest, pairs=manifest.get("pairs", []), views=side_by_side(tables), tables=sorted(tables),
        base=manifest.get("base", {}),
    )
    path = Path(out) / "report.html"
    atomic_write_text(path, html)
    return path


def rerender_many(run_dir: str | Path, manifest: Mapping, problems: list[str]) -> Path:
    """Render every pair's report again, then the index page; what could not be read goes into ``problems``.

    Each problem names the file under ``run_dir`` (``Could not read pairs/a~s0/tables/x.parquet: ...``), so a
    corrupt table of one pair or of the combined tables is said, not raised from deep inside pandas.
    """
    from bertology.report.render import render_report

    run_dir = Path(run_dir)
    for pair in manifest.get("pairs", []):
        found: list[str] = []
        render_report(run_dir / pair["dir"], warnings=found)
        problems += [w.replace("Could not read tables/", f"Could not read {pair['dir']}/tables/", 1)
                     if w.startswith("Could not read tables/") else f"{pair['dir']}: {w}" for w in found]
    pairs = [{**p, "report": f"{p['dir']}/report.html"} for p in manifest.get("pairs", [])]
    tables = {}
    for name in manifest.get("tables", []):
        try:
            tables[name] = pd.read_parquet(run_dir / "tables" / f"{name}.parquet")
        except Exception as err:  # noqa: BLE001 - any reader failure is reported by the caller, naming the table
            problems.append(f"Could not read tables/{name}.parquet: {type(err).__name__}: {err}")
    return render_many_index(run_dir, {**manifest, "pairs": pairs}, tables)
