"""The transplant sweep: the base encoder under the tuned task head, plus one tuned unit or the tuned top/bottom k
layers, scored on the task. How much of the fine-tuning gain does a unit carry?

The converse of the revert sweep (:mod:`bertology.experiments.revert_sweep`), following Tamkin et al. 2020 (parts of a
fine-tuned model reset to their pretrained values) and cross-model activation patching (Prakash et al. 2024, who
patch a fine-tuned model's components into the base model). Rows of the ``transplant`` table
(:mod:`bertology.experiments.transplant_score`):

* single units (``unit_kind``): ``embeddings`` (layer 0), every ``layer`` (whole), its ``attention`` and ``ffn``
  blocks, and with ``heads=True`` every ``head`` (L x H full forwards, off by default for that reason);
* two layer curves (``unit_kind`` ``layers``, ``direction`` ``top``/``bottom``, ``k`` = 0..L): the top k or bottom
  k layers transplanted. The embeddings go with the bottom: ``bottom`` k >= 1 includes them, ``top`` includes them at
  k = L only (``with_embeddings``), so both curves run from k = 0, the head alone, to k = L, the tuned model.

Every distinct set of transplanted units is scored once (``top 1`` is ``layer L``, run once); the tuned model's
weights are restored bit for bit after each (:func:`bertology.models.transplant.transplanted`). Where the family's
blocks allow it (BERT, RoBERTa, XLM-R, ELECTRA) a set reuses the hidden states of the reference it shares the
most lower layers with (:mod:`bertology.experiments.layer_cache`), bit-identical to a full forward: the head
alone's for single units at layer ``l`` and the top-k curve (layers below ``l`` or ``L - k + 1`` are the base's), the
tuned model's for the bottom-k curve (the embeddings and layers ``1..k`` are the tuned ones). Sets that change the
embeddings against both references run a full forward, as does every set of the other families
(``params["method"]``: ``cached`` or ``naive``).
ALBERT shares one layer across all depths: only its embeddings are transplanted (``params["refused"]`` says why).
Resuming works as in the revert sweep (``progress_dir``; the base's weights are in the fingerprint).
"""
from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from functools import partial

import numpy as np
import pandas as pd
import torch

from bertology.data.encode import EncodedCorpus
from bertology.errors import BertologyError
from bertology.experiments.revert_sweep import base_fingerprint
from bertology.experiments.layer_cache import Method, Variant, no_change, run_variants
from bertology.experiments.scoring import HeadScoring, ProgressStore, _record, classifier_batches, fingerprint_of
from bertology.experiments.transplant_score import (
    HEAD_ALONE_KEY, TABLE, TABLE_COLUMNS, TUNED_KEY, gain_of, scores,  # noqa: F401  (TABLE re-exported)
)
from bertology.models import sites
from bertology.models.revert import EMBEDDINGS, check_base, reverted, unit_pieces
from bertology.models.transplant import Part, parts_key, transplanted

logger = logging.getLogger(__name__)

MODE = "transplant"
#: The per-layer single units, in table order.
LAYER_UNITS = ("layer", "attention", "ffn")
ALBERT_TRANSPLANT_REASON = (
    "ALBERT shares one layer's weights across all depths, so transplanting one layer (or one head of it) would "
    "transplant every depth; per-layer and per-head units and the layer curves are refused for ALBERT (its embeddings "
    "can be transplanted)")


@dataclass(frozen=True)
class Row:
    """One row group of the table: what is transplanted (``parts``) and how the row is labelled."""

    kind: str  # embeddings | layer | attention | ffn | head | layers (a curve point)
    parts: frozenset = field(default_factory=frozenset)
    layer: int = -1
    head: int = -1
    direction: str = ""  # top | bottom on curve rows
    k: int = -1

    @property
    def key(self) -> str:
        return parts_key(self.parts)

    @property
    def with_embeddings(self) -> bool:
        return Part(EMBEDDINGS) in self.parts

    @property
    def label(self) -> str:
        if self.kind == "layers":
            return f"{self.direction} {self.k}"
        if self.kind == EMBEDDINGS:
            return "embeddings"
        return f"L{self.layer}H{self.head}" if self.kind == "head" else f"L{self.layer} {self.kind}"


def curve_rows(n_layers: int) -> list[Row]:
    """The top-k and bottom-k curves, k = 0..L; the embeddings ride with the bottom layers (and with top L)."""
    rows = []
    for k in range(n_layers + 1):
        bottom = {Part("layer", layer) for layer in range(1, k + 1)} | ({Part(EMBEDDINGS)} if k else set())
        top = {Part("layer", layer) for layer in range(n_layers - k + 1, n_layers + 1)}
        top |= {Part(EMBEDDINGS)} if k == n_layers else set()
        rows += [Row("layers", frozenset(top), direction="top", k=k),
                 Row("layers", frozenset(bottom), direction="bottom", k=k)]
    return rows


