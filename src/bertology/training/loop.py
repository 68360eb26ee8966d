"""The training loop shared by every fine-tuning objective: accumulation, schedule, evaluation,
early stopping, checkpoints and exact resumption.

A :class:`TrainTask` supplies the objective (``loss`` on a list of item positions), the evaluation and
the way a model folder is written; :func:`train_loop` does the rest:

* **Batches.** One seeded ``torch.Generator`` draws a permutation per epoch, cut into effective batches
  of ``batch_size * grad_accum`` items; each is run as ``grad_accum`` micro-batches of ``batch_size``
  whose mean losses are weighted by their share of the batch, so with dropout off ``k`` micro-batches
  of ``b`` give the same update as one batch of ``k * b`` (to float rounding).
* **Schedule.** AdamW (no weight decay on biases and LayerNorm weights, frozen parameters left out),
  linear warm-up then linear decay, gradient-norm clipping.
* **Evaluation** at step 0, every ``eval_every`` steps, at each epoch end and at the last step.
  ``early_stopping=P`` stops after ``P`` evaluations without improvement of the chosen metric and
  restores the best weights.
* **Checkpoints** (``save_every=N``): ``checkpoints/step-N/`` holds a loadable model folder plus
  ``trainer_state.pt`` (optimiser, scheduler, RNG states, step, the table so far). A run started again
  with the same settings resumes from the latest one and ends with the same weights as an
  uninterrupted run (the batch stream is replayed from the seed, the RNG states are restored).
"""
from __future__ import annotations

import logging
import math
import random
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from bertology.errors import BertologyError
from bertology.state_files import load_state, save_state
from bertology.training.precision import MixedPrecision

logger = logging.getLogger(__name__)

#: Training loss is logged (averaged over the window) every this many optimiser steps.
LOG_EVERY = 10
STATE_FILE = "trainer_state.pt"
_STEP_DIR = re.compile(r"^step-(\d+)$")


class TrainTask(Protocol):
    """What the loop needs from an objective."""

    n_items: int
    #: The kind of objective: ``supervised`` (a head fit to the data's targets) or ``contrastive``.
    objective: str
    #: What :meth:`loss` computes, by name (the manifest's ``loss``; see ``common.objective_record``).
    loss_name: str

    def loss(self, model: torch.nn.Module, indices: list[int]) -> torch.Tensor:
        """Mean loss over the items at these positions (model in train mode)."""

    def evaluate(self, model: torch.nn.Module) -> tuple[dict, list[dict]]:
        """Headline metrics and table rows (``split, metric, value`` and optional ``slice``)."""

    def save(self, model: torch.nn.Module, folder: Path) -> None:
        """Write a loadable model folder (weights as ``model.safetensors``) into ``folder``."""


class LoopObserver(Protocol):
    """What watches a run from inside the loop without changing it (``bertology finetune --track-every``: the
    tracker of :mod:`bertology.integrations.tracker`). ``step`` is the number of the optimiser step an event
    belongs to (1 for the first update); an observer must leave the weights, gradients, module modes and
    random states as it found them."""

    def prepare(self, model: torch.nn.Module) -> None:
        """Before resumption: ``model`` is still the base (as loaded and prepared, before any update)."""

    def begin(self, model: torch.nn.Module, step: int) -> None:
        """Training starts at ``step`` (0, or the checkpoint a run resumed from)."""

    def step_begin(self, step: int) -> None:
        """Optimiser step ``step`` is about to run its forward and backward passes."""

    def after_backward(self, step: int) -> None:
        """Step ``step``'s gradients are accumulated and not yet unscaled or clipped."""

    def step_end(self, model: torch.nn.Module, step: int) -> None:
        """Step ``step``'s update is done (before its evaluation and checkpoint)."""

    def evaluated(self, model: torch.nn.Module, step: int) -> None:
        """The model was evaluated at step ``step``."""

    def saved(self, step: int) -> None:
        """A checkpoint of step ``step`` was written (a resumed run starts from it)."""

    def end(self, complete: bool = True) -> None:
        """Training ended (``complete``) or was interrupted by an error."""


