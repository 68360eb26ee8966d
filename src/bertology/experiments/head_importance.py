"""Head importance (Michel et al. 2019, "Are Sixteen Heads Really Better than One?") and pruning curves.

Importance of head h: ``I_h = E_x |∂L(x)/∂ξ_h|``, where ξ_h is a gate multiplying the head's context
output (ξ = 1 in the forward pass, so the model is unchanged) and L(x) the cross-entropy of example x.
The expectation is over examples of the absolute *per-example* gradient: every example gets its own
gates (:class:`~bertology.models.ablate.HeadGates`), so one backward pass of the summed batch loss
yields each example's gradient. As in the paper's code, importance is then normalised per layer by
the L2 norm over the layer's heads (``importance``; the raw mean is ``importance_raw``).

Pruning curve: heads are removed in steps of ``step_fraction`` of all heads, least important first,
and the task metrics measured after each step. With ``recompute`` (the paper's procedure, default)
the importance is re-estimated on the pruned model after every step, over the heads that remain; the
control removes heads in a seeded random order. Removed heads are ablated with the sweep's ``mode``
(``zero`` is the paper's masking). Each step is saved like the sweep's units, so an interrupted run
resumes where it stopped.

:func:`importance_vs_deltas` is the Spearman rank correlation between importance and the exact
single-head ablation deltas of the ``ablation`` table (positive = agreement: important heads are
those whose removal raises the loss / lowers the accuracy). Importance linearises the effect of
*scaling* a head's output around 1, the sweep measures the effect of removing it, so the two need not
agree; the correlation says how far the cheap estimate can stand in for the sweep.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from bertology.experiments.scoring import (
    HIGHER_IS_BETTER,
    Batches,
    HeadScoring,
    ProgressStore,
    _logits,
    _record,
    classifier_batches,
    fingerprint_of,
    head_means,
)
from bertology.analyses.device_state import state_dtype
from bertology.data.encode import EncodedCorpus
from bertology.errors import BertologyError
from bertology.models import sites
from bertology.models.ablate import Mode, ablate_heads, head_gates, needs_means
from bertology.tasks.catalog import task_of_table

logger = logging.getLogger(__name__)

TABLE = "head_importance"
CURVE_TABLE = "pruning_curve"
ORDERS = ("importance", "random")
IMPORTANCE_COLUMNS = ["layer", "head", "label", "importance", "importance_raw", "rank", "n_examples"]
CURVE_COLUMNS = ["order", "step", "fraction_removed", "n_removed", "metric", "value", "mode", "recompute", "n_examples"]


@dataclass
class ImportanceResult:
    """``head_importance`` and ``pruning_curve`` tables plus provenance."""

    importance: pd.DataFrame
    curve: pd.DataFrame
    params: dict = field(default_factory=dict)
    removal_order: dict[str, list[str]] = field(default_factory=dict)  # order -> head labels, first removed first


def normalise_per_layer(raw: np.ndarray, keep: np.ndarray | None = None) -> np.ndarray:
    """Divide each layer's importances by their L2 norm (over the heads in ``keep``; others become 0)."""
    raw = np.where(keep, raw, 0.0) if keep is not None else raw
    norm = np.sqrt((raw**2).sum(axis=1, keepdims=True))
    return raw / (norm + 1e-20)


