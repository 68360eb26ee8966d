"""Mixed-precision training (``--dtype bfloat16|float16`` of ``finetune``): autocast and a loss scaler.

The weights, the optimiser state and the gradients stay float32; the training forward runs under
``torch.autocast`` in the reduced type (matmuls in it, softmax, norms and losses widened by
autocast's own op lists). float16's range ends at 65504 and its smallest normal is 6e-5, so small
gradients underflow: a ``torch.amp.GradScaler`` multiplies the loss before the backward pass,
unscales the gradients before clipping, and skips a step whose gradients overflowed (lowering the
scale). bfloat16 has float32's range and needs no scaler. ``float32`` is the plain loop, bit for bit.
Evaluation runs without autocast: it scores the float32 weights that are saved.
"""
from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch

from bertology.models.precision import resolve_dtype


@dataclass
class MixedPrecision:
    """The autocast type of the training forward and, for float16, its loss scaler."""

    device_type: str
    dtype: torch.dtype = torch.float32
    scaler: torch.amp.GradScaler | None = None

    @classmethod
    def create(cls, name: str, device: torch.device) -> "MixedPrecision":
        """Settings for ``--dtype name`` on ``device`` (a dtype the device cannot run is one clear error)."""
        dtype = resolve_dtype(name, device)
        scaler = torch.amp.GradScaler(device.type) if dtype == torch.float16 else None
        return cls(device.type, dtype, scaler)

    @property
    def enabled(self) -> bool:
        return self.dtype != torch.float32

    def autocast(self) -> AbstractContextManager:
        """The context of a training forward pass (nothing for float32)."""
        return torch.autocast(self.device_type, dtype=self.dtype) if self.enabled else nullcontext()

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()``, of the scaled loss when a scaler is in use."""
        (self.scaler.scale(loss) if self.scaler is not None else loss).backward()

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        """Divide the gradients by the scale (before clipping their norm)."""
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)

    def step(self, optimizer: torch.optim.Optimizer) -> None:
        """``optimizer.step()``; with a scaler, skipped when a gradient overflowed, and the scale updated."""
        if self.scaler is None:
            optimizer.step()
        else:
            self.scaler.step(optimizer)
            self.scaler.update()

    def state_dict(self) -> dict | None:
        """The scaler's state for a checkpoint (None without one), so a resumed run continues exactly."""
        return None if self.scaler is None else self.scaler.state_dict()

    def load_state_dict(self, state: dict | None) -> None:
        if self.scaler is not None and state:
            self.scaler.load_state_dict(state)
