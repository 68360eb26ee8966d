"""The one run-directory helper: open an ``--out`` folder (resume, refuse, replace), write its manifest.

Every command that writes a run (compare, ablate, probe, finetune) names its settings with
:func:`fingerprint`, opens its folder with :func:`open_run` and writes its manifest with
:func:`build_manifest` (which starts with :func:`manifest_header`), so the run's identity, resuming,
refusing a foreign folder, clearing a replaced run's unfinished work and the provenance fields are
written once. Each command's library function returns a :class:`RunResult` (its folder, its tables by
name, its manifest).

A run folder is safe under concurrency and failure:

* one writer at a time: :func:`open_run` holds a lock file in the folder until the run ends, and a
  second run into the same folder gets one clear error instead of mixing its tables into the first;
* marked from its first write: the manifest says ``status: running`` (with the run's fingerprint)
  before any work, so the same command after a kill resumes, and an unwritable ``--out`` fails
  before the computation rather than after it;
* a run that raises ends ``status: failed`` with its error, and may be replaced by a corrected run
  of the same kind without ``--overwrite`` (nothing finished is lost that the failure had not lost).
"""
from __future__ import annotations

import hashlib
import json
import logging
import shutil
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from filelock import FileLock, Timeout

from bertology.errors import BertologyError, did_you_mean
from bertology.results import MANIFEST, atomic_write_text, now_iso, package_versions

if TYPE_CHECKING:
    import pandas as pd

logger = logging.getLogger(__name__)

#: The lock file a running writer holds inside its run folder (not part of the run's contents).
LOCK = ".bertology.lock"


