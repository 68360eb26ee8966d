"""The one check of a ``--dtype`` value: which floating-point type the models run in, on this device.

``float32`` is the default and gives today's numbers bit for bit. ``bfloat16`` (8-bit mantissa:
relative rounding 2^-8 per operation) and ``float16`` (11-bit mantissa, but a range that ends at
65504) halve the memory of weights and activations and run faster on GPUs with tensor cores.
Only the models run in that type: every captured activation is widened to float32 before the
analyses see it, and their statistics are accumulated in float64 as in a float32 run.
"""
from __future__ import annotations

import torch

from bertology.config import DTYPES  # the --dtype values, declared once beside the settings that take them
from bertology.errors import BertologyError

_TORCH = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def torch_dtype(name: str) -> torch.dtype:
    """``torch.dtype`` of a ``--dtype`` name; one clear error for any other name."""
    if name not in _TORCH:
        raise BertologyError(f"Unknown --dtype {name!r}; use one of {', '.join(DTYPES)}.")
    return _TORCH[name]


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """``torch.dtype`` for ``name``, after checking that ``device`` runs what an encoder needs in it.

    The check runs a tiny matmul, softmax, layer norm and GELU in that type on the device: a
    GPU without bfloat16 (compute capability below 8.0) or a build without float16 kernels on the
    CPU fails here with one message naming the dtype, the device and the way out, not in the
    middle of a forward pass.
    """
    dtype = torch_dtype(name)
    if dtype == torch.float32:
        return dtype
    if device.type == "cuda" and dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        raise BertologyError(
            f"--dtype bfloat16 needs a GPU of compute capability 8.0 or newer; {torch.cuda.get_device_name(device)} "
            "has no bfloat16 arithmetic. Use --dtype float16 or float32.")
    try:
        x = torch.linspace(-1.0, 1.0, 64, device=device).reshape(8, 8).to(dtype)
        y = torch.nn.functional.layer_norm(torch.softmax(x @ x.T, -1), (8,))
        ok = bool(torch.isfinite(torch.nn.functional.gelu(y).float()).all())
    except (RuntimeError, NotImplementedError, TypeError) as err:
        raise BertologyError(
            f"--dtype {name} cannot run on {device} here ({str(err).splitlines()[0]}); use --dtype float32"
            + (" or another device." if device.type == "cpu" else ".")) from err
    if not ok:  # pragma: no cover - a device that computes garbage in this type
        raise BertologyError(f"--dtype {name} gives non-finite results on {device}; use --dtype float32.")
    return dtype

