"""Single-label classification: cross-entropy; accuracy, macro-F1 and mean cross-entropy (``loss``).

Two more metrics are computed when a run names one its main metric (:meth:`~bertology.tasks.base.Task.with_main`;
:mod:`bertology.tasks.main_metric` names GLUE's): ``mcc``, Matthews' correlation (CoLA's), and ``f1``, the F1 of
the positive class (MRPC's and QQP's). Like macro-F1 they are made from weighted per-class counts, so one matrix
product scores every bootstrap resample at once; they equal scikit-learn's ``matthews_corrcoef`` and
``f1_score(pos_label=...)`` given the same ``sample_weight`` (tests/unit/test_main_metric.py). scikit-learn itself
is not called per resample: at about 4 ms a call, the 1,000 resamples of 150 units would take ten minutes.
"""
from __future__ import annotations

import copy
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


def mcc_from_counts(tp: np.ndarray, pred: np.ndarray, true: np.ndarray) -> np.ndarray:
    """Matthews' correlation from per-class counts (last axis = class), as scikit-learn's ``matthews_corrcoef``
    (its multi-class form; 0 where every prediction or every target is one class)."""
    tp, pred, true = (np.asarray(a, dtype=np.float64) for a in (tp, pred, true))
    s, correct = true.sum(-1), tp.sum(-1)
    cov_tp = correct * s - (true * pred).sum(-1)
    cov_pp, cov_tt = s * s - (pred * pred).sum(-1), s * s - (true * true).sum(-1)
    denom = cov_pp * cov_tt
    return np.where(denom > 0, cov_tp / np.sqrt(np.where(denom > 0, denom, 1.0)), 0.0)


def positive_f1_from_counts(tp: np.ndarray, pred: np.ndarray, true: np.ndarray, positive: int) -> np.ndarray:
    """The F1 of class ``positive`` from per-class counts, as scikit-learn's ``f1_score(pos_label=positive)``
    (0 when that class is neither predicted nor present)."""
    hits = np.asarray(tp, dtype=np.float64)[..., positive]
    denom = np.asarray(pred, dtype=np.float64)[..., positive] + np.asarray(true, dtype=np.float64)[..., positive]
    return np.where(denom > 0, 2 * hits / np.where(denom > 0, denom, 1.0), 0.0)


#: Label names read as the positive class of ``f1``, first found first: GLUE's ``1``, MRPC's and QQP's names in
#: Hugging Face datasets, a generic ``LABEL_1``.
POSITIVE_LABELS = ("1", "equivalent", "duplicate", "label_1")


def positive_id(config) -> int:
    """The label id ``f1`` scores: that of the first of :data:`POSITIVE_LABELS` in the model's ``label2id``
    (case-insensitive), else id 1."""
    label2id = {str(k).lower(): int(v) for k, v in (getattr(config, "label2id", None) or {}).items()}
    return next((label2id[name] for name in POSITIVE_LABELS if name in label2id), 1)


def known_labels(config) -> dict[str, int]:
    """The labels a classifier's ``config`` knows, by name -> id (its ``label2id``).

    A model whose labels are the generic ``LABEL_0 .. LABEL_{k-1}`` also accepts the labels ``0 .. k-1``.
    """
    label2id = {str(k): int(v) for k, v in (getattr(config, "label2id", None) or {}).items()}
    num_labels = int(getattr(config, "num_labels", len(label2id)) or len(label2id))
    if set(label2id) == {f"LABEL_{i}" for i in range(num_labels)}:
        label2id.update({str(i): i for i in range(num_labels)})
    return label2id


def _model_labels(config) -> list[str]:
    """The model's labels in id order (``id2label``)."""
    return [str(v) for _, v in sorted((getattr(config, "id2label", None) or {}).items(), key=lambda kv: int(kv[0]))]


def _in_order(labels) -> list[str]:
    """Labels sorted as numbers when they all are (``-1, 0, 1``), else as text."""
    labels = sorted(set(labels))
    try:
        return sorted(labels, key=float)
    except ValueError:
        return labels


