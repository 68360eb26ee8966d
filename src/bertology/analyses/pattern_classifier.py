"""The attention-pattern CNN as a classifier of maps: images, network, save and load.

:class:`~bertology.analyses.attention_patterns.AttentionPatterns` uses a trained classifier in place of
its feature rules; training it (and the labelling workflow) is the experiment
:mod:`bertology.experiments.pattern_cnn`.
"""
from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from bertology.errors import BertologyError
from bertology.metrics.patterns import PATTERNS

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
        dev = next(self.model.parameters()).device
        x = torch.as_tensor(images, dtype=torch.float32).to(dev)
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

        from bertology.results import atomic_write, atomic_write_text

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        weights = folder / WEIGHTS_FILE
        data = st_save({k: v.detach().contiguous() for k, v in self.model.state_dict().items()},
                       metadata={"format": FORMAT})
        atomic_write(weights, lambda p: p.write_bytes(data))
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
