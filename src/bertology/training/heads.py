"""The training loop's view of a supervised head on an encoded corpus (sequence heads, taggers, the parser).

:class:`Batching` turns encoded items into model inputs (every trainer batches this way);
:class:`HeadTask` batches the examples with their targets (the task's
:meth:`~bertology.tasks.base.Task.collate_targets`), takes the task's loss, and evaluates the task's
metrics on the held-out set and its word slices. What differs between the heads is in the task.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from bertology.data.batching import collate, length_batches
from bertology.data.encode import EncodedCorpus, EncodedExample
from bertology.models.loading import save_model
from bertology.models.sites import uses_token_types
from bertology.tasks.base import Task
from bertology.training.common import padding_id
from bertology.training.data import SLICE_ALL


@dataclass(frozen=True)
class Batching:
    """How a batch of encoded items becomes the model's inputs: batch size, padding id, token types, device."""

    batch_size: int
    pad_id: int
    use_token_types: bool
    device: torch.device

    @classmethod
    def of(cls, batch_size: int, model: torch.nn.Module, tokenizer, device: torch.device) -> "Batching":
        """The batching for ``model`` and ``tokenizer`` (token type ids only where the model uses them)."""
        return cls(batch_size, padding_id(tokenizer), uses_token_types(model), device)

    def inputs(self, items: Sequence[EncodedExample]) -> dict[str, torch.Tensor]:
        """The items padded to their longest (the extraction engine's collate), on the device."""
        t = collate(items, self.pad_id)
        kwargs = {"input_ids": t["input_ids"].to(self.device), "attention_mask": t["attention_mask"].to(self.device)}
        if self.use_token_types:
            kwargs["token_type_ids"] = t["token_type_ids"].to(self.device)
        return kwargs


def _scores(task: Task, records: dict[str, np.ndarray], y: np.ndarray, sel: np.ndarray) -> dict:
    """The task's metrics over the examples ``sel`` (NaN for an empty selection) and their count ``n_eval``."""
    if len(sel) == 0 or not records:
        return {**{m: float("nan") for m in task.metrics}, "n_eval": 0}
    return {**task.point_scores({k: v[sel] for k, v in records.items()}, y[sel]), "n_eval": int(len(sel))}


class HeadTask:
    """The training loop's view of a supervised head: the task's loss; its metrics on the held-out set and slices.

    ``train`` and ``evaluation`` are ``(encoded corpus, targets by corpus index)``; ``slices`` maps a
    slice name to a boolean mask over the eval corpus (each slice gets the same metrics).
    """

    objective = "supervised"

    @property
    def loss_name(self) -> str:
        """The task's loss by name."""
        return self.task.loss_name

    def __init__(self, task: Task, tokenizer, train: tuple[EncodedCorpus, np.ndarray],
                 evaluation: tuple[EncodedCorpus, np.ndarray], batching: Batching,
                 slices: dict[str, np.ndarray] | None = None) -> None:
        self.task = task
        self.tokenizer = tokenizer
        (self.enc_train, self.y_train), (self.enc_eval, self.y_eval) = train, evaluation
        self.batching = batching
        self.use_token_types = batching.use_token_types
        self.slices = slices
        self.n_items = len(self.enc_train.items)
        self.last_preds: np.ndarray | None = None
        #: the records and targets of the held-out examples scored at the last evaluation (skipped ones left out)
        self.last_scored: tuple[dict[str, np.ndarray], np.ndarray] | None = None

    def outputs(self, model: torch.nn.Module, items: Sequence[EncodedExample], y: np.ndarray
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """The head's logits for ``items`` and their targets (``y`` by corpus index), on the device."""
        targets = self.task.collate_targets(items, [y[it.index] for it in items]).to(self.batching.device)
        return model(**self.batching.inputs(items)).logits, targets

    def loss(self, model: torch.nn.Module, indices: list[int]) -> torch.Tensor:
        return self.task.loss(*self.outputs(model, [self.enc_train.items[i] for i in indices], self.y_train))

    def records(self, model: torch.nn.Module) -> dict[str, np.ndarray]:
        """The task's per-example records of the held-out set by corpus index (-1 / NaN: skipped by the tokeniser)."""
        was_training = model.training
        model.eval()
        records: dict[str, np.ndarray] = {}
        n = len(self.y_eval)
        try:
            with torch.inference_mode():
                for items in length_batches(self.enc_eval.items, self.batching.batch_size):
                    index = np.array([it.index for it in items], dtype=np.int64)
                    for k, v in self.task.record(*self.outputs(model, items, self.y_eval)).items():
                        if k not in records:
                            records[k] = np.full((n, *v.shape[1:]), -1 if v.dtype.kind in "iu" else np.nan, dtype=v.dtype)
                        records[k][index] = v
        finally:
            model.train(was_training)
        return records

    def evaluate(self, model: torch.nn.Module) -> tuple[dict, list[dict]]:
        """The task's metrics (and per slice, with ``n_eval``) and their table rows."""
        records = self.records(model)
        kept = np.array([it.index for it in self.enc_eval.items], dtype=np.int64)
        metrics = _scores(self.task, records, self.y_eval, kept)
        if self.slices:
            metrics["slices"] = {name: _scores(self.task, records, self.y_eval, kept[mask[kept]])
                                 for name, mask in self.slices.items()}
        self.last_preds = records.get("pred", np.full(len(self.y_eval), -1))
        self.last_scored = ({k: v[kept] for k, v in records.items()}, self.y_eval[kept])
        rows = [{"split": "eval", "metric": m, "value": float(metrics[m]), "slice": SLICE_ALL} for m in self.task.metrics]
        for name, sm in metrics.get("slices", {}).items():
            rows += [{"split": "eval", "metric": m, "value": float(sm[m]), "slice": name} for m in (*self.task.metrics, "n_eval")]
        return metrics, rows

    def save(self, model: torch.nn.Module, folder: Path) -> None:
        save_model(model, self.tokenizer, folder)

    def tokenisation(self) -> dict:
        """The manifest's ``tokenisation``: what encoding did to the training and eval sets."""
        return {"train": self.enc_train.describe(), "eval": self.enc_eval.describe()}
