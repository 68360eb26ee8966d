"""Fine-tuning a sequence classifier or regressor on labelled sentences or sentence pairs (the fine-tuning lab).

:func:`finetune` trains ``AutoModelForSequenceClassification`` on a :class:`~bertology.data.corpus.Corpus`
with AdamW and a linear warm-up/decay schedule, for the task ``config.task`` chooses
(:mod:`bertology.tasks`: classification, or regression with one output and ``problem_type="regression"``),
evaluates the task's metrics (accuracy and macro-F1; Pearson, Spearman and MSE) on a held-out split
(step 0, every ``eval_every`` steps, every epoch end, the last step), and saves a Hugging Face folder
(model + tokenizer, safetensors) that the rest of bertology (``compare --tuned``) reads back. One
``seed`` drives the head initialisation, the split, the shuffling and dropout, so two runs with the
same config on the same machine give identical weights.

The lab's experiments are settings of the same call: ``drop_layers`` / ``freeze_layers`` /
``freeze_embeddings`` (:mod:`bertology.training.surgery`), ``exclude_words`` / ``slice_words``
(:mod:`bertology.training.data`; eval rows per slice), ``objective="contrastive"``
(:mod:`bertology.training.contrastive`), and the loop's hygiene (:mod:`bertology.training.loop`:
gradient accumulation, early stopping, checkpoints and exact resumption).

Labels are strings; they are mapped to ids in sorted order (``"-1" -> 0``, ``"1" -> 1``) unless the
checkpoint already has a classification head whose ``label2id`` covers exactly the same labels, in
which case its mapping is kept. ``id2label``/``label2id`` are stored in the saved config.
"""
from __future__ import annotations

import copy
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from bertology.data.batching import collate, length_batches
from bertology.config import FinetuneConfig
from bertology.data.corpus import Corpus, require_labels
from bertology.data.encode import EncodedCorpus, EncodedExample, encode_corpus
from bertology.errors import BertologyError
from bertology.models.device import resolve_device
from bertology.models.sites import uses_token_types
from bertology.training.common import (  # TABLE_COLUMNS, FinetuneResult: also importable from here
    INTERVALS_TABLE, TABLE_COLUMNS, check_config, checkpoint_folder, FinetuneResult, interval_table, loop_config,
    make_table, objective_record, padding_id, plan_schedule, prepare_model, save_atomically, training_record,
)
from bertology.training.contrastive import contrastive_finetune
from bertology.training.parser import finetune_parser
from bertology.training.data import SLICE_ALL, SLICE_WITH, SLICE_WITHOUT, eval_slices, exclude_examples, mention_mask, parse_word_list
from bertology.training.loop import seed_everything, train_loop
from bertology.tasks.base import Task
from bertology.tasks.catalog import choose_task
from bertology.tasks.regression import regression_targets

logger = logging.getLogger(__name__)
#: Gradient-norm clipping threshold (the usual BERT fine-tuning value).
MAX_GRAD_NORM = 1.0


# --------------------------------------------------------------------------------------------------
# Validation, labels and splits
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
# Batching
# --------------------------------------------------------------------------------------------------


@dataclass
class _Batch:
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    token_type_ids: torch.Tensor | None
    labels: torch.Tensor
    index: np.ndarray  # corpus positions of the rows


def _collate(
    items: Sequence[EncodedExample], label_ids: np.ndarray, pad_id: int, use_token_types: bool, device: torch.device,
    task: Task,
) -> _Batch:
    """Pad one batch to its own longest sequence (the extraction engine's collate) and attach the task's targets."""
    t = collate(items, pad_id)
    index = np.array([it.index for it in items], dtype=np.int64)
    return _Batch(
        input_ids=t["input_ids"].to(device),
        attention_mask=t["attention_mask"].to(device),
        token_type_ids=t["token_type_ids"].to(device) if use_token_types else None,
        labels=task.collate_targets(items, [label_ids[i] for i in index]).to(device),
        index=index,
    )


