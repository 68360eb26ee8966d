"""Scoring a fine-tuned model (classifier or regressor) on labelled data: what ablation and head importance share.

Labels checked against the model, the corpus collated once into device batches, per-example
predictions and losses, each head's mean context (for ``mode="mean"``), and the progress store that
makes long sweeps resumable (one atomically written ``.npz`` per finished unit).
"""
from __future__ import annotations

import hashlib
import json
import logging
import shutil
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from bertology.data.batching import collate, length_batches
from bertology.data.encode import EncodedCorpus
from bertology.config import Mode
from bertology.errors import BertologyError
from bertology.models import sites
from bertology.models.ablate import check_mode
from bertology.models.hooks import on_layers
from bertology.results import atomic_write, atomic_write_text, read_json_key
from bertology.tasks.base import Task, head_logits
from bertology.tasks.catalog import get_task, higher_is_better, task_of_model
from bertology.tasks.classification import label_ids_for  # noqa: F401  (re-exported: the ablation API)

logger = logging.getLogger(__name__)

#: Every task's metric directions (loss: lower is better); each task declares its own.
HIGHER_IS_BETTER = higher_is_better()


# --------------------------------------------------------------------------------------------------
# Batches
# --------------------------------------------------------------------------------------------------


@dataclass
class Batches:
    """The corpus in length-bucketed batches, tensors already on the device, in a fixed order."""

    inputs: list[dict[str, torch.Tensor]]
    positions: list[np.ndarray]  # item positions (into ``encoded.items``) of each batch's rows
    mask: list[torch.Tensor]  # [B, T] bool real tokens
    labels: list[torch.Tensor]  # [B] targets (label ids, or numbers for regression)
    y: np.ndarray  # targets by item position
    n: int
    task: Task = field(default_factory=lambda: get_task("classification"))
    encoded: EncodedCorpus | None = None  # the items' data, for tasks whose examples span several items (QA)

    def __len__(self) -> int:
        return len(self.inputs)

    @property
    def y_examples(self) -> np.ndarray:
        """The targets per example (what the metrics count and the bootstrap resamples; = ``y`` for most tasks)."""
        return self.task.example_targets(self.y, self.encoded)


def make_batches(
    encoded: EncodedCorpus,
    label_ids: np.ndarray,
    *,
    batch_size: int,
    pad_id: int,
    use_token_types: bool,
    device: torch.device | str = "cpu",
    task: Task | None = None,
) -> Batches:
    """Collate once; ``label_ids`` (the task's targets) are in corpus order (indexed by ``EncodedExample.index``)."""
    dev = torch.device(device)
    task = task or get_task("classification")
    position = {id(it): i for i, it in enumerate(encoded.items)}
    y = _by_item(label_ids, encoded, task)
    inputs, positions, masks, labels = [], [], [], []
    for items in length_batches(encoded.items, batch_size):
        t = collate(items, pad_id)
        d = {k: t[k].to(dev) for k in ("input_ids", "token_type_ids", "attention_mask")}
        if not use_token_types:
            d.pop("token_type_ids")
        pos = np.array([position[id(it)] for it in items], dtype=np.int64)
        inputs.append(d)
        positions.append(pos)
        masks.append(t["mask"].to(dev))
        labels.append(task.collate_targets(items, [y[p] for p in pos]).to(dev))
    return Batches(inputs, positions, masks, labels, y, len(encoded.items), task, encoded)


def _by_item(targets: np.ndarray | Sequence, encoded: EncodedCorpus, task: Task) -> np.ndarray:
    """Each encoded item's target (corpus order -> item order): numbers, or an object array of per-word arrays."""
    picked = [targets[it.index] for it in encoded.items]
    if picked and isinstance(picked[0], np.ndarray):  # token-level targets: ragged per example
        out = np.empty(len(picked), dtype=object)
        out[:] = picked
        return out
    return np.array(picked, dtype=np.float32 if task.target_dtype.is_floating_point else np.int64)


@dataclass(frozen=True)
class HeadScoring:
    """How heads are disabled and the classifier is run: what the ablation sweep and head importance share.

    ``mode``: uniform (1/L attention), zero or mean output (:mod:`bertology.models.ablate`);
    ``exclude_special``: leave [CLS]/[SEP] (``special_ids``) out of the uniform average; ``means``
    overrides the mean-mode reference (default: the heads' means over the scored corpus); ``metric`` is the task's
    main metric (:func:`bertology.tasks.main_metric.main_metric`; None: the task's own), which the tables list first
    and the findings use.
    """

    mode: Mode = "uniform"
    exclude_special: bool = False
    special_ids: tuple[int, ...] = ()
    pad_id: int = 0
    batch_size: int = 32
    device: str = "cpu"
    means: torch.Tensor | None = None
    metric: str | None = None

    def __post_init__(self) -> None:
        check_mode(self.mode)
        object.__setattr__(self, "special_ids", tuple(int(i) for i in self.special_ids))

    @classmethod
    def for_tokenizer(cls, tokenizer, **settings) -> "HeadScoring":
        """Scoring with the tokenizer's [CLS]/[SEP] and padding ids."""
        special = tuple(i for i in (tokenizer.cls_token_id, tokenizer.sep_token_id) if i is not None)
        return cls(special_ids=special, pad_id=tokenizer.pad_token_id or 0, **settings)


