"""Streaming state kept where the maps are: accumulators on the maps' device, one host copy at the end.

An analysis adds each batch's terms to tensors on the batch's device, so a GPU run copies nothing back per batch
(each copy is a device sync). The helpers here make such tensors, move them between devices (a shard merged into
another), and pick the dtype a device can hold: MPS has no float64, so float64 sums are float32 there. The host's
per-batch index and mask arrays go to the device by :func:`bertology.transfer.send` (no wait for the device).
"""
from __future__ import annotations

import torch


def state_dtype(dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """``dtype`` as ``device`` can hold it: float64 becomes float32 on MPS (no float64 there), else unchanged."""
    return torch.float32 if dtype == torch.float64 and device.type == "mps" else dtype


def zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
    """A fresh accumulator: a normal tensor (updates add to it in place inside inference mode or not)."""
    device = torch.device(device)
    with torch.inference_mode(False):
        return torch.zeros(shape, dtype=state_dtype(dtype, device), device=device)


def moved(t: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``t`` on ``like``'s device and in its dtype, the dtype changed on whichever side has both (MPS lacks float64)."""
    if like.device.type == "mps":
        return t.to(like.dtype).to(like.device)
    return t.to(like.device).to(like.dtype)


def to_device(t: torch.Tensor, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """Accumulator ``t`` moved to ``device`` as ``dtype`` (:func:`state_dtype`), a normal tensor; ``t`` itself if it is there."""
    dtype = state_dtype(dtype, device)
    if t.device == device and t.dtype == dtype:
        return t
    with torch.inference_mode(False):
        return moved(t, torch.empty(0, dtype=dtype, device=device))


def host(v):
    """Device state as a NumPy copy (in ``compute``: one copy per run); NumPy arrays and None as they are."""
    return v.cpu().numpy() if isinstance(v, torch.Tensor) else v
