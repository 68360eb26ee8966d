"""What a finished study job promised, and whether it is still there: the test a job passes to be ``cached``.

A job's marker (``jobs/<id>.json``) records, when the job finishes, every file it promised (a fine-tune's
model folder, manifest and tables; a comparison's manifest and tables) with its size, modification time
and SHA-256. A rerun trusts the job only when every such file is present with its recorded size and
content; otherwise the job is run afresh and the study says why (a deleted or truncated model is
retrained instead of being trusted and failing every comparison that loads it).

Checking a file re-hashes it only when its size or modification time differ from the record (as ``git
status`` does): a rerun of a study with ten BERT-base fine-tunes does not re-read 4 GB of weights, yet a
file rewritten in place, even to the same size, is caught by its new modification time and then its hash.
"""
from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from pathlib import Path

#: Weight files of a Hugging Face model folder: what a trained model's identity is made of.
WEIGHT_SUFFIXES = (".safetensors", ".bin")


def sha256_file(path: Path) -> str:
    """A file's contents as a SHA-256 hex digest (read in 1 MiB chunks)."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def describe_files(root: Path, files: Iterable[Path]) -> dict[str, dict]:
    """``{path relative to root: {size, mtime_ns, sha256}}`` for the files a job just wrote."""
    out = {}
    for path in sorted(set(files)):
        stat = path.stat()
        out[path.relative_to(root).as_posix()] = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns,
                                                   "sha256": sha256_file(path)}
    return out


def _size(n: int) -> str:
    return f"{n:,} bytes"


def file_problem(root: Path, rel: str, record: Mapping) -> str | None:
    """Why the file recorded as ``record`` no longer is what the job wrote (None when it is)."""
    path = root / rel
    try:
        stat = path.stat()
    except OSError:
        return f"{rel} is missing"
    if stat.st_size != record.get("size"):
        return f"{rel} has {_size(stat.st_size)}, not the {_size(int(record.get('size') or 0))} written"
    if stat.st_mtime_ns == record.get("mtime_ns"):
        return None
    if sha256_file(path) != record.get("sha256"):
        return f"{rel} was changed after the job wrote it (its contents differ)"
    return None


def outputs_problem(root: Path, recorded: Mapping[str, Mapping]) -> str | None:
    """The first reason the recorded outputs do not verify (every file present, same size and contents), or None."""
    for rel, record in recorded.items():
        problem = file_problem(root, rel, record)
        if problem is not None:
            return problem
    return None


def weights_identity(recorded: Mapping[str, Mapping], model_dir: str) -> str | None:
    """A trained model's identity from its recorded weight files' hashes (None when none is recorded).

    What a comparison's fingerprint holds for a model the study trained: a fine-tune re-run that gives
    other weights makes every comparison of it run again, one that gives the same bits leaves them cached.
    """
    prefix = model_dir.rstrip("/") + "/"
    weights = sorted((rel, rec["sha256"]) for rel, rec in recorded.items()
                     if rel.startswith(prefix) and rel.endswith(WEIGHT_SUFFIXES))
    if not weights:
        return None
    digest = hashlib.sha256()
    for rel, sha in weights:
        digest.update(f"{rel.removeprefix(prefix)}:{sha}\n".encode())
    return digest.hexdigest()
