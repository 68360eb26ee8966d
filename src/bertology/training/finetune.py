"""Minimal fine-tuning: a sequence classifier on labelled sentences or sentence pairs.

:func:`finetune` trains ``AutoModelForSequenceClassification`` on a :class:`~bertology.data.corpus.Corpus`
with AdamW and a linear warm-up/decay schedule, evaluates accuracy and macro-F1 on a held-out split
after every epoch, and saves a Hugging Face folder (model + tokenizer, safetensors) that the rest of
bertology (``compare --tuned``) reads back. One ``seed`` drives the head initialisation, the split,
the shuffling and dropout, so two runs with the same config on the same machine give identical weights.

Labels are strings; they are mapped to ids in sorted order (``"-1" -> 0``, ``"1" -> 1``) unless the
checkpoint already has a classification head whose ``label2id`` covers exactly the same labels, in
which case its mapping is kept. ``id2label``/``label2id`` are stored in the saved config.
"""
from __future__ import annotations

import copy
import logging
import math
import os
import random
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from bertology.activations.extract import collate, length_batches
from bertology.config import FinetuneConfig
from bertology.data.corpus import Corpus
from bertology.data.encode import EncodedCorpus, EncodedExample, encode_corpus
from bertology.errors import BertologyError

logger = logging.getLogger(__name__)

TABLE_COLUMNS = ["step", "epoch", "split", "metric", "value"]
#: Training loss is logged (averaged over the window) every this many optimiser steps.
LOG_EVERY = 10
#: Gradient-norm clipping threshold (the usual BERT fine-tuning value).
MAX_GRAD_NORM = 1.0


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
        return (
            f"<b>FinetuneResult</b>: {self.n_train} train / {self.n_eval} held-out examples, "
            f"accuracy {m.get('accuracy', float('nan')):.4f}, macro-F1 {m.get('macro_f1', float('nan')):.4f}, "
            f"model saved to <code>{escape(str(self.model_dir))}</code>"
        )


# --------------------------------------------------------------------------------------------------
# Validation, labels and splits
# --------------------------------------------------------------------------------------------------


def _check_config(config: FinetuneConfig) -> None:
    if not (config.epochs > 0 and math.isfinite(config.epochs)):
        raise BertologyError(f"epochs must be a positive number, not {config.epochs!r}.")
    if config.batch_size < 1:
        raise BertologyError(f"batch_size must be at least 1, not {config.batch_size!r}.")
    if not (config.learning_rate > 0):
        raise BertologyError(f"learning_rate must be positive, not {config.learning_rate!r}.")
    if config.weight_decay < 0:
        raise BertologyError(f"weight_decay must be >= 0, not {config.weight_decay!r}.")
    if not (0 <= config.warmup_ratio < 1):
        raise BertologyError(f"warmup_ratio must be in [0, 1), not {config.warmup_ratio!r}.")
    if config.data.max_length < 2:
        raise BertologyError(f"max_length must be at least 2, not {config.data.max_length!r}.")
    if config.data.max_examples is not None and config.data.max_examples < 2:
        raise BertologyError(f"max_examples must be at least 2, not {config.data.max_examples!r}.")


def _check_labels(corpus: Corpus, role: str) -> list[str]:
    """Every example's label as a string; a clear error when any is missing."""
    missing = [i for i, ex in enumerate(corpus) if ex.label is None]
    if missing:
        shown = ", ".join(str(i) for i in missing[:5]) + (" ..." if len(missing) > 5 else "")
        raise BertologyError(
            f"Fine-tuning needs a label for every example, but {len(missing)} of {len(corpus)} examples in the "
            f"{role} data ({corpus.source}) have none (rows {shown}). Name the label column with --label-column."
        )
    return [str(ex.label) for ex in corpus]


def _stratified_split(labels: Sequence[str], fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray, bool]:
    """Indices of a seeded train/held-out split, stratified by label when every class allows it."""
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


def _subsample(corpus: Corpus, labels: list[str], n: int, seed: int) -> tuple[Corpus, list[str]]:
    """A seeded (stratified when possible) sample of ``n`` examples, kept in corpus order.

    Taking the first ``n`` rows would give a single class on files sorted by label.
    """
    from sklearn.model_selection import train_test_split

    idx = np.arange(len(corpus))
    try:
        keep, _ = train_test_split(idx, train_size=n, random_state=seed, stratify=labels)
    except ValueError:
        keep, _ = train_test_split(idx, train_size=n, random_state=seed)
    keep = np.sort(keep)
    out = corpus.subset([int(i) for i in keep])
    out.stats["sampled_to"] = n
    return out, [labels[i] for i in keep]


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
    items: Sequence[EncodedExample], label_ids: np.ndarray, pad_id: int, use_token_types: bool, device: torch.device
) -> _Batch:
    """Pad one batch to its own longest sequence (the extraction engine's collate) and attach labels."""
    t = collate(items, pad_id)
    index = np.array([it.index for it in items], dtype=np.int64)
    return _Batch(
        input_ids=t["input_ids"].to(device),
        attention_mask=t["attention_mask"].to(device),
        token_type_ids=t["token_type_ids"].to(device) if use_token_types else None,
        labels=torch.from_numpy(label_ids[index]).to(device),
        index=index,
    )


