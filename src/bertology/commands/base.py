"""The one command lifecycle: inputs -> fingerprint -> open the run folder (lock, refuse, resume) -> work -> tables
-> manifest -> report -> the returned result.

Every command that writes a run folder takes it here: :func:`hold` is the only caller of
:func:`bertology.runs.open_run` besides the run folder's own helpers, and :class:`OpenRun` is the folder while
the command holds it (its lock, whether it resumes, the manifest it started from, the tables written so far and
the wall time). A command with one pass (ablate, probe) subclasses :class:`Command` and declares only what
differs: its kind, its fingerprint's parts (``inputs``), the manifest it starts with, its ``work`` (the tables)
and what it returns. Commands whose work is split around a shared pass (compare's pairs, the tracker that
writes while training runs) hold an :class:`OpenRun` themselves and finish it with :meth:`OpenRun.complete`.
"""
from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from bertology.results import now_iso, write_table
from bertology.runs import OpenedRun, RunDirectory, fingerprint, manifest_header, open_run

if TYPE_CHECKING:
    import pandas as pd

#: A command's tables by name, as it writes them under ``tables/``.
Tables = Mapping[str, "pd.DataFrame"]
R = TypeVar("R")


@dataclass
class OpenRun:
    """A run folder held by a command, from :func:`hold` to the end of the ``with`` block (which releases the lock
    and marks a run that raised ``failed``, as :class:`~bertology.runs.OpenedRun` does).

    ``created`` is the creation time of the identical run this one resumes (None: a new run); ``tables`` the
    tables written through :meth:`write_tables`, in order; :meth:`elapsed` the seconds since :meth:`start`.
    """

    opened: OpenedRun
    kind: str
    fingerprint: str
    tables: list[str] = field(default_factory=list)
    t0: float = field(default_factory=time.perf_counter)

    @property
    def path(self) -> Path:
        return self.opened.path

    @property
    def dir(self) -> RunDirectory:
        return self.opened.dir

    @property
    def resumed(self) -> bool:
        return self.opened.resumed

    @property
    def previous(self) -> dict:
        """The manifest of the identical run resumed ({} when none)."""
        return self.opened.previous

    @property
    def created(self) -> str | None:
        return self.previous.get("created") if self.resumed else None

    def __enter__(self) -> "OpenRun":
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        return self.opened.__exit__(exc_type, exc, tb)

    def close(self) -> None:
        """Release the folder's lock (idempotent)."""
        self.opened.close()

    def start(self) -> None:
        """Start the wall clock (the work's, not the loading's)."""
        self.t0 = time.perf_counter()

    def elapsed(self, digits: int = 3) -> float:
        return round(time.perf_counter() - self.t0, digits)

    def header(self) -> dict:
        """:func:`~bertology.runs.manifest_header` of this run (``created`` kept when it resumes)."""
        return manifest_header(self.kind, self.fingerprint, created=self.created)

    def write_manifest(self, manifest: dict) -> Path:
        return self.dir.write_manifest(manifest)

    def write_tables(self, tables: Tables) -> list[str]:
        """Write each table (``tables/<name>.parquet`` + ``.csv``) and remember its name; returns the names written."""
        for name, table in tables.items():
            write_table(self.path, name, table)
            if name not in self.tables:
                self.tables.append(name)
        return list(tables)

    def complete(self, manifest: dict, *, status: str = "complete", **sections: Any) -> dict:
        """Mark ``manifest`` finished (``status``, ``finished``, ``wall_time_s``, then ``sections``, which may give a
        ``wall_time_s`` of their own) and write it."""
        manifest.update({"status": status, "finished": now_iso(), "wall_time_s": self.elapsed(), **sections})
        self.write_manifest(manifest)
        return manifest


def hold(out: str | Path, kind: str, fingerprint: str, *, overwrite: bool = False, fresh: bool = False,
         scratch: Sequence[str] = ("partial",)) -> OpenRun:
    """Take ``out`` for a run of ``kind`` (:func:`bertology.runs.open_run`: resume an identical run unless ``fresh``,
    refuse another unless ``overwrite``, remove the ``scratch`` folders of a run that is not resumed)."""
    return OpenRun(open_run(out, kind, fingerprint, overwrite=overwrite, fresh=fresh, scratch=scratch), kind,
                   fingerprint)


class Command(Generic[R]):
    """A command that writes one run folder in one pass; :meth:`run` is the lifecycle, written once.

    A subclass declares ``name`` (the manifest's ``kind``) and writes:

    * :meth:`inputs`: the parts of the fingerprint (settings that change the numbers, the data's and the
      weights' hashes), in the order earlier versions hashed them, so their run folders still resume;
    * :meth:`manifest`: the manifest written before the work (``status: running``);
    * :meth:`work`: the tables (the only part that computes);
    * :meth:`finished`: what the finished manifest adds (figures, headlines), and :meth:`result`: what the
      command returns, after the folder is released (the report is rendered there).

    :meth:`reuse` may return the result of an identical finished run as it is (the work is then skipped).
    """

    name: ClassVar[str]
    #: the folders of unfinished work removed when the run is not resumed
    scratch: ClassVar[tuple[str, ...]] = ("partial",)
    #: the finished manifest's ``status`` (fine-tuning runs have always said ``done``)
    done_status: ClassVar[str] = "complete"

    def inputs(self) -> Sequence[Any]:
        raise NotImplementedError

    def fingerprint(self) -> str:
        """The run's identity: :func:`bertology.runs.fingerprint` of :meth:`inputs`."""
        return fingerprint(*self.inputs())

    def reuse(self, run: OpenRun) -> R | None:
        """The result of an identical finished run, returned without working again (default: None, work)."""
        return None

    def manifest(self, run: OpenRun) -> dict:
        raise NotImplementedError

    def work(self, run: OpenRun) -> Tables:
        raise NotImplementedError

    def finished(self, run: OpenRun, manifest: dict, tables: Tables) -> dict:
        """The sections the finished manifest adds after ``wall_time_s`` (default: the tables' names)."""
        return {"tables": list(tables)}

    def result(self, run: OpenRun, manifest: dict, tables: Tables) -> R:
        raise NotImplementedError

    def run(self, out: str | Path, *, overwrite: bool = False, fresh: bool = False) -> R:
        """fingerprint -> hold ``out`` -> reuse, or manifest -> work -> tables -> finished manifest -> result."""
        with hold(out, self.name, self.fingerprint(), overwrite=overwrite, fresh=fresh, scratch=self.scratch) as run:
            reused = self.reuse(run)
            if reused is not None:
                return reused
            manifest = self.manifest(run)
            run.write_manifest(manifest)
            run.start()
            tables = self.work(run)
            run.write_tables(tables)
            run.complete(manifest, status=self.done_status, **self.finished(run, manifest, tables))
        return self.result(run, manifest, tables)
