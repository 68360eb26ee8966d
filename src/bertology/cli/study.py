"""``bertology study STUDY.toml``: fine-tune every task x seed that is missing, then compare them all with the base."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Table

from bertology.cli.app import app, console, user_errors
from bertology.progress import command_progress
from bertology.cli.options import overwrite_option

STATUS_STYLE = {"done": "green", "cached": "cyan", "failed": "bold red", "skipped": "yellow"}


@app.command("study")
@user_errors
def study_command(
    spec: Path = typer.Argument(..., help="The study spec (TOML): base, seeds, the lab and compare tables and the tasks; see the docs' Studies page."),
    out: Optional[Path] = typer.Option(None, "--out", help="Study folder (default: the spec's out = ...)."),
    executor: str = typer.Option("local", "--executor", help="local (sequential, this process) or ray (each job a Ray task; pip install 'bertology\\[ray]')."),
    ray_address: Optional[str] = typer.Option(
        None, "--ray-address", help="Ray cluster to join: auto or HOST:PORT (default: start a local Ray). The study folder must be on a filesystem every node sees."),
    overwrite: bool = overwrite_option(help="Delete the study folder and run every job again."),
) -> None:
    """Run a study: one base, many fine-tunes (tasks x seeds), compared with the base and with each other in one pass.
    Finished jobs are reused (a rerun does only what is missing or failed)."""
    from bertology.studies.runner import run_study

    result = run_study(spec, out, executor=executor, ray_address=ray_address, overwrite=overwrite,
                       progress=executor == "local" and command_progress())
    console.print(job_table(result))
    for warning in result.manifest.get("warnings") or []:  # e.g. a seed whose model did not beat chance
        console.print(f"[yellow]warning:[/] {escape(str(warning))}", soft_wrap=True, emoji=False)
    console.print(f"study: [bold]{escape(str(result.out))}[/] (tables/, manifest.json)")
    if result.report:
        console.print(f"report: [bold]{escape(str(result.report))}[/]")
    from bertology.report.study import stale_lines

    for line in stale_lines(result.manifest.get("stale_tables") or {}):
        console.print(f"[yellow]{escape(line)}[/]")
    if result.manifest.get("no_verdicts"):
        console.print(f"[yellow]No seed-noise verdicts: {escape(result.manifest['no_verdicts'])}.[/]",
                      soft_wrap=True, emoji=False)
    if result.failed:  # one line per failed job, whatever the terminal's width
        console.print(f"[bold red]{len(result.failed)} of {len(result.jobs)} job(s) failed[/]; run the same command "
                      "again to retry them:", soft_wrap=True, emoji=False)
        for job in result.failed:
            console.print(f"failed: {escape(job.id)}: {escape(job.error or 'no error recorded')}",
                          soft_wrap=True, emoji=False)  # emoji=False: "a:b:" is no emoji code here
        raise typer.Exit(code=1)


def job_table(result) -> Table:
    """Every job's status, wall time, and its error or why it ran again."""
    table = Table(title=f"study jobs ({result.manifest['executor']} executor)")
    for col in ("job", "status", "wall time", "error or note"):
        table.add_column(col, overflow="fold")  # a path in a note is folded, not cut to "…"
    for job in result.jobs:
        style = STATUS_STYLE.get(job.status, "")
        wall = "" if job.status not in ("done", "cached") or job.wall_time_s is None else f"{job.wall_time_s:.1f} s"
        if wall and job.status == "cached":
            wall += " (earlier run)"  # a cached job did not run now: the time it took when it did
        table.add_row(escape(job.id), f"[{style}]{job.status}[/]", wall, escape(job.error or job.reason or ""))
    return table