def _train_batches(n: int, batch_size: int, generator: torch.Generator) -> Iterator[list[int]]:
    """An endless stream of training batches (item positions): a fresh seeded permutation per epoch,
    cut into ``ceil(n / batch_size)`` batches (the last one of an epoch is smaller when it must be)."""
    while True:
        perm = torch.randperm(n, generator=generator).tolist()
        for i in range(0, n, batch_size):
            yield perm[i : i + batch_size]


def _forward(model: torch.nn.Module, batch: _Batch) -> torch.Tensor:
    kwargs = dict(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
    if batch.token_type_ids is not None:
        kwargs["token_type_ids"] = batch.token_type_ids
    return model(**kwargs).logits


def _evaluate(
    model: torch.nn.Module,
    enc: EncodedCorpus,
    label_ids: np.ndarray,
    batch_size: int,
    pad_id: int,
    use_token_types: bool,
    device: torch.device,
) -> tuple[dict, np.ndarray]:
    """Accuracy, macro-F1 and mean cross-entropy on a held-out set; also the predicted ids by corpus index."""
    from sklearn.metrics import accuracy_score, f1_score

    was_training = model.training
    model.eval()
    preds = np.full(len(label_ids), -1, dtype=np.int64)
    loss_sum = 0.0
    try:
        with torch.inference_mode():
            for items in length_batches(enc.items, batch_size):
                batch = _collate(items, label_ids, pad_id, use_token_types, device)
                logits = _forward(model, batch).float()
                loss_sum += float(F.cross_entropy(logits, batch.labels, reduction="sum"))
                preds[batch.index] = logits.argmax(-1).cpu().numpy()
    finally:
        model.train(was_training)
    kept = np.array([it.index for it in enc.items], dtype=np.int64)
    y_true, y_pred = label_ids[kept], preds[kept]
    metrics = {
        "accuracy": float(accuracy_score(y_true, y_pred)),
        "macro_f1": float(f1_score(y_true, y_pred, average="macro", zero_division=0)),
        "loss": loss_sum / len(kept),
        "n_eval": int(len(kept)),
    }
    return metrics, preds


# --------------------------------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------------------------------


def _load_classifier(config: FinetuneConfig, labels: list[str]):
    """Load the model with a ``len(labels)``-way head and decide the label -> id mapping.

    A checkpoint without a classification head gets a fresh one (initialised from the seeded RNG). A
    checkpoint whose head has a different number of labels gets a fresh head too (the encoder weights
    are kept). A head of the right size is reused; its label mapping is kept when it names exactly our
    labels, otherwise labels are numbered in sorted order.
    """
    from transformers import AutoConfig, AutoModelForSequenceClassification

    from bertology.models.loading import load_model

    k = len(labels)
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


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def _resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError) as err:
        raise BertologyError(f"Unknown device {name!r}: {err}") from err
    if device.type == "cuda" and not torch.cuda.is_available():
        raise BertologyError(f"Device {name!r} was requested but CUDA is not available; use --device cpu.")
    return device


