"""Per-layer gradient norms of a model in training (the stability check of Mosbach et al. 2021).

The norm of the gradient of each layer's parameters: the embeddings (layer 0), each transformer block
(layers 1..N) and everything else (``other``: pooler, task head), plus the ``total`` over all trainable
parameters. The norms are read by a ``post_accumulate_grad`` hook on every trainable parameter, which
fires right after backward has added into ``.grad``: with gradient accumulation the last call of a step
holds the whole step's gradient, and it comes before the Trainer clips the gradients (``max_grad_norm``)
and long before it zeroes them, so these are the raw norms the optimizer step starts from (the Trainer's
``on_pre_optimizer_step`` sees them already clipped). Under fp16 mixed precision with a loss scaler the
gradients are still scaled at that point.
"""
from __future__ import annotations

import math
from collections.abc import Callable

import pandas as pd
import torch

from bertology.models import sites

OTHER, TOTAL = "other", "total"


def layer_groups(model: torch.nn.Module) -> dict[int, tuple[str, int | None]]:
    """``id(parameter) -> (group, layer)`` for every parameter: embeddings 0, blocks 1..N, the rest ``other``.

    ALBERT's shared block is one set of parameters run N times: its parameters count in layer 1 only.
    """
    groups: dict[int, tuple[str, int | None]] = {}
    for layer, block in reversed(list(enumerate(sites.blocks(model), start=1))):
        groups.update({id(p): ("layer", layer) for p in block.parameters()})
    for module in sites.embedding_modules(model):
        groups.update({id(p): ("embeddings", 0) for p in module.parameters()})
    return {id(p): groups.get(id(p), (OTHER, None)) for p in model.parameters()}


class GradientNorms:
    """Records the gradient norm of each layer at the steps it is told to (``arm``), via parameter hooks."""

    def __init__(self, model: torch.nn.Module):
        self.groups = layer_groups(model)
        self.sizes: dict[tuple[str, int | None], int] = {}
        for p in model.parameters():
            if p.requires_grad:
                key = self.groups[id(p)]
                self.sizes[key] = self.sizes.get(key, 0) + p.numel()
        self._armed = False
        self._norms: dict[int, torch.Tensor] = {}
        self._handles = [p.register_post_accumulate_grad_hook(self._hook()) for p in model.parameters() if p.requires_grad]

    def _hook(self) -> Callable[[torch.Tensor], None]:
        def keep(param: torch.Tensor) -> None:
            if self._armed and param.grad is not None:
                self._norms[id(param)] = torch.linalg.vector_norm(param.grad.detach(), dtype=torch.float64)
        return keep

    def arm(self) -> None:
        """Record the gradients of the coming backward pass(es), until :meth:`read`."""
        self._armed, self._norms = True, {}

    @property
    def armed(self) -> bool:
        return self._armed

    def read(self, step: int) -> pd.DataFrame:
        """The recorded norms as rows ``step, group, layer, metric, value, n_params`` (then disarm)."""
        squares: dict[tuple[str, int | None], float] = {}
        for pid, norm in self._norms.items():
            key = self.groups[pid]
            squares[key] = squares.get(key, 0.0) + float(norm) ** 2
        self._armed, self._norms = False, {}
        rows = [(step, g, layer, "grad_norm", math.sqrt(s), self.sizes[(g, layer)])
                for (g, layer), s in sorted(squares.items(), key=lambda kv: (kv[0][1] is None, kv[0][1] or 0))]
        rows.append((step, TOTAL, None, "grad_norm", math.sqrt(sum(squares.values())), sum(self.sizes.values())))
        table = pd.DataFrame(rows, columns=["step", "group", "layer", "metric", "value", "n_params"])
        table["layer"] = table["layer"].astype("Int64")
        return table

    def remove(self) -> None:
        """Remove the hooks from the parameters."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
