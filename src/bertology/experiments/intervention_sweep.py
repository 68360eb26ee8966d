"""The sweep of any intervention: score the model intact and with each of its units applied, into the ``ablation`` table.

An intervention (:mod:`bertology.experiments.interventions`) says which units it has, how one is applied (a context
manager that restores the model on exit) and from which layer on a unit changes the model. :func:`run_intervention`
runs them with :func:`~bertology.experiments.layer_cache.run_variants` (a unit starting at layer ``l`` reuses the
model's own hidden states below ``l``, where the family's blocks allow it; bit-identical to a full forward), keeps
every unit's per-example records in the resumable :class:`~bertology.experiments.scoring.ProgressStore` and scores
them with :func:`~bertology.experiments.ablation_table.score_units`: the same paired bootstrap intervals,
``helps``/``hurts`` flags and degenerate-model check as the head ablations. The revert sweep is this sweep with
:class:`~bertology.experiments.interventions.Revert`; a new intervention needs nothing else to run here.
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path

import numpy as np
import torch

from bertology.data.encode import EncodedCorpus
from bertology.experiments.ablation_table import AblationResult, Bootstrap, degeneracy_record, score_units
from bertology.experiments.ablation_units import SweepPlan, Unit
from bertology.experiments.layer_cache import Method, Variant, no_change, run_variants
from bertology.experiments.scoring import HeadScoring, ProgressStore, _record, classifier_batches, fingerprint_of
from bertology.models import sites

logger = logging.getLogger(__name__)

#: The reference whose hidden states the units reuse: the model as given.
INTACT = "tuned"


def variants(model: torch.nn.Module, intervention, units: Sequence[Unit]) -> list[Variant]:
    """One :class:`Variant` per unit: the intact model as it is, every other unit applied by ``intervention`` and
    started at its first changed layer (``intervention.start``; 0: a full forward)."""
    return [Variant(u.key, no_change, INTACT, intervention.start(model, u)) if u.target == "intact" else
            Variant(u.key, partial(intervention.apply, model, u), INTACT, intervention.start(model, u)) for u in units]


def sweep_units(model: torch.nn.Module, intervention, batches, store: ProgressStore, units: Sequence[Unit], *,
                method: Method = "cached", on_done: Callable[[str], None] | None = None) -> Method:
    """Score every unit into ``store`` (the model restored after each); the method that ran (``cached``: from the
    intact model's hidden states where the family allows it, ``naive``: full forwards)."""
    def finish(key: str, logits: list[torch.Tensor]) -> None:
        store.save(key, **_record(batches, logits, key))
        if on_done is not None:
            on_done(key)

    return run_variants(model, batches, variants(model, intervention, units), {INTACT: lambda _layer: no_change()},
                        finish, method)


def run_intervention(
    model: torch.nn.Module,
    intervention,
    encoded: EncodedCorpus,
    label_ids: np.ndarray | Sequence[int],
    scoring: HeadScoring = HeadScoring(),
    *,
    sweep: SweepPlan = SweepPlan(),
    n_bootstrap: int = 1000,
    seed: int = 0,
    progress_dir: str | Path | None = None,
    on_unit: Callable[[Unit, int, int], None] | None = None,
) -> AblationResult:
    """Score ``model`` intact and with every unit ``intervention`` plans for ``sweep``; the ``ablation`` table with
    ``mode`` = the intervention's name. ``scoring`` gives the batch size and device; ``sweep.method`` whether units
    reuse the hidden states below their first changed layer; the rest is as in
    :func:`~bertology.experiments.ablation_sweep.run_ablation`."""
    t0 = time.perf_counter()
    intervention.prepare(model, scoring)
    batches = classifier_batches(model, encoded, label_ids, scoring)
    plan, refused = intervention.plan(model, sweep)
    name = intervention.name
    if refused:
        logger.warning("%s: %s", name, refused)
    fp_settings = {"mode": name, **intervention.fingerprint(), "batch_size": scoring.batch_size}
    store = ProgressStore(progress_dir, fingerprint_of(model, batches, fp_settings))
    pending = [u for u in plan if u.key not in store]
    logger.info("%s: %d of %d units to run", name, len(pending), len(plan))
    t1 = time.perf_counter()
    by_key, done = {u.key: u for u in pending}, [len(plan) - len(pending)]

    def on_done(key: str) -> None:
        done[0] += 1
        if on_unit is not None:
            on_unit(by_key[key], done[0], len(plan))

    method = sweep_units(model, intervention, batches, store, pending, method=sweep.method, on_done=on_done)
    t2 = time.perf_counter()
    per_example = {u.key: store.get(u.key) for u in plan}
    table = score_units(plan, per_example, batches.y_examples, task=batches.task, mode=name, exclude_special=False,
                        bootstrap=Bootstrap(n_bootstrap, seed))
    params = {
        "mode": name, "exclude_special": False,
        "layers": None if sweep.layers is None else sorted(int(x) for x in sweep.layers), "heads": sweep.heads,
        **intervention.plan_params(sweep), "refused": refused, "batch_size": scoring.batch_size,
        "n_bootstrap": n_bootstrap, "seed": seed, "method": method, "n_examples": len(batches.y_examples),
        "n_layers": sites.num_layers(model), "n_heads": sites.num_heads(model), "fingerprint": store.fingerprint,
        **intervention.fingerprint_params(fp_settings), "resumed_units": len(plan) - len(pending),
        "task": batches.task.name, "main_metric": batches.task.primary, "delta": intervention.delta_note,
    }
    params["degenerate"] = degeneracy_record(table, per_example["intact"]["pred"], model.config)
    if params["degenerate"]["flagged"]:
        logger.warning("%s: %s", name, params["degenerate"]["note"])
    timing = {"setup_s": t1 - t0, "sweep_s": t2 - t1, "scoring_s": time.perf_counter() - t2}
    return AblationResult(table, plan, per_example, batches.y_examples, params, timing)
