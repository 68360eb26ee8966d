"""One fine-tuning run, whatever is trained: check, split, load, prepare, encode, train, save, record.

:meth:`TaskTrainer.run` is the flow every objective shares (written once, so a fix to seeding, surgery,
checkpoints or the save reaches every task); a subclass says only what is its own:

* :meth:`TaskTrainer.prepare_data`: its inputs' checks, the sample, the held-out split, the word filters;
* :meth:`TaskTrainer.load`: the model with its head (a fresh head is drawn from the seeded RNG);
* :meth:`TaskTrainer.make_head`: the targets and encodings, as the loop's :class:`~bertology.training.loop.TrainTask`;
* :meth:`TaskTrainer.finish`: the predictions, extra tables and the manifest entries of its own.

The sequence heads, the tagger, the parser, question answering (:mod:`bertology.training.finetune`,
``tagging``, ``parser``, ``qa``) and SimCSE (``contrastive``) are subclasses.
"""
from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from bertology.config import FinetuneConfig, parse_word_list
from bertology.errors import BertologyError
from bertology.models.device import resolve_device
from bertology.results import atomic_folder
from bertology.tasks.base import Task
from bertology.training.common import (
    INTERVALS_TABLE, FinetuneResult, Training, check_config, checkpoint_folder, interval_table, loop_config, make_table,
    objective_record, plan_schedule, prepare_model, training_record,
)
from bertology.training.data import eval_slices, exclude_examples
from bertology.training.lora import MERGED_DIR, AdapterSaving, save_merged, wrap_lora
from bertology.training.loop import LoopObserver, LoopOutcome, TrainTask, seed_everything, train_loop
from bertology.training.recipes import apply_recipe, recipe_record

logger = logging.getLogger(__name__)


#: Makes the loop's observer of a run that tracks its model (``track_every``): ``(config, tokenizer, probe data)``
#: -> a :class:`~bertology.training.loop.LoopObserver` with a ``record()`` for the manifest. The tracker lives
#: above the training room (:func:`bertology.integrations.tracker.finetune_tracker`), so the caller hands it in.
TrackerFactory = Callable[[FinetuneConfig, Any, Any], LoopObserver]


def observe(config: FinetuneConfig, tracker: TrackerFactory | None, tokenizer: Any, data: "RunData") -> LoopObserver | None:
    """The loop's observer: ``tracker``'s, probing the held-out data (else the training data), when ``track_every``
    is set; None otherwise. ``track_every`` without a ``tracker`` is one clear error."""
    if not config.tracking.every:
        return None
    if tracker is None:
        raise BertologyError("--track-every (track_every) needs the tracker of bertology.integrations: run bertology "
                             "finetune or bertology.finetune(...), or pass tracker=finetune_tracker.")
    return tracker(config, tokenizer, data.eval if data.eval is not None else data.train)


