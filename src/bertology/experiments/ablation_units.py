"""What an ablation sweep disables: its units (the intact model, one head, one layer) and the plan that picks them.

Conventions (table ``ablation``, DESIGN §3): ``layer`` is 1-based and ``head`` 0-based; ``head`` is -1 on layer and
intact rows, ``layer`` -1 on intact rows. The sweep that runs them is :mod:`bertology.experiments.ablation_sweep`;
the table they score into, :mod:`bertology.experiments.ablation_table`.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from bertology.errors import BertologyError

LAYER_MODES = ("skip", "heads")
Method = Literal["cached", "naive"]


@dataclass(frozen=True)
class Unit:
    """One ablation: the intact model, one head, or one layer (skipped or with every head ablated)."""

    target: str  # "intact" | "head" | "layer"
    layer: int = -1
    head: int = -1
    layer_mode: str = ""  # "skip" | "heads" for layers

    @property
    def key(self) -> str:
        if self.target == "intact":
            return "intact"
        if self.target == "head":
            return f"head-L{self.layer}-H{self.head}"
        return f"layer-{self.layer_mode}-L{self.layer}"

    @property
    def label(self) -> str:
        if self.target == "intact":
            return "intact"
        if self.target == "head":
            return f"L{self.layer}H{self.head}"
        if self.layer_mode == "embeddings":  # revert's layer-0 unit
            return "embeddings"
        return f"L{self.layer}" + _LAYER_LABELS.get(self.layer_mode, f" {self.layer_mode}")


#: How a layer unit's label ends, by its ``layer_mode`` (``attention``/``ffn``/``layer``: revert's units).
_LAYER_LABELS = {"skip": " skipped", "heads": " all heads", "erase": " erased", "attention": " attention",
                 "ffn": " feed-forward", "layer": " whole layer"}


def layer_mode_name(mode: str, layer_mode: str) -> str:
    """The table's ``layer_mode``: ``skip``, or ``{mode}_{unit}`` (``uniform_heads``, ``revert_attention`` ...), or
    empty on head and intact rows."""
    if not layer_mode:
        return ""
    return "skip" if layer_mode == "skip" else f"{mode}_{layer_mode}"


def plan_units(
    n_layers: int,
    n_heads: int,
    *,
    layers: Sequence[int] | None = None,
    heads: bool = True,
    layer_modes: Sequence[str] = LAYER_MODES,
) -> list[Unit]:
    """The ablations of one sweep: intact, then every head and every layer of ``layers`` (all by default)."""
    chosen = sorted(set(range(1, n_layers + 1) if layers is None else (int(x) for x in layers)))
    bad = [x for x in chosen if not 1 <= x <= n_layers]
    if bad:
        raise BertologyError(f"Layer(s) {bad} do not exist; the model has attention layers 1..{n_layers}.")
    units = [Unit("intact")]
    for layer in chosen:
        if heads:
            units += [Unit("head", layer, h) for h in range(n_heads)]
        for lm in LAYER_MODES:
            if lm in layer_modes:
                units.append(Unit("layer", layer, -1, lm))
    return units

@dataclass(frozen=True)
class SweepPlan:
    """Which units an ablation sweep disables and how it runs them.

    ``layers`` (None: every layer), ``heads`` (every head of those layers alone), ``layer_modes`` (whole layers:
    ``skip`` and/or ``heads``); ``method``: ``cached`` (layers below an ablated one run once) or ``naive``
    (a full forward per unit, the reference); ``first_token_shortcut``: let the cached sweep run the last
    block's feed-forward on the first token only, on the batches where that gave the same bits on the intact
    model (about a tenth less work at BERT-base). Off by default: matrix kernels chosen by shape may still round
    an ablated unit's one-row product differently (seen on tiny RoBERTa models), so its numbers equal the naive
    re-run's to float rounding only; without it they are equal bit for bit.

    ``units_per_forward`` (K): how many head units (single heads and ``heads`` layer units of one layer) one
    forward scores, on K copies of each batch with unit k's heads ablated in copy k (:meth:`_Sweep._groups`), so
    a GPU runs fewer, larger kernels. ``skip`` units, and the revert and transplant sweeps, stay one unit per
    forward. None: :func:`units_per_forward_for` (1 on the CPU, up to :data:`AUTO_UNITS_ON_CUDA` on CUDA). K > 1
    multiplies matrices of other shapes, so its numbers equal the one-unit sweep's to float rounding only.
    """

    layers: Sequence[int] | None = None
    heads: bool = True
    layer_modes: Sequence[str] = LAYER_MODES
    method: Method = "cached"
    first_token_shortcut: bool = False
    units_per_forward: int | None = None