def gradient_pass(
    model: torch.nn.Module,
    batches: Batches,
    *,
    removed: Collection[tuple[int, int]] = (),
    mode: Mode = "zero",
    exclude_special: bool = False,
    special_ids: Collection[int] | None = None,
    means: torch.Tensor | None = None,
    gradients: bool = True,
) -> tuple[np.ndarray | None, dict[str, np.ndarray]]:
    """One pass over the data with ``removed`` heads ablated: raw importance ``[layers, heads]`` and per-example results.

    With ``gradients=False`` only the forward runs (no importance).
    """
    params = [p for p in model.parameters() if p.requires_grad]
    total = None
    logits_all: list[torch.Tensor] = []
    try:
        for p in params:
            p.requires_grad_(False)
        with ablate_heads(model, removed, mode, exclude_special=exclude_special, special_ids=special_ids, means=means):
            if not gradients:
                with torch.inference_mode():
                    logits_all = [_logits(model, inp) for inp in batches.inputs]
            else:
                with head_gates(model) as gates, torch.enable_grad():
                    for inp, y in zip(batches.inputs, batches.labels):
                        gates.prepare(len(y), device=y.device)
                        logits = _logits(model, inp)  # float32 loss for a bfloat16/float16 model
                        batches.task.loss(logits, y, reduction="sum").backward()
                        g = gates.grad.detach().abs().sum(0)  # stays where the model is: one host copy at the end
                        g = g.to(state_dtype(torch.float64, g.device))  # float64 (float32 on MPS, which has none)
                        total = g if total is None else total + g
                        logits_all.append(logits.detach())
    finally:
        for p in params:
            p.requires_grad_(True)
    raw = None if total is None else (total / batches.n).cpu().numpy().astype(np.float64)
    return raw, _record(batches, logits_all)