def _save_atomically(model, tokenizer, out: Path) -> Path:
    """Write ``out/model`` via a temporary folder in ``out`` and a rename, so no half-written model remains."""
    out.mkdir(parents=True, exist_ok=True)
    final = out / "model"
    tmp = Path(tempfile.mkdtemp(prefix=".model-", suffix=".tmp", dir=out))
    old: Path | None = None
    try:
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes it private (0700); the final folder is an ordinary one
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        if final.exists():
            old = Path(tempfile.mkdtemp(prefix=".model-old-", suffix=".tmp", dir=out))
            os.rmdir(old)
            os.replace(final, old)
        os.replace(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and old.exists() and not final.exists():
            os.replace(old, final)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return final


# --------------------------------------------------------------------------------------------------
# The loop
# --------------------------------------------------------------------------------------------------


def _progress(enabled: bool):
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    return Progress(
        TextColumn("[bold]fine-tuning[/]"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("epoch {task.fields[epoch]:.2f}  loss {task.fields[loss]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
        disable=not enabled,
        transient=False,
    )


def finetune(
    config: FinetuneConfig,
    train: Corpus,
    eval: Corpus | None = None,  # noqa: A002 - the public name the API documents
    progress: bool = False,
) -> FinetuneResult:
    """Fine-tune ``config.model`` as a sequence classifier on ``train``; evaluate on ``eval`` or a held-out split.

    Returns a :class:`FinetuneResult`; the model and tokenizer are saved (safetensors) to
    ``Path(config.out) / "model"``. The ``finetune`` table has columns ``step, epoch, split, metric,
    value``: ``split="train"`` rows carry the mean training loss over each logging window
    (every :data:`LOG_EVERY` steps and at each epoch end) and the learning rate; ``split="eval"`` rows
    carry ``accuracy``, ``macro_f1`` and ``loss`` on the held-out set before training (step 0), at
    the end of every epoch, and at the last step.
    """
    from transformers import get_linear_schedule_with_warmup

    t0 = time.perf_counter()
    _check_config(config)
    if len(train) == 0:
        raise BertologyError(f"The training data {train.name!r} ({train.source}) has no examples.")
    train_labels = _check_labels(train, "training")
    max_n = config.data.max_examples
    if max_n is not None and len(train) > max_n:
        train, train_labels = _subsample(train, train_labels, max_n, config.seed)
        logger.info("Using a seeded sample of %d of the training examples (max_examples)", max_n)

    split: dict = {}
    if eval is None:
        if not (0 < config.eval_fraction < 1):
            raise BertologyError(
                f"eval_fraction must be between 0 and 1 (exclusive) when no eval data is given, not {config.eval_fraction!r}."
            )
        tr_idx, ev_idx, stratified = _stratified_split(train_labels, config.eval_fraction, config.seed)
        eval_corpus = train.subset([int(i) for i in ev_idx], name=f"{train.name} (held out)")
        eval_labels = [train_labels[i] for i in ev_idx]
        train = train.subset([int(i) for i in tr_idx], name=f"{train.name} (train)")
        train_labels = [train_labels[i] for i in tr_idx]
        split = {"source": "split", "eval_fraction": config.eval_fraction, "stratified": stratified, "seed": config.seed}
    else:
        if len(eval) == 0:
            raise BertologyError(f"The eval data {eval.name!r} ({eval.source}) has no examples.")
        eval_corpus = eval
        eval_labels = _check_labels(eval, "eval")
        split = {"source": "eval_data"}

    labels = sorted(set(train_labels))
    if len(labels) < 2:
        raise BertologyError(
            f"The training data has a single label ({labels[0]!r}); a classifier needs at least two classes."
        )
    unseen = sorted(set(eval_labels) - set(labels))
    if unseen:
        raise BertologyError(
            f"The eval data has labels never seen in training: {', '.join(repr(u) for u in unseen)} "
            f"(training labels: {', '.join(repr(lab) for lab in labels)})."
        )
    split.update(n_train=len(train), n_eval=len(eval_corpus))

    device = _resolve_device(config.device)
    _seed_everything(config.seed)
    loaded, label2id, reused_head = _load_classifier(config, labels)
    model, tokenizer = loaded.model, loaded.tokenizer
    model.to(device)

    pad_id = tokenizer.pad_token_id
    if pad_id is None:
        logger.warning("The tokenizer has no padding token; padding with id 0 (masked out by the attention mask).")
        pad_id = 0
    use_token_types = "token_type_ids" in getattr(tokenizer, "model_input_names", ["token_type_ids"])

    y_train = np.array([label2id[lab] for lab in train_labels], dtype=np.int64)
    y_eval = np.array([label2id[lab] for lab in eval_labels], dtype=np.int64)
    overlong = config.data.overlong
    enc_train = encode_corpus(train, tokenizer, max_length=config.data.max_length, overlong=overlong)
    enc_eval = encode_corpus(eval_corpus, tokenizer, max_length=config.data.max_length, overlong=overlong)

    n_items = len(enc_train.items)
    steps_per_epoch = math.ceil(n_items / config.batch_size)
    total_steps = max(1, math.ceil(config.epochs * steps_per_epoch))
    warmup_steps = math.ceil(config.warmup_ratio * total_steps)
    logger.info(
        "Fine-tuning %s on %d examples (%d held out), labels %s: %d steps (%d per epoch, %g epochs), batch %d, lr %g",
        loaded.name, n_items, len(enc_eval.items), label2id, total_steps, steps_per_epoch, config.epochs,
        config.batch_size, config.learning_rate,
    )

    no_decay = ("bias", "LayerNorm.weight", "layer_norm.weight", "norm.weight")
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    groups = [
        {"params": [p for n, p in named if not n.endswith(no_decay)], "weight_decay": config.weight_decay},
        {"params": [p for n, p in named if n.endswith(no_decay)], "weight_decay": 0.0},
    ]
    optimizer = torch.optim.AdamW(groups, lr=config.learning_rate)
    scheduler = get_linear_schedule_with_warmup(optimizer, warmup_steps, total_steps)

    rows: list[dict] = []

    def record(step: int, split_name: str, metrics: dict) -> None:
        epoch = step / steps_per_epoch
        for name in ("accuracy", "macro_f1", "loss", "learning_rate"):
            if name in metrics:
                rows.append({"step": step, "epoch": epoch, "split": split_name, "metric": name, "value": float(metrics[name])})

    def run_eval(step: int) -> tuple[dict, np.ndarray]:
        metrics, preds = _evaluate(model, enc_eval, y_eval, config.batch_size, pad_id, use_token_types, device)
        record(step, "eval", metrics)
        logger.info(
            "step %d (epoch %.2f): held-out accuracy %.4f, macro-F1 %.4f, loss %.4f",
            step, step / steps_per_epoch, metrics["accuracy"], metrics["macro_f1"], metrics["loss"],
        )
        return metrics, preds

    run_eval(0)
    generator = torch.Generator().manual_seed(config.seed)
    batches = _train_batches(n_items, config.batch_size, generator)
    window: list[float] = []
    running: float | None = None  # exponential moving average of the loss, for the progress bar
    final_metrics: dict = {}
    preds = np.array([], dtype=np.int64)

    model.train()
    with _progress(progress) as bar:
        task = bar.add_task("train", total=total_steps, epoch=0.0, loss="-")
        for step in range(1, total_steps + 1):
            items = [enc_train.items[i] for i in next(batches)]
            batch = _collate(items, y_train, pad_id, use_token_types, device)
            logits = _forward(model, batch)
            loss = F.cross_entropy(logits.float(), batch.labels)
            if not torch.isfinite(loss):
                raise BertologyError(
                    f"The training loss became {float(loss)} at step {step}; lower the learning rate (now {config.learning_rate})."
                )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
            lr = scheduler.get_last_lr()[0]
            optimizer.step()
            scheduler.step()
            window.append(float(loss.detach()))
            running = window[-1] if running is None else 0.9 * running + 0.1 * window[-1]
            epoch_end = step % steps_per_epoch == 0
            if step % LOG_EVERY == 0 or epoch_end or step == total_steps:
                mean_loss = float(np.mean(window))
                record(step, "train", {"loss": mean_loss, "learning_rate": lr})
                logger.debug("step %d: train loss %.4f", step, mean_loss)
                window = []
            bar.update(task, advance=1, epoch=step / steps_per_epoch, loss=f"{running:.4f}")
            if epoch_end or step == total_steps:
                final_metrics, preds = run_eval(step)
    model.eval()

    model_dir = _save_atomically(model, tokenizer, Path(config.out))
    id2label = {i: lab for lab, i in label2id.items()}
    predictions = pd.DataFrame(
        {
            "index": np.arange(len(eval_corpus)),
            "text": [ex.text for ex in eval_corpus],
            **({"text_pair": [ex.text_pair for ex in eval_corpus]} if eval_corpus.has_pairs else {}),
            "label": eval_labels,
            "predicted": [id2label.get(int(p)) if p >= 0 else None for p in preds],
        }
    )
    predictions["correct"] = predictions["label"] == predictions["predicted"]
    table = pd.DataFrame(rows, columns=TABLE_COLUMNS)
    table["step"] = table["step"].astype("int64")
    details = {
        "split": split,
        "labels": labels,
        "reused_checkpoint_head": reused_head,
        "steps": total_steps,
        "steps_per_epoch": steps_per_epoch,
        "warmup_steps": warmup_steps,
        "epochs": config.epochs,
        "log_every": LOG_EVERY,
        "max_grad_norm": MAX_GRAD_NORM,
        "device": str(device),
        "token_type_ids": use_token_types,
        "tokenisation": {"train": enc_train.describe(), "eval": enc_eval.describe()},
        "label_counts": {
            "train": {str(lab): int(c) for lab, c in zip(*np.unique(train_labels, return_counts=True))},
            "eval": {str(lab): int(c) for lab, c in zip(*np.unique(eval_labels, return_counts=True))},
        },
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
    )
