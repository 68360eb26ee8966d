"""Put the base model's weights back into one unit of a fine-tuned model, and take them out again exactly.

Reverting (Tamkin et al. 2020, "Investigating Transferability in Pretrained Language Models": they reset
parts of a fine-tuned model to their pretrained values and measure what the task loses) asks which
fine-tuning changes the task depends on. A unit's weights are found through the family's
:class:`~bertology.models.adapters.base.WeightLayout`, as :class:`Piece` records (a parameter of the bare
encoder, or a row/column slice of one):

* ``head`` (layer ``l``, head ``h``): the head's ``d`` rows of the query, key and value projections
  (weight and bias; DeBERTa's position query/key projections too when the model has them) and its ``d``
  columns of the attention output projection's weight. ModernBERT's fused ``attn.Wqkv`` holds query, key and
  value as its three row chunks (``attn.Wqkv:i/3``); the head's rows are taken inside each chunk. The
  output projection's bias is added after the heads are summed: it belongs to no head and is not reverted
  with one (the attention block reverts it).
* ``attention``: every attention weight of the block (query, key, value, position projections, attention
  output and its norm); ``ffn``: the feed-forward block (``ffn_in``, ``ffn_out``, ``ffn_norm``); ``layer``: every
  parameter of the block, plus the module whose output is the layer's hidden state when that is not the block
  (DeBERTa-v2's convolution after block 1, ModernBERT's final norm after the last block).
* ``embeddings`` (layer 0): the layout's embeddings (word, position and token-type tables, their norm,
  ELECTRA's and ALBERT's projection, DeBERTa's relative embeddings and MPNet's relative attention bias).

The pooler of BERT and ALBERT lives in the bare encoder but only the task head reads it: it counts as part
of the head and is never reverted, so reverting every unit gives the base encoder under the tuned head.

ALBERT shares one layer's weights across all depths: reverting "layer 3" (or one of its heads) would revert
every depth, so per-layer and per-head units are refused for ALBERT (:func:`unit_pieces` says why); its
embeddings can be reverted.

:func:`reverted` swaps the base's values into the tuned model's parameters in place and restores the
tuned values bit for bit on exit, even when the body raises.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from bertology.errors import BertologyError
from bertology.models import sites
from bertology.models.adapters import get_path
from bertology.models.adapters.base import Adapter, WeightLayout

#: The per-layer revert units (the ``layer_mode`` of the table's layer rows, written ``revert_<unit>``).
LAYER_UNITS = ("attention", "ffn", "layer")
#: The embeddings unit (layer 0).
EMBEDDINGS = "embeddings"
#: Every revert unit kind but the single head.
REVERT_UNITS = (*LAYER_UNITS, EMBEDDINGS)
#: Canonical layout names per block unit.
ATTENTION_NAMES = ("query", "key", "value", "position_query", "position_key", "attention_output", "attention_norm")
FFN_NAMES = ("ffn_in", "ffn_out", "ffn_norm")
#: The per-head projections: the head owns ``d`` rows of each (DeBERTa's position projections are per head too).
HEAD_ROW_NAMES = ("query", "key", "value", "position_query", "position_key")
#: Parameters of the bare encoder that belong to the task head (read by the classifier only).
HEAD_PREFIXES = ("pooler.",)
ALBERT_REASON = ("ALBERT shares one layer's weights across all depths, so reverting one layer (or one head of it) "
                 "would revert every depth; revert is refused per layer and per head for ALBERT (its embeddings can "
                 "be reverted)")


@dataclass(frozen=True)
class Piece:
    """One parameter of the bare encoder (``name``), or its rows ``rows`` / columns ``cols`` (half-open ranges)."""

    name: str
    rows: tuple[int, int] | None = None
    cols: tuple[int, int] | None = None

    def view(self, encoder: nn.Module) -> torch.Tensor:
        """The piece as a view of the parameter's data (writing into it writes the model)."""
        t = encoder.get_parameter(self.name).data
        if self.rows is not None:
            t = t[self.rows[0]:self.rows[1]]
        if self.cols is not None:
            t = t[:, self.cols[0]:self.cols[1]]
        return t


def _layout(adapter: Adapter) -> WeightLayout:
    if adapter.weights is None:
        raise BertologyError(f"{adapter.family} has no weight layout; revert cannot find its weights.")
    return adapter.weights


def _split(path: str) -> tuple[str, int, int]:
    """``attn.Wqkv:1/3`` -> (``attn.Wqkv``, 1, 3); a plain path -> (path, 0, 1)."""
    if ":" not in path:
        return path, 0, 1
    module, chunk = path.split(":")
    i, n = chunk.split("/")
    return module, int(i), int(n)


def _module_pieces(encoder: nn.Module, prefix: str, path: str) -> list[Piece]:
    """Every parameter of the module at ``prefix + path`` (its row chunk for a fused path); none if absent."""
    module_path, i, n = _split(path)
    full = f"{prefix}{module_path}"
    module = get_path(encoder, full)
    if module is None:
        return []
    out = []
    for pname, p in module.named_parameters():
        rows = None
        if n > 1:
            size = p.shape[0] // n
            rows = (i * size, (i + 1) * size)
        out.append(Piece(f"{full}.{pname}", rows))
    return out