def _records(saved: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The task's per-example records of a saved pass (every array but the pass's ``removed`` and ``raw``)."""
    return {k: v for k, v in saved.items() if k not in ("removed", "raw")}


def importance_table(raw: np.ndarray, n_examples: int, keep: np.ndarray | None = None) -> pd.DataFrame:
    """The ``head_importance`` table from raw importances ``[layers, heads]`` (rank 1 = most important)."""
    norm = normalise_per_layer(raw, keep)
    n_layers, n_heads = raw.shape
    rows = [
        {"layer": l + 1, "head": h, "label": f"L{l + 1}H{h}", "importance": float(norm[l, h]),
         "importance_raw": float(raw[l, h]), "n_examples": int(n_examples)}
        for l in range(n_layers) for h in range(n_heads)
    ]
    df = pd.DataFrame(rows)
    order = np.lexsort((df["head"].to_numpy(), df["layer"].to_numpy(), -df["importance"].to_numpy()))
    rank = np.empty(len(df), dtype=np.int64)
    rank[order] = np.arange(1, len(df) + 1)
    df["rank"] = rank
    return df[IMPORTANCE_COLUMNS]


def _steps(total: int, step_fraction: float) -> list[int]:
    step = max(1, int(round(step_fraction * total)))
    counts = list(range(0, total, step))
    return counts + [total]


def _least_important(norm: np.ndarray, removed: set[int], k: int) -> list[int]:
    """Flat ids of the ``k`` least important heads not yet removed (ties: lower layer, then head, first)."""
    flat = norm.ravel()
    candidates = [i for i in range(flat.size) if i not in removed]
    candidates.sort(key=lambda i: (flat[i], i))
    return candidates[:k]


@dataclass(frozen=True)
class PruningPlan:
    """How the pruning curves run: heads removed in steps of ``step_fraction`` of all heads, importance
    ``recompute``d on the pruned model after each step (Michel et al.) or kept from the intact model, the
    ``orders`` drawn (``importance``, ``random``), and the ``seed`` of the random order. A step outside (0, 1] or
    an unknown order is refused with one line."""

    step_fraction: float = 0.1
    recompute: bool = True
    orders: tuple[str, ...] = ORDERS
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0 < self.step_fraction <= 1:
            raise BertologyError(f"pruning step must be in (0, 1], not {self.step_fraction}.")
        bad = [o for o in self.orders if o not in ORDERS]
        if bad:
            raise BertologyError(f"Unknown pruning order(s) {bad}; choose from {', '.join(ORDERS)}.")
        object.__setattr__(self, "orders", tuple(self.orders))


def run_head_importance(
    model: torch.nn.Module,
    encoded: EncodedCorpus,
    label_ids: np.ndarray | Sequence[int],
    scoring: HeadScoring = HeadScoring(),
    *,
    pruning: PruningPlan = PruningPlan(),
    progress_dir: str | Path | None = None,
    on_step: Callable[[str, int, int], None] | None = None,
) -> ImportanceResult:
    """Michel et al. head importance on the intact model, and pruning curves by importance and at random.

    ``label_ids`` are in corpus order. ``pruning`` (:class:`PruningPlan`): the step, whether importance is
    recomputed, the orders and the random order's seed. ``on_step(name, done, total)`` is called after every pass.
    Removed heads are disabled as ``scoring`` says (the mean-mode reference is this corpus unless it gives ``means``).
    """
    step_fraction, recompute, orders, seed = pruning.step_fraction, pruning.recompute, pruning.orders, pruning.seed
    passes = _Pruning(model, classifier_batches(model, encoded, label_ids, scoring), scoring, pruning, progress_dir,
                      on_step)
    first_raw = passes.by_importance()
    if "random" in orders:
        passes.at_random()
    importance = importance_table(first_raw, passes.batches.n)
    curve = pd.DataFrame(passes.curve_rows, columns=CURVE_COLUMNS)
    params = {
        "method": "Michel et al. 2019: E_x |dL(x)/d gate_h|, per-example gates, per-layer L2 normalisation",
        "mode": scoring.mode, "exclude_special": scoring.exclude_special, "step_fraction": step_fraction,
        "recompute": recompute, "orders": list(orders), "seed": seed, "n_examples": passes.batches.n,
        "fingerprint": passes.store.fingerprint,
    }
    return ImportanceResult(importance, curve, params, passes.removal_order)


class _Pruning:
    """The passes of :func:`run_head_importance`: the importance order (pass 0 is the intact model's importance,
    later passes remove the least important heads left) and the random order, each pass saved to the progress
    store so an interrupted run resumes, each scored into ``curve_rows``."""

    def __init__(self, model, batches, scoring: HeadScoring, plan: PruningPlan, progress_dir, on_step) -> None:
        step_fraction, recompute, orders, seed = plan.step_fraction, plan.recompute, plan.orders, plan.seed
        self.model, self.batches, self.recompute, self.orders, self.seed = model, batches, recompute, orders, seed
        self.mode, self.on_step = scoring.mode, on_step
        self.n_layers, self.n_heads = sites.num_layers(model), sites.num_heads(model)
        self.total = self.n_layers * self.n_heads
        self.counts = _steps(self.total, step_fraction)
        settings = {
            "what": "head_importance", "mode": scoring.mode, "exclude_special": scoring.exclude_special,
            "special_ids": sorted(scoring.special_ids), "batch_size": scoring.batch_size,
            "step_fraction": step_fraction, "recompute": recompute, "seed": seed,
            "means": None if scoring.means is None else float(scoring.means.double().sum()),
        }
        self.store = ProgressStore(progress_dir, fingerprint_of(model, batches, settings))
        self.n_passes = len(self.counts) * len(orders) + (0 if "importance" in orders else 1)
        self.done = 0
        means = scoring.means
        if needs_means(scoring.mode) and means is None:
            means = head_means(model, batches)
        self.common = dict(mode=scoring.mode, exclude_special=scoring.exclude_special,
                           special_ids=scoring.special_ids, means=means)
        self.curve_rows: list[dict] = []
        self.removal_order: dict[str, list[str]] = {}

    def _tick(self, name: str) -> None:
        self.done += 1
        if self.on_step is not None:
            self.on_step(name, self.done, self.n_passes)

    def _heads(self, flat_ids: Sequence[int]) -> list[tuple[int, int]]:
        return [(int(i) // self.n_heads + 1, int(i) % self.n_heads) for i in flat_ids]

    def _add_points(self, order: str, step: int, n_removed: int, rec: dict[str, np.ndarray]) -> None:
        y_examples = self.batches.y_examples  # what the metrics count (QA: questions, not windows)
        for metric, value in self.batches.task.point_scores(rec, y_examples).items():
            self.curve_rows.append({
                "order": order, "step": step, "fraction_removed": n_removed / self.total, "n_removed": n_removed,
                "metric": metric, "value": value, "mode": self.mode,
                "recompute": bool(self.recompute and order == "importance"), "n_examples": len(y_examples),
            })

    def by_importance(self) -> np.ndarray:
        """The intact model's raw importance (pass 0); with the importance order, its whole pruning curve."""
        removed: list[int] = []
        norm: np.ndarray | None = None
        first_raw: np.ndarray | None = None
        with_order = "importance" in self.orders
        for step, count in (list(enumerate(self.counts)) if with_order else [(0, 0)]):
            key = f"importance-step-{step}"
            if step > 0:
                ranking = norm if self.recompute else normalise_per_layer(first_raw)
                removed = removed + _least_important(ranking, set(removed), count - len(removed))
            saved = self.store.get(key)
            if saved is not None and list(saved["removed"]) == removed:
                raw, rec = saved["raw"], _records(saved)
            else:
                want_grad = step == 0 or (self.recompute and count < self.total)
                raw, rec = gradient_pass(self.model, self.batches, removed=self._heads(removed), gradients=want_grad,
                                         **self.common)
                raw = np.full((self.n_layers, self.n_heads), np.nan) if raw is None else raw
                self.store.save(key, removed=np.array(removed, dtype=np.int64), raw=raw, **rec)
            if step == 0:
                first_raw = raw
            if np.isfinite(raw).all():
                keep = np.ones(self.total, dtype=bool)
                keep[removed] = False
                norm = normalise_per_layer(raw, keep.reshape(self.n_layers, self.n_heads))
            if with_order:
                self._add_points("importance", step, count, rec)
            self._tick(key)
        if with_order:
            self.removal_order["importance"] = [f"L{l}H{h}" for l, h in self._heads(removed)]
        return first_raw

    def at_random(self) -> None:
        """The random order's pruning curve (a seeded permutation; its step 0 is the intact model's pass)."""
        perm = np.random.default_rng(self.seed).permutation(self.total)
        self.removal_order["random"] = [f"L{l}H{h}" for l, h in self._heads(perm)]
        for step, count in enumerate(self.counts):
            key = f"random-step-{step}"
            if step == 0 and "importance-step-0" in self.store:
                saved = self.store.get("importance-step-0")
            else:
                saved = self.store.get(key)
            if saved is None:
                _, rec = gradient_pass(self.model, self.batches, removed=self._heads(perm[:count]), gradients=False,
                                       **self.common)
                self.store.save(key, removed=perm[:count].astype(np.int64), **rec)
            else:
                rec = _records(saved)
            self._add_points("random", step, count, rec)
            self._tick(key)


