"""Training state saved and read back without unpickling anything but tensors.

A checkpoint in a run folder may come from someone else (a study folder on a shared disk, a run downloaded
with a paper), so reading it back must not run code: ``torch.load(..., weights_only=True)`` accepts only
tensors, numbers, strings and containers of them. What bertology keeps in its states that it refuses
(numpy arrays and scalars: the numpy RNG state, per-probe bookkeeping) is stored as a tensor under a marker
and turned back on load. Hand-written because torch's alternative, ``add_safe_globals`` for numpy's
reconstruct functions, allow-lists object-building code process-wide.
"""
from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np

from bertology.errors import BertologyError

_NUMPY = "__numpy_array__"
_NUMPY_DTYPE = "__numpy_dtype__"


def to_plain(obj: Any) -> Any:
    """``obj`` with every numpy array and scalar replaced by what the weights-only loader accepts."""
    import torch

    if isinstance(obj, np.ndarray):
        if obj.dtype == object:
            raise TypeError("an object array cannot be saved as training state")
        # uint32 (the MT19937 key) has no torch dtype on every version: keep it as int64 and its dtype's name
        arr = obj.astype(np.int64) if obj.dtype == np.uint32 else obj
        return {_NUMPY: torch.from_numpy(np.ascontiguousarray(arr)), _NUMPY_DTYPE: str(obj.dtype)}
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, dict):
        return {k: to_plain(v) for k, v in obj.items()}
    if isinstance(obj, tuple):
        return tuple(to_plain(v) for v in obj)
    if isinstance(obj, list):
        return [to_plain(v) for v in obj]
    return obj


def from_plain(obj: Any) -> Any:
    """The inverse of :func:`to_plain`: marked tensors back to numpy arrays of their recorded dtype."""
    if isinstance(obj, dict):
        if set(obj) == {_NUMPY, _NUMPY_DTYPE}:
            return obj[_NUMPY].numpy().astype(np.dtype(obj[_NUMPY_DTYPE]))
        return {k: from_plain(v) for k, v in obj.items()}
    if isinstance(obj, tuple):
        return tuple(from_plain(v) for v in obj)
    if isinstance(obj, list):
        return [from_plain(v) for v in obj]
    return obj


def save_state(state: Any, path: str | Path) -> None:
    """Write ``state`` (tensors, numbers, strings, numpy arrays, containers) with ``torch.save``."""
    import torch

    torch.save(to_plain(state), path)


def _why(err: Exception) -> str:
    """The part of torch's refusal that names what the file holds (its full text advises unpickling anyway)."""
    import re

    text = str(err)
    found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", text) or re.search(r"WeightsUnpickler error: ([^\n]+)", text)
    if found:
        return f"it holds {found.group(1)}" if found.re.pattern.startswith("Unsupported") else found.group(1).strip()
    first = text.strip().splitlines()[0] if text.strip() else type(err).__name__
    return first[:160]


def load_state(path: str | Path, *, map_location: Any = "cpu", remedy: str = "") -> Any:
    """Read a state written by :func:`save_state`, refusing (one line, naming the file) anything else.

    ``weights_only=True``: a file holding objects other than tensors and plain containers is refused
    before any of its code could run. ``remedy`` says what the user can do (delete the checkpoint, ...).
    """
    import torch

    try:
        raw = torch.load(path, map_location=map_location, weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, AttributeError, ValueError, TypeError) as err:
        raise BertologyError(
            f"Refusing to read {path}: it is not a training state bertology wrote ({_why(err)}; only tensors and "
            "plain values are read back, so a crafted file runs no code). " + (remedy or "Delete it to start afresh.")
        ) from None
    return from_plain(raw)