@dataclass
class LoopConfig:
    total_steps: int
    steps_per_epoch: int
    warmup_steps: int
    batch_size: int
    grad_accum: int = 1
    learning_rate: float = 5e-5
    head_lr: float | None = None  # the task head's peak rate (None: learning_rate); see _optimizer
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    seed: int = 0
    eval_every: int | None = None
    early_stopping: int | None = None
    metric: str = "accuracy"
    greater_is_better: bool = True
    save_every: int | None = None
    checkpoint_dir: Path | None = None
    resume: bool = True
    dtype: str = "float32"  # the training forward's autocast type (bertology.training.precision)

    @property
    def effective_batch(self) -> int:
        return self.batch_size * self.grad_accum


@dataclass
class LoopOutcome:
    rows: list[dict]
    metrics: dict  # of the returned weights (the best evaluation when early stopping restored them)
    last_step: int
    stopped_early: bool = False
    best_step: int | None = None
    resumed_from: int | None = None
    train_time_s: float = 0.0  # summed over resumed segments
    details: dict = field(default_factory=dict)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def rng_state() -> dict:
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def batch_stream(n: int, batch_size: int, seed: int, skip: int = 0) -> Iterator[list[int]]:
    """Endless seeded batches of item positions: a fresh permutation per epoch, cut into ``ceil(n / batch_size)``
    batches (the last of an epoch smaller when it must be). ``skip`` batches are drawn and discarded first
    (resumption replays the stream instead of storing it)."""
    generator = torch.Generator().manual_seed(seed)
    k = 0
    while True:
        perm = torch.randperm(n, generator=generator).tolist()
        for i in range(0, n, batch_size):
            if k >= skip:
                yield perm[i : i + batch_size]
            k += 1


def checkpoints(folder: str | Path) -> list[tuple[int, Path]]:
    """``(step, path)`` of the finished checkpoints in ``folder`` (``step-N/`` with a trainer state), by step."""
    folder = Path(folder)
    out = []
    if folder.is_dir():
        for p in folder.iterdir():
            m = _STEP_DIR.match(p.name)
            if m and p.is_dir() and (p / STATE_FILE).exists():
                out.append((int(m.group(1)), p))
    return sorted(out)


def head_parameter_names(model: torch.nn.Module) -> set[str]:
    """Names of the parameters of the task head: every parameter outside the encoder (``model.base_model``; a
    model that is its own base model, such as a bare encoder, has no head)."""
    base = getattr(model, "base_model", model)
    if base is model:
        return set()
    inside = {id(p) for p in base.parameters()}
    return {n for n, p in model.named_parameters() if id(p) not in inside}


def _optimizer(model: torch.nn.Module, cfg: LoopConfig) -> torch.optim.Optimizer:
    """AdamW over four groups: encoder and head (the head at ``head_lr``, Dozat & Manning's separate rate for the
    biaffine scorer), each with and without weight decay (none on biases and LayerNorm weights)."""
    no_decay = ("bias", "LayerNorm.weight", "layer_norm.weight", "norm.weight")
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not named:
        raise BertologyError("Every parameter is frozen; nothing would be trained.")
    head = head_parameter_names(model)
    head_lr = cfg.head_lr if cfg.head_lr is not None else cfg.learning_rate
    groups = [
        {"params": [p for n, p in named if (n in head) == is_head and n.endswith(no_decay) == bare],
         "weight_decay": 0.0 if bare else cfg.weight_decay, "lr": head_lr if is_head else cfg.learning_rate}
        for is_head in (False, True) for bare in (False, True)
    ]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=cfg.learning_rate)


