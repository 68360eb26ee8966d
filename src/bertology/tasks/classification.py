"""Single-label classification: cross-entropy; accuracy, macro-F1 and mean cross-entropy (``loss``)."""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
import torch.nn.functional as F

from bertology.data.corpus import Corpus, require_labels
from bertology.errors import BertologyError
from bertology.metrics.chance import accuracy_interval, chance_rate
from bertology.tasks.base import Degeneracy, Task


def macro_f1_from_counts(tp: np.ndarray, pred: np.ndarray, true: np.ndarray) -> np.ndarray:
    """Macro-F1 from per-class counts (last axis = class), as scikit-learn with ``zero_division=0``.

    Classes neither predicted nor present (``pred + true == 0``) are left out of the average.
    """
    denom = pred + true
    present = denom > 0
    f1 = np.where(present, 2 * tp / np.where(present, denom, 1), 0.0)
    return f1.sum(-1) / np.maximum(present.sum(-1), 1)


def label_ids_for(corpus: Corpus, model: torch.nn.Module, *, what: str = "data") -> np.ndarray:
    """Each example's label id under the model's ``label2id`` (corpus order), or one clear error.

    A model whose labels are the generic ``LABEL_0 .. LABEL_{k-1}`` also accepts the labels ``0 .. k-1``.
    """
    require_labels(corpus, "Ablation needs labelled data", what)
    cfg = model.config
    label2id = {str(k): int(v) for k, v in (getattr(cfg, "label2id", None) or {}).items()}
    num_labels = int(getattr(cfg, "num_labels", len(label2id)) or len(label2id))
    if set(label2id) == {f"LABEL_{i}" for i in range(num_labels)}:
        label2id.update({str(i): i for i in range(num_labels)})
    unknown = sorted({str(ex.label) for ex in corpus} - set(label2id))
    if unknown:
        model_labels = [str(v) for _, v in sorted((getattr(cfg, "id2label", None) or {}).items(), key=lambda kv: int(kv[0]))]
        raise BertologyError(
            f"The {what} has label(s) {', '.join(map(repr, unknown[:10]))}{' ...' if len(unknown) > 10 else ''} "
            f"that the model does not know; its labels are {', '.join(map(repr, model_labels or sorted(label2id)))}. "
            "Use data labelled like the model's training data, or pick the right --label-column."
        )
    return np.array([label2id[str(ex.label)] for ex in corpus], dtype=np.int64)


class Classification(Task):
    name = "classification"
    metrics = ("accuracy", "macro_f1", "loss")
    higher_is_better = {"accuracy": True, "macro_f1": True, "loss": False}
    loss_metric = "loss"
    loss_name = "cross-entropy"
    problem_type = "single_label_classification"
    target_dtype = torch.long

    def check_model(self, model: torch.nn.Module, name: str = "the model") -> None:
        if not type(model).__name__.endswith("ForSequenceClassification"):
            raise BertologyError(
                f"{name} has no classification head; pass a fine-tuned classifier (e.g. from `bertology finetune`)."
            )
        cfg = model.config
        if int(getattr(cfg, "num_labels", 2)) < 2 or getattr(cfg, "problem_type", None) == "multi_label_classification":
            raise BertologyError(
                f"{name} is not a single-label classifier (it is multi-label); ablation scores one label per example."
            )

    def targets(self, corpus: Corpus, model: torch.nn.Module, what: str = "data") -> np.ndarray:
        return label_ids_for(corpus, model, what=what)

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        return F.cross_entropy(outputs.float(), targets, reduction=reduction)

    def record(self, outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, np.ndarray]:
        lg = outputs.detach().double()
        return {"pred": lg.argmax(-1).cpu().numpy(),
                "loss": F.cross_entropy(lg, targets, reduction="none").cpu().numpy()}

    def scores(self, weights: np.ndarray, records: Mapping[str, np.ndarray], y: np.ndarray) -> dict[str, np.ndarray]:
        pred, loss = np.asarray(records["pred"]), np.asarray(records["loss"])
        k = int(max(pred.max(initial=0), y.max(initial=0))) + 1
        total = weights.sum(1, keepdims=True)  # [R, 1]
        correct = (pred == y[None, :]).astype(np.float32)  # [U, n]
        acc = weights @ correct.T / total  # [R, U]
        mean_loss = (weights.astype(np.float64) @ loss.T) / total
        onehot_true = (y[:, None] == np.arange(k)[None, :]).astype(np.float32)  # [n, k]
        true = weights @ onehot_true  # [R, k]
        f1 = np.empty_like(acc, dtype=np.float64)
        for u in range(pred.shape[0]):
            onehot_pred = (pred[u][:, None] == np.arange(k)[None, :]).astype(np.float32)
            f1[:, u] = macro_f1_from_counts(weights @ (onehot_pred * onehot_true), weights @ onehot_pred, true)
        return {"accuracy": acc.astype(np.float64), "macro_f1": f1, "loss": mean_loss}

    def n_predicted(self, pred: np.ndarray) -> int:
        return int(np.unique(pred).size)

    def chance(self, y: np.ndarray) -> float:
        return chance_rate(y)

    def degeneracy(self, value: float, n: int, n_predicted: int, chance: float) -> Degeneracy:
        """Constant when one class (or none) was predicted; at chance when the Wilson 95% interval's
        lower end is at or below the majority-class rate (an accuracy below chance is not above it)."""
        lo, hi = accuracy_interval(round(value * n), n)
        return Degeneracy(
            metric="accuracy", value=float(value), n=int(n), ci=(lo, hi), ci_method="wilson 95%", chance=float(chance),
            chance_method="majority-class rate", n_predicted=int(n_predicted),
            constant_predictions=int(n_predicted) <= 1, at_chance=bool(lo <= chance), what="classifier",
        )


TASK = Classification()