def random_split(n: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Sorted indices of a seeded train / held-out split of ``n`` sentences (no labels to stratify by)."""
    from sklearn.model_selection import train_test_split

    try:
        tr, ev = train_test_split(np.arange(n), test_size=fraction, random_state=seed, shuffle=True)
    except ValueError as err:
        raise BertologyError(f"Cannot split {n} sentences with eval_fraction={fraction}: {err}") from None
    return np.sort(tr), np.sort(ev)


@dataclass
class RunData:
    """The data a run trains and evaluates on, after sampling, the held-out split and the word filters."""

    train: Any  # a Corpus, or SquadData for question answering
    eval: Any  # the held-out data (None: a contrastive run without eval data)
    split: dict | None = None  # the manifest's ``split`` (None: no held-out set)
    exclusion: dict | None = None  # what ``exclude_words`` dropped
    slices: dict | None = None  # eval slice name -> mask over the eval data
    slicing: dict | None = None  # the manifest's ``eval_slices``


def tuned_record(base: dict, trained: dict, lora: dict | None) -> dict:
    """The manifest's ``models.tuned`` description (its folder and weights' hash are added when it is saved): the
    trained model's architecture, named after its base; a LoRA run's adapter in the fields a compare of an adapter
    records (``peft_type``, ``r``, ``lora_alpha``, ``target_modules``, ``base``)."""
    keep = ("model_type", "family", "class", "is_classifier", "num_hidden_layers", "num_attention_heads", "hidden_size",
            "attn_implementation")
    out = {"name": f"{base.get('name') or 'base'}, fine-tuned", "source": "this run",
           **{k: trained[k] for k in keep if k in trained}}
    if lora is not None:
        out["adapter"] = {"peft_type": "LORA", "base": lora.get("base"), "r": lora.get("rank"),
                          "lora_alpha": lora.get("alpha"), "target_modules": list(lora.get("targets") or []),
                          "modules_to_save": list(lora.get("modules_to_save") or [])}
    return out


@dataclass
class ModelToTrain:
    """The model to train, its tokenizer, and where it came from."""

    model: torch.nn.Module
    tokenizer: Any
    # the model as it stands when called: before training it gives the manifest's ``models.base``, after it the
    # architecture of ``models.tuned`` (layers removed, the task head)
    describe: Callable[[], dict]
    name: str  # for the log
    reused_head: bool = False  # whether the checkpoint's own head was kept
    label2id: dict[str, int] = field(default_factory=dict)


@dataclass
class Finish:
    """What a trainer adds to the shared result: predictions, tables, metrics and manifest entries."""

    predictions: pd.DataFrame | None = None
    extra_tables: dict[str, pd.DataFrame] = field(default_factory=dict)
    record: dict = field(default_factory=dict)  # manifest entries after the shared training record
    metrics: dict | None = None  # replaces the final metrics (contrastive: adds anisotropy, train loss)


class TaskTrainer(ABC):
    """The flow of one fine-tuning run (:meth:`run`); subclasses fill in the steps of their own."""

    #: The task trained (chosen in :meth:`prepare_data` where it depends on the data); None: no task head.
    task: Task | None = None
    #: Why this task, in words (the manifest's ``task_choice``).
    task_choice: str = ""
    #: What one training item is, for the log.
    unit: str = "examples"
    #: The labels (classes, tags, relations) the head predicts, in the manifest; None for a numeric target.
    labels: list[str] | None = None
    #: The recipe (:data:`bertology.training.recipes.RECIPES`) whose defaults fill the settings left unset.
    recipe_name: str = "classification"

    def __init__(self, config: FinetuneConfig) -> None:
        self.config = config

    # ------------------------------------------------------------------ what differs per trainer

    @abstractmethod
    def prepare_data(self, train, eval) -> RunData:  # noqa: A002 - the name finetune() uses
        """Check the inputs, sample, split off the held-out set, apply the word filters."""

    @abstractmethod
    def load(self, data: RunData) -> ModelToTrain:
        """The model with this trainer's head (called right after seeding: a fresh head is seeded)."""

    @abstractmethod
    def make_head(self, loaded: ModelToTrain, data: RunData, device: torch.device) -> TrainTask:
        """The loop's view of the objective on the encoded data (after the model surgery); besides the loop's
        :class:`~bertology.training.loop.TrainTask` it has ``use_token_types`` and ``tokenisation()`` (for the
        manifest) and, with a task, ``last_scored`` (the records the final intervals resample)."""

    def finish(self, loaded: ModelToTrain, head: TrainTask, data: RunData, outcome: LoopOutcome) -> Finish:
        """Predictions, extra tables and the manifest entries of this trainer (weights as they will be saved)."""
        return Finish()

    def task_record(self, loaded: ModelToTrain, data: RunData) -> dict:
        """The manifest entries that name the task, before the training record."""
        return {"task": self.task.name, "task_choice": self.task_choice, "split": data.split, "labels": self.labels,
                "reused_checkpoint_head": loaded.reused_head}

    def default_metric(self) -> str:
        """The metric early stopping watches unless ``early_stopping_metric`` names one: the task's own primary
        metric, also where a dataset names another main metric (CoLA's MCC; pick it with the setting)."""
        return self.task.default_metric

    def final_metrics(self, head: TrainTask, model: torch.nn.Module, outcome: LoopOutcome) -> dict:
        """The metrics of the weights that are saved: evaluated again when this process has not scored them
        (a run resumed at its last step) or early stopping put back an earlier step's weights."""
        if getattr(head, "last_scored", None) is None or (outcome.best_step is not None and outcome.best_step != outcome.last_step):
            return head.evaluate(model)[0]
        return outcome.metrics

    def counts(self, head: TrainTask, data: RunData) -> tuple[int, int]:
        """``(n_train, n_eval)`` of the result."""
        return len(data.train), len(data.eval)

    # ------------------------------------------------------------------ shared by the trainers' steps

    def held_out(self, train, eval, split: Callable) -> RunData:  # noqa: A002
        """The held-out set (``eval``, or a seeded split of ``train``: ``split(train)`` gives the training and
        held-out indices and the manifest's words on the split), then the training examples ``exclude_words``
        drops and the eval slices by word (``slice_words``, else the excluded words)."""
        config = self.config
        if eval is None:
            if not 0 < config.eval_fraction < 1:
                raise BertologyError(f"eval_fraction (--eval-fraction) must be between 0 and 1 (exclusive) when no eval "
                                     f"data is given, not {config.eval_fraction!r}.")
            tr, ev, how = split(train)
            eval = train.subset([int(i) for i in ev], name=f"{train.name} (held out)")  # noqa: A001
            train = train.subset([int(i) for i in tr], name=f"{train.name} (train)")
            record = {"source": "split", "eval_fraction": config.eval_fraction, **how}
        else:
            if len(eval) == 0:
                raise BertologyError(f"The eval data {eval.name!r} ({eval.source}) has no examples.")
            record = {"source": "eval_data"}
        exclusion = None
        if config.words.exclude:
            words = parse_word_list(list(config.words.exclude))
            train, exclusion = exclude_examples(train, words)
            if len(train) == 0:
                raise BertologyError(f"Every training {self.unit[:-1]} mentions one of {', '.join(words)}; "
                                     "nothing is left to train on.")
            logger.info("Dropped %d of %d training %s that mention %s", exclusion["n_dropped"], exclusion["n_before"],
                        self.unit, ", ".join(words))
        slices, slicing = eval_slices(eval, parse_word_list(list(config.words.slices or config.words.exclude)), exclusion)
        record.update(n_train=len(train), n_eval=len(eval))
        return RunData(train, eval, record, exclusion, slices, slicing)

    # ------------------------------------------------------------------ the shared flow

    def check_metric(self) -> None:
        """The early-stopping metric must be one the task reports."""
        metric, task = self.config.early_stopping_metric, self.task
        if task is not None and metric is not None and metric not in task.metrics:
            raise BertologyError(f"--early-stopping-metric {metric!r} is not a metric of the {task.name} task; "
                                 f"choose from {', '.join(task.metrics)}.")

    def run(self, train, eval=None, *, progress: bool = False, resume: bool = True,  # noqa: A002
            on_step=None, tracker: TrackerFactory | None = None) -> FinetuneResult:
        """Fine-tune: check, prepare the data, seed, load, prepare the model, train, save, record.

        ``tracker`` makes the loop's observer when ``track_every`` asks for one (see :func:`observe`)."""
        t0 = time.perf_counter()
        config = self.config = apply_recipe(self.config, self.recipe_name)
        check_config(config)
        data = self.prepare_data(train, eval)
        self.check_metric()
        device = resolve_device(config.device)
        seed_everything(config.seed)
        loaded = self.load(data)
        base_record = loaded.describe()  # the base as loaded, before any layer is removed or an adapter put in
        surgery = prepare_model(loaded.model, config, device)
        lora = wrap_lora(loaded.model, config, self.task.name if self.task else "contrastive") if config.method == "lora" else None
        head = self.make_head(loaded, data, device)
        if lora is not None:  # checkpoints and the model folder hold the adapter (LoRA + head)
            head = AdapterSaving(head, lora, loaded.tokenizer)
        schedule = plan_schedule(config, head.n_items)
        logger.info("Fine-tuning %s (%s) on %d %s: %d steps (%d per epoch, %g epochs), batch %d x %d, lr %g (head %g)",
                    loaded.name, self.task.name if self.task else head.objective, head.n_items, self.unit,
                    schedule.total_steps, schedule.steps_per_epoch, config.epochs, config.batch_size, config.grad_accum,
                    config.learning_rate, config.head_lr)
        checkpoint_dir = checkpoint_folder(config, data.train, data.eval, resume)
        metric = config.early_stopping_metric or self.default_metric()
        observer = observe(config, tracker, loaded.tokenizer, data)
        outcome = train_loop(loaded.model, head, loop_config(config, schedule, metric, checkpoint_dir, resume),
                             progress=progress, on_step=on_step, observer=observer)
        metrics = self.final_metrics(head, loaded.model, outcome)
        done = self.finish(loaded, head, data, outcome)
        model_dir = atomic_folder(Path(config.out) / "model", lambda tmp: head.save(loaded.model, tmp))
        details = self._details(loaded, head, data, Training(schedule, surgery, outcome, metric, device), done)
        details["base_model"] = base_record
        details["tuned_model"] = tuned_record(base_record, loaded.describe(), lora.record if lora is not None else None)
        details["lora"] = lora.record if lora is not None else None
        details["tracking"] = observer.record() if observer is not None else None
        if lora is not None and config.lora.merge:
            merged = atomic_folder(Path(config.out) / MERGED_DIR, lambda tmp: save_merged(lora, loaded.tokenizer, tmp))
            details["lora"] = {**lora.record, "merged_model_dir": str(merged)}
        n_train, n_eval = self.counts(head, data)
        wall = time.perf_counter() - t0
        logger.info("Saved the fine-tuned model to %s (%.1f s)", model_dir, wall)
        if self.task is not None:
            done.extra_tables = {INTERVALS_TABLE: interval_table(self.task, head.last_scored, seed=config.seed),
                                 **done.extra_tables}
        return FinetuneResult(model_dir=model_dir, table=make_table(outcome.rows),
                              metrics=done.metrics if done.metrics is not None else metrics, n_train=n_train,
                              n_eval=n_eval, wall_time_s=wall, label2id=loaded.label2id, predictions=done.predictions,
                              details=details, extra_tables=done.extra_tables)

    def _details(self, loaded: ModelToTrain, head: TrainTask, data: RunData, training: Training, done: Finish) -> dict:
        """The manifest's ``result``: objective, task, the shared training record, the trainer's own, the base model."""
        return {
            **objective_record(self.config, head),
            **self.task_record(loaded, data),
            **training_record(self.config, loaded.model, training, token_types=head.use_token_types,
                              exclusion=data.exclusion, slicing=data.slicing, tokenisation=head.tokenisation()),
            **done.record,
            "recipe": recipe_record(self.config),
        }