def _forward(model: torch.nn.Module, batch: _Batch) -> torch.Tensor:
    kwargs = dict(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
    if batch.token_type_ids is not None:
        kwargs["token_type_ids"] = batch.token_type_ids
    return model(**kwargs).logits


def _evaluate(
    model: torch.nn.Module,
    task: Task,
    enc: EncodedCorpus,
    label_ids: np.ndarray,
    batch_size: int,
    pad_id: int,
    use_token_types: bool,
    device: torch.device,
    slices: dict[str, np.ndarray] | None = None,
) -> tuple[dict, dict[str, np.ndarray]]:
    """The task's metrics on a held-out set (accuracy, macro-F1, loss; Pearson, Spearman, MSE); also the
    per-example records by corpus index (``pred`` -1 / NaN for examples the tokeniser skipped).

    ``slices`` maps a slice name to a boolean mask over the corpus; each slice gets the same metrics
    (over its kept examples) under ``metrics["slices"][name]``.
    """
    was_training = model.training
    model.eval()
    records: dict[str, np.ndarray] = {}
    try:
        with torch.inference_mode():
            for items in length_batches(enc.items, batch_size):
                batch = _collate(items, label_ids, pad_id, use_token_types, device, task)
                for k, v in task.record(_forward(model, batch), batch.labels).items():
                    if k not in records:
                        records[k] = np.full((len(label_ids), *v.shape[1:]), -1 if v.dtype.kind in "iu" else np.nan,
                                             dtype=v.dtype)
                    records[k][batch.index] = v
    finally:
        model.train(was_training)
    kept = np.array([it.index for it in enc.items], dtype=np.int64)
    metrics = _scores(task, records, label_ids, kept)
    if slices:
        metrics["slices"] = {name: _scores(task, records, label_ids, kept[mask[kept]]) for name, mask in slices.items()}
    return metrics, records


def _scores(task: Task, records: dict[str, np.ndarray], y: np.ndarray, sel: np.ndarray) -> dict:
    """The task's metrics over the examples ``sel`` (NaN for an empty selection) and their count ``n_eval``."""
    if len(sel) == 0 or not records:
        return {**{m: float("nan") for m in task.metrics}, "n_eval": 0}
    return {**task.point_scores({k: v[sel] for k, v in records.items()}, y[sel]), "n_eval": int(len(sel))}


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
# The loop
# --------------------------------------------------------------------------------------------------


def _progress(enabled: bool):
    """The training progress bar (kept for callers of the old name; the loop owns it now)."""
    from bertology.training.loop import _progress as progress_bar

    return progress_bar(enabled)


class HeadTask:
    """The training loop's view of a supervised head: the task's loss; its metrics on the held-out set and slices."""

    objective = "supervised"

    @property
    def loss_name(self) -> str:
        """The task's loss by name."""
        return self.task.loss_name

    def __init__(self, task: Task, tokenizer, enc_train, y_train, enc_eval, y_eval, *, batch_size, pad_id,
                 use_token_types, device, slices: dict[str, np.ndarray] | None = None) -> None:
        self.task = task
        self.tokenizer = tokenizer
        self.enc_train, self.y_train = enc_train, y_train
        self.enc_eval, self.y_eval = enc_eval, y_eval
        self.batch_size, self.pad_id, self.use_token_types, self.device = batch_size, pad_id, use_token_types, device
        self.slices = slices
        self.n_items = len(enc_train.items)
        self.last_preds: np.ndarray | None = None
        #: the records and targets of the held-out examples scored at the last evaluation (skipped ones left out)
        self.last_scored: tuple[dict[str, np.ndarray], np.ndarray] | None = None

    def loss(self, model: torch.nn.Module, indices: list[int]) -> torch.Tensor:
        items = [self.enc_train.items[i] for i in indices]
        batch = _collate(items, self.y_train, self.pad_id, self.use_token_types, self.device, self.task)
        return self.task.loss(_forward(model, batch), batch.labels)

    def evaluate(self, model: torch.nn.Module) -> tuple[dict, list[dict]]:
        metrics, records = _evaluate(model, self.task, self.enc_eval, self.y_eval, self.batch_size, self.pad_id,
                                     self.use_token_types, self.device, self.slices)
        self.last_preds = records.get("pred", np.full(len(self.y_eval), -1))
        kept = np.array([it.index for it in self.enc_eval.items], dtype=np.int64)
        self.last_scored = ({k: v[kept] for k, v in records.items()}, self.y_eval[kept])
        rows = [{"split": "eval", "metric": m, "value": float(metrics[m]), "slice": SLICE_ALL} for m in self.task.metrics]
        for name, sm in metrics.get("slices", {}).items():
            rows += [{"split": "eval", "metric": m, "value": float(sm[m]), "slice": name} for m in (*self.task.metrics, "n_eval")]
        return metrics, rows

    def save(self, model: torch.nn.Module, folder: Path) -> None:
        model.save_pretrained(folder, safe_serialization=True)
        self.tokenizer.save_pretrained(folder)


def finetune(
    config: FinetuneConfig,
    train: Corpus,
    eval: Corpus | None = None,  # noqa: A002 - the public name the API documents
    progress: bool = False,
    *,
    resume: bool = True,
    on_step=None,
):
    """Fine-tune ``config.model`` on ``train``; evaluate on ``eval`` or a held-out split.

    With ``config.objective == "contrastive"`` this is :func:`bertology.training.contrastive.contrastive_finetune`
    (a SimCSE sentence encoder); with ``config.task == "parsing"`` it is
    :func:`bertology.training.parser.finetune_parser` (a biaffine dependency parser). Otherwise a sequence classifier: returns a :class:`FinetuneResult`; the
    model and tokenizer are saved (safetensors) to ``Path(config.out) / "model"``. The ``finetune`` table
    has columns ``step, epoch, split, metric, value, slice``: ``split="train"`` rows carry the mean
    training loss over each logging window (every :data:`~bertology.training.loop.LOG_EVERY` steps and at each epoch end) and
    the learning rate; ``split="eval"`` rows carry ``accuracy``, ``macro_f1`` and ``loss`` on the
    held-out set (``slice="all"``) before training (step 0), every ``eval_every`` steps, at the end of
    every epoch and at the last step. With ``exclude_words`` the eval rows are repeated for the
    examples with (``slice="with_words"``) and without (``slice="without_words"``) those words,
    with their ``n_eval``.

    ``drop_layers``/``freeze_layers``/``freeze_embeddings`` change the model before training (see
    :mod:`bertology.training.surgery`); ``exclude_words`` drops training examples (see
    :mod:`bertology.training.data`). With ``save_every`` the run keeps ``checkpoints/step-N/`` and,
    when ``resume``, continues from the latest one written with the same settings. ``on_step(step)``
    is called after every optimiser step.
    """
    if config.objective == "contrastive":
        return contrastive_finetune(config, train, eval, progress=progress, resume=resume, on_step=on_step)
    if config.objective != "classification":
        raise BertologyError(f"Unknown objective {config.objective!r}; use classification or contrastive.")
    if config.task == "qa":  # SQuAD data: questions over contexts, a start/end head (its own module)
        from bertology.training.qa import finetune_qa

        return finetune_qa(config, train, eval, progress=progress, resume=resume, on_step=on_step)
    if config.task == "parsing":
        return finetune_parser(config, train, eval, progress=progress, resume=resume, on_step=on_step)
    if config.task == "tagging":
        raise BertologyError("finetune() trains sequence heads; a tagger is trained by "
                             "bertology.training.tagging.finetune_tagger (finetune_to_dir chooses it).")
    t0 = time.perf_counter()
    check_config(config)
    if len(train) == 0:
        raise BertologyError(f"The training data {train.name!r} ({train.source}) has no examples.")
    train_labels = _check_labels(train, "training")
    task, task_reason = choose_task(config.task, train_labels)
    regression = task.name == "regression"
    if regression:
        regression_targets(train, "training data")  # a label that is not a number: one clear error now
    logger.info("Task: %s", task_reason)
    if config.early_stopping_metric is not None and config.early_stopping_metric not in task.metrics:
        raise BertologyError(f"--early-stopping-metric {config.early_stopping_metric!r} is not a metric of the "
                             f"{task.name} task; choose from {', '.join(task.metrics)}.")
    max_n = config.data.max_examples
    if max_n is not None and len(train) > max_n:
        train = train.stratified_sample(max_n, config.seed)
        train_labels = [str(ex.label) for ex in train]
        logger.info("Using a seeded sample of %d of the training examples (max_examples)", max_n)

    split: dict = {}
    if eval is None:
        if not (0 < config.eval_fraction < 1):
            raise BertologyError(
                f"eval_fraction must be between 0 and 1 (exclusive) when no eval data is given, not {config.eval_fraction!r}."
            )
        strata = regression_strata([float(v) for v in train_labels]) if regression else train_labels
        tr_idx, ev_idx, stratified = _stratified_split(strata, config.eval_fraction, config.seed)
        eval_corpus = train.subset([int(i) for i in ev_idx], name=f"{train.name} (held out)")
        eval_labels = [train_labels[i] for i in ev_idx]
        train = train.subset([int(i) for i in tr_idx], name=f"{train.name} (train)")
        train_labels = [train_labels[i] for i in tr_idx]
        split = {"source": "split", "eval_fraction": config.eval_fraction, "stratified": stratified, "seed": config.seed,
                 "strata": "quintiles of the target" if regression else "labels"}
    else:
        if len(eval) == 0:
            raise BertologyError(f"The eval data {eval.name!r} ({eval.source}) has no examples.")
        eval_corpus = eval
        eval_labels = _check_labels(eval, "eval")
        split = {"source": "eval_data"}

    # biased data: drop the training examples that mention any of the words; slice the eval set by them
    # (or by ``slice_words``, which slices without dropping anything: the control run of a bias experiment)
    exclusion: dict | None = None
    if config.exclude_words:
        words = parse_word_list(list(config.exclude_words))
        kept_idx = np.flatnonzero(~mention_mask(train, words))
        train_after, exclusion = exclude_examples(train, words)
        train_labels = [train_labels[i] for i in kept_idx]
        train = train_after
        if len(train) == 0:
            raise BertologyError(f"Every training example mentions one of {', '.join(words)}; nothing is left to train on.")
        logger.info("Dropped %d of %d training examples that mention %s", exclusion["n_dropped"], exclusion["n_before"], ", ".join(words))
    slices, slicing = eval_slices(eval_corpus, parse_word_list(list(config.slice_words or config.exclude_words)), exclusion)

    labels = sorted(set(train_labels))
    if len(labels) < 2:
        raise BertologyError(
            f"The training data has a single label ({labels[0]!r}); a classifier needs at least two classes"
            + (" and a regressor targets that vary." if regression else ".")
        )
    unseen = [] if regression else sorted(set(eval_labels) - set(labels))
    if unseen:
        raise BertologyError(
            f"The eval data has labels never seen in training: {', '.join(repr(u) for u in unseen)} "
            f"(training labels: {', '.join(repr(lab) for lab in labels)})."
        )
    split.update(n_train=len(train), n_eval=len(eval_corpus))

    device = resolve_device(config.device)
    seed_everything(config.seed)
    if regression:
        loaded, reused_head = _load_regressor(config)
        label2id: dict[str, int] = {}
    else:
        loaded, label2id, reused_head = _load_classifier(config, labels)
    model, tokenizer = loaded.model, loaded.tokenizer
    surgery = prepare_model(model, config, device)

    pad_id = padding_id(tokenizer)
    use_token_types = uses_token_types(model)

    if regression:
        y_train, y_eval = regression_targets(train, "training data"), regression_targets(eval_corpus, "eval data")
        head_start = None if reused_head else _start_at_the_mean(model, float(y_train.mean()))
    else:
        head_start = None
        y_train = np.array([label2id[lab] for lab in train_labels], dtype=np.int64)
        y_eval = np.array([label2id[lab] for lab in eval_labels], dtype=np.int64)
    overlong = config.data.overlong
    enc_train = encode_corpus(train, tokenizer, max_length=config.data.max_length, overlong=overlong)
    enc_eval = encode_corpus(eval_corpus, tokenizer, max_length=config.data.max_length, overlong=overlong)

    n_items = len(enc_train.items)
    schedule = plan_schedule(config, n_items)
    logger.info(
        "Fine-tuning %s (%s) on %d examples (%d held out), labels %s: %d steps (%d per epoch, %g epochs), batch %d x %d, lr %g",
        loaded.name, task.name, n_items, len(enc_eval.items), label2id or "numeric", schedule.total_steps, schedule.steps_per_epoch,
        config.epochs, config.batch_size, config.grad_accum, config.learning_rate,
    )

    checkpoint_dir = checkpoint_folder(config, train, eval_corpus, resume)
    head = HeadTask(task, tokenizer, enc_train, y_train, enc_eval, y_eval, batch_size=config.batch_size,
                    pad_id=pad_id, use_token_types=use_token_types, device=device, slices=slices)
    metric = config.early_stopping_metric or task.primary
    loop_cfg = loop_config(config, schedule, metric, checkpoint_dir, resume)
    outcome = train_loop(model, head, loop_cfg, progress=progress, on_step=on_step)
    final_metrics = outcome.metrics
    if head.last_preds is None or (outcome.best_step is not None and outcome.best_step != outcome.last_step):
        final_metrics, _ = head.evaluate(model)  # predictions of the weights that are saved
    preds = head.last_preds

    model_dir = save_atomically(model, tokenizer, Path(config.out))
    id2label = {i: lab for lab, i in label2id.items()}
    predictions = pd.DataFrame(
        {
            "index": np.arange(len(eval_corpus)),
            "text": [ex.text for ex in eval_corpus],
            **({"text_pair": [ex.text_pair for ex in eval_corpus]} if eval_corpus.has_pairs else {}),
            "label": y_eval.astype(np.float64) if regression else eval_labels,
            "predicted": preds.astype(np.float64) if regression else [id2label.get(int(p)) if p >= 0 else None for p in preds],
        }
    )
    if regression:
        predictions["error"] = predictions["predicted"] - predictions["label"]
    else:
        predictions["correct"] = predictions["label"] == predictions["predicted"]
    if slices:
        predictions["slice"] = np.where(slices[SLICE_WITH], SLICE_WITH, SLICE_WITHOUT)
    table = make_table(outcome.rows)
    details = {
        **objective_record(config, head),
        "task": task.name,
        "task_choice": task_reason,
        "split": split,
        "labels": None if regression else labels,
        "reused_checkpoint_head": reused_head,
        **training_record(config, schedule, outcome, metric, model, surgery, device=device, token_types=use_token_types,
                          exclusion=exclusion, slicing=slicing, encoded=(enc_train, enc_eval)),
        **({"targets": {"train": _target_stats(y_train), "eval": _target_stats(y_eval)},
            "head_bias_start": head_start} if regression else {
            "label_counts": {
                "train": {str(lab): int(c) for lab, c in zip(*np.unique(train_labels, return_counts=True))},
                "eval": {str(lab): int(c) for lab, c in zip(*np.unique(eval_labels, return_counts=True))},
            }}),
        "base_model": loaded.describe(),
    }
    wall = time.perf_counter() - t0
    logger.info("Saved the fine-tuned model to %s (%.1f s)", model_dir, wall)
    return FinetuneResult(
        model_dir=model_dir,
        table=table,
        metrics=final_metrics,
        n_train=len(train),
        n_eval=len(eval_corpus),
        wall_time_s=wall,
        label2id=label2id,
        predictions=predictions,
        details=details,
        extra_tables={INTERVALS_TABLE: interval_table(task, head.last_scored, seed=config.seed)},
    )