def _head_pieces(encoder: nn.Module, prefix: str, layout: WeightLayout, head: int, d: int) -> list[Piece]:
    """Head ``head``'s rows of q/k/v (and position projections) and its columns of the attention output weight."""
    out: list[Piece] = []
    for name in HEAD_ROW_NAMES:
        if name not in layout.block:
            continue
        for piece in _module_pieces(encoder, prefix, layout.block[name]):
            start = 0 if piece.rows is None else piece.rows[0]
            out.append(Piece(piece.name, (start + head * d, start + (head + 1) * d)))
    proj = _module_pieces(encoder, prefix, layout.block["attention_output"])
    out += [Piece(p.name, None, (head * d, (head + 1) * d)) for p in proj if p.name.endswith(".weight")]
    return out


def _output_module_pieces(encoder: nn.Module, adapter: Adapter, layer: int) -> list[Piece]:
    """Parameters of the module whose output is hidden state ``layer`` when that is not the block itself."""
    module = adapter.layer_output(encoder, layer) if adapter.layer_output is not None else None
    if module is None:
        return []
    names = {id(m): n for n, m in encoder.named_modules()}
    return [Piece(f"{names[id(module)]}.{pname}") for pname, _ in module.named_parameters()]


def unit_pieces(model: nn.Module, unit: str, layer: int = -1, head: int = -1) -> list[Piece]:
    """The pieces of one revert unit of ``model``: ``head`` (``layer``, ``head``), ``attention``, ``ffn``, ``layer``
    (``layer``, 1-based) or ``embeddings``. One :class:`BertologyError` for a unit the family cannot revert."""
    encoder, adapter = sites.encoder(model), sites.adapter(model)
    layout = _layout(adapter)
    if unit == EMBEDDINGS:
        return [p for path in layout.embeddings.values() for p in _module_pieces(encoder, "", path)]
    if unit not in ("head", *LAYER_UNITS):
        raise ValueError(f"unknown revert unit {unit!r}; units: head, {', '.join(REVERT_UNITS)}")
    if adapter.shared_blocks:
        raise BertologyError(ALBERT_REASON + ".")
    n = sites.num_layers(model)
    if not 1 <= layer <= n:
        raise BertologyError(f"Layer {layer} does not exist; the model has layers 1..{n}.")
    prefix = f"{adapter.blocks}.{layer - 1}."
    if unit == "head":
        h = sites.num_heads(model)
        if not 0 <= head < h:
            raise BertologyError(f"Head {head} does not exist; layer {layer} has heads 0..{h - 1}.")
        return _head_pieces(encoder, prefix, layout, head, sites.head_size(model))
    if unit == "layer":
        block = get_path(encoder, prefix[:-1])
        own = [Piece(f"{prefix}{pname}") for pname, _ in block.named_parameters()]
        return own + _output_module_pieces(encoder, adapter, layer)
    names = ATTENTION_NAMES if unit == "attention" else FFN_NAMES
    return [p for name in names if name in layout.block for p in _module_pieces(encoder, prefix, layout.block[name])]


def encoder_parameter_names(model: nn.Module) -> list[str]:
    """Every parameter of the bare encoder that a revert may touch (the pooler, part of the task head, left out)."""
    return [n for n, _ in sites.encoder(model).named_parameters() if not n.startswith(HEAD_PREFIXES)]


def check_base(model: nn.Module, base: nn.Module, base_name: str = "the base model") -> None:
    """One :class:`BertologyError` line unless ``base`` has every encoder parameter of ``model`` with the same shape."""
    if sites.adapter(model).family != sites.adapter(base).family:
        raise BertologyError(
            f"Cannot revert into a {sites.adapter(model).family} model from {base_name}, a {sites.adapter(base).family} "
            "model; --base must be the pretrained model the tuned one was fine-tuned from.")
    tuned_enc, base_enc = sites.encoder(model), sites.encoder(base)
    base_params = dict(base_enc.named_parameters())
    for name in encoder_parameter_names(model):
        mine, theirs = tuned_enc.get_parameter(name), base_params.get(name)
        if theirs is None or theirs.shape != mine.shape:
            there = "missing" if theirs is None else f"of shape {tuple(theirs.shape)}"
            raise BertologyError(
                f"Cannot revert from {base_name}: its {name} is {there}, the tuned model's is {tuple(mine.shape)}; "
                "--base must be the pretrained model the tuned one was fine-tuned from.")


@contextmanager
def reverted(model: nn.Module, base: nn.Module, pieces: Iterable[Piece]) -> Iterator[None]:
    """Within the block, ``model``'s ``pieces`` hold ``base``'s values; on exit the tuned values are back, bit for bit.

    The tuned values are kept as clones and copied back in ``finally``; pieces may overlap (restored in reverse).
    """
    tuned_enc, base_enc = sites.encoder(model), sites.encoder(base)
    saved: list[tuple[torch.Tensor, torch.Tensor]] = []
    try:
        with torch.no_grad():
            for piece in pieces:
                target = piece.view(tuned_enc)
                saved.append((target, target.clone()))
                target.copy_(piece.view(base_enc))
        yield
    finally:
        with torch.no_grad():
            for target, original in reversed(saved):
                target.copy_(original)


def all_pieces(model: nn.Module) -> list[Piece]:
    """Every unit at once: the embeddings and every whole layer (the base encoder under the tuned head)."""
    n = sites.num_layers(model)
    return unit_pieces(model, EMBEDDINGS) + [p for layer in range(1, n + 1) for p in unit_pieces(model, "layer", layer)]


def piece_names(pieces: Sequence[Piece]) -> set[str]:
    """The parameter names the pieces touch (whole or in part)."""
    return {p.name for p in pieces}
