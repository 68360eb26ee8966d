"""Fine-tuning: the entry point (:func:`finetune`), and the sequence heads: a classifier or a regressor.

:func:`finetune` resolves and checks the settings (:func:`~bertology.training.common.resolve_config`)
and runs the trainer the settings and data call for, each a :class:`~bertology.training.skeleton.TaskTrainer`:
a sequence head here (``AutoModelForSequenceClassification`` on sentences or sentence pairs; the
task, :mod:`bertology.tasks`, is classification, or regression with one output and
``problem_type="regression"``), a tagger (:mod:`bertology.training.tagging`), a dependency parser
(:mod:`bertology.training.parser`), extractive QA (:mod:`bertology.training.qa`) or a SimCSE sentence
encoder (``objective="contrastive"``, :mod:`bertology.training.contrastive`). :func:`read_data` reads
the data files a config names with the reader the task needs (SQuAD JSON for ``qa``).

Every run evaluates the task's metrics on a held-out split (step 0, every ``eval_every`` steps, every
epoch end, the last step) and saves a Hugging Face folder (model + tokenizer, safetensors) that the rest
of bertology (``compare --tuned``) reads back. One ``seed`` drives the head initialisation, the split,
the shuffling and dropout, so two runs with the same config on the same machine give identical weights.
The lab's experiments are settings of the same call: ``drop_layers`` / ``freeze_layers`` /
``freeze_embeddings`` (:mod:`bertology.training.surgery`), ``exclude_words`` / ``slice_words``
(:mod:`bertology.training.data`), and the loop's hygiene (:mod:`bertology.training.loop`: gradient
accumulation, early stopping, checkpoints and exact resumption).

Classifier labels are strings; they are mapped to ids in sorted order (``"-1" -> 0``, ``"1" -> 1``)
unless the checkpoint already has a classification head whose ``label2id`` covers exactly the same
labels, in which case its mapping is kept. ``id2label``/``label2id`` are stored in the saved config.
"""
from __future__ import annotations

import copy
import logging
from abc import abstractmethod
from collections.abc import Sequence

import numpy as np
import pandas as pd
import torch

from bertology.config import FinetuneConfig
from bertology.data.corpus import Corpus, require_labels
from bertology.data.encode import encode_corpus
from bertology.errors import BertologyError
from bertology.tasks.base import Task
from bertology.tasks.catalog import choose_task
from bertology.tasks.main_metric import MainMetric, main_metric
from bertology.tasks.regression import regression_targets
from bertology.training.common import (  # TABLE_COLUMNS, FinetuneResult: also importable from here
    TABLE_COLUMNS, FinetuneResult, resolve_config,
)
from bertology.training.contrastive import ContrastiveTrainer
from bertology.training.data import SLICE_WITH, SLICE_WITHOUT
from bertology.training.heads import Batching, HeadTask  # HeadTask: also importable from here
from bertology.training.loop import LoopOutcome
from bertology.training.parser import ParserTrainer
from bertology.training.qa import QATrainer
from bertology.training.recipes import apply_recipe
from bertology.training.skeleton import Finish, ModelToTrain, RunData, TaskTrainer
from bertology.training.tagging import TaggerTrainer, is_tagging_run

logger = logging.getLogger(__name__)
__all__ = ["TABLE_COLUMNS", "FinetuneResult", "HeadTask", "finetune", "read_data", "trainer_for"]


# --------------------------------------------------------------------------------------------------
# Labels and splits
# --------------------------------------------------------------------------------------------------


def _check_labels(corpus: Corpus, role: str) -> list[str]:
    """Every example's label as a string; a clear error when any is missing."""
    require_labels(corpus, "Fine-tuning needs a label for every example", f"{role} data", lack="none")
    return [str(ex.label) for ex in corpus]


def regression_strata(values: Sequence[float], bins: int = 5) -> list[str]:
    """Quantile bins of regression targets: the held-out split keeps the training data's spread of scores."""
    codes = pd.qcut(np.asarray(values, dtype=np.float64), q=bins, labels=False, duplicates="drop")
    return [str(c) for c in codes]


def _target_stats(y: np.ndarray) -> dict:
    """What the manifest says of regression targets: their count, range, mean and spread."""
    return {"n": int(y.size), "min": float(y.min()), "max": float(y.max()), "mean": float(y.mean()), "std": float(y.std())}


