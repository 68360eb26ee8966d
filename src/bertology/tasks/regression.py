"""Regression (GLUE STS-B): one real-valued output, mean squared error; Pearson, Spearman and MSE.

Targets are the label column's numbers. A model is a regressor when its config says
``problem_type="regression"`` or it has a single output (``num_labels == 1``), as Hugging Face's
``*ForSequenceClassification`` decides. The degenerate check: constant predictions, or a Pearson r
whose Fisher 95% interval reaches down to 0 (chance for a correlation).
"""
from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import torch
import torch.nn.functional as F

from bertology.data.corpus import Corpus, require_labels
from bertology.errors import BertologyError
from bertology.metrics.correlation import pearson_interval, weighted_pearson, weighted_spearman
from bertology.tasks.base import Degeneracy, Task


def is_regressor(model: torch.nn.Module) -> bool:
    """Whether a sequence-classification model is a regressor (one output, or ``problem_type`` regression)."""
    cfg = model.config
    return getattr(cfg, "problem_type", None) == "regression" or int(getattr(cfg, "num_labels", 2)) == 1


def regression_targets(corpus: Corpus, what: str = "data") -> np.ndarray:
    """Each example's label as a float (corpus order); one clear error naming a value that is not a number."""
    require_labels(corpus, "A regression task needs a number for every example", what)
    out = np.empty(len(corpus), dtype=np.float32)
    for i, ex in enumerate(corpus):
        try:
            out[i] = float(ex.label)
        except (TypeError, ValueError):
            raise BertologyError(
                f"The {what} ({corpus.source}) has the label {ex.label!r} (example {i + 1}), which is not a number; "
                "a regression task needs numeric labels (name the score column with --label-column)."
            ) from None
        if not math.isfinite(out[i]):
            raise BertologyError(f"The {what} ({corpus.source}) has the label {ex.label!r} (example {i + 1}); "
                                 "a regression target must be a finite number.")
    return out


class Regression(Task):
    name = "regression"
    metrics = ("pearson", "spearman", "mse")
    higher_is_better = {"pearson": True, "spearman": True, "mse": False}
    loss_metric = "mse"
    loss_name = "mean squared error"
    problem_type = "regression"
    target_dtype = torch.float32

    def check_model(self, model: torch.nn.Module, name: str = "the model") -> None:
        if not type(model).__name__.endswith("ForSequenceClassification") or not is_regressor(model):
            raise BertologyError(
                f"{name} has no regression head; pass a fine-tuned regressor (e.g. `bertology finetune --task regression`)."
            )

    def targets(self, corpus: Corpus, model: torch.nn.Module, what: str = "data") -> np.ndarray:
        return regression_targets(corpus, what)

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        return F.mse_loss(outputs.float()[:, 0], targets.float(), reduction=reduction)

    def record(self, outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, np.ndarray]:
        pred = outputs.detach().double()[:, 0]
        return {"pred": pred.cpu().numpy(), "loss": ((pred - targets.double()) ** 2).cpu().numpy()}

    def scores(self, weights: np.ndarray, records: Mapping[str, np.ndarray], y: np.ndarray) -> dict[str, np.ndarray]:
        pred, loss = np.asarray(records["pred"], dtype=np.float64), np.asarray(records["loss"], dtype=np.float64)
        w = np.asarray(weights, dtype=np.float64)
        return {
            "pearson": weighted_pearson(w, pred, y),
            "spearman": weighted_spearman(w, pred, y),
            "mse": (w @ loss.T) / w.sum(axis=1, keepdims=True),
        }

    def n_predicted(self, pred: np.ndarray) -> int:
        """Distinct predicted values (at float32 resolution: the head computes in float32)."""
        return int(np.unique(np.asarray(pred, dtype=np.float32)).size)

    def chance(self, y: np.ndarray) -> float:
        return 0.0

    def prediction_summary(self, pred: np.ndarray, config) -> dict:
        return {"predicted_range": [float(np.min(pred)), float(np.max(pred))]}

    def degeneracy(self, value: float, n: int, n_predicted: int, chance: float) -> Degeneracy:
        lo, hi = pearson_interval(value, n)
        return Degeneracy(
            metric="pearson", value=float(value), n=int(n), ci=(lo, hi), ci_method="fisher z 95%", chance=float(chance),
            chance_method="no correlation (r = 0)", n_predicted=int(n_predicted),
            constant_predictions=int(n_predicted) <= 1 or not math.isfinite(value),
            at_chance=bool(not math.isfinite(lo) or lo <= chance), what="regressor",
        )


TASK = Regression()