def suggested_label_map(data_labels, config) -> str:
    """A ``--label-map`` to show in an error: the data's labels in order onto the model's in id order when there are
    as many of each (``0=-1,1=1``), else the syntax's example."""
    data, model = _in_order(data_labels), _model_labels(config)
    if data and len(data) == len(model) and all("," not in x and "=" not in x for x in data + model):
        return ",".join(f"{d}={m}" for d, m in zip(data, model))
    return "DATA=MODEL,..."


def unknown_labels(corpus: Corpus, config, *, what: str = "data") -> str | None:
    """Why a classifier with ``config`` cannot score ``corpus``'s labels (one sentence naming the labels it does not
    know, the model's, and the fixes, ``--label-map`` among them), or None when it knows every one.

    Reads the config only (``label2id``/``id2label``): a model's config.json says this before any weights load.
    """
    label2id = known_labels(config)
    unknown = _in_order({str(ex.label) for ex in corpus if ex.label is not None} - set(label2id))
    if not unknown:
        return None
    mapped = corpus.stats.get("label_map")
    model_labels = _model_labels(config)
    shown = ", ".join(map(repr, unknown[:10])) + (" ..." if len(unknown) > 10 else "")
    if mapped:
        return (f"The {what} has label(s) {shown} after --label-map {mapped} that the model does not know; its labels "
                f"are {', '.join(map(repr, model_labels or sorted(label2id)))}. Map each label of the data onto one of "
                "the model's.")
    example = suggested_label_map({str(ex.label) for ex in corpus if ex.label is not None}, config)
    return (f"The {what} has label(s) {shown} that the model does not know; its labels are "
            f"{', '.join(map(repr, model_labels or sorted(label2id)))}. Use data labelled like the model's training "
            f"data, pick the right --label-column, or map the data's labels onto the model's with --label-map "
            f"(label_map= in Python), e.g. --label-map {example}.")


def label_ids_for(corpus: Corpus, model: torch.nn.Module, *, what: str = "data") -> np.ndarray:
    """Each example's label id under the model's ``label2id`` (corpus order), or one clear error
    (:func:`unknown_labels`)."""
    require_labels(corpus, "Ablation needs labelled data", what)
    problem = unknown_labels(corpus, model.config, what=what)
    if problem is not None:
        raise BertologyError(problem)
    label2id = known_labels(model.config)
    return np.array([label2id[str(ex.label)] for ex in corpus], dtype=np.int64)


class Classification(Task):
    name = "classification"
    metrics = ("accuracy", "macro_f1", "loss")
    extra_metrics = ("mcc", "f1")
    higher_is_better = {"accuracy": True, "macro_f1": True, "loss": False, "mcc": True, "f1": True}
    loss_metric = "loss"
    loss_name = "cross-entropy"
    problem_type = "single_label_classification"
    target_dtype = torch.long
    #: The label id ``f1`` scores (:func:`positive_id` of the model: :meth:`for_model`).
    positive: int = 1

    def for_model(self, model: torch.nn.Module) -> "Classification":
        """This task with the model's positive class (what ``f1`` scores)."""
        pos = positive_id(model.config)
        if pos == self.positive:
            return self
        bound = copy.copy(self)
        bound.positive = pos
        return bound

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
        extra = {m: np.empty_like(acc, dtype=np.float64) for m in self.metrics if m in self.extra_metrics}
        f1 = np.empty_like(acc, dtype=np.float64)
        for u in range(pred.shape[0]):
            onehot_pred = (pred[u][:, None] == np.arange(k)[None, :]).astype(np.float32)
            tp, predicted = weights @ (onehot_pred * onehot_true), weights @ onehot_pred
            f1[:, u] = macro_f1_from_counts(tp, predicted, true)
            for m, out in extra.items():
                out[:, u] = self._extra(m, tp, predicted, true)
        return {"accuracy": acc.astype(np.float64), "macro_f1": f1, "loss": mean_loss, **extra}

    def _extra(self, metric: str, tp: np.ndarray, pred: np.ndarray, true: np.ndarray) -> np.ndarray:
        """An extra metric (``mcc`` or ``f1``) from the per-class counts ``[R, k]`` of one unit."""
        if metric == "mcc":
            return mcc_from_counts(tp, pred, true)
        if self.positive >= tp.shape[-1]:  # the positive class neither predicted nor present
            return np.zeros(tp.shape[0])
        return positive_f1_from_counts(tp, pred, true, self.positive)

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
