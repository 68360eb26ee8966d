"""Render ``report.html`` again from a finished run folder's tables (``bertology report``, ``bt.report``).

A many-model run gets each pair's report and then its index page; any other run its one report. A table
that cannot be read leaves its section out, and the page says so; :func:`rerender` then refuses the result
in one line after writing the page, since part of the run is missing from it.
"""
from __future__ import annotations

from pathlib import Path

from bertology.errors import BertologyError
from bertology.runs import RunDirectory


def rerender(run_dir: str | Path, problems: list[str] | None = None) -> Path:
    """Write ``run_dir``'s report again and return its path; ``problems`` receives the warnings. Raises one
    :class:`BertologyError` (after writing) when a table could not be read."""
    from bertology.report.render import render_report

    run_dir = Path(run_dir).expanduser()
    if not (run_dir / "manifest.json").exists():
        raise BertologyError(f"{run_dir} is not a bertology run directory (no manifest.json).")
    manifest = RunDirectory(run_dir).read_manifest()  # a truncated or hand-broken file: one line naming it
    problems = [] if problems is None else problems
    if isinstance(manifest, dict) and manifest.get("kind") == "compare_many":  # each pair's report, then the index
        from bertology.report.many import rerender_many

        path = rerender_many(run_dir, manifest, problems)
    else:
        path = render_report(run_dir, warnings=problems)
    unreadable = unreadable_tables(problems)
    if unreadable:  # the page is written, but part of the run is missing from it: not a success
        raise BertologyError(f"Table(s) {', '.join(unreadable)} of {run_dir} could not be read, so their sections are "
                             f"left out of the report ({path}); rerun the command that made the run to rewrite them.")
    return path


def unreadable_tables(problems: list[str]) -> list[str]:
    """The tables the report could not read, by name (``ablation``; a pair's as ``attention_change (pairs/b)``)."""
    out = set()
    for w in problems:
        if w.startswith("Could not read ") and "tables/" in w:
            where, _, name = w.split(":")[0].removeprefix("Could not read ").rpartition("tables/")
            out.add(Path(name).stem + (f" ({where.rstrip('/')})" if where else ""))
    return sorted(out)
