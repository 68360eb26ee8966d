"""The ``ablation`` table: per-example records of every unit scored into metrics, deltas and paired bootstrap intervals.

:func:`score_units` turns the sweep's per-example predictions and losses into the table (accuracy, macro-F1 and mean
cross-entropy for a classifier, each task its own metrics), with deltas (ablated - intact) and paired bootstrap 95%
confidence intervals of the deltas (the same seeded resamples of examples for every unit); ``helps`` / ``hurts``
flag a removal beyond the interval. Every intervention's sweep scores with it.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from bertology.experiments.ablation_units import Unit, layer_mode_name
from bertology.experiments.degenerate import table_degeneracy
from bertology.metrics.bootstrap import bootstrap_counts
from bertology.results import Result
from bertology.tasks.base import Task
from bertology.tasks.catalog import get_task, task_of_table

TABLE = "ablation"
#: The classification metrics (other tasks declare theirs: :attr:`bertology.tasks.base.Task.metrics`).
METRICS = get_task("classification").metrics
TABLE_COLUMNS = [
    "target", "layer", "head", "label", "mode", "layer_mode", "exclude_special", "metric", "value", "delta",
    "ci_low", "ci_high", "n_examples", "helps", "hurts",
    # at the end (DESIGN's columns unchanged): what the degenerate-classifier check needs, so the summary
    # and the report make it from the table alone (:mod:`bertology.experiments.degenerate`)
    "n_predicted", "chance",
    # the task whose metrics the rows hold (classification, regression): readers pick the primary metric by it
    "task",
    # the metric the findings use (CoLA: mcc; bertology.tasks.main_metric), the same on every row
    "main_metric",
]


@dataclass(frozen=True)
class Bootstrap:
    """The paired bootstrap of :func:`score_units`: ``n`` resamples of the examples (0: no intervals), drawn with
    ``seed``, the same for every unit, scored ``chunk`` resamples at a time (memory, not the numbers)."""

    n: int = 1000
    seed: int = 0
    chunk: int = 100


@dataclass
class AblationResult:
    """The ``ablation`` table, the per-example arrays it came from, and provenance."""

    table: pd.DataFrame
    units: list[Unit]
    per_example: dict[str, dict[str, np.ndarray]]  # unit key -> {"pred", "loss"} by item position
    y: np.ndarray
    params: dict = field(default_factory=dict)
    timing: dict = field(default_factory=dict)

    @property
    def intact(self) -> dict[str, float]:
        t = self.table[self.table["target"] == "intact"]
        return dict(zip(t["metric"], t["value"].astype(float)))

    def to_result(self) -> Result:
        return Result(TABLE, self.table, self.params)

    def _repr_html_(self) -> str:
        main = task_of_table(self.table).primary
        return (
            f"<b>AblationResult</b> ({self.params.get('mode')}): intact {main} {self.intact.get(main, float('nan')):.4f}, "
            f"{len(self.units) - 1} ablations over {len(self.y)} examples"
        )


def score_units(
    units: Sequence[Unit],
    per_example: dict[str, dict[str, np.ndarray]],
    y: np.ndarray,
    *,
    mode: str,
    exclude_special: bool,
    task: Task | None = None,
    bootstrap: Bootstrap = Bootstrap(),
) -> pd.DataFrame:
    """The ``ablation`` table from per-example records (paired bootstrap over examples).

    ``task`` (default classification) turns the records into its metrics (:meth:`Task.scores`).
    """
    task = task or get_task("classification")
    n_bootstrap, seed, chunk = bootstrap.n, bootstrap.seed, bootstrap.chunk
    keys = [u.key for u in units]
    if "intact" not in keys:
        raise ValueError("score_units needs the intact unit")
    records = {name: np.stack([per_example[k][name] for k in keys]) for name in per_example[keys[0]]}
    n = len(y)
    i0 = keys.index("intact")
    chance = task.chance(y)
    metrics = task.metrics
    point = task.scores(np.ones((1, n), dtype=np.float32), records, y)
    # without resamples there is no interval: NaN, never a zero-width interval around a non-zero delta
    lo = {m: np.full(len(keys), np.nan) for m in metrics}
    hi = {m: np.full(len(keys), np.nan) for m in metrics}
    if n_bootstrap > 0:
        deltas = {m: [] for m in metrics}
        counts = bootstrap_counts(n, n_bootstrap, seed)
        for s in range(0, n_bootstrap, chunk):
            boot = task.scores(counts[s : s + chunk], records, y)
            for m in metrics:
                deltas[m].append(boot[m] - boot[m][:, i0 : i0 + 1])
        for m in metrics:
            d = np.concatenate(deltas[m])
            lo[m], hi[m] = np.percentile(d, 2.5, axis=0), np.percentile(d, 97.5, axis=0)
    rows = []
    for j, u in enumerate(units):
        n_predicted = task.n_predicted(records["pred"][j])
        for m in metrics:
            value = float(point[m][0, j])
            delta = value - float(point[m][0, i0])
            cl, ch = float(lo[m][j]), float(hi[m][j])
            better = task.higher_is_better[m]
            helps = bool(n_bootstrap > 0 and u.target != "intact" and (cl > 0 if better else ch < 0))
            hurts = bool(n_bootstrap > 0 and u.target != "intact" and (ch < 0 if better else cl > 0))
            rows.append({
                "target": u.target, "layer": u.layer, "head": u.head, "label": u.label, "mode": mode,
                "layer_mode": layer_mode_name(mode, u.layer_mode),
                "exclude_special": bool(exclude_special), "metric": m, "value": value, "delta": delta,
                "ci_low": cl, "ci_high": ch, "n_examples": int(n), "helps": helps, "hurts": hurts,
                "n_predicted": n_predicted, "chance": chance, "task": task.name, "main_metric": task.primary,
            })
    df = pd.DataFrame(rows, columns=TABLE_COLUMNS)
    return df.astype({"layer": "int64", "head": "int64", "n_examples": "int64", "n_predicted": "int64"})


def degeneracy_record(table: pd.DataFrame, intact_pred: np.ndarray, config) -> dict:
    """The manifest's ``degenerate`` section: the verdict plus what the intact model predicted
    (the class names of a classifier, the range of a regressor's values)."""
    verdict = table_degeneracy(table)
    if verdict is None:
        raise ValueError("the ablation table lacks the intact primary-metric row or the check's columns")
    return {**verdict.to_dict(), **task_of_table(table).prediction_summary(intact_pred, config)}