def _load_weights(model: torch.nn.Module, folder: Path) -> None:
    from safetensors.torch import load_file

    if hasattr(model, "load_folder_weights"):  # a model saved as several parts (the parser: encoder + head)
        model.load_folder_weights(folder)
        return

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise BertologyError(f"Checkpoint {folder} has no safetensors weights.")
    state: dict = {}
    for f in files:
        state.update(load_file(str(f)))
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = set(getattr(model, "_tied_weights_keys", None) or [])
    missing = [k for k in missing if k not in tied]
    if missing or unexpected:
        raise BertologyError(
            f"Checkpoint {folder} does not fit the model (missing {missing[:3]}, unexpected {unexpected[:3]}); "
            "was it written with other settings? Pass --overwrite to start again."
        )


def _check(cfg: LoopConfig) -> None:
    """Refuse loop settings that cannot run, naming the setting."""
    if cfg.grad_accum < 1:
        raise BertologyError(f"grad_accum must be at least 1, not {cfg.grad_accum}.")
    if cfg.early_stopping is not None and cfg.early_stopping < 1:
        raise BertologyError(f"early_stopping (patience) must be at least 1, not {cfg.early_stopping}.")
    for name in ("eval_every", "save_every"):
        v = getattr(cfg, name)
        if v is not None and v < 1:
            raise BertologyError(f"{name} must be at least 1, not {v}.")


