"""Is the intact classifier degenerate? Then no ablation delta can say which heads the task needs.

A classifier that predicts one class for every example, or whose accuracy is not shown to beat
chance, gives ablation deltas that are zero or noise: naming "the head the task needs most" from
them would print a wrong number as fact. :func:`check_predictions` decides it from the intact
model's accuracy, the number of examples, how many classes it predicted and the chance rate;
:func:`table_degeneracy` reads those from the ``ablation`` table's intact rows, so the CLI summary
and the report (which read only the run folder) make the same call as the sweep.

Chance is the majority-class rate of the labels: the accuracy of always predicting the most
frequent class (at least ``1/k``; ``0.5`` on a balanced two-class sample).
"""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from bertology.metrics.chance import accuracy_interval, chance_rate  # noqa: F401  (re-exported)

#: Columns of the ``ablation`` table the check reads (added at the end of the table, after ``hurts``).
CHECK_COLUMNS = ("n_predicted", "chance")


@dataclass(frozen=True)
class Degeneracy:
    """The verdict on the intact classifier, with the numbers behind it (``to_dict`` for the manifest)."""

    constant_predictions: bool  # one class predicted for every example
    n_predicted: int  # distinct classes predicted
    accuracy: float
    n: int
    ci: tuple[float, float]  # Wilson 95% interval of the accuracy
    chance: float  # majority-class rate of the labels
    at_chance: bool  # the interval reaches down to chance: not shown to beat it

    @property
    def flagged(self) -> bool:
        """Whether ablation deltas cannot say which heads or layers the task needs."""
        return self.constant_predictions or self.at_chance

    @property
    def note(self) -> str:
        """One plain sentence: what is wrong (or that the accuracy is above chance)."""
        acc = f"accuracy {self.accuracy:.3f}, 95% CI [{self.ci[0]:.3f}, {self.ci[1]:.3f}], n={self.n}; chance {self.chance:.3f}"
        if self.constant_predictions:
            return f"the tuned model predicts one class for every example ({acc}); no head or layer can be called needed"
        if self.at_chance:
            return f"the tuned model's accuracy is not above chance ({acc}); no head or layer can be called needed"
        return f"the tuned model is above chance ({acc})"

    def to_dict(self) -> dict:
        return {
            "flagged": self.flagged, "constant_predictions": self.constant_predictions, "n_predicted": self.n_predicted,
            "accuracy": self.accuracy, "n": self.n, "ci": list(self.ci), "ci_method": "wilson 95%",
            "chance": self.chance, "chance_method": "majority-class rate", "at_chance": self.at_chance, "note": self.note,
        }


def check_predictions(accuracy: float, n: int, n_predicted: int, chance: float) -> Degeneracy:
    """The verdict from the intact accuracy over ``n`` examples, the classes predicted and the chance rate.

    Constant when one class (or none) was predicted; at chance when the Wilson 95% interval's lower
    end is at or below ``chance`` (an accuracy below chance is not above it either).
    """
    lo, hi = accuracy_interval(round(accuracy * n), n)
    return Degeneracy(
        constant_predictions=int(n_predicted) <= 1, n_predicted=int(n_predicted), accuracy=float(accuracy), n=int(n),
        ci=(lo, hi), chance=float(chance), at_chance=bool(lo <= chance),
    )


def table_degeneracy(table: pd.DataFrame) -> Degeneracy | None:
    """The verdict from the ``ablation`` table's intact accuracy row (None for a table without the check's columns)."""
    if any(c not in table.columns for c in CHECK_COLUMNS):
        return None
    row = table[(table["target"] == "intact") & (table["metric"] == "accuracy")]
    if row.empty:
        return None
    r = row.iloc[0]
    return check_predictions(float(r["value"]), int(r["n_examples"]), int(r["n_predicted"]), float(r["chance"]))