def _stratified_split(labels: Sequence[str], fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray, bool]:
    """Indices of a seeded train/held-out split, stratified by label (a regression's quantile bin) when every class allows it."""
    from sklearn.model_selection import train_test_split

    idx = np.arange(len(labels))
    try:
        tr, ev = train_test_split(idx, test_size=fraction, random_state=seed, stratify=list(labels), shuffle=True)
        stratified = True
    except ValueError as err:
        logger.warning("Could not stratify the held-out split (%s); splitting at random instead.", err)
        try:
            tr, ev = train_test_split(idx, test_size=fraction, random_state=seed, shuffle=True)
        except ValueError as err2:
            raise BertologyError(f"Cannot split {len(labels)} examples with eval_fraction={fraction}: {err2}") from err2
        stratified = False
    if len(tr) == 0 or len(ev) == 0:
        raise BertologyError(
            f"eval_fraction={fraction} leaves {len(tr)} training and {len(ev)} held-out examples out of "
            f"{len(labels)}; use more data or a different --eval-fraction."
        )
    return np.sort(tr), np.sort(ev), stratified


# --------------------------------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------------------------------


def _load_with_head(config: FinetuneConfig, k: int):
    """Load the model with a ``k``-output sequence head; return it and whether the checkpoint's own head was kept.

    A checkpoint without such a head gets a fresh one (initialised from the seeded RNG). A checkpoint
    whose head has a different number of outputs gets a fresh head too (the encoder weights are kept).
    """
    from transformers import AutoConfig, AutoModelForSequenceClassification

    from bertology.models.loading import load_model

    try:
        loaded = load_model(config.model, kind="classifier", num_labels=k, trust_remote_code=config.trust_remote_code)
    except RuntimeError as err:
        if "mismatch" not in str(err).lower():
            raise
        # The checkpoint already has a head of another size: load it as it is, then move every weight
        # that fits into a fresh k-label model (the head is the only part that does not fit).
        old = load_model(config.model, kind="classifier", trust_remote_code=config.trust_remote_code)
        logger.warning(
            "%s has a %d-label classification head; replacing it with a fresh %d-label head.",
            config.model, old.model.config.num_labels, k,
        )
        cfg = copy.deepcopy(old.model.config)
        cfg.num_labels = k
        cfg.id2label = {i: f"LABEL_{i}" for i in range(k)}
        cfg.label2id = {v: i for i, v in cfg.id2label.items()}
        new = AutoModelForSequenceClassification.from_config(
            cfg, attn_implementation="eager", trust_remote_code=config.trust_remote_code
        )
        target = new.state_dict()
        fits = {n: t for n, t in old.model.state_dict().items() if n in target and target[n].shape == t.shape}
        new.load_state_dict(fits, strict=False)
        new.eval()
        old.model = new
        loaded = old
        reused_head = False
    else:
        reused_head = _checkpoint_has_head(loaded.path, config.trust_remote_code, AutoConfig)
    return loaded, reused_head


def _load_regressor(config: FinetuneConfig):
    """Load the model with a one-output regression head (``problem_type="regression"``, MSE loss)."""
    loaded, reused_head = _load_with_head(config, 1)
    cfg = loaded.model.config
    cfg.problem_type = "regression"
    cfg.id2label, cfg.label2id = {0: "score"}, {"score": 0}
    return loaded, reused_head


def _start_at_the_mean(model: torch.nn.Module, mean: float) -> float | None:
    """Set a fresh regression head's output bias to the training targets' mean; return it.

    A fresh head predicts about 0, so on targets such as STS-B's 0-5 scores (mean ~2.7) the first
    hundred steps only move the bias to the mean; starting there, training begins at the targets'
    variance and goes straight to what the encoder can tell. The output layer is the head's last
    one-output ``Linear`` (``classifier`` in BERT, ``classifier.out_proj`` in RoBERTa-style heads).
    """
    heads = [m for name, m in model.named_modules()
             if name.startswith("classifier") and isinstance(m, torch.nn.Linear) and m.out_features == 1]
    if not heads or heads[-1].bias is None:
        logger.info("regression head: no one-output layer with a bias found; it starts as initialised")
        return None
    with torch.no_grad():
        heads[-1].bias.fill_(mean)
    return mean


def _load_classifier(config: FinetuneConfig, labels: list[str]):
    """Load the model with a ``len(labels)``-way head and decide the label -> id mapping.

    A head of the right size is reused; its label mapping is kept when it names exactly our labels,
    otherwise labels are numbered in sorted order.
    """
    loaded, reused_head = _load_with_head(config, len(labels))
    k = len(labels)
    label2id = {lab: i for i, lab in enumerate(labels)}
    if reused_head:
        ckpt = {str(k_): int(v) for k_, v in (loaded.model.config.label2id or {}).items()}
        if set(ckpt) == set(labels) and sorted(ckpt.values()) == list(range(k)):
            label2id = {lab: ckpt[lab] for lab in labels}
            logger.info("Reusing the checkpoint's classification head and its label mapping %s", label2id)
        else:
            logger.info("Reusing the checkpoint's %d-label classification head with labels numbered in sorted order", k)
    cfg = loaded.model.config
    cfg.label2id = dict(label2id)
    cfg.id2label = {i: lab for lab, i in label2id.items()}
    cfg.problem_type = "single_label_classification"
    return loaded, label2id, reused_head


