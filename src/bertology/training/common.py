"""The pieces every fine-tuning run uses (the flow itself is :mod:`bertology.training.skeleton`).

The result record and its ``finetune`` table, the settings check, the resumable checkpoint folder,
the model surgery before training, the step schedule and the loop settings, and the manifest records
built from them.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from bertology.tasks.base import Task
from bertology.tasks.catalog import higher_is_better
from bertology.config import FINETUNE_DATA_SETTINGS, OBJECTIVE_ALIASES, FinetuneConfig  # noqa: F401 - re-exported
from bertology.data.corpus import Corpus
from bertology.settings import field_settings
from bertology.training.data import SLICE_ALL
from bertology.training.loop import LOG_EVERY, LoopConfig, LoopOutcome, TrainTask, plan_steps
from bertology.training.surgery import drop_layers, freeze, layers_record, num_blocks, parameter_counts

logger = logging.getLogger(__name__)

TABLE_COLUMNS = ["step", "epoch", "split", "metric", "value"]


@dataclass
class FinetuneResult:
    """What a fine-tuning run produced: the saved model folder, the metric table and provenance."""

    model_dir: Path
    table: pd.DataFrame
    metrics: dict
    n_train: int
    n_eval: int
    wall_time_s: float
    label2id: dict[str, int]
    predictions: pd.DataFrame | None = None
    details: dict = field(default_factory=dict)
    #: further tables by name (e.g. ``anisotropy`` of a contrastive run), written beside ``finetune``
    extra_tables: dict[str, pd.DataFrame] = field(default_factory=dict)

    @property
    def id2label(self) -> dict[int, str]:
        return {i: lab for lab, i in self.label2id.items()}

    def describe(self) -> dict:
        """Provenance and final numbers for manifest.json (JSON-serialisable)."""
        return {
            "model_dir": str(self.model_dir),
            "n_train": self.n_train,
            "n_eval": self.n_eval,
            "label2id": dict(self.label2id),
            "metrics": dict(self.metrics),
            "wall_time_s": round(self.wall_time_s, 3),
            **self.details,
        }

    def _repr_html_(self) -> str:
        from html import escape

        m = self.metrics
        shown = ", ".join(f"{k} {v:.4f}" for k, v in m.items() if isinstance(v, float))
        return (
            f"<b>FinetuneResult</b>: {self.n_train} train / {self.n_eval} held-out examples, {escape(shown)}, "
            f"model saved to <code>{escape(str(self.model_dir))}</code>"
        )


def make_table(rows: list[dict]) -> pd.DataFrame:
    """The long-form ``finetune`` table: ``step, epoch, split, metric, value, slice`` (+ any extra columns)."""
    table = pd.DataFrame(rows)
    if table.empty:
        table = pd.DataFrame(columns=[*TABLE_COLUMNS, "slice"])
    if "slice" not in table.columns:
        table["slice"] = SLICE_ALL
    table["slice"] = table["slice"].fillna(SLICE_ALL)
    extra = [c for c in table.columns if c not in TABLE_COLUMNS]
    table = table[[*TABLE_COLUMNS, *extra]]
    table["step"] = table["step"].astype("int64")
    table["value"] = table["value"].astype("float64")
    return table.reset_index(drop=True)


#: The table of the final held-out metrics with their bootstrap intervals, beside ``finetune``.
INTERVALS_TABLE = "finetune_intervals"
INTERVAL_COLUMNS = ["split", "metric", "value", "ci_low", "ci_high", "n_eval", "n_bootstrap", "ci_method"]


def interval_table(task: Task, scored: tuple[dict[str, np.ndarray], np.ndarray] | None, *, seed: int,
                   n_bootstrap: int = 1000) -> pd.DataFrame:
    """``finetune_intervals``: each final held-out metric with its 95% percentile-bootstrap interval over examples.

    ``scored`` is the head's ``last_scored`` (per-example records and targets of the saved weights'
    evaluation); the values equal the ``finetune`` table's last eval rows, and the resamples are the
    ablation's (:meth:`Task.intervals`). Without a held-out set the table is empty.
    """
    if scored is None or len(scored[1]) == 0:
        return pd.DataFrame(columns=INTERVAL_COLUMNS)
    records, y = scored
    method = f"percentile bootstrap over held-out examples ({task.name}), {n_bootstrap} resamples, seed {seed}"
    rows = [{"split": "eval", "metric": m, "value": v, "ci_low": lo, "ci_high": hi, "n_eval": int(len(y)),
             "n_bootstrap": int(n_bootstrap), "ci_method": method}
            for m, (v, lo, hi) in task.intervals(records, y, n_bootstrap=n_bootstrap, seed=seed).items()]
    return pd.DataFrame(rows, columns=INTERVAL_COLUMNS)


# --------------------------------------------------------------------------------------------------
# Settings
# --------------------------------------------------------------------------------------------------


def flag(name: str) -> str:
    """The ``bertology finetune`` flag of a setting (its declaration's), for error messages."""
    declared = {s.name: s.cli_flag for s in (*field_settings(FinetuneConfig), *FINETUNE_DATA_SETTINGS)}
    return declared.get(name, "--" + name.replace("_", "-"))


def resolve_config(config: FinetuneConfig, train=None) -> FinetuneConfig:
    """The settings as a run uses them: old names mapped (``objective="classification"`` is ``supervised``),
    ``contrastive="auto"`` decided by ``train`` (supervised for labelled pairs), then checked (:func:`check_config`).

    Runs, fingerprints and manifests see only the resolved settings, so the old and the new spelling
    are one run.
    """
    changes: dict = {}
    objective = OBJECTIVE_ALIASES.get(config.objective, config.objective)
    if objective != config.objective:
        changes["objective"] = objective
    if config.simcse.mode == "auto" and train is not None:
        paired = objective == "contrastive" and getattr(train, "has_pairs", False) and getattr(train, "has_labels", False)
        changes["contrastive"] = "supervised" if paired else "unsupervised"
    config = dataclasses.replace(config, **changes) if changes else config
    check_config(config)
    return config


def check_config(config: FinetuneConfig) -> None:
    """Refuse settings no run can train with (:meth:`FinetuneConfig.check`: the declarations, then the bounds one
    declaration cannot state): one line naming the flag and the setting, e.g. ``--epochs (epochs) must be ...``."""
    config.check()


# --------------------------------------------------------------------------------------------------
# The model before training
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Surgery:
    """What :func:`prepare_model` did: the depth before, the blocks kept (1-based) and the frozen tensors."""

    n_before: int
    kept: tuple[int, ...]
    frozen: list[str]


def prepare_model(model: torch.nn.Module, config: FinetuneConfig, device: torch.device) -> Surgery:
    """Drop and freeze the configured blocks (:mod:`bertology.training.surgery`), then move the model to ``device``."""
    n_before = num_blocks(model)
    surgery = config.surgery
    kept = drop_layers(model, surgery.drop_layers) if surgery.drop_layers else tuple(range(1, n_before + 1))
    frozen = freeze(model, surgery.freeze_layers, surgery.freeze_embeddings)
    model.to(device)
    return Surgery(n_before=n_before, kept=kept, frozen=frozen)


def surgery_record(model: torch.nn.Module, config: FinetuneConfig, surgery: Surgery) -> dict:
    """The manifest's ``layers`` and ``frozen`` entries (parameter counts as the model stands now)."""
    return {
        "layers": layers_record(model, surgery.n_before, config.surgery.drop_layers, surgery.kept),
        "frozen": {"layers": config.surgery.freeze_layers, "embeddings": config.surgery.freeze_embeddings, "n_tensors": len(surgery.frozen),
                   "parameters": parameter_counts(model)},
    }


def padding_id(tokenizer) -> int:
    """The tokenizer's padding id, or 0 with a warning (padding is masked out by the attention mask anyway)."""
    if tokenizer.pad_token_id is None:
        logger.warning("The tokenizer has no padding token; padding with id 0 (masked out by the attention mask).")
        return 0
    return tokenizer.pad_token_id


# --------------------------------------------------------------------------------------------------
# Schedule, loop settings and checkpoints
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Schedule:
    """Optimiser steps of a run: per epoch, in all, and of linear warm-up."""

    steps_per_epoch: int
    total_steps: int
    warmup_steps: int


def plan_schedule(config: FinetuneConfig, n_items: int) -> Schedule:
    """The step schedule for ``n_items`` training items under ``config`` (epochs, batch, accumulation, warm-up)."""
    steps_per_epoch, total_steps = plan_steps(n_items, config.batch_size, config.grad_accum, config.epochs)
    return Schedule(steps_per_epoch, total_steps, math.ceil(config.warmup_ratio * total_steps))


def loop_config(config: FinetuneConfig, schedule: Schedule, metric: str, checkpoint_dir: Path | None,
                resume: bool) -> LoopConfig:
    """The training loop's settings; ``metric`` is watched for early stopping (lower is better for ``loss`` and ``mse``)."""
    return LoopConfig(
        total_steps=schedule.total_steps, steps_per_epoch=schedule.steps_per_epoch, warmup_steps=schedule.warmup_steps,
        batch_size=config.batch_size, grad_accum=config.grad_accum, learning_rate=config.learning_rate,
        head_lr=config.head_lr, weight_decay=config.weight_decay, max_grad_norm=config.max_grad_norm, seed=config.seed,
        eval_every=config.eval_every, early_stopping=config.early_stopping, metric=metric,
        greater_is_better=higher_is_better().get(metric, metric != "loss"), save_every=config.save_every, checkpoint_dir=checkpoint_dir, resume=resume,
        dtype=config.dtype,
    )


def schedule_record(config: FinetuneConfig, schedule: Schedule, outcome: LoopOutcome) -> dict:
    """The manifest's step counts and batch settings."""
    return {
        "steps": schedule.total_steps,
        "steps_done": outcome.last_step,
        "steps_per_epoch": schedule.steps_per_epoch,
        "warmup_steps": schedule.warmup_steps,
        "epochs": config.epochs,
        "batch_size": config.batch_size,
        "grad_accum": config.grad_accum,
    }


def outcome_record(config: FinetuneConfig, metric: str, outcome: LoopOutcome) -> dict:
    """The manifest's early-stopping, checkpoint and timing entries."""
    return {
        "early_stopping": {"patience": config.early_stopping, "metric": metric, "stopped_early": outcome.stopped_early,
                           "best_step": outcome.best_step} if config.early_stopping else None,
        "checkpoints": {"every": config.save_every, "resumed_from_step": outcome.resumed_from} if config.save_every else None,
        "train_time_s": round(outcome.train_time_s, 3),
    }


def objective_record(config: FinetuneConfig, train_task: TrainTask) -> dict:
    """What a run minimised, for the manifest: the ``--objective`` value (``objective``, kept as scripts read
    it), the loss as the trainer that computes it names it (``loss``), and both as a person reads them
    (``training_objective``, e.g. "supervised (cross-entropy)"; the summary's and the report's ``objective``)."""
    return {"objective": config.objective, "loss": train_task.loss_name,
            "training_objective": f"{train_task.objective} ({train_task.loss_name})"}


@dataclass(frozen=True)
class Training:
    """How a run trained, for its manifest: the schedule, the model surgery, the loop's outcome, the metric
    early stopping watched and the device."""

    schedule: Schedule
    surgery: Surgery
    outcome: LoopOutcome
    metric: str
    device: torch.device


def training_record(config: FinetuneConfig, model: torch.nn.Module, training: Training, *, token_types: bool,
                    exclusion: dict | None, slicing: dict | None, tokenisation: dict) -> dict:
    """The manifest entries every run shares, in this order: steps and batches, the model surgery, the
    biased-data exclusion and eval slices, early stopping and timing, and the tokenisation of the data."""
    schedule, surgery, outcome, metric, device = (training.schedule, training.surgery, training.outcome, training.metric,
                                                  training.device)
    return {
        **schedule_record(config, schedule, outcome),
        "effective_batch_size": config.batch_size * config.grad_accum,
        "log_every": LOG_EVERY,
        "max_grad_norm": config.max_grad_norm,
        "device": str(device),
        "token_type_ids": token_types,
        **surgery_record(model, config, surgery),
        "excluded_words": exclusion,
        "eval_slices": slicing,
        **outcome_record(config, metric, outcome),
        "tokenisation": tokenisation,
    }


def checkpoint_fingerprint(config: FinetuneConfig, train: Corpus, eval: Corpus | None) -> str:  # noqa: A002
    """Identity of the settings that checkpoints must share to be resumed (not ``out``, ``device``, nor a setting
    that does not change the numbers: ``save_every``, the ``track_*`` settings)."""
    d = config.to_dict()
    for key in ("out", "device", "recipe", *(s.name for s in field_settings(FinetuneConfig) if not s.changes_numbers)):
        d.pop(key, None)
    parts = [d, train.fingerprint(), eval.fingerprint() if eval is not None else None]
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def prepare_checkpoints(folder: Path, fingerprint: str, resume: bool) -> None:
    """Keep the checkpoints in ``folder`` when they belong to this run and ``resume``; otherwise start afresh."""
    from bertology.results import atomic_write_text, read_json_key

    meta = folder / "run.json"
    if folder.exists():
        old = read_json_key(meta, "fingerprint")
        if not resume or old != fingerprint:
            if old is not None and old != fingerprint and resume:
                logger.warning("Discarding the checkpoints in %s: they belong to a run with other settings", folder)
            shutil.rmtree(folder)
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_text(meta, json.dumps({"fingerprint": fingerprint}))


def checkpoint_folder(config: FinetuneConfig, train: Corpus, eval: Corpus | None, resume: bool) -> Path | None:  # noqa: A002
    """``out/checkpoints`` made ready for this run when ``save_every`` asks for checkpoints, else ``None``."""
    if not config.save_every:
        return None
    folder = Path(config.out) / "checkpoints"
    prepare_checkpoints(folder, checkpoint_fingerprint(config, train, eval), resume)
    return folder