class RunDirectory:
    """A ``--out`` folder: manifest.json, tables/, figures/, report.html.

    ``prepare`` resumes a run of the same kind and fingerprint, refuses a different one (unless
    ``overwrite``), and refuses a non-empty folder that is not a bertology run.
    """

    def __init__(self, path: str | Path):
        self.path = Path(path).expanduser()

    @property
    def manifest_path(self) -> Path:
        return self.path / MANIFEST

    def read_manifest(self) -> dict | None:
        if not self.manifest_path.exists():
            return None
        try:
            manifest = json.loads(self.manifest_path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise BertologyError(f"{self.manifest_path} is not a valid manifest ({err}): a truncated or edited file; "
                                 "rerun the command that made the run to write it again.") from err
        if not isinstance(manifest, dict):
            raise BertologyError(f"{self.manifest_path} is not a valid manifest (a JSON {type(manifest).__name__}, "
                                 "not an object); rerun the command that made the run to write it again.")
        return manifest

    def check_foreign(self, overwrite: bool = False) -> None:
        """Refuse a file, or a non-empty folder that holds no bertology run (unless ``overwrite``)."""
        if self.path.exists() and not self.path.is_dir():
            raise BertologyError(f"--out {self.path} is a file, not a folder.")
        if self.read_manifest() is None and not overwrite and self.path.exists():
            if any(p.name != LOCK for p in self.path.iterdir()):
                raise BertologyError(
                    f"--out {self.path} is not empty and holds no bertology run; choose an empty folder "
                    "or pass --overwrite."
                )

    def prepare(self, kind: str, fingerprint: str, *, overwrite: bool = False) -> bool:
        """Make the folder ready; return True when resuming an identical earlier run.

        A run of another kind or with other settings is refused unless ``overwrite``; a *failed*
        run of the same kind is replaced without it (its error is logged).
        """
        self.check_foreign(overwrite)
        old = self.read_manifest()
        if old is not None and (old.get("kind"), old.get("fingerprint")) != (kind, fingerprint):
            failed = old.get("kind") == kind and old.get("status") == "failed"
            if not (overwrite or failed):
                raise BertologyError(
                    f"--out {self.path} holds another run ({old.get('kind')}, created {old.get('created')}, "
                    "different settings); choose another folder or pass --overwrite to replace it."
                )
            if failed:
                logger.info("replacing the failed run in %s (%s)", self.path, old.get("error"))
            old = None
            for sub in ("tables", "figures"):
                for f in (self.path / sub).glob("*"):
                    f.unlink()
        self.path.mkdir(parents=True, exist_ok=True)
        return old is not None

    def write_manifest(self, manifest: dict) -> Path:
        atomic_write_text(self.manifest_path, json.dumps(manifest, indent=2, default=str))
        return self.manifest_path

    def has_table(self, name: str) -> bool:
        return (self.path / "tables" / f"{name}.parquet").exists()


@dataclass
class OpenedRun:
    """An ``--out`` folder held by this run: whether it resumes an identical run, and that run's manifest.

    Use it as a context manager: leaving it by an exception marks the run ``failed`` (with the
    error) unless it already finished; leaving it in any way releases the folder's lock.
    """

    dir: RunDirectory
    resumed: bool
    previous: dict
    lock: FileLock | None = field(default=None, repr=False)

    @property
    def path(self) -> Path:
        return self.dir.path

    def __enter__(self) -> "OpenedRun":
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        try:
            if exc is not None:
                self.mark_failed(exc)
        finally:
            self.close()
        return False

    def mark_failed(self, exc: BaseException) -> None:
        """Record that the run stopped on ``exc`` (``interrupted`` for Ctrl-C); a finished run is left as it is."""
        manifest = self.dir.read_manifest() or {}
        if manifest.get("status") in ("complete", "done"):
            return
        status = "interrupted" if isinstance(exc, KeyboardInterrupt) else "failed"
        manifest.update(status=status, error=f"{type(exc).__name__}: {exc}", finished=now_iso())
        try:
            self.dir.write_manifest(manifest)
        except OSError:  # pragma: no cover - the folder became unwritable; the original error matters more
            logger.warning("could not record the failure in %s", self.dir.manifest_path)

    def close(self) -> None:
        """Release the folder's lock (idempotent)."""
        if self.lock is not None:
            self.lock.release()
            self.lock = None


def lock_folder(path: Path) -> FileLock:
    """Create ``path`` and take its writer lock at once, or one clear error (exists elsewhere, unwritable, busy).

    Single runs hold it through :func:`open_run`; a study holds it on its own folder for the whole study."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(path / LOCK), timeout=0)
        lock.acquire()
    except Timeout:
        raise BertologyError(
            f"Another bertology run is writing into --out {path} right now; wait for it to finish or choose "
            "another folder."
        ) from None
    except OSError as err:
        raise BertologyError(f"Cannot write into --out {path}: {err.strerror or err}; choose a writable folder.") from None
    return lock


def open_run(
    out: str | Path, kind: str, fingerprint: str, *, overwrite: bool = False, fresh: bool = False,
    scratch: Sequence[str] = ("partial",),
) -> OpenedRun:
    """Take ``out`` for a run of ``kind`` (see :meth:`RunDirectory.prepare`) and mark it as this run's.

    An identical earlier run is resumed unless ``fresh``; otherwise the ``scratch`` folders (the
    unfinished work of whatever run was there: ablation units, cached features, checkpoints) are
    removed, so nothing of another run can leak into this one. Unless an identical finished run is
    being resumed, the manifest says ``status: running`` from now on (which also proves the folder
    writable before any work).
    """
    run_dir = RunDirectory(out)
    run_dir.check_foreign(overwrite)  # a foreign folder is refused before anything is written into it
    lock = lock_folder(run_dir.path)
    try:
        identical = run_dir.prepare(kind, fingerprint, overwrite=overwrite)
        previous = (run_dir.read_manifest() or {}) if identical else {}
        resumed = identical and not fresh
        if not resumed:
            for sub in scratch:
                shutil.rmtree(run_dir.path / sub, ignore_errors=True)
        if not (resumed and previous.get("status") in ("complete", "done")):
            created = previous.get("created") if resumed else None
            run_dir.write_manifest({**manifest_header(kind, fingerprint, created=created), "status": "running"})
    except OSError as err:
        lock.release()
        raise BertologyError(f"Cannot write into --out {run_dir.path}: {err.strerror or err}; choose a writable folder.") from None
    except BaseException:
        lock.release()
        raise
    return OpenedRun(run_dir, resumed, previous, lock)


def manifest_header(kind: str, fingerprint: str, *, created: str | None = None) -> dict:
    """The provenance every manifest starts with: what wrote it, when, with which command and packages."""
    versions = package_versions()
    return {
        "kind": kind,
        "fingerprint": fingerprint,
        "bertology_version": versions.get("bertology"),
        "created": created or now_iso(),
        "command": " ".join(sys.argv) if sys.argv else None,
        "packages": versions,
    }


def build_manifest(
    kind: str, fingerprint: str, *, created: str | None = None, status: str = "running", config: dict | None = None,
    models: dict | None = None, data: dict | None = None, **sections: Any,
) -> dict:
    """A run's manifest: :func:`manifest_header`, its ``status``, ``config``, the command's own ``sections``
    (seed, device, dtype, ...), then ``models`` and ``data`` (each left out when None)."""
    manifest = {**manifest_header(kind, fingerprint, created=created), "status": status}
    if config is not None:
        manifest["config"] = config
    manifest.update(sections)
    for key, value in (("models", models), ("data", data)):
        if value is not None:
            manifest[key] = value
    return manifest


def fingerprint(*parts: Any) -> str:
    """The one run fingerprint: SHA-256 of ``parts`` as JSON with sorted keys (``default=str``), 16 hex digits.

    Equal fingerprints mean the same settings, models and data, so one run may resume the other. The
    parts are written as one JSON list, so ``fingerprint(a, b)`` equals the older
    ``sha256(json.dumps([a, b], sort_keys=True, default=str))[:16]``.
    """
    return hashlib.sha256(json.dumps(list(parts), sort_keys=True, default=str).encode()).hexdigest()[:16]


@contextmanager
def run_folder(out: str | Path | None) -> Iterator[Path]:
    """``out`` itself, or (``out=None``: a run kept in memory) a temporary folder removed afterwards."""
    if out is not None:
        yield Path(out).expanduser()
        return
    with tempfile.TemporaryDirectory(prefix="bertology-") as tmp:
        yield Path(tmp) / "run"


@dataclass
class RunResult:
    """What a command's library function returns: its run folder, its tables by name, its manifest.

    ``out`` is None for a run kept in memory (``out=None``). ``table(name)`` is one table as a
    DataFrame; ``tables`` holds them all.
    """

    out: Path | None
    tables: dict[str, "pd.DataFrame"]
    manifest: dict

    def table(self, name: str) -> "pd.DataFrame":
        """The table ``name`` (one clear error naming the tables there are)."""
        if name not in self.tables:
            raise BertologyError(f"This run has no table {name!r}{did_you_mean(name, self.tables)}; "
                                 f"it has: {', '.join(self.tables) or 'none'}.")
        return self.tables[name]

    def _repr_html_(self) -> str:
        from html import escape

        where = "in memory" if self.out is None else escape(str(self.out))
        kind = escape(str(self.manifest.get("kind", "run")))
        return (f"<b>{kind}</b> run ({where}): tables "
                + ", ".join(f"<code>{escape(n)}</code> ({len(t)} rows)" for n, t in self.tables.items()))
