"""A small CNN that learns Kovaleva's attention pattern classes from maps a person labelled.

Kovaleva et al. (2019, §4.1) hand-labelled ~400 maps and trained an 8-layer CNN on them (F1 0.86);
neither was released. This module is that recipe, small enough for a CPU:

- **Input** (:func:`map_images`): each map cropped to the example's real tokens, resized to
  ``size x size`` (area averaging when the map is larger, nearest-neighbour repetition when smaller,
  so short sentences are not blurred), then divided by its maximum, so the CNN sees what the
  thumbnails show a person (0 = no attention, 1 = the map's strongest cell).
- **Model** (:class:`PatternCNN`), 8 layers: 3 x (3x3 conv + ReLU + 2x2 max-pool), then a hidden
  dense layer + ReLU and the output layer.
- **Training** (:func:`train_pattern_cnn`): Adam, cross-entropy weighted by inverse class frequency
  (macro-F1 is the score), seeded; stratified k-fold cross-validation gives per-fold macro-F1 and
  out-of-fold predictions, then one model is fitted on all labelled maps.
- **Files** (:meth:`PatternClassifier.save`): ``pattern_cnn.safetensors`` (weights) and
  ``pattern_cnn.json`` (classes, input size, seed, cross-validation scores, agreement, creation time).
  A loaded :class:`PatternClassifier` can replace the rule classifier in
  :class:`~bertology.analyses.attention_patterns.AttentionPatterns`.
- **Labelling** (used by ``bertology patterns export`` / ``train``): :mod:`bertology.experiments.pattern_labels`
  samples maps with one seed, exports them for a person and reads the filled-in CSV back.
"""
from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from bertology.settings import check_fields, setting_field, seed_field
from bertology.errors import BertologyError
from bertology.analyses.pattern_classifier import (  # noqa: F401  (re-exported: the pattern CNN API)
    DEFAULT_SIZE,
    FORMAT,
    IMAGE_RECIPE,
    META_FILE,
    WEIGHTS_FILE,
    PatternClassifier,
    PatternCNN,
    _json_default,
    _predict,
    map_images,
    resize_map,
)
from bertology.metrics.patterns import PATTERNS

logger = logging.getLogger(__name__)


@dataclass
class TrainSettings:
    """Hyper-parameters of one training run (recorded in the metadata); ``bertology patterns train``'s flags are
    generated from the fields made with :func:`~bertology.settings.setting_field`."""

    epochs: int = setting_field(40, "Training epochs per fit.", minimum=1)
    batch_size: int = setting_field(32, "Maps per training step.", minimum=1)
    lr: float = setting_field(1e-3, "Adam learning rate.", above=0)
    seed: int = seed_field("Seed for the folds, initialisation and shuffling.")
    channels: tuple[int, ...] = (8, 16, 32)
    hidden: int = 64

    def __post_init__(self) -> None:
        check_fields(self)

    def to_dict(self) -> dict:
        return {"epochs": self.epochs, "batch_size": self.batch_size, "lr": self.lr, "seed": self.seed,
                "channels": list(self.channels), "hidden": self.hidden}


def _fit(images: torch.Tensor, y: np.ndarray, n_classes: int, settings: TrainSettings, seed: int) -> PatternCNN:
    """Train one CNN on images ``[N, S, S]`` and class indices ``y`` (0..n_classes-1)."""
    from sklearn.utils.class_weight import compute_class_weight

    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(seed)
    model = PatternCNN(n_classes, images.shape[-1], settings.channels, settings.hidden)
    present = np.unique(y)
    weights = np.ones(n_classes)
    weights[present] = compute_class_weight("balanced", classes=present, y=y)
    loss_fn = nn.CrossEntropyLoss(weight=torch.as_tensor(weights, dtype=torch.float32))
    opt = torch.optim.Adam(model.parameters(), lr=settings.lr)
    x = images[:, None].float()
    target = torch.as_tensor(y, dtype=torch.long)
    model.train()
    for _ in range(settings.epochs):
        order = torch.randperm(len(x), generator=gen)
        for s in range(0, len(x), settings.batch_size):
            idx = order[s : s + settings.batch_size]
            opt.zero_grad()
            loss_fn(model(x[idx]), target[idx]).backward()
            opt.step()
    model.eval()
    return model


# -- scores ----------------------------------------------------------------------------------------


def agreement(a: Sequence[str], b: Sequence[str]) -> dict:
    """Cohen's kappa, accuracy and confusion matrix (rows ``a``, columns ``b``) of two labellings."""
    from sklearn.metrics import cohen_kappa_score, confusion_matrix

    a, b = np.asarray(a, dtype=object), np.asarray(b, dtype=object)
    labels = [p for p in PATTERNS if p in set(a) | set(b)]
    kappa = float(cohen_kappa_score(a, b, labels=labels)) if len(set(a) | set(b)) > 1 else float("nan")
    return {
        "kappa": kappa,
        "accuracy": float(np.mean(a == b)) if len(a) else float("nan"),
        "labels": labels,
        "confusion": confusion_matrix(a, b, labels=labels).tolist(),
        "n": int(len(a)),
    }


