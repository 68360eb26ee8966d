"""Transplant: the base encoder under the tuned task head, with some of the tuned model's units put back.

The converse of :mod:`bertology.models.revert`. "Head alone" is the tuned model with every revert unit
reverted (:func:`~bertology.models.revert.all_pieces`: the embeddings and every whole layer, which is every
encoder parameter but the pooler, read by the task head only); a transplant of some units is the same model
with those units' tuned values kept. The units and their weights are revert's (:func:`unit_pieces`), so no
weight layout is written twice.

A :class:`Part` names one transplanted unit: ``embeddings``, a whole ``layer``, a layer's ``attention`` or
``ffn`` block, or one ``head`` (its rows and columns, as revert defines them). ALBERT shares one layer's
weights across all depths: only its embeddings can be transplanted (its head alone is every encoder
parameter reverted; per-layer parts are refused by :func:`unit_pieces` with the reason).

:func:`transplanted` reverts the head-alone pieces in place, copies the kept units' tuned values back, and
on exit restores the tuned model bit for bit (through :func:`~bertology.models.revert.reverted`).
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from bertology.models import sites
from bertology.models.revert import EMBEDDINGS, Piece, all_pieces, encoder_parameter_names, reverted, unit_pieces

#: The kinds of a transplanted part.
PART_KINDS = ("embeddings", "layer", "attention", "ffn", "head")


@dataclass(frozen=True, order=True)
class Part:
    """One transplanted unit: ``kind`` in :data:`PART_KINDS`, ``layer`` 1-based (0 for the embeddings), ``head`` 0-based."""

    kind: str
    layer: int = 0
    head: int = -1

    @property
    def key(self) -> str:
        """Short, file-name-safe name: ``emb``, ``L3``, ``L3att``, ``L3ffn``, ``L3H2``."""
        if self.kind == EMBEDDINGS:
            return "emb"
        suffix = {"layer": "", "attention": "att", "ffn": "ffn", "head": f"H{self.head}"}[self.kind]
        return f"L{self.layer}{suffix}"

    def pieces(self, model: nn.Module) -> list[Piece]:
        """The part's weight pieces (revert's definition of the unit)."""
        if self.kind == EMBEDDINGS:
            return unit_pieces(model, EMBEDDINGS)
        return unit_pieces(model, self.kind, self.layer, self.head)


def parts_key(parts: Iterable[Part]) -> str:
    """The store key of a set of transplanted parts (order-free): ``transplant-none``, ``transplant-emb+L1+L2`` ..."""
    keys = [p.key for p in sorted(set(parts))]
    return "transplant-" + ("+".join(keys) if keys else "none")


def head_alone_pieces(model: nn.Module) -> list[Piece]:
    """Every piece reverted for "head alone": revert's every unit; for ALBERT (shared layers) every encoder parameter
    but the pooler, the same set."""
    if sites.adapter(model).shared_blocks:
        return [Piece(name) for name in encoder_parameter_names(model)]
    return all_pieces(model)


@contextmanager
def transplanted(model: nn.Module, base: nn.Module, parts: Iterable[Part]) -> Iterator[None]:
    """Within the block ``model`` is the base encoder under its own task head plus its tuned ``parts``; on exit the
    tuned model is back bit for bit (also when the body raises)."""
    encoder = sites.encoder(model)
    keep = [piece for part in parts for piece in part.pieces(model)]
    kept = [(piece, piece.view(encoder).clone()) for piece in keep]
    with reverted(model, base, head_alone_pieces(model)):
        with torch.no_grad():
            for piece, value in kept:
                piece.view(encoder).copy_(value)
        yield