def _checkpoint_has_head(path: str, trust_remote_code: bool, auto_config) -> bool:
    try:
        cfg = auto_config.from_pretrained(path, trust_remote_code=trust_remote_code)
    except Exception:  # pragma: no cover - the model loaded, so its config did too
        return False
    return any(a.endswith("ForSequenceClassification") for a in (getattr(cfg, "architectures", None) or []))


# --------------------------------------------------------------------------------------------------
# The sequence heads
# --------------------------------------------------------------------------------------------------


class SequenceTrainer(TaskTrainer):
    """A sequence head (one prediction per sentence or pair): what the classifier and the regressor share."""

    #: The held-out split's strata, in words (the manifest's ``split.strata``).
    strata_name = "labels"
    #: The end of the error for training data with a single label.
    single_label_hint = "."

    def __init__(self, config: FinetuneConfig, task: Task, reason: str, main: MainMetric | None = None) -> None:
        super().__init__(config)
        #: the metric the run is judged by (CoLA's MCC ...): reported beside the task's own, and first
        self.main = main or MainMetric(task.default_metric, f"the {task.name} task's own")
        self.task, self.task_choice = task.with_main(self.main.metric), reason
        self.distinct: list[str] = []

    def task_record(self, loaded: ModelToTrain, data: RunData) -> dict:
        """The task's manifest entries, with the main metric and why it is the main one."""
        return {**super().task_record(loaded, data), "main_metric": self.main.to_dict()}

    @property
    def recipe_name(self) -> str:  # type: ignore[override]
        """The recipe of the task chosen (classification or regression)."""
        return self.task.name

    def strata(self, labels: list[str]) -> list[str]:
        """What the held-out split is stratified by."""
        return labels

    def check_labels(self, distinct: list[str], eval_labels: list[str]) -> None:
        """Refuse training labels the head cannot learn from, or eval labels it cannot predict."""

    @abstractmethod
    def targets(self, loaded: ModelToTrain, corpus: Corpus, what: str) -> np.ndarray:
        """Each example's target (corpus order)."""

    def split(self, train: Corpus) -> tuple[np.ndarray, np.ndarray, dict]:
        labels = [str(ex.label) for ex in train]
        tr, ev, stratified = _stratified_split(self.strata(labels), self.config.eval_fraction, self.config.seed)
        return tr, ev, {"stratified": stratified, "seed": self.config.seed, "strata": self.strata_name}

    def prepare_data(self, train: Corpus, eval: Corpus | None) -> RunData:  # noqa: A002
        max_n = self.config.data.max_examples
        if max_n is not None and len(train) > max_n:
            train = train.stratified_sample(max_n, self.config.seed)
            logger.info("Using a seeded sample of %d of the training examples (max_examples)", max_n)
        if eval is not None and len(eval):
            _check_labels(eval, "eval")
        data = self.held_out(train, eval, self.split)
        self.distinct = sorted({str(ex.label) for ex in data.train})
        if len(self.distinct) < 2:
            raise BertologyError(
                f"The training data has a single label ({self.distinct[0]!r}); a classifier needs at least two classes"
                + self.single_label_hint
            )
        self.check_labels(self.distinct, [str(ex.label) for ex in data.eval])
        return data

    def make_head(self, loaded: ModelToTrain, data: RunData, device: torch.device) -> HeadTask:
        config = self.config
        y_train = self.targets(loaded, data.train, "training data")
        y_eval = self.targets(loaded, data.eval, "eval data")
        enc = [encode_corpus(c, loaded.tokenizer, max_length=config.data.max_length, overlong=config.data.overlong)
               for c in (data.train, data.eval)]
        return HeadTask(self.task.for_model(loaded.model), loaded.tokenizer, (enc[0], y_train), (enc[1], y_eval),
                        Batching.of(config.batch_size, loaded.model, loaded.tokenizer, device), data.slices)

    def predictions(self, loaded: ModelToTrain, head: HeadTask, data: RunData) -> pd.DataFrame:
        """One row per held-out example: its text(s), label and prediction."""
        corpus = data.eval
        return pd.DataFrame({
            "index": np.arange(len(corpus)),
            "text": [ex.text for ex in corpus],
            **({"text_pair": [ex.text_pair for ex in corpus]} if corpus.has_pairs else {}),
        })

    def finish(self, loaded: ModelToTrain, head: HeadTask, data: RunData, outcome: LoopOutcome) -> Finish:
        predictions = self.predictions(loaded, head, data)
        if data.slices:
            predictions["slice"] = np.where(data.slices[SLICE_WITH], SLICE_WITH, SLICE_WITHOUT)
        return Finish(predictions=predictions, record=self.target_record(head, data))

    def target_record(self, head: HeadTask, data: RunData) -> dict:
        """The manifest's words on the targets."""
        return {}


