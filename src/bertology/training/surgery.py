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
from bertology.models import sites
from bertology.models.adapters import get_path

logger = logging.getLogger(__name__)


def _block_list(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The ModuleList that holds the blocks (found through the family adapter)."""
    enc = sites.encoder(model)
    blocks = get_path(enc, sites.adapter(model).blocks)
    if not isinstance(blocks, torch.nn.ModuleList):  # pragma: no cover - the adapter conformance tests cover this
        raise BertologyError(f"Cannot find the transformer blocks of {type(model).__name__}.")
    return blocks


def _set_blocks(model: torch.nn.Module, blocks: torch.nn.ModuleList) -> None:
    path = sites.adapter(model).blocks
    parent_path, _, name = path.rpartition(".")
    enc = sites.encoder(model)
    parent = get_path(enc, parent_path) if parent_path else enc
    setattr(parent, name, blocks)


def num_blocks(model: torch.nn.Module) -> int:
    """Depth of the model (ALBERT: how many times its shared layer runs)."""
    return sites.num_layers(model)


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
    to match), and the kept blocks' ``layer_idx`` attributes are renumbered. With shared blocks (ALBERT)
    there is nothing to remove: every depth runs the same module, so dropping layers lowers the repeat
    count (the result is the same whichever layers are named; :func:`describe_drop` says so).
    """
    n = sites.num_layers(model)
    chosen = check_drop_layers(layers, n)
    if not chosen:
        return tuple(range(1, n + 1))
    kept = tuple(i for i in range(1, n + 1) if i not in chosen)
    if sites.adapter(model).shared_blocks:
        _drop_shared(model, len(kept))
        logger.info("Shared blocks: the layer now runs %d times instead of %d", len(kept), n)
        return kept
    blocks = _block_list(model)
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


def _drop_shared(model: torch.nn.Module, depth: int) -> None:
    """ALBERT: run the shared layer ``depth`` times (groups keep their share of the depth)."""
    cfg = model.config
    groups = int(getattr(cfg, "num_hidden_groups", 1))
    if depth % groups:
        raise BertologyError(
            f"--drop-layers: this ALBERT has {groups} layer groups; the remaining depth ({depth}) must be a multiple of it."
        )
    cfg.num_hidden_layers = depth


def layers_record(model: torch.nn.Module, before: int, dropped: Sequence[int], kept: Sequence[int]) -> dict:
    """The manifest's ``layers`` entry; with shared blocks (ALBERT) a note says what dropping meant."""
    record = {"before": before, "dropped": list(dropped), "kept": list(kept), "after": num_blocks(model)}
    if dropped and sites.adapter(model).shared_blocks:
        record["note"] = (f"{sites.adapter(model).family} shares one layer across depth: dropping {len(dropped)} "
                          "layer(s) lowers how many times it runs; which layers were named makes no difference")
    return record


def check_freeze_layers(model: torch.nn.Module, bottom_layers: int) -> None:
    """A clear error for a count of bottom blocks to freeze that ``model`` does not have (or cannot freeze alone:
    ALBERT shares one layer across its depth)."""
    n = sites.num_layers(model)
    if not 0 <= bottom_layers <= n:
        raise BertologyError(f"--freeze-layers {bottom_layers}: the model has {n} layers.")
    if sites.adapter(model).shared_blocks and 0 < bottom_layers < n:
        raise BertologyError(
            f"--freeze-layers {bottom_layers}: {sites.adapter(model).family} shares one layer across all {n} depths, "
            f"so its bottom layers cannot be frozen alone; freeze 0 or all {n}."
        )


def freeze(model: torch.nn.Module, bottom_layers: int = 0, embeddings: bool = False) -> list[str]:
    """Set ``requires_grad=False`` on the embeddings and/or the bottom ``bottom_layers`` blocks.

    Returns the names of the frozen parameters. Frozen parameters get no gradient, are left out of the
    optimiser, and so stay bit-identical (no weight decay either).
    """
    check_freeze_layers(model, bottom_layers)
    frozen: set[int] = set()
    modules: list[torch.nn.Module] = list(sites.blocks(model)[:bottom_layers])
    if embeddings:
        modules.extend(sites.embedding_modules(model))
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
