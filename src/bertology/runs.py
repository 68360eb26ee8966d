"""The one run-directory helper: open an ``--out`` folder (resume, refuse, replace), write its manifest.

Every command that writes a run (compare, ablate, probe, finetune, track) opens its folder with
:func:`open_run` and starts its manifest with :func:`manifest_header`, so resuming, refusing a
foreign folder, clearing a replaced run's unfinished work and the provenance fields are written once.
"""
from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bertology.errors import BertologyError
from bertology.results import MANIFEST, atomic_write_text, now_iso, package_versions


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
            return json.loads(self.manifest_path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise BertologyError(f"{self.manifest_path} is not a valid manifest ({err}).") from err

    def prepare(self, kind: str, fingerprint: str, *, overwrite: bool = False) -> bool:
        """Make the folder ready; return True when resuming an identical earlier run."""
        if self.path.exists() and not self.path.is_dir():
            raise BertologyError(f"--out {self.path} is a file, not a folder.")
        old = self.read_manifest()
        if old is None:
            if self.path.exists() and any(self.path.iterdir()) and not overwrite:
                raise BertologyError(
                    f"--out {self.path} is not empty and holds no bertology run; choose an empty folder "
                    "or pass --overwrite."
                )
        elif (old.get("kind"), old.get("fingerprint")) != (kind, fingerprint):
            if not overwrite:
                raise BertologyError(
                    f"--out {self.path} holds another run ({old.get('kind')}, created {old.get('created')}, "
                    "different settings); choose another folder or pass --overwrite to replace it."
                )
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
    """An ``--out`` folder made ready: whether it resumes an identical run, and that run's manifest."""

    dir: RunDirectory
    resumed: bool
    previous: dict

    @property
    def path(self) -> Path:
        return self.dir.path


def open_run(
    out: str | Path, kind: str, fingerprint: str, *, overwrite: bool = False, fresh: bool = False,
    scratch: Sequence[str] = ("partial",),
) -> OpenedRun:
    """Prepare ``out`` for a run of ``kind`` (see :meth:`RunDirectory.prepare`).

    An identical earlier run is resumed unless ``fresh``; otherwise the ``scratch`` folders (the
    unfinished work of whatever run was there: ablation units, cached features, checkpoints) are
    removed, so nothing of another run can leak into this one.
    """
    run_dir = RunDirectory(out)
    identical = run_dir.prepare(kind, fingerprint, overwrite=overwrite)
    previous = run_dir.read_manifest() or {}
    resumed = identical and not fresh
    if not resumed:
        for sub in scratch:
            shutil.rmtree(run_dir.path / sub, ignore_errors=True)
    return OpenedRun(run_dir, resumed, previous)


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
