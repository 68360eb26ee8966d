"""The revert sweep: put the base model's weights back into one unit of the tuned model at a time and score the task.

Tamkin et al. 2020 ("Investigating Transferability in Pretrained Language Models") reset parts of a
fine-tuned model to their pretrained values to see which parts' fine-tuning the task needs. Here every
unit of :mod:`bertology.models.revert` is reverted in turn: every head, every layer's attention block,
feed-forward block and whole layer, and the embeddings. A unit whose revert costs the task is one whose
fine-tuning change the task depends on; a revert that costs nothing says the task does not need what
fine-tuning did to that unit (it may still need the unit itself: the uniform/zero/mean ablations ask that).

The table is the ``ablation`` table of :mod:`bertology.experiments.ablation_sweep` with ``mode`` ``revert``:
head rows as there; layer rows with ``layer_mode`` ``revert_attention``, ``revert_ffn`` or ``revert_layer``;
the embeddings as a layer row with ``layer`` 0 and ``layer_mode`` ``revert_embeddings``. Deltas are
reverted minus intact (the tuned model), with the same paired bootstrap intervals, ``helps``/``hurts``
flags and degenerate-model checks as the other modes (:func:`~bertology.experiments.ablation_sweep.score_units`).

A unit that touches only layer ``l`` leaves the tuned model's layers below ``l`` as they are: where the family's
blocks allow it (BERT, RoBERTa, XLM-R, ELECTRA) the tuned model's hidden states entering each layer are computed
once per batch and every unit runs only its layers ``l..L`` and the head from them
(:mod:`bertology.experiments.layer_cache`), bit-identical to a full forward; the embeddings unit, and every unit
of the other families, runs a full forward (``params["method"]``: ``cached`` or ``naive``). The tuned model's
weights are restored bit for bit after each unit (:func:`bertology.models.revert.reverted`). ALBERT's shared
layer cannot be reverted one depth at a time: its sweep holds the embeddings unit only (``params["refused"]``
says why). Resuming works as in the other sweep (``progress_dir``), with the base model's weights in the
fingerprint.
"""
from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

import numpy as np
import torch

from bertology.data.encode import EncodedCorpus
from bertology.errors import BertologyError
from bertology.experiments.ablation_sweep import AblationResult, SweepPlan, Unit, degeneracy_record, score_units
from bertology.experiments.scoring import (
    HeadScoring,
    ProgressStore,
    _raw_bytes,
    _record,
    classifier_batches,
    fingerprint_of,
)
from bertology.models import sites
from bertology.experiments.layer_cache import Method, Variant, first_layer, no_change, run_variants
from bertology.models.revert import (
    ALBERT_REASON, EMBEDDINGS, LAYER_UNITS, REVERT_UNITS, check_base, piece_names, reverted, unit_pieces,
)

logger = logging.getLogger(__name__)

MODE = "revert"
#: The reference whose hidden states the revert units reuse: the tuned model.
TUNED = "tuned"


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


def revert_variants(model, base, units: Sequence[Unit]) -> list[Variant]:
    """One :class:`Variant` per unit, each reusing the tuned model's hidden states below its first reverted layer."""
    out = []
    for unit in units:
        pieces = [] if unit.target == "intact" else unit_of(model, unit)
        out.append(Variant(unit.key, partial(reverted, model, base, pieces), TUNED,
                           first_layer(model, piece_names(pieces))))
    return out


def sweep_units(model, base, batches, store: ProgressStore, units: Sequence[Unit], *, method: Method = "cached",
                on_done: Callable[[str], None] | None = None) -> Method:
    """Score every unit with its base weights swapped in (restored after each) into ``store``; the method that ran
    (``cached``: from the tuned model's hidden states where the family allows it, ``naive``: full forwards)."""
    def finish(key: str, logits: list[torch.Tensor]) -> None:
        store.save(key, **_record(batches, logits, key))
        if on_done is not None:
            on_done(key)

    return run_variants(model, batches, revert_variants(model, base, units), {TUNED: lambda _layer: no_change()},
                        finish, method)