def plan_transplant(model: torch.nn.Module, *, layers: Sequence[int] | None = None, heads: bool = False,
                    curves: bool = True) -> tuple[list[Row], str | None]:
    """The rows of one sweep and why some were refused (None when none was). ``layers``: which layers' single units
    (None: all; the curves always span every layer); ``heads``: every head alone too (L x H forwards)."""
    n_layers, n_heads = sites.num_layers(model), sites.num_heads(model)
    rows = [Row(EMBEDDINGS, frozenset({Part(EMBEDDINGS)}), layer=0)]
    if sites.adapter(model).shared_blocks:
        if layers is not None:
            raise BertologyError(ALBERT_TRANSPLANT_REASON + "; leave --layers out.")
        return rows, ALBERT_TRANSPLANT_REASON
    chosen = sorted(set(range(1, n_layers + 1) if layers is None else (int(x) for x in layers)))
    bad = [x for x in chosen if not 1 <= x <= n_layers]
    if bad:
        raise BertologyError(f"Layer(s) {bad} do not exist; the model has attention layers 1..{n_layers}.")
    for layer in chosen:
        rows += [Row(u, frozenset({Part(u, layer)}), layer=layer) for u in LAYER_UNITS]
        if heads:
            rows += [Row("head", frozenset({Part("head", layer, h)}), layer=layer, head=h) for h in range(n_heads)]
    return rows + (curve_rows(n_layers) if curves else []), None


def starts(parts: frozenset, n_layers: int) -> tuple[int, int]:
    """The first layer at which a transplant of ``parts`` differs from the head alone and from the tuned model
    (0: the embeddings; ``n_layers + 1``: nowhere). Only a whole tuned layer counts as equal to the tuned model's."""
    from_head = min((0 if p.kind == EMBEDDINGS else p.layer for p in parts), default=n_layers + 1)
    if Part(EMBEDDINGS) not in parts:
        return from_head, 0
    from_tuned = next((j for j in range(1, n_layers + 1) if Part("layer", j) not in parts), n_layers + 1)
    return from_head, from_tuned


def transplant_variants(model, base, runs: dict[str, frozenset]) -> list[Variant]:
    """One :class:`Variant` per set of parts, reusing the reference (head alone or tuned) that it shares more lower
    layers with; the tuned model itself is the tuned reference's own run."""
    n = sites.num_layers(model)
    out = []
    for key, parts in runs.items():
        if key == TUNED_KEY:
            out.append(Variant(key, no_change, TUNED_KEY, n + 1))
            continue
        from_head, from_tuned = starts(parts, n)
        ref, start = (HEAD_ALONE_KEY, from_head) if from_head >= from_tuned else (TUNED_KEY, from_tuned)
        out.append(Variant(key, partial(transplanted, model, base, parts), ref, start))
    return out


def head_alone_weights(model, base) -> Callable[[int], AbstractContextManager]:
    """The head alone's weights for block ``layer`` (0: the embeddings): that unit reverted, the rest left tuned
    (the head alone's hidden states entering ``layer + 1`` depend on nothing else)."""
    def weights(layer: int) -> AbstractContextManager:
        pieces = unit_pieces(model, EMBEDDINGS) if layer == 0 else unit_pieces(model, "layer", layer)
        return reverted(model, base, pieces)

    return weights


def sweep_runs(model, base, batches, store: ProgressStore, todo: dict[str, frozenset], *, method: Method = "cached",
               on_done: Callable[[str], None] | None = None) -> Method:
    """Score every set of parts (the tuned model itself for ``intact``) into ``store``, the tuned model restored after
    each; the method that ran (``cached`` where the family allows it, ``naive``: a full forward per set)."""
    def finish(key: str, logits: list[torch.Tensor]) -> None:
        store.save(key, **_record(batches, logits, key))
        if on_done is not None:
            on_done(key)

    references = {HEAD_ALONE_KEY: head_alone_weights(model, base), TUNED_KEY: lambda _layer: no_change()}
    return run_variants(model, batches, transplant_variants(model, base, todo), references, finish, method)


