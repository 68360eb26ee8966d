"""A finished job's outputs are verified by size, then (when the modification time moved) by content."""
from __future__ import annotations

import hashlib
import os

from bertology.studies.verify import describe_files, file_problem, outputs_problem, weights_identity


def _write(path, data: bytes):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def test_recorded_files_verify_until_one_is_deleted_truncated_or_rewritten(tmp_path):
    w = _write(tmp_path / "model/model.safetensors", b"w" * 100)
    c = _write(tmp_path / "model/config.json", b"{}")
    rec = describe_files(tmp_path, [w, c])
    assert rec["model/model.safetensors"] == {"size": 100, "mtime_ns": w.stat().st_mtime_ns,
                                              "sha256": hashlib.sha256(b"w" * 100).hexdigest()}
    assert outputs_problem(tmp_path, rec) is None

    w.write_bytes(b"w" * 100)  # rewritten with the same bytes: mtime moves, the hash still matches
    os.utime(w, ns=(w.stat().st_atime_ns, rec["model/model.safetensors"]["mtime_ns"] + 10**9))
    assert file_problem(tmp_path, "model/model.safetensors", rec["model/model.safetensors"]) is None

    w.write_bytes(b"x" * 100)  # same size, other contents, later mtime
    os.utime(w, ns=(w.stat().st_atime_ns, rec["model/model.safetensors"]["mtime_ns"] + 2 * 10**9))
    assert outputs_problem(tmp_path, rec) == "model/model.safetensors was changed after the job wrote it (its contents differ)"

    w.write_bytes(b"w" * 10)
    assert outputs_problem(tmp_path, rec) == "model/model.safetensors has 10 bytes, not the 100 bytes written"
    w.unlink()
    assert outputs_problem(tmp_path, rec) == "model/model.safetensors is missing"


def test_a_trained_models_identity_is_its_weights_not_its_other_files(tmp_path):
    w = _write(tmp_path / "ft/model/model.safetensors", b"weights")
    c = _write(tmp_path / "ft/model/config.json", b"{}")
    m = _write(tmp_path / "ft/manifest.json", b"{}")
    one = weights_identity(describe_files(tmp_path, [w, c, m]), "ft/model")
    c.write_bytes(b'{"a": 1}')
    assert weights_identity(describe_files(tmp_path, [w, c, m]), "ft/model") == one
    w.write_bytes(b"other weights")
    assert weights_identity(describe_files(tmp_path, [w, c, m]), "ft/model") != one
    assert weights_identity(describe_files(tmp_path, [c, m]), "ft/model") is None