def classifier_batches(model: torch.nn.Module, encoded: EncodedCorpus, label_ids: np.ndarray | Sequence[int],
                       scoring: HeadScoring) -> Batches:
    """Check the model's task head, put it on the scoring device in eval mode and collate the corpus for it, once.

    The setup ablation and head importance share before their first forward pass; the task is bound to the
    scoring's main metric.
    """
    task = task_of_model(model).with_main(scoring.metric)
    dev = torch.device(scoring.device)
    model.to(dev).eval()
    return make_batches(
        encoded, np.asarray(label_ids), batch_size=scoring.batch_size, pad_id=scoring.pad_id,
        use_token_types=sites.uses_token_types(model), device=dev, task=task,
    )


# --------------------------------------------------------------------------------------------------
# Progress store (resumable sweeps)
# --------------------------------------------------------------------------------------------------


class ProgressStore:
    """Finished units of a sweep (per-example arrays), one atomically written ``.npz`` each.

    ``folder=None`` keeps them in memory only. A folder whose ``progress.json`` holds another
    fingerprint is emptied first (the caller's run directory decides whether that is allowed).
    """

    def __init__(self, folder: str | Path | None, fingerprint: str) -> None:
        self.folder = None if folder is None else Path(folder)
        self.fingerprint = fingerprint
        self.memory: dict[str, dict[str, np.ndarray]] = {}
        if self.folder is None:
            return
        meta = self.folder / "progress.json"
        if read_json_key(meta, "fingerprint") != fingerprint:
            if (self.folder / "units").exists():
                logger.info("discarding finished units of another sweep in %s", self.folder)
                shutil.rmtree(self.folder / "units")
            atomic_write_text(meta, json.dumps({"fingerprint": fingerprint, "version": 1}))
        for f in (self.folder / "units").glob(".*.tmp"):  # left by a kill in the middle of a write
            f.unlink(missing_ok=True)
        for f in sorted((self.folder / "units").glob("*.npz")):
            try:
                with np.load(f, allow_pickle=False) as z:
                    self.memory[f.stem] = {k: z[k] for k in z.files}
            except (OSError, ValueError, EOFError):  # pragma: no cover - a torn file cannot exist (atomic writes)
                logger.warning("ignoring unreadable progress file %s", f)

    def __contains__(self, key: str) -> bool:
        return key in self.memory

    def get(self, key: str) -> dict[str, np.ndarray] | None:
        return self.memory.get(key)

    def save(self, key: str, **arrays: np.ndarray) -> None:
        self.memory[key] = {k: np.asarray(v) for k, v in arrays.items()}
        if self.folder is not None:
            atomic_write(self.folder / "units" / f"{key}.npz", lambda p: _savez(p, arrays))


def _savez(path: Path, arrays: dict) -> None:
    with path.open("wb") as fh:
        np.savez(fh, **arrays)


def fingerprint_of(model: torch.nn.Module, batches: Batches, settings: dict) -> str:
    """Hash of the weights, the tokenised batches, the labels and the given settings."""
    digest = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(_raw_bytes(t))
    for inp, pos in zip(batches.inputs, batches.positions):
        for k in sorted(inp):
            digest.update(inp[k].cpu().numpy().tobytes())
        digest.update(pos.tobytes())
    for lab in batches.labels:  # the targets as the model is scored on them (ragged token targets included)
        digest.update(lab.cpu().numpy().tobytes())
    digest.update(json.dumps(settings, sort_keys=True, default=str).encode())
    return digest.hexdigest()[:16]