class _Run:
    """One call of :func:`train_loop`: the optimiser, schedule and precision, and every piece of state a
    checkpoint saves (table rows, loss window, running loss, best evaluation, time) so a resumed run
    continues exactly where the interrupted one stopped."""

    def __init__(self, model: torch.nn.Module, task: TrainTask, cfg: LoopConfig) -> None:
        from transformers import get_linear_schedule_with_warmup

        self.model, self.task, self.cfg = model, task, cfg
        self.optimizer = _optimizer(model, cfg)
        self.scheduler = get_linear_schedule_with_warmup(self.optimizer, cfg.warmup_steps, cfg.total_steps)
        self.device = next(model.parameters()).device
        self.precision = MixedPrecision.create(cfg.dtype, self.device)
        self.rows: list[dict] = []
        self.window: list[float] = []
        self.running: float | None = None
        self.best: dict = {"value": None, "step": None, "metrics": None, "state": None, "bad": 0}
        self.start_step, self.resumed_from, self.time_before = 0, None, 0.0
        self.last_metrics: dict = {}
        self.t_start = time.perf_counter()

    def resume(self) -> None:
        """Restore the latest checkpoint of ``cfg.checkpoint_dir`` (when resuming and there is one)."""
        cfg = self.cfg
        found = checkpoints(cfg.checkpoint_dir) if cfg.resume and cfg.checkpoint_dir is not None else []
        if not found:
            return
        step0, path = found[-1]
        state = load_state(path / STATE_FILE, remedy=f"Delete {path} to resume from an earlier "
                           "checkpoint, or the run folder to train afresh.")
        getattr(self.task, "load_weights", _load_weights)(self.model, path)  # a LoRA run: its adapter's weights
        self.model.to(self.device)
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.precision.load_state_dict(state.get("scaler"))
        set_rng_state(state["rng"])
        self.rows, self.window, self.running = state["rows"], state["window"], state["running"]
        self.best = state["best"]
        self.last_metrics = state.get("last_metrics", {})
        self.time_before = state.get("train_time_s", 0.0)
        self.start_step = self.resumed_from = step0
        logger.info("Resuming from %s (step %d of %d)", path, step0, cfg.total_steps)

    def train_time(self) -> float:
        return self.time_before + (time.perf_counter() - self.t_start)

    def evaluate(self, step: int) -> None:
        """Evaluate, add the rows to the table and keep the metrics."""
        metrics, eval_rows = self.task.evaluate(self.model)
        epoch = step / self.cfg.steps_per_epoch
        for r in eval_rows:
            self.rows.append({"step": step, "epoch": epoch, **r})
        logger.info("step %d (epoch %.2f): %s", step, epoch,
                    ", ".join(f"{k} {v:.4f}" for k, v in metrics.items() if isinstance(v, float)))
        self.last_metrics = metrics

    def optimiser_step(self, step: int, indices: list[int], observer: LoopObserver | None = None) -> None:
        """One optimiser step on the effective batch ``indices``; the loss window's rows when a log step.
        ``observer`` sees the gradients before they are unscaled and clipped."""
        cfg, model = self.cfg, self.model
        self.optimizer.zero_grad(set_to_none=True)
        total = accumulate_gradients(model, self.task, indices, cfg.batch_size, step, cfg.learning_rate,
                                     precision=self.precision)
        if observer is not None:
            observer.after_backward(step)
        if cfg.max_grad_norm and cfg.max_grad_norm > 0:
            self.precision.unscale(self.optimizer)
            torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], cfg.max_grad_norm)
        lr = self.scheduler.get_last_lr()[0]
        self.precision.step(self.optimizer)
        self.scheduler.step()
        self.window.append(total)
        self.running = total if self.running is None else 0.9 * self.running + 0.1 * total
        if step % LOG_EVERY == 0 or step % cfg.steps_per_epoch == 0 or step == cfg.total_steps:
            epoch = step / cfg.steps_per_epoch
            self.rows.append({"step": step, "epoch": epoch, "split": "train", "metric": "loss", "value": float(np.mean(self.window))})
            self.rows.append({"step": step, "epoch": epoch, "split": "train", "metric": "learning_rate", "value": float(lr)})
            self.window = []

    def stop_early(self, step: int) -> bool:
        """Whether early stopping ends the run after this evaluation (keeping the best weights so far)."""
        cfg, metrics, best = self.cfg, self.last_metrics, self.best
        if cfg.metric not in metrics:
            raise BertologyError(
                f"Early stopping watches {cfg.metric!r}, which the evaluation does not report "
                f"(it reports {', '.join(k for k in metrics if isinstance(metrics[k], float))})."
            )
        value = float(metrics[cfg.metric])
        if best["value"] is None or (value > best["value"] if cfg.greater_is_better else value < best["value"]):
            best.update(value=value, step=step, metrics=dict(metrics), bad=0,
                        state={k: v.detach().to("cpu", copy=True) for k, v in self.model.state_dict().items()})
            return False
        best["bad"] += 1
        return best["bad"] >= cfg.early_stopping

    def save_checkpoint(self, step: int) -> None:
        """``checkpoints/step-N/``: the model folder plus everything :meth:`resume` restores."""
        from bertology.results import atomic_folder

        state = {
            "step": step, "optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
            "scaler": self.precision.state_dict(), "rng": rng_state(), "rows": self.rows, "window": self.window,
            "running": self.running, "best": self.best, "last_metrics": self.last_metrics,
            "train_time_s": self.train_time(),
        }

        def write(tmp: Path) -> None:
            self.task.save(self.model, tmp)
            save_state(state, tmp / STATE_FILE)

        atomic_folder(Path(self.cfg.checkpoint_dir) / f"step-{step}", write)

    def outcome(self, step: int, stopped_early: bool) -> LoopOutcome:
        """The result; with early stopping the best evaluation's weights are put back first."""
        cfg, best = self.cfg, self.best
        metrics, best_step = self.last_metrics, None
        if cfg.early_stopping is not None and best["step"] is not None:
            best_step = best["step"]
            if best_step != step and best["state"] is not None:
                self.model.load_state_dict(best["state"])
                logger.info("Restored the best weights (step %d, %s %.4f)", best_step, cfg.metric, best["value"])
            metrics = best["metrics"]
        return LoopOutcome(rows=self.rows, metrics=metrics, last_step=step, stopped_early=stopped_early,
                           best_step=best_step, resumed_from=self.resumed_from, train_time_s=self.train_time())


