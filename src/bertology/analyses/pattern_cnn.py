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
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bertology.errors import BertologyError
from bertology.metrics.patterns import PATTERNS

logger = logging.getLogger(__name__)

DEFAULT_SIZE = 32
WEIGHTS_FILE = "pattern_cnn.safetensors"
META_FILE = "pattern_cnn.json"
FORMAT = "bertology.pattern_cnn"
IMAGE_RECIPE = "crop to real tokens; area-average to size x size (nearest repeat when smaller); divide by max"


# -- images ----------------------------------------------------------------------------------------


def resize_map(a: torch.Tensor, size: int = DEFAULT_SIZE) -> torch.Tensor:
    """Resize cropped maps ``[..., n, n]`` to ``[..., size, size]`` and scale each to max 1."""
    lead = a.shape[:-2]
    n = a.shape[-1]
    x = a.reshape(-1, 1, n, n).float()
    if n >= size:
        x = F.adaptive_avg_pool2d(x, size)
    else:
        x = F.interpolate(x, size=(size, size), mode="nearest-exact")
    top = x.amax((-2, -1), keepdim=True)
    x = torch.where(top > 0, x / top.clamp_min(torch.finfo(x.dtype).tiny), torch.zeros_like(x))
    return x.reshape(*lead, size, size)


def map_images(attn: torch.Tensor, lengths: torch.Tensor | Sequence[int], size: int = DEFAULT_SIZE) -> torch.Tensor:
    """Images ``[B, H, size, size]`` (float32) of a padded batch ``[B, H, T, T]`` with real lengths."""
    lengths = [int(n) for n in lengths]
    out = attn.new_empty(attn.shape[0], attn.shape[1], size, size, dtype=torch.float32)
    # Examples of one length are resized together.
    for n in sorted(set(lengths)):
        idx = [b for b, m in enumerate(lengths) if m == n]
        out[idx] = resize_map(attn[idx, :, :n, :n], size)
    return out


# -- model -----------------------------------------------------------------------------------------


