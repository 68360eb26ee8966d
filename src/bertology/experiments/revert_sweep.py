"""The revert sweep's units: put the base model's weights back into one unit of the tuned model at a time.

Tamkin et al. 2020 ("Investigating Transferability in Pretrained Language Models") reset parts of a
fine-tuned model to their pretrained values to see which parts' fine-tuning the task needs. Here every
unit of :mod:`bertology.models.revert` is reverted in turn: every head, every layer's attention block,
feed-forward block and whole layer, and the embeddings. A unit whose revert costs the task is one whose
fine-tuning change the task depends on; a revert that costs nothing says the task does not need what
fine-tuning did to that unit (it may still need the unit itself: the uniform/zero/mean ablations ask that).

The table is the ``ablation`` table of :mod:`bertology.experiments.ablation_table` with ``mode`` ``revert``:
head rows as there; layer rows with ``layer_mode`` ``revert_attention``, ``revert_ffn`` or ``revert_layer``;
the embeddings as a layer row with ``layer`` 0 and ``layer_mode`` ``revert_embeddings``. Deltas are
reverted minus intact (the tuned model), with the same paired bootstrap intervals, ``helps``/``hurts``
flags and degenerate-model checks as the other modes (:func:`~bertology.experiments.ablation_table.score_units`).

A unit that touches only layer ``l`` leaves the tuned model's layers below ``l`` as they are: where the family's
blocks allow it (BERT, RoBERTa, XLM-R, ELECTRA) the tuned model's hidden states entering each layer are computed
once per batch and every unit runs only its layers ``l..L`` and the head from them
(:mod:`bertology.experiments.layer_cache`), bit-identical to a full forward; the embeddings unit, and every unit
of the other families, runs a full forward (``params["method"]``: ``cached`` or ``naive``). The tuned model's
weights are restored bit for bit after each unit (:func:`bertology.models.revert.reverted`). The sweep itself is
:class:`~bertology.experiments.interventions.Revert` run by :func:`~bertology.experiments.intervention_sweep.run_intervention`
(:func:`~bertology.experiments.interventions.run_revert`); this module plans its units and hashes the base. ALBERT's shared
layer cannot be reverted one depth at a time: its sweep holds the embeddings unit only (``params["refused"]``
says why). Resuming works as in the other sweep (``progress_dir``), with the base model's weights in the
fingerprint.
"""
from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch

from bertology.errors import BertologyError
from bertology.experiments.ablation_units import Unit
from bertology.experiments.scoring import _raw_bytes
from bertology.models import sites
from bertology.models.revert import ALBERT_REASON, EMBEDDINGS, LAYER_UNITS, REVERT_UNITS, unit_pieces


def plan_revert_units(
    model: torch.nn.Module,
    *,
    layers: Sequence[int] | None = None,
    heads: bool = True,
    units: Sequence[str] = REVERT_UNITS,
) -> tuple[list[Unit], str | None]:
    """The units of one revert sweep (intact first) and why some were refused (None when none was).

    ``layers``: which layers' heads and blocks (None: all); ``heads``: every head alone; ``units``: which of
    ``attention``, ``ffn``, ``layer`` (per layer) and ``embeddings`` (once, layer 0).
    """
    bad_units = [u for u in units if u not in REVERT_UNITS]
    if bad_units:
        raise BertologyError(f"Revert units must be among {', '.join(REVERT_UNITS)}, not {', '.join(bad_units)}.")
    n_layers, n_heads = sites.num_layers(model), sites.num_heads(model)
    chosen = sorted(set(range(1, n_layers + 1) if layers is None else (int(x) for x in layers)))
    bad = [x for x in chosen if not 1 <= x <= n_layers]
    if bad:
        raise BertologyError(f"Layer(s) {bad} do not exist; the model has attention layers 1..{n_layers}.")
    plan = [Unit("intact")] + ([Unit("layer", 0, -1, EMBEDDINGS)] if EMBEDDINGS in units else [])
    if sites.adapter(model).shared_blocks:
        if layers is not None:
            raise BertologyError(ALBERT_REASON + "; leave --layers out.")
        return plan, ALBERT_REASON
    for layer in chosen:
        if heads:
            plan += [Unit("head", layer, h) for h in range(n_heads)]
        plan += [Unit("layer", layer, -1, u) for u in LAYER_UNITS if u in units]
    return plan, None


def unit_of(model: torch.nn.Module, unit: Unit) -> list:
    """The weight pieces a table unit reverts."""
    if unit.target == "head":
        return unit_pieces(model, "head", unit.layer, unit.head)
    return unit_pieces(model, unit.layer_mode, unit.layer)


def base_fingerprint(base: torch.nn.Module) -> str:
    """Hash of the base encoder's weights (the revert sweep's numbers depend on them)."""
    digest = hashlib.sha256()
    for name, t in sorted(sites.encoder(base).state_dict().items()):
        digest.update(name.encode())
        digest.update(_raw_bytes(t))
    return digest.hexdigest()[:16]