def train_loop(
    model: torch.nn.Module,
    task: TrainTask,
    cfg: LoopConfig,
    *,
    progress: bool = False,
    on_step: Callable[[int], None] | None = None,
    observer: LoopObserver | None = None,
) -> LoopOutcome:
    """Train ``model`` on ``task`` (see the module docs). ``on_step(step)`` is called after every optimiser
    step and any evaluation or checkpoint of that step (tests use it to interrupt a run). ``observer``
    (:class:`LoopObserver`) is told of every step, evaluation and the run's start and end."""
    from bertology.progress import BarText, progress_bar

    _check(cfg)
    run = _Run(model, task, cfg)
    if observer is not None:
        observer.prepare(model)  # before resume(): the model is still the base
    try:
        run.resume()
        run.t_start = time.perf_counter()
        if run.start_step == 0:
            run.evaluate(0)
        stopped_early = False
        batches = batch_stream(task.n_items, cfg.effective_batch, cfg.seed, skip=run.start_step)
        model.train()
        step = run.start_step
        fields = {"epoch": step / cfg.steps_per_epoch, "loss": "-" if run.running is None else f"{run.running:.4f}"}
        if observer is not None:
            observer.begin(model, step)
        text = BarText(template="epoch {task.fields[epoch]:.2f}  loss {task.fields[loss]}", fields=fields)
        with progress_bar("fine-tuning", cfg.total_steps, progress, text=text, completed=step, stderr=True) as advance:
            while step < cfg.total_steps:
                step += 1
                if observer is not None:
                    observer.step_begin(step)
                run.optimiser_step(step, next(batches), observer)
                if observer is not None:
                    observer.step_end(model, step)
                if advance is not None:
                    advance(1, epoch=step / cfg.steps_per_epoch, loss=f"{run.running:.4f}")
                last = step == cfg.total_steps
                if step % cfg.steps_per_epoch == 0 or last or (cfg.eval_every and step % cfg.eval_every == 0):
                    run.evaluate(step)
                    model.train()
                    if observer is not None:
                        observer.evaluated(model, step)
                    stopped_early = cfg.early_stopping is not None and run.stop_early(step)
                if cfg.save_every and cfg.checkpoint_dir is not None and (step % cfg.save_every == 0 or last or stopped_early):
                    run.save_checkpoint(step)
                    if observer is not None:
                        observer.saved(step)
                if on_step is not None:
                    on_step(step)
                if stopped_early:
                    logger.info("Early stopping at step %d: no %s improvement in %d evaluations (best %.4f at step %d)",
                                step, cfg.metric, cfg.early_stopping, run.best["value"], run.best["step"])
                    break
    except BaseException:
        if observer is not None:
            observer.end(complete=False)
        raise
    finally:
        model.eval()
    if observer is not None:
        observer.end()
    return run.outcome(step, stopped_early)


def accumulate_gradients(
    model: torch.nn.Module, task: TrainTask, indices: list[int], batch_size: int, step: int = 0, learning_rate: float = 0.0,
    *, precision: MixedPrecision | None = None,
) -> float:
    """Add the gradient of the mean loss over ``indices`` to ``.grad``, in micro-batches of ``batch_size``.

    Each micro-batch's mean loss is weighted by its share of the items, so the accumulated gradient
    is the gradient of the whole batch's mean loss (equal to one big batch up to float rounding).
    Returns that mean loss. A non-finite loss is one clear error naming the step. With ``precision``
    the forward runs under its autocast and the backward through its loss scaler (the gradients are
    then scaled until :meth:`MixedPrecision.unscale`).
    """
    precision = precision or MixedPrecision("cpu")
    total = 0.0
    for j in range(0, len(indices), batch_size):
        micro = indices[j : j + batch_size]
        with precision.autocast():
            loss = task.loss(model, micro)
        if not torch.isfinite(loss):
            raise BertologyError(
                f"The training loss became {float(loss)} at step {step}; lower the learning rate (now {learning_rate})."
            )
        precision.backward(loss * (len(micro) / len(indices)))
        total += float(loss.detach()) * len(micro) / len(indices)
    return total


def plan_steps(n_items: int, batch_size: int, grad_accum: int, epochs: float) -> tuple[int, int]:
    """``(steps_per_epoch, total_steps)`` for ``n_items`` items in effective batches of ``batch_size * grad_accum``."""
    steps_per_epoch = math.ceil(n_items / (batch_size * grad_accum))
    return steps_per_epoch, max(1, math.ceil(epochs * steps_per_epoch))