class ClassifierTrainer(SequenceTrainer):
    """A ``k``-way classification head; labels mapped to ids (the checkpoint's mapping kept when it fits)."""

    def check_labels(self, distinct: list[str], eval_labels: list[str]) -> None:
        unseen = sorted(set(eval_labels) - set(distinct))
        if unseen:
            raise BertologyError(
                f"The eval data has labels never seen in training: {', '.join(repr(u) for u in unseen)} "
                f"(training labels: {', '.join(repr(lab) for lab in distinct)})."
            )
        self.labels = distinct

    def load(self, data: RunData) -> ModelToTrain:
        loaded, label2id, reused_head = _load_classifier(self.config, self.distinct)
        return ModelToTrain(loaded.model, loaded.tokenizer, loaded.describe, loaded.name, reused_head, label2id)

    def targets(self, loaded: ModelToTrain, corpus: Corpus, what: str) -> np.ndarray:
        return np.array([loaded.label2id[str(ex.label)] for ex in corpus], dtype=np.int64)

    def predictions(self, loaded: ModelToTrain, head: HeadTask, data: RunData) -> pd.DataFrame:
        id2label = {i: lab for lab, i in loaded.label2id.items()}
        out = super().predictions(loaded, head, data)
        out["label"] = [str(ex.label) for ex in data.eval]
        out["predicted"] = [id2label.get(int(p)) if p >= 0 else None for p in head.last_preds]
        out["correct"] = out["label"] == out["predicted"]
        return out

    def target_record(self, head: HeadTask, data: RunData) -> dict:
        def counts(corpus: Corpus) -> dict:
            return {str(lab): int(c) for lab, c in zip(*np.unique([str(ex.label) for ex in corpus], return_counts=True))}

        return {"label_counts": {"train": counts(data.train), "eval": counts(data.eval)}}


class RegressorTrainer(SequenceTrainer):
    """A one-output regression head (MSE); a fresh head starts at the training targets' mean."""

    strata_name = "quintiles of the target"
    single_label_hint = " and a regressor targets that vary."

    def strata(self, labels: list[str]) -> list[str]:
        return regression_strata([float(v) for v in labels])

    def load(self, data: RunData) -> ModelToTrain:
        loaded, reused_head = _load_regressor(self.config)
        return ModelToTrain(loaded.model, loaded.tokenizer, loaded.describe, loaded.name, reused_head)

    def targets(self, loaded: ModelToTrain, corpus: Corpus, what: str) -> np.ndarray:
        return regression_targets(corpus, what)

    def make_head(self, loaded: ModelToTrain, data: RunData, device: torch.device) -> HeadTask:
        head = super().make_head(loaded, data, device)
        self.head_start = None if loaded.reused_head else _start_at_the_mean(loaded.model, float(head.y_train.mean()))
        return head

    def predictions(self, loaded: ModelToTrain, head: HeadTask, data: RunData) -> pd.DataFrame:
        out = super().predictions(loaded, head, data)
        out["label"] = head.y_eval.astype(np.float64)
        out["predicted"] = head.last_preds.astype(np.float64)
        out["error"] = out["predicted"] - out["label"]
        return out

    def target_record(self, head: HeadTask, data: RunData) -> dict:
        return {"targets": {"train": _target_stats(head.y_train), "eval": _target_stats(head.y_eval)},
                "head_bias_start": self.head_start}


# --------------------------------------------------------------------------------------------------
# The entry point
# --------------------------------------------------------------------------------------------------


def sequence_trainer(config: FinetuneConfig, train: Corpus) -> SequenceTrainer:
    """The classifier or regressor for ``config.task`` on ``train``'s labels (``auto`` decides by the labels)."""
    if len(train) == 0:
        raise BertologyError(f"The training data {train.name!r} ({train.source}) has no examples.")
    task, reason = choose_task(config.task, _check_labels(train, "training"))
    logger.info("Task: %s", reason)
    main = main_metric(task, corpus=train)  # the training data's dataset names it (CoLA: MCC), else the task's own
    if task.name == "regression":
        regression_targets(train, "training data")  # a label that is not a number: one clear error now
        return RegressorTrainer(config, task, reason, main)
    return ClassifierTrainer(config, task, reason, main)


