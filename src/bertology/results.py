"""Results: tidy tables with provenance, the run directory and its manifest.

Every write is atomic (temp file in the same folder, then ``os.replace``) so an interrupted run never
leaves a half-written table, and a run directory refuses to mix two different runs.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import secrets
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

import pandas as pd

from bertology.errors import DISK_FULL, BertologyError, disk_full, safe_name

MANIFEST = "manifest.json"


@dataclass
class Result:
    """One analysis's output: a long-form DataFrame plus the parameters that produced it."""

    name: str
    table: pd.DataFrame
    params: dict = field(default_factory=dict)

    def to_df(self) -> pd.DataFrame:
        return self.table.copy()

    def _repr_html_(self) -> str:
        return f"<h4>{self.name}</h4>" + self.table.head(50).to_html(index=False, escape=True)


def weights_rows(table: pd.DataFrame) -> pd.DataFrame:
    """An attention analysis's table as under the attention probabilities alone: a table of a run with several
    ``--attention-measures`` (a ``measure`` column) gives its ``weights`` rows (the first measure's when weights
    was not asked) without that column, any other table itself. For the readers that show or combine one
    measure (summaries, report sections, experiments)."""
    if "measure" not in table.columns or table.empty:
        return table
    measures = table["measure"].unique().tolist()
    keep = "weights" if "weights" in measures else measures[0]
    return table[table["measure"] == keep].drop(columns="measure").reset_index(drop=True)


def _sibling(path: Path, tag: str = "") -> Path:
    """A fresh hidden name beside ``path`` (``.name.<tag>XXXXXXXX.tmp``) for a temp file or folder."""
    return path.parent / f".{path.name}.{tag}{secrets.token_hex(4)}.tmp"


def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    """Let ``write`` fill a temp file beside ``path``, then move it into place with ``os.replace``.

    The one "temp file, then replace" helper: a reader never sees a half-written file, and a failed
    or interrupted ``write`` leaves the old file (if any) and no temp file behind. The temp file is
    created with mode 0666 so the umask alone decides its permissions (``mkstemp`` would make it
    private; reading the umask would mean setting it, which is process-wide and races with threads).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        tmp = _sibling(path)
        try:
            os.close(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
            break
        except FileExistsError:  # pragma: no cover - 32 random bits already taken
            continue
    try:
        write(tmp)
        os.replace(tmp, path)
    except OSError as err:
        tmp.unlink(missing_ok=True)
        if err.errno in DISK_FULL:
            raise disk_full(path, err) from err
        raise
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def atomic_folder(final: Path, write: Callable[[Path], None]) -> Path:
    """Let ``write`` fill a temp folder beside ``final``, then rename it into place; return ``final``.

    A kill never leaves half a folder (a model, a checkpoint): ``final`` is the old folder or the new
    one. An old ``final`` is moved aside first and put back if the rename fails. The temp folder is
    made with ``os.mkdir``, which honours the umask, so the folder gets the usual permissions without
    touching the process-wide umask.
    """
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    while True:
        tmp = _sibling(final)
        try:
            os.mkdir(tmp)
            break
        except FileExistsError:  # pragma: no cover - 32 random bits already taken
            continue
    old: Path | None = None
    try:
        write(tmp)
        if final.exists():
            old = _sibling(final, "old-")
            os.replace(final, old)
        os.replace(tmp, final)
    except BaseException as err:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and old.exists() and not final.exists():
            os.replace(old, final)
        if isinstance(err, OSError) and err.errno in DISK_FULL:
            raise disk_full(final, err) from err
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return final


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write text to ``path`` atomically."""
    atomic_write(Path(path), lambda p: p.write_text(text, encoding="utf-8"))


def check_output_file(path: str | Path, flag: str = "--out", example: str = "out.html") -> Path:
    """Refuse, before any work, an output file that cannot be written: one error naming it and the fix.

    A folder in its place, or a place where no file can be created (read-only, a file where a folder
    should be), is a :class:`BertologyError`; the check leaves nothing behind but missing parent folders.
    """
    path = Path(path)
    if path.is_dir():
        raise BertologyError(f"{flag} {path} is a folder; {flag} takes a file: name one inside it, "
                             f"e.g. {flag} {path / example}")
    above = next(p for p in path.parents if p.exists())
    if not above.is_dir():
        raise BertologyError(f"Cannot write {flag} {path}: {above} is a file, not a folder; choose another place.")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
        os.unlink(tmp)
    except OSError as err:
        raise cannot_write(path, flag, err) from None
    return path


def cannot_write(path: Path, flag: str, err: OSError) -> BertologyError:
    """The user error for an output file the system refused (permissions, read-only disk, disk full)."""
    return BertologyError(f"Cannot write {flag} {path}: {err.strerror or err}; choose a writable place.")


def read_json_key(path: Path, key: str) -> object | None:
    """``key`` of the JSON object in ``path``; ``None`` when the file is missing, unreadable or lacks it.

    Used to read back a folder's fingerprint, where a torn or foreign file simply means "not ours".
    """
    if not path.exists():
        return None
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    return found.get(key) if isinstance(found, dict) else None


def write_table(run_dir: str | Path, name: str, df: pd.DataFrame) -> tuple[Path, Path]:
    """Write ``tables/<name>.parquet`` and ``.csv`` atomically (``name``: one file name, :func:`safe_name`)."""
    tables = Path(run_dir) / "tables"
    safe_name("table name", name)
    pq, csv = tables / f"{name}.parquet", tables / f"{name}.csv"
    atomic_write(pq, lambda p: df.to_parquet(p, index=False))
    atomic_write(csv, lambda p: df.to_csv(p, index=False))
    return pq, csv


def read_table(run_dir: str | Path, name: str) -> pd.DataFrame:
    """Read ``tables/<name>.parquet`` from a run directory."""
    safe_name("table name", name)
    path = Path(run_dir) / "tables" / f"{name}.parquet"
    if not path.exists():
        raise BertologyError(f"{path} does not exist; was the {name!r} analysis run?")
    return pd.read_parquet(path)


def package_versions() -> dict[str, str]:
    """Versions of the packages that change the numbers."""
    out = {"python": platform.python_version()}
    for pkg in ("bertology", "torch", "transformers", "tokenizers", "numpy", "scipy", "pandas", "spacy"):
        try:
            out[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            continue
    return out


def now_iso() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
