"""The one check of a ``--device`` value, before any work starts."""
from __future__ import annotations

import torch

from bertology.errors import BertologyError


def resolve_device(name: str) -> torch.device:
    """``torch.device`` for ``name`` (``auto`` = CUDA when present, else CPU); a clear error for a device
    this machine does not have (``cuda`` without CUDA, ``mps`` off Apple silicon, an index out of range)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError) as err:
        raise BertologyError(f"Unknown device {name!r} ({err}); use cpu, cuda, cuda:N, mps or auto.") from err
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise BertologyError(f"Device {name!r} was requested but CUDA is not available here; use --device cpu.")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise BertologyError(f"Device {name!r}: this machine has {torch.cuda.device_count()} CUDA device(s).")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise BertologyError(f"Device {name!r} was requested but MPS (Apple silicon) is not available; use --device cpu.")
    return device