def _raw_bytes(t: torch.Tensor) -> bytes:
    """A tensor's memory as bytes, for any dtype (numpy has no bfloat16); the same bytes as ``.numpy().tobytes()``."""
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def _record(batches: Batches, logits: list[torch.Tensor], unit: str = "") -> dict[str, np.ndarray]:
    """The task's per-example records (``pred``, ``loss``, ...) of every batch: by item position, then folded
    into examples by the task (:meth:`Task.example_records`: QA's windows into questions).

    A non-finite loss (the logits of ``unit`` NaN or infinite) is refused: every metric and interval computed
    from it would be a number no one can vouch for. Checked on the records, already on the host (no extra sync).
    """
    out: dict[str, np.ndarray] = {}
    for pos, lg, y in zip(batches.positions, logits, batches.labels):
        for k, v in batches.task.record(lg, y).items():
            if k not in out:
                out[k] = np.empty((batches.n, *v.shape[1:]), dtype=v.dtype)  # per-example rows (a tagger's tag counts: 2-D)
            out[k][pos] = v
    check_finite_loss(out.get("loss"), unit)
    return batches.task.example_records(out, batches.encoded)


def check_finite_loss(loss: np.ndarray | None, unit: str = "") -> None:
    """Refuse per-example losses holding NaN or infinity, saying how many and under which unit."""
    if loss is None or not np.issubdtype(np.asarray(loss).dtype, np.floating):
        return
    bad = int(np.size(loss) - np.count_nonzero(np.isfinite(loss)))
    if bad:
        where = "the intact model" if unit in ("", "intact") else f"unit {unit}"
        raise BertologyError(
            f"The model's outputs are NaN or infinite on {bad} of {np.shape(loss)[0]} examples under {where}: no "
            "metric or interval from them can be trusted, so none is reported. In float16 or bfloat16 try "
            "--dtype float32; otherwise check the model's weights."
        )


def _logits(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    """The task head's output (QA: start/end stacked), widened to float32 when the model runs in a reduced dtype
    (losses and metrics in float32)."""
    return head_logits(model(**inputs)).float()


def tile_rows(x, k: int):
    """``k`` copies of the rows of ``x`` one after the other (a tensor, or a dict or tuple of them; anything else as
    it is): the batch of a forward that scores ``k`` units at once (:func:`~bertology.models.ablate.ablate_head_groups`).
    ``x`` itself when ``k`` is 1."""
    if k == 1:
        return x
    if isinstance(x, torch.Tensor):
        return torch.cat([x] * k)
    if isinstance(x, dict):
        return {name: tile_rows(v, k) for name, v in x.items()}
    if isinstance(x, tuple):
        return tuple(tile_rows(v, k) for v in x)
    return x


def split_rows(logits: Sequence[torch.Tensor], k: int) -> list[list[torch.Tensor]]:
    """Per unit, every batch's logits of a forward that scored ``k`` units (:func:`tile_rows`): row group ``j`` of each."""
    parts = [lg.chunk(k) for lg in logits]
    if any(len(p) != k or p[0].shape[0] * k != lg.shape[0] for p, lg in zip(parts, logits)):
        raise RuntimeError(f"logits of {[lg.shape[0] for lg in logits]} rows do not hold {k} equal row groups")
    return [[p[j] for p in parts] for j in range(k)]


class _MeanAccumulator:
    """Sums each head's context vector over real tokens (pre-hook on the output projection)."""

    def __init__(self, n_layers: int, n_heads: int, head_size: int) -> None:
        self.sums = torch.zeros(n_layers, n_heads, head_size, dtype=torch.float64)
        self.counts = torch.zeros(n_layers, dtype=torch.float64)
        self.mask: torch.Tensor | None = None
        self.n_heads, self.head_size = n_heads, head_size

    def hook(self, layer: int):
        def pre(_m, args):
            x = args[0]
            m = self.mask.to(x.dtype)[..., None]
            s = (x * m).sum(dim=(0, 1)).double().cpu().view(self.n_heads, self.head_size)
            self.sums[layer - 1] += s
            self.counts[layer - 1] += float(self.mask.sum())

        return pre

    def means(self) -> torch.Tensor:
        return (self.sums / self.counts.clamp_min(1)[:, None, None]).float()


def head_means(
    model: torch.nn.Module,
    batches: Batches,
    layers: Collection[int] | None = None,
) -> torch.Tensor:
    """Mean context vector of every head over the real tokens of a reference corpus: ``[layers, heads, d]``.

    Used by ``mode="mean"`` (the head's output replaced by this mean). Layers not in ``layers`` stay 0.
    """
    n = sites.num_layers(model)
    acc = _MeanAccumulator(n, sites.num_heads(model), sites.head_size(model))
    handles = on_layers(model, sites.out_proj, {layer: acc.hook(layer) for layer in (layers or range(1, n + 1))}, pre=True)
    try:
        with torch.inference_mode():
            for inp, mask in zip(batches.inputs, batches.mask):
                acc.mask = mask
                _logits(model, inp)
    finally:
        for h in handles:
            h.remove()
    return acc.means()