class PatternCNN(nn.Module):
    """3 x (conv 3x3 + ReLU + max-pool 2x2) -> dense + ReLU -> dense; input ``[N, 1, size, size]``."""

    def __init__(self, n_classes: int, size: int = DEFAULT_SIZE, channels: Sequence[int] = (8, 16, 32), hidden: int = 64):
        super().__init__()
        if size % 8:
            raise ValueError(f"size must be a multiple of 8 (three 2x2 poolings), not {size}")
        layers: list[nn.Module] = []
        c_in = 1
        for c in channels:
            layers += [nn.Conv2d(c_in, c, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)]
            c_in = c
        self.features = nn.Sequential(*layers)
        side = size // 2 ** len(channels)
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(c_in * side * side, hidden), nn.ReLU(), nn.Linear(hidden, n_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


@dataclass
class TrainSettings:
    """Hyper-parameters of one training run (recorded in the metadata)."""

    epochs: int = 40
    batch_size: int = 32
    lr: float = 1e-3
    seed: int = 0
    channels: tuple[int, ...] = (8, 16, 32)
    hidden: int = 64

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


def _predict(model: PatternCNN, images: torch.Tensor, batch_size: int = 512) -> np.ndarray:
    out = []
    with torch.inference_mode():
        for s in range(0, len(images), batch_size):
            out.append(model(images[s : s + batch_size, None].float()).argmax(-1).cpu().numpy())
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


# -- classifier object -----------------------------------------------------------------------------


@dataclass
class PatternClassifier:
    """A trained CNN plus its metadata; ``predict`` returns codes into :data:`PATTERNS`."""

    model: PatternCNN
    classes: tuple[str, ...]
    size: int
    metadata: dict = field(default_factory=dict)
    path: str | None = None
    sha256: str | None = None

    def __post_init__(self) -> None:
        unknown = [c for c in self.classes if c not in PATTERNS]
        if unknown:
            raise BertologyError(f"pattern CNN classes {unknown} are not pattern names ({', '.join(PATTERNS)})")
        self._codes = np.array([PATTERNS.index(c) for c in self.classes], dtype=np.int64)

    def predict(self, images: torch.Tensor | np.ndarray) -> np.ndarray:
        """Pattern codes ``[N]`` of images ``[N, size, size]`` made by :func:`map_images`/:func:`resize_map`."""
        x = torch.as_tensor(images, dtype=torch.float32)
        if x.shape[-2:] != (self.size, self.size):
            raise ValueError(f"the CNN expects {self.size}x{self.size} images, got {tuple(x.shape[-2:])}")
        return self._codes[_predict(self.model, x.reshape(-1, self.size, self.size))].reshape(x.shape[:-2])

    def predict_batch(self, attn: torch.Tensor, lengths) -> torch.Tensor:
        """Pattern codes ``[B, H]`` of a padded batch of maps ``[B, H, T, T]``."""
        codes = self.predict(map_images(attn, lengths, self.size))
        return torch.as_tensor(codes, dtype=torch.long, device=attn.device)

    def identity(self) -> dict:
        """What identifies this classifier in a table's provenance."""
        return {"kind": "cnn", "path": self.path, "sha256": self.sha256, "classes": list(self.classes),
                "input_size": self.size}

    def save(self, folder: str | os.PathLike) -> Path:
        """Write ``pattern_cnn.safetensors`` and ``pattern_cnn.json`` into ``folder`` (atomically each)."""
        from safetensors.torch import save as st_save

        from bertology.results import atomic_write_text

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        weights = folder / WEIGHTS_FILE
        data = st_save({k: v.detach().contiguous() for k, v in self.model.state_dict().items()},
                       metadata={"format": FORMAT})
        fd, tmp = tempfile.mkstemp(prefix=f".{WEIGHTS_FILE}.", suffix=".tmp", dir=folder)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            os.replace(tmp, weights)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        self.path, self.sha256 = str(weights.resolve()), hashlib.sha256(data).hexdigest()
        meta = dict(self.metadata)
        meta.update(format=FORMAT, version=1, classes=list(self.classes), input_size=self.size,
                    weights=WEIGHTS_FILE, weights_sha256=self.sha256, image=IMAGE_RECIPE)
        self.metadata = meta
        atomic_write_text(folder / META_FILE, json.dumps(meta, indent=2, default=_json_default))
        return weights

    @classmethod
    def load(cls, path: str | os.PathLike) -> "PatternClassifier":
        """Load from the folder written by :meth:`save` (or either of its two files)."""
        from safetensors.torch import load as st_load

        p = Path(path).expanduser()
        if not p.exists():
            raise BertologyError(f"{p} does not exist; pass the folder written by `bertology patterns train`.")
        folder = p if p.is_dir() else p.parent
        meta_path, weights = folder / META_FILE, folder / WEIGHTS_FILE
        for f in (meta_path, weights):
            if not f.exists():
                raise BertologyError(f"{f} does not exist; pass the folder written by `bertology patterns train`.")
        try:
            meta = json.loads(meta_path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise BertologyError(f"{meta_path} is not valid JSON ({err}).") from err
        if meta.get("format") != FORMAT:
            raise BertologyError(f"{meta_path} is not a bertology pattern CNN (format {meta.get('format')!r}).")
        data = weights.read_bytes()
        arch = meta.get("train", {})
        model = PatternCNN(len(meta["classes"]), int(meta["input_size"]), tuple(arch.get("channels", (8, 16, 32))),
                           int(arch.get("hidden", 64)))
        try:
            model.load_state_dict(st_load(data))
        except RuntimeError as err:
            raise BertologyError(f"{weights} does not match the architecture in {meta_path}: {err}") from err
        model.eval()
        return cls(model, tuple(meta["classes"]), int(meta["input_size"]), meta, str(weights.resolve()),
                   hashlib.sha256(data).hexdigest())


def _json_default(obj):
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    return str(obj)


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