def _n_folds(labels: np.ndarray, folds: int) -> int:
    """Folds usable for stratified CV: at most the smallest class count; at least 2 (else an error)."""
    classes, counts = np.unique(labels, return_counts=True)
    if len(classes) < 2:
        raise BertologyError(f"all {len(labels)} labelled maps are {classes[0]!r}; label at least two classes.")
    if folds < 2:
        raise BertologyError(f"--folds must be at least 2, not {folds}")
    small = {str(c): int(n) for c, n in zip(classes, counts) if n < 2}
    if small:
        raise BertologyError(
            "cross-validation needs at least 2 labelled maps of each class used; too few: "
            + ", ".join(f"{c} ({n})" for c, n in small.items())
            + ". Label more maps of these classes, or relabel them."
        )
    k = min(folds, int(counts.min()))
    if k < folds:
        least = str(classes[counts.argmin()])
        logger.warning("class %r has only %d labelled maps: using %d folds instead of %d", least, counts.min(), k, folds)
    return k


@dataclass
class TrainReport:
    """Cross-validation scores and agreement of a trained pattern CNN."""

    classes: tuple[str, ...]
    folds: int
    fold_macro_f1: list[float]
    per_class_f1: dict[str, float]
    out_of_fold: np.ndarray  # predicted class names, one per labelled map
    label_counts: dict[str, int]
    agreement: dict = field(default_factory=dict)

    @property
    def macro_f1(self) -> float:
        return float(np.mean(self.fold_macro_f1))

    @property
    def macro_f1_std(self) -> float:
        return float(np.std(self.fold_macro_f1, ddof=1)) if len(self.fold_macro_f1) > 1 else 0.0

    def to_dict(self) -> dict:
        return {
            "folds": self.folds,
            "fold_macro_f1": self.fold_macro_f1,
            "macro_f1_mean": self.macro_f1,
            "macro_f1_std": self.macro_f1_std,
            "per_class_f1_out_of_fold": self.per_class_f1,
            "label_counts": self.label_counts,
            "agreement": self.agreement,
        }


def train_pattern_cnn(
    images: torch.Tensor | np.ndarray,
    labels: Sequence[str],
    *,
    folds: int = 5,
    settings: TrainSettings = TrainSettings(),
    rules: Sequence[str] | None = None,
) -> tuple[PatternClassifier, TrainReport]:
    """Cross-validate, then fit on all maps; returns the classifier and the report.

    ``images`` ``[N, S, S]`` from :func:`map_images`; ``labels`` pattern names. ``rules`` (the rule
    classifier's names for the same maps) adds agreement scores: person vs rules, CNN (out-of-fold)
    vs person, and CNN (out-of-fold) vs rules.
    """
    from sklearn.metrics import f1_score
    from sklearn.model_selection import StratifiedKFold

    x = torch.as_tensor(np.asarray(images), dtype=torch.float32)
    y_names = np.asarray(labels, dtype=object)
    if x.ndim != 3 or x.shape[1] != x.shape[2] or len(x) != len(y_names):
        raise ValueError(f"images must be [N, S, S] with one label each; got {tuple(x.shape)} and {len(y_names)} labels")
    bad = sorted({str(v) for v in y_names if v not in PATTERNS})
    if bad:
        raise BertologyError(f"unknown pattern labels {bad}; use {', '.join(PATTERNS)}")
    classes = tuple(p for p in PATTERNS if p in set(y_names))
    y = np.array([classes.index(v) for v in y_names], dtype=np.int64)
    k = _n_folds(y_names, folds)
    oof = np.zeros(len(y), dtype=np.int64)
    fold_f1 = []
    splitter = StratifiedKFold(n_splits=k, shuffle=True, random_state=settings.seed)
    for i, (tr, te) in enumerate(splitter.split(np.zeros(len(y)), y)):
        model = _fit(x[tr], y[tr], len(classes), settings, settings.seed + 1 + i)
        pred = _predict(model, x[te])
        oof[te] = pred
        fold_f1.append(float(f1_score(y[te], pred, labels=range(len(classes)), average="macro", zero_division=0)))
    per_class = f1_score(y, oof, labels=range(len(classes)), average=None, zero_division=0)
    oof_names = np.array([classes[i] for i in oof], dtype=object)
    report = TrainReport(
        classes=classes,
        folds=k,
        fold_macro_f1=fold_f1,
        per_class_f1={c: float(f) for c, f in zip(classes, per_class)},
        out_of_fold=oof_names,
        label_counts={c: int((y_names == c).sum()) for c in classes},
    )
    report.agreement["cnn_vs_labels"] = agreement(y_names, oof_names)
    if rules is not None:
        rules = np.asarray(rules, dtype=object)
        report.agreement["rules_vs_labels"] = agreement(y_names, rules)
        report.agreement["cnn_vs_rules"] = agreement(oof_names, rules)
    final = _fit(x, y, len(classes), settings, settings.seed)
    from bertology.results import now_iso, package_versions

    meta = {
        "created": now_iso(),
        "seed": settings.seed,
        "train": settings.to_dict(),
        "n_train": int(len(y)),
        "cv": report.to_dict(),
        "versions": package_versions(),
    }
    return PatternClassifier(final, classes, int(x.shape[-1]), meta), report