def importance_vs_deltas(importance: pd.DataFrame, ablation: pd.DataFrame) -> dict[str, dict]:
    """Spearman correlation of head importance with the single-head ablation deltas, per metric.

    Signs are chosen so that agreement is positive: a lower-is-better metric (``loss``, ``mse``)
    correlates importance with Δmetric, a higher-is-better one (``accuracy``, ``pearson``) with −Δmetric. Returns ``{metric: {"spearman", "p_value", "n",
    "spearman_raw"}}``; ``spearman_raw`` uses the importance before the per-layer normalisation (which
    makes importances comparable within a layer, not across layers).
    """
    from scipy.stats import spearmanr

    out: dict[str, dict] = {}
    heads = ablation[ablation["target"] == "head"]
    for metric in task_of_table(ablation).metrics:
        d = heads[heads["metric"] == metric][["layer", "head", "delta"]]
        m = importance.merge(d, on=["layer", "head"], how="inner")
        sign = 1.0 if not HIGHER_IS_BETTER[metric] else -1.0
        if len(m) < 3 or m["delta"].nunique() < 2 or m["importance"].nunique() < 2:
            out[metric] = {"spearman": float("nan"), "p_value": float("nan"), "n": int(len(m)), "spearman_raw": float("nan")}
            continue
        res = spearmanr(m["importance"], sign * m["delta"])
        raw = spearmanr(m["importance_raw"], sign * m["delta"]).statistic if "importance_raw" in m else float("nan")
        out[metric] = {"spearman": float(res.statistic), "p_value": float(res.pvalue), "n": int(len(m)), "spearman_raw": float(raw)}
    return out