def transplant_table(rows: Sequence[Row], per_example: dict, y: np.ndarray, task, n_bootstrap: int,
                     seed: int) -> pd.DataFrame:
    """The ``transplant`` table: per row and metric, value, the two references and the gain recovered with its interval."""
    keys = list(dict.fromkeys([TUNED_KEY, HEAD_ALONE_KEY, *(r.key for r in rows)]))
    point, boot = scores(keys, per_example, y, task, n_bootstrap, seed)
    index = {k: i for i, k in enumerate(keys)}
    out = []
    for r in rows:
        j = index[r.key]
        for m in task.metrics:
            g = gain_of(point[m], None if boot is None else boot[m], j, index[HEAD_ALONE_KEY], index[TUNED_KEY],
                        task.higher_is_better[m])
            out.append({
                "unit_kind": r.kind, "layer": r.layer, "head": r.head, "direction": r.direction, "k": r.k,
                "with_embeddings": r.with_embeddings, "label": r.label, "mode": MODE, "metric": m,
                "value": float(point[m][j]), "value_head_alone": float(point[m][index[HEAD_ALONE_KEY]]),
                "value_tuned": float(point[m][index[TUNED_KEY]]), "gain_recovered": g.value, "ci_low": g.ci_low,
                "ci_high": g.ci_high, "reason": g.reason, "n_examples": len(y), "task": task.name,
                "main_metric": task.primary,
            })
    df = pd.DataFrame(out, columns=TABLE_COLUMNS)
    return df.astype({"layer": "int64", "head": "int64", "k": "int64", "n_examples": "int64"})


@dataclass(frozen=True)
class TransplantUnits:
    """Which single units a sweep runs: ``layers`` (None: all) and every head alone (``heads``: L x H forwards)."""

    layers: Sequence[int] | None = None
    heads: bool = False


@dataclass
class TransplantResult:
    """The ``transplant`` table, the per-example records it came from, and provenance."""

    table: pd.DataFrame
    rows: list[Row]
    per_example: dict[str, dict[str, np.ndarray]]
    y: np.ndarray
    params: dict = field(default_factory=dict)
    timing: dict = field(default_factory=dict)


def run_transplant(model: torch.nn.Module, base: torch.nn.Module, encoded: EncodedCorpus,
                   label_ids: np.ndarray | Sequence[int], scoring: HeadScoring = HeadScoring(), *,
                   units: TransplantUnits = TransplantUnits(), n_bootstrap: int = 1000, seed: int = 0,
                   progress_dir=None, on_unit: Callable[[str, int, int], None] | None = None) -> TransplantResult:
    """Score the tuned ``model``, the head alone (``base``'s encoder under the tuned head) and every planned
    transplant; return the ``transplant`` table. ``base`` is checked as revert checks it (one line)."""
    t0 = time.perf_counter()
    layers, heads = units.layers, units.heads
    check_base(model, base)
    batches = classifier_batches(model, encoded, label_ids, scoring)
    base.to(torch.device(scoring.device)).eval()
    rows, refused = plan_transplant(model, layers=layers, heads=heads)
    if refused:
        logger.warning("transplant: %s", refused)
    runs = {TUNED_KEY: frozenset(), HEAD_ALONE_KEY: frozenset()} | {r.key: r.parts for r in rows}
    store = ProgressStore(progress_dir, fingerprint_of(model, batches, {
        "mode": MODE, "base": base_fingerprint(base), "batch_size": scoring.batch_size}))
    todo = {k: v for k, v in runs.items() if k not in store}
    logger.info("transplant: %d of %d models to run", len(todo), len(runs))
    t1 = time.perf_counter()
    done = [len(runs) - len(todo)]

    def on_done(key: str) -> None:
        done[0] += 1
        if on_unit is not None:
            on_unit(key, done[0], len(runs))

    method = sweep_runs(model, base, batches, store, todo, on_done=on_done)
    t2 = time.perf_counter()
    per_example = {k: store.get(k) for k in runs}
    table = transplant_table(rows, per_example, batches.y_examples, batches.task, n_bootstrap, seed)
    params = {
        "mode": MODE, "layers": None if layers is None else sorted(int(x) for x in layers), "heads": heads,
        "refused": refused, "batch_size": scoring.batch_size, "n_bootstrap": n_bootstrap, "seed": seed,
        "n_examples": len(batches.y_examples), "n_layers": sites.num_layers(model), "n_heads": sites.num_heads(model),
        "fingerprint": store.fingerprint, "resumed_units": len(runs) - len(todo), "forwards": len(runs),
        "method": method,
        "task": batches.task.name,
        "main_metric": batches.task.primary,
        "gain_recovered": "(with the unit - head alone) / (tuned - head alone), paired bootstrap over examples; "
                          "undefined (NaN, reason) when tuned - head alone's 95% interval includes 0",
    }
    timing = {"setup_s": t1 - t0, "sweep_s": t2 - t1, "scoring_s": time.perf_counter() - t2}
    return TransplantResult(table, rows, per_example, batches.y_examples, params, timing)
