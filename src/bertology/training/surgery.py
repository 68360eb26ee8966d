"""Model surgery before fine-tuning: remove transformer blocks, freeze the bottom blocks or the embeddings.

Layer numbers are 1-based (bertology's convention: layer ``i`` is ``hidden_states[i]``, the output of
block ``i``). Removing blocks renumbers the rest (the saved model's ``encoder.layer.0`` is the first
kept block) and updates ``config.num_hidden_layers``, so the saved folder reloads with the right depth.
"""
from __future__ import annotations

import logging
from collections.abc import Sequence

import torch

from bertology.errors import BertologyError

logger = logging.getLogger(__name__)


def _blocks(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The ModuleList of transformer blocks of a BERT-family model (task model or bare encoder)."""
    enc = getattr(model, "base_model", model)
    for path in ("encoder.layer", "transformer.layer", "layers", "encoder.layers"):
        obj = enc
        for part in path.split("."):
            obj = getattr(obj, part, None)
            if obj is None:
                break
        if isinstance(obj, torch.nn.ModuleList):
            return obj
    raise BertologyError(f"Cannot find the transformer blocks of {type(model).__name__} (looked for encoder.layer).")


def _set_blocks(model: torch.nn.Module, blocks: torch.nn.ModuleList) -> None:
    enc = getattr(model, "base_model", model)
    for path in ("encoder.layer", "transformer.layer", "layers", "encoder.layers"):
        parts = path.split(".")
        parent = enc
        for part in parts[:-1]:
            parent = getattr(parent, part, None)
            if parent is None:
                break
        if parent is not None and isinstance(getattr(parent, parts[-1], None), torch.nn.ModuleList):
            setattr(parent, parts[-1], blocks)
            return
    raise BertologyError(f"Cannot find the transformer blocks of {type(model).__name__}.")  # pragma: no cover


def num_blocks(model: torch.nn.Module) -> int:
    return len(_blocks(model))


def check_drop_layers(layers: Sequence[int], n_layers: int) -> tuple[int, ...]:
    """Sorted unique 1-based block numbers; a clear error for numbers out of range or dropping every block."""
    chosen = tuple(sorted({int(x) for x in layers}))
    bad = [x for x in chosen if not 1 <= x <= n_layers]
    if bad:
        raise BertologyError(
            f"--drop-layers {', '.join(map(str, bad))}: the model has layers 1..{n_layers} (1-based)."
        )
    if len(chosen) >= n_layers:
        raise BertologyError(f"--drop-layers would remove all {n_layers} layers; keep at least one.")
    return chosen


def drop_layers(model: torch.nn.Module, layers: Sequence[int]) -> tuple[int, ...]:
    """Remove the 1-based transformer blocks ``layers`` in place; return the original numbers of the kept ones.

    ``config.num_hidden_layers`` is updated (and per-layer config lists such as ``layer_types`` are cut
    to match), and the kept blocks' ``layer_idx`` attributes are renumbered.
    """
    blocks = _blocks(model)
    n = len(blocks)
    chosen = check_drop_layers(layers, n)
    if not chosen:
        return tuple(range(1, n + 1))
    kept = tuple(i for i in range(1, n + 1) if i not in chosen)
    new = torch.nn.ModuleList([blocks[i - 1] for i in kept])
    _set_blocks(model, new)
    for new_idx, block in enumerate(new):
        for module in block.modules():
            if hasattr(module, "layer_idx") and isinstance(module.layer_idx, int):
                module.layer_idx = new_idx
    cfg = model.config
    for name in ("layer_types",):  # per-layer lists some configs carry
        value = getattr(cfg, name, None)
        if isinstance(value, (list, tuple)) and len(value) == n:
            setattr(cfg, name, [value[i - 1] for i in kept])
    cfg.num_hidden_layers = len(kept)
    logger.info("Removed layer(s) %s; %d of %d layers remain", ", ".join(map(str, chosen)), len(kept), n)
    return kept


def _embeddings(model: torch.nn.Module) -> torch.nn.Module:
    enc = getattr(model, "base_model", model)
    emb = getattr(enc, "embeddings", None)
    if emb is None:
        raise BertologyError(f"Cannot find the embeddings of {type(model).__name__}.")
    return emb


def freeze(model: torch.nn.Module, bottom_layers: int = 0, embeddings: bool = False) -> list[str]:
    """Set ``requires_grad=False`` on the embeddings and/or the bottom ``bottom_layers`` blocks.

    Returns the names of the frozen parameters. Frozen parameters get no gradient, are left out of the
    optimiser, and so stay bit-identical (no weight decay either).
    """
    blocks = _blocks(model)
    if not 0 <= bottom_layers <= len(blocks):
        raise BertologyError(f"--freeze-layers {bottom_layers}: the model has {len(blocks)} layers.")
    frozen: set[int] = set()
    modules: list[torch.nn.Module] = list(blocks[:bottom_layers])
    if embeddings:
        modules.append(_embeddings(model))
    for m in modules:
        for p in m.parameters():
            p.requires_grad_(False)
            frozen.add(id(p))
    names = [n for n, p in model.named_parameters() if id(p) in frozen]
    if names:
        logger.info("Froze %d parameter tensors (%s%s)", len(names),
                    f"layers 1-{bottom_layers}" if bottom_layers else "", " + embeddings" if embeddings else "")
    return names


def parameter_counts(model: torch.nn.Module) -> dict[str, int]:
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return {"total": int(total), "trainable": int(trainable), "frozen": int(total - trainable)}