def trainer_for(config: FinetuneConfig, train) -> TaskTrainer:
    """The trainer ``config`` (resolved) calls for on ``train``: contrastive, QA, parser, tagger or a sequence head."""
    if config.objective == "contrastive":
        return ContrastiveTrainer(config)
    if config.task == "qa":
        return QATrainer(config)
    if config.task == "parsing":
        return ParserTrainer(config)
    if is_tagging_run(config, train):
        return TaggerTrainer(config)
    return sequence_trainer(config, train)


def resolve_run_config(config: FinetuneConfig, train) -> FinetuneConfig:
    """The settings a run on ``train`` uses (what its fingerprint and manifest record): old names mapped, ``auto``
    decided (:func:`~bertology.training.common.resolve_config`), then every setting left to the task's recipe filled
    from the recipe of the trainer the data calls for (:func:`~bertology.training.recipes.apply_recipe`)."""
    config = resolve_config(config, train)
    if config.recipe is not None:  # already filled (the task, and so the trainer, is decided once)
        return config
    return apply_recipe(config, trainer_for(config, train).recipe_name)


def finetune(
    config: FinetuneConfig,
    train,
    eval=None,  # noqa: A002 - the public name the API documents
    progress: bool = False,
    *,
    resume: bool = True,
    on_step=None,
    tracker=None,
) -> FinetuneResult:
    """Fine-tune ``config.model`` on ``train``; evaluate on ``eval`` or a held-out split; return a :class:`FinetuneResult`.

    The trainer is chosen by the settings and the data (:func:`trainer_for`): a SimCSE encoder for
    ``objective="contrastive"``, a QA head (SQuAD data, :func:`read_data`), a parser, a tagger (``task="tagging"``,
    or ``auto`` on word-tagged data without sentence labels), else a classifier or regressor. The model and
    tokenizer are saved (safetensors) to ``Path(config.out) / "model"``. The ``finetune`` table has columns
    ``step, epoch, split, metric, value, slice``: ``split="train"`` rows carry the mean training loss over each
    logging window (every :data:`~bertology.training.loop.LOG_EVERY` steps and at each epoch end) and the
    learning rate; ``split="eval"`` rows carry the task's metrics on the held-out set (``slice="all"``) before
    training (step 0), every ``eval_every`` steps, at the end of every epoch and at the last step. With
    ``exclude_words`` (or ``slice_words``) the eval rows are repeated for the examples with
    (``slice="with_words"``) and without (``slice="without_words"``) those words, with their ``n_eval``.

    With ``save_every`` the run keeps ``checkpoints/step-N/`` and, when ``resume``, continues from the latest
    one written with the same settings. ``on_step(step)`` is called after every optimiser step. With
    ``track_every`` the loop is watched by ``tracker(config, tokenizer, probe data)``
    (:func:`bertology.integrations.tracker.finetune_tracker`; see :data:`~bertology.training.skeleton.TrackerFactory`).
    """
    config = resolve_config(config, train)
    return trainer_for(config, train).run(train, eval, progress=progress, resume=resume, on_step=on_step,
                                          tracker=tracker)


def read_data(config: FinetuneConfig):
    """The training and eval data ``config`` names (``data.path``, ``eval_data``), read as the task needs them:
    SQuAD JSON for ``task="qa"`` (:func:`~bertology.data.squad.read_squad`), else a corpus
    (:func:`~bertology.data.loaders.load_corpus`). A ``.json`` file for another task is one clear error."""
    config = resolve_config(config)
    path, d = config.data.path, config.data
    if path is None:
        raise BertologyError("No training data: set data.path (--data).")
    if config.task == "qa":  # SQuAD JSON: questions over contexts, not rows of a table
        from bertology.data.squad import read_squad

        return read_squad(path), read_squad(config.eval_data) if config.eval_data else None
    if config.objective == "supervised" and str(path).lower().endswith(".json"):
        raise BertologyError(f"{path} is a SQuAD .json file (questions over contexts, no labels); "
                             "pass --task qa to train a QA head.")
    from bertology.data.loaders import load_corpus

    columns = dict(text_column=d.text_column, pair_column=d.pair_column, label_column=d.label_column)
    return load_corpus(path, **columns), load_corpus(config.eval_data, **columns) if config.eval_data else None
