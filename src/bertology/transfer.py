"""Host-to-device copies that do not make the host wait for the device.

The streaming analyses choose tokens, positions and pairs on the host (from the items) and send small index and
mask arrays to the maps' device several times per batch. :func:`send` is the one way they do it. It sits below
``analyses``, ``metrics`` and ``data`` so that all three can use it (``data.align`` pools words on the device).
"""
from __future__ import annotations

import numpy as np
import numpy.typing as npt
import torch


def send(array: npt.ArrayLike, device: torch.device | str, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``array`` (NumPy, a list, a scalar or a host tensor) as a tensor on ``device``, without waiting for the device.

    Why: on CUDA a plain host-to-device copy from pageable memory (``torch.as_tensor(a, device="cuda")``,
    ``t.to("cuda")``) ends in ``cudaStreamSynchronize`` (PyTorch's ``Copy.cu``, ``memcpy_and_sync``): the host waits
    for every queued kernel, so the GPU pipeline drains once per copy, several times per batch. Here the array is
    staged in pinned memory (``pin_memory()``, PyTorch's caching host allocator) and copied with
    ``non_blocking=True``, which only enqueues the copy on the current stream.

    Why it is safe: the copy is ordered on the stream before the kernels that read its result, and the pinned staging
    tensor is owned by the caching host allocator, which records the copy's stream and does not hand the block out
    again until the copy has landed, even once the staging tensor is dropped; ``array`` itself was copied into it on
    the host, so it may be freed at once. Elsewhere (CPU, MPS) it is exactly ``torch.as_tensor(array, dtype,
    device)``, as before: the same values, dtype and speed.
    """
    device = torch.device(device)
    if device.type != "cuda":
        return torch.as_tensor(array, dtype=dtype, device=device)
    if isinstance(array, torch.Tensor) and array.device.type != "cpu":  # already on a device: no host staging
        return array.to(device=device, dtype=dtype)
    return staged(array, dtype).pin_memory().to(device, non_blocking=True)


def staged(array: npt.ArrayLike, dtype: torch.dtype | None = None) -> torch.Tensor:
    """The contiguous host tensor :func:`send` pins on CUDA: the values and dtype of ``torch.as_tensor(array, dtype)``.

    A NumPy array is taken as it is (copied only if it is not contiguous or not writable, which ``from_numpy``
    needs); lists, scalars and host tensors go through torch's own conversion (its default dtypes).
    """
    if isinstance(array, np.ndarray):
        host = torch.from_numpy(np.require(array, requirements=("C", "W")))
    else:
        host = torch.as_tensor(array)
    return (host if dtype is None else host.to(dtype)).contiguous()