def run_revert(
    model: torch.nn.Module,
    base: torch.nn.Module,
    encoded: EncodedCorpus,
    label_ids: np.ndarray | Sequence[int],
    scoring: HeadScoring = HeadScoring(),
    *,
    sweep: SweepPlan = SweepPlan(layer_modes=REVERT_UNITS),
    n_bootstrap: int = 1000,
    seed: int = 0,
    progress_dir: str | Path | None = None,
    on_unit: Callable[[Unit, int, int], None] | None = None,
) -> AblationResult:
    """Score the tuned ``model`` intact and with every planned unit reverted to ``base``; the ``ablation`` table.

    ``base`` is the pretrained model ``model`` was fine-tuned from (checked: same family and every encoder
    parameter's shape, one :class:`BertologyError` line otherwise); ``scoring`` gives the batch size and device
    (its head mode is not used). ``sweep`` is the ablation's plan: its ``layer_modes`` are revert's layer units
    (``attention``, ``ffn``, ``layer``, ``embeddings``), its ``method`` whether hidden states below the first
    reverted layer are reused (``cached``, where the family allows) or every unit runs a full forward (``naive``);
    its ``units_per_forward`` is not read (each reverted unit has its own weights: one unit per forward).
    The rest is as in :func:`~bertology.experiments.ablation_sweep.run_ablation`.
    """
    layers, heads, units = sweep.layers, sweep.heads, sweep.layer_modes
    t0 = time.perf_counter()
    check_base(model, base)
    batches = classifier_batches(model, encoded, label_ids, scoring)
    base.to(torch.device(scoring.device)).eval()
    plan, refused = plan_revert_units(model, layers=layers, heads=heads, units=units)
    if refused:
        logger.warning("revert: %s", refused)
    fp_settings = {"mode": MODE, "base": base_fingerprint(base), "batch_size": scoring.batch_size}
    store = ProgressStore(progress_dir, fingerprint_of(model, batches, fp_settings))
    pending = [u for u in plan if u.key not in store]
    logger.info("revert: %d of %d units to run", len(pending), len(plan))
    t1 = time.perf_counter()
    by_key, done = {u.key: u for u in pending}, [len(plan) - len(pending)]

    def on_done(key: str) -> None:
        done[0] += 1
        if on_unit is not None:
            on_unit(by_key[key], done[0], len(plan))

    method = sweep_units(model, base, batches, store, pending, method=sweep.method, on_done=on_done)
    t2 = time.perf_counter()
    per_example = {u.key: store.get(u.key) for u in plan}
    table = score_units(plan, per_example, batches.y_examples, task=batches.task, mode=MODE, exclude_special=False,
                        n_bootstrap=n_bootstrap, seed=seed)
    params = {
        "mode": MODE, "exclude_special": False, "layers": None if layers is None else sorted(int(x) for x in layers),
        "heads": heads, "layer_modes": [u for u in REVERT_UNITS if u in units],
        "layer_mode_names": {u: f"{MODE}_{u}" for u in REVERT_UNITS if u in units},
        "refused": refused, "batch_size": scoring.batch_size, "n_bootstrap": n_bootstrap, "seed": seed,
        "method": method, "n_examples": len(batches.y_examples), "n_layers": sites.num_layers(model),
        "n_heads": sites.num_heads(model), "fingerprint": store.fingerprint, "base_fingerprint": fp_settings["base"],
        "resumed_units": len(plan) - len(pending), "task": batches.task.name,
        "main_metric": batches.task.primary,
        "delta": "reverted minus intact (the tuned model); helps = ci_low > 0 where higher is better, ci_high < 0 "
                 "where lower is",
    }
    params["degenerate"] = degeneracy_record(table, per_example["intact"]["pred"], model.config)
    if params["degenerate"]["flagged"]:
        logger.warning("revert: %s", params["degenerate"]["note"])
    timing = {"setup_s": t1 - t0, "sweep_s": t2 - t1, "scoring_s": time.perf_counter() - t2}
    return AblationResult(table, plan, per_example, batches.y_examples, params, timing)
