"""Is the intact model degenerate? Then no ablation delta can say which heads the task needs.

A classifier that predicts one class for every example, a regressor that predicts one value, or a
model whose primary metric is not shown to beat chance, gives ablation deltas that are zero or noise:
naming "the head the task needs most" from them would print a wrong number as fact. Each task decides
it (:meth:`bertology.tasks.base.Task.degeneracy`) from the intact primary metric, the number of
examples, how many distinct predictions it made and the chance level; :func:`table_degeneracy` reads
those from the ``ablation`` table's intact rows, so the CLI summary and the report (which read only
the run folder) make the same call as the sweep.

Classification: chance is the majority-class rate (at least ``1/k``), the interval Wilson's.
Regression: chance is a Pearson r of 0, the interval Fisher's.
"""
from __future__ import annotations

import pandas as pd

from bertology.metrics.chance import accuracy_interval, chance_rate  # noqa: F401  (re-exported)
from bertology.tasks.base import Degeneracy
from bertology.tasks.catalog import get_task, task_of_table

#: Columns of the ``ablation`` table the check reads (added at the end of the table, after ``hurts``).
CHECK_COLUMNS = ("n_predicted", "chance")

__all__ = ["CHECK_COLUMNS", "Degeneracy", "check_predictions", "table_degeneracy"]


def check_predictions(accuracy: float, n: int, n_predicted: int, chance: float) -> Degeneracy:
    """The classifier's verdict from its intact accuracy over ``n`` examples, the classes predicted and chance."""
    return get_task("classification").degeneracy(accuracy, n, n_predicted, chance)


def table_degeneracy(table: pd.DataFrame) -> Degeneracy | None:
    """The verdict from the ``ablation`` table's intact row of the task's own primary metric (accuracy for a
    classifier even where the main metric is another, e.g. CoLA's MCC: the chance level is accuracy's), None without
    the check's columns."""
    if any(c not in table.columns for c in CHECK_COLUMNS):
        return None
    task = task_of_table(table)
    row = table[(table["target"] == "intact") & (table["metric"] == task.default_metric)]
    if row.empty:
        return None
    r = row.iloc[0]
    return task.degeneracy(float(r["value"]), int(r["n_examples"]), int(r["n_predicted"]), float(r["chance"]))
