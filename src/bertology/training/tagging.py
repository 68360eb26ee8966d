"""Fine-tuning a tagger: ``AutoModelForTokenClassification`` on words with one tag each (the fine-tuning lab).

The tags are a CoNLL-U file's UPOS or XPOS column (``tag_column``) or a CoNLL-2003-style tag file's tag
column (:mod:`bertology.data.tagfile`). Each word's tag sits on its first word piece, -100 elsewhere
(:mod:`bertology.tasks.tagging`); a BIO tag set makes the task ``bio_tagging`` (entity P/R/F1 by seqeval).
The run is :func:`bertology.training.finetune.finetune`'s with these differences: the held-out split is a
seeded random split of sentences (there is no sentence label to stratify by), the head is a fresh token
head on the encoder (a tagger checkpoint with exactly these tags keeps its head and mapping), the tags are
numbered in sorted order and saved as ``id2label``, the example field learnt is recorded in the saved
config (``bertology_tag_field``) so ``ablate`` and ``compare`` score the same tags, and
``finetune_predictions`` has one row per word. The lab's flags (drop/freeze layers, exclude words,
gradient accumulation, early stopping, checkpoints, ``--against``) work the same.
"""
from __future__ import annotations

import copy
import logging
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from bertology.config import FinetuneConfig
from bertology.data.batching import collate, length_batches
from bertology.data.corpus import Corpus
from bertology.data.encode import EncodedCorpus, encode_corpus
from bertology.errors import BertologyError
from bertology.models.device import resolve_device
from bertology.models.sites import uses_token_types
from bertology.tasks.base import Task
from bertology.tasks.bio_tagging import TASK as BIO_TAGGING
from bertology.tasks.tagging import CONFIG_KEY, TASK as TAGGING, check_tags, first_pieces, is_bio
from bertology.training.common import (
    INTERVALS_TABLE, check_config, checkpoint_folder, FinetuneResult, interval_table, loop_config, make_table, objective_record,
    padding_id, plan_schedule, prepare_model, save_atomically, training_record,
)
from bertology.training.data import SLICE_WITH, SLICE_WITHOUT, eval_slices, exclude_examples, parse_word_list
from bertology.training.finetune import HeadTask
from bertology.training.loop import seed_everything, train_loop

logger = logging.getLogger(__name__)


def tag_field(config: FinetuneConfig, corpus: Corpus) -> str:
    """The example field to learn: a tag file's ``tags``, else the CoNLL-U column ``config.tag_column``."""
    return "tags" if len(corpus) and all(ex.tags is not None for ex in corpus) else config.tag_column


def is_tagging_run(config: FinetuneConfig, train: Corpus) -> bool:
    """Whether ``config`` on ``train`` trains a tagger: ``--task tagging``, or ``auto`` on data with word tags
    and no sentence labels (a tag file, a CoNLL-U file)."""
    if config.objective != "classification":
        return False
    if config.task == "tagging":
        return True
    if config.task != "auto":  # another task named explicitly (qa data has no word tags to look at)
        return False
    field = tag_field(config, train)
    return not train.has_labels and len(train) > 0 and all(
        getattr(ex, field) is not None for ex in train)


def choose_tagging_task(tags: list[str]) -> Task:
    """``bio_tagging`` for a BIO tag set (entity-level scores), ``tagging`` otherwise; bound to ``tags``."""
    return BIO_TAGGING.with_labels(tags) if is_bio(tags) else TAGGING


def _load_tagger(config: FinetuneConfig, tags: list[str]):
    """The model with a ``len(tags)``-way token head; whether a checkpoint's tagger head was kept.

    A tagger checkpoint whose ``label2id`` names exactly ``tags`` is loaded as it is (its mapping kept);
    anything else (an encoder, a sequence classifier, a tagger of other tags) gives its encoder weights to
    a fresh token-classification model whose head is initialised from the seeded RNG.
    """
    from transformers import AutoConfig, AutoModelForTokenClassification

    from bertology.models.loading import load_model

    loaded = load_model(config.model, kind="encoder", trust_remote_code=config.trust_remote_code)
    ckpt = AutoConfig.from_pretrained(loaded.path, trust_remote_code=config.trust_remote_code)
    was_tagger = any(a.endswith("ForTokenClassification") for a in (getattr(ckpt, "architectures", None) or []))
    if was_tagger and set((getattr(ckpt, "label2id", None) or {})) == set(tags):
        tagger = load_model(config.model, kind="token_classifier", trust_remote_code=config.trust_remote_code)
        logger.info("Reusing the checkpoint's tagging head and its tag mapping")
        return tagger, {str(k): int(v) for k, v in tagger.model.config.label2id.items()}, True
    cfg = copy.deepcopy(loaded.model.config)
    label2id = {t: i for i, t in enumerate(tags)}
    cfg.num_labels = len(tags)
    cfg.id2label = {i: t for t, i in label2id.items()}
    cfg.label2id = dict(label2id)
    model = AutoModelForTokenClassification.from_config(cfg, attn_implementation="eager",
                                                        trust_remote_code=config.trust_remote_code)
    missing, _unexpected = model.base_model.load_state_dict(loaded.model.state_dict(), strict=False)
    if missing:  # pragma: no cover - the encoder and the tagger's base model are the same class
        raise BertologyError(f"Could not move {config.model}'s encoder into a tagger: missing {missing[:3]}.")
    model.eval()
    loaded.model, loaded.is_classifier = model, True
    return loaded, label2id, False


def _targets(tags: list[tuple[str, ...]], label2id: dict[str, int]) -> np.ndarray:
    out = np.empty(len(tags), dtype=object)
    out[:] = [np.array([label2id[t] for t in seq], dtype=np.int64) for seq in tags]
    return out


def _scored_words(enc: EncodedCorpus, corpus: Corpus) -> dict:
    """How many words have a first piece (scored) and how many have none (shared token or truncated)."""
    n_words = sum(len(ex.words or ()) for ex in corpus)
    scored = sum(int((first_pieces(it, len(corpus[it.index].words or ())) >= 0).sum()) for it in enc.items)
    return {"n_words": n_words, "n_scored": scored, "n_unscored": n_words - scored}


def word_predictions(model: torch.nn.Module, enc: EncodedCorpus, corpus: Corpus, tags: list[tuple[str, ...]],
                     id2label: dict[int, str], *, batch_size: int, pad_id: int, use_token_types: bool,
                     device: torch.device) -> pd.DataFrame:
    """One row per word of ``corpus``: ``index, word_index, word, label, predicted, correct`` (``predicted`` is
    None for a word without a first piece)."""
    predicted: dict[int, np.ndarray] = {}
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            for items in length_batches(enc.items, batch_size):
                t = collate(items, pad_id)
                kwargs = {"input_ids": t["input_ids"].to(device), "attention_mask": t["attention_mask"].to(device)}
                if use_token_types:
                    kwargs["token_type_ids"] = t["token_type_ids"].to(device)
                pred = model(**kwargs).logits.argmax(-1).cpu().numpy()
                for row, it in enumerate(items):
                    at = first_pieces(it, len(tags[it.index]))
                    predicted[it.index] = np.where(at >= 0, pred[row, np.maximum(at, 0)], -1)
    finally:
        model.train(was_training)
    rows = []
    for i, ex in enumerate(corpus):
        p = predicted.get(i, np.full(len(tags[i]), -1))
        for j, (word, gold) in enumerate(zip(ex.words or (), tags[i])):
            label = id2label.get(int(p[j])) if p[j] >= 0 else None
            rows.append({"index": i, "word_index": j, "word": word, "label": gold, "predicted": label,
                         "correct": label == gold if label is not None else None})
    return pd.DataFrame(rows, columns=["index", "word_index", "word", "label", "predicted", "correct"])


def finetune_tagger(
    config: FinetuneConfig,
    train: Corpus,
    eval: Corpus | None = None,  # noqa: A002 - the name finetune() uses
    progress: bool = False,
    *,
    resume: bool = True,
    on_step=None,
) -> FinetuneResult:
    """Fine-tune ``config.model`` as a tagger on ``train``'s word tags; evaluate on ``eval`` or a seeded split.

    Returns a :class:`FinetuneResult` like :func:`bertology.training.finetune.finetune` (the ``finetune``
    table carries the task's metrics: accuracy and loss, plus entity F1/precision/recall for BIO tags).
    """
    t0 = time.perf_counter()
    check_config(config)
    if len(train) == 0:
        raise BertologyError(f"The training data {train.name!r} ({train.source}) has no examples.")
    field = tag_field(config, train)
    check_tags(train, field, "training data")
    tag_set = sorted({t for ex in train for t in getattr(ex, field)})
    if len(tag_set) < 2:
        raise BertologyError(f"The training data has a single {field} tag ({tag_set[0]!r}); a tagger needs at least two.")
    task = choose_tagging_task(tag_set)
    reason = (f"tagging ({'--task' if config.task == 'tagging' else 'auto: the data has word tags and no sentence labels'}); "
              f"tags from {field}" + ("; BIO tags: entity-level P/R/F1 (seqeval)" if task.name == "bio_tagging" else ""))
    logger.info("Task: %s", reason)
    if config.early_stopping_metric is not None and config.early_stopping_metric not in task.metrics:
        raise BertologyError(f"--early-stopping-metric {config.early_stopping_metric!r} is not a metric of the "
                             f"{task.name} task; choose from {', '.join(task.metrics)}.")
    max_n = config.data.max_examples
    if max_n is not None and len(train) > max_n:
        train = train.stratified_sample(max_n, config.seed)  # no labels: a seeded sample of sentences
        logger.info("Using a seeded sample of %d of the training sentences (max_examples)", max_n)

    if eval is None:
        if not (0 < config.eval_fraction < 1):
            raise BertologyError(
                f"eval_fraction must be between 0 and 1 (exclusive) when no eval data is given, not {config.eval_fraction!r}."
            )
        from sklearn.model_selection import train_test_split

        idx = np.arange(len(train))
        try:
            tr_idx, ev_idx = train_test_split(idx, test_size=config.eval_fraction, random_state=config.seed, shuffle=True)
        except ValueError as err:
            raise BertologyError(f"Cannot split {len(train)} sentences with eval_fraction={config.eval_fraction}: {err}") from None
        eval_corpus = train.subset(sorted(int(i) for i in ev_idx), name=f"{train.name} (held out)")
        train = train.subset(sorted(int(i) for i in tr_idx), name=f"{train.name} (train)")
        split: dict = {"source": "split", "eval_fraction": config.eval_fraction, "stratified": False, "seed": config.seed,
                       "strata": "none: a seeded random split of sentences"}
    else:
        if len(eval) == 0:
            raise BertologyError(f"The eval data {eval.name!r} ({eval.source}) has no examples.")
        eval_corpus, split = eval, {"source": "eval_data"}

    exclusion: dict | None = None
    if config.exclude_words:
        words = parse_word_list(list(config.exclude_words))
        train, exclusion = exclude_examples(train, words)
        if len(train) == 0:
            raise BertologyError(f"Every training sentence mentions one of {', '.join(words)}; nothing is left to train on.")
    slices, slicing = eval_slices(eval_corpus, parse_word_list(list(config.slice_words or config.exclude_words)), exclusion)

    train_tags = check_tags(train, field, "training data")
    eval_tags = check_tags(eval_corpus, field, "eval data")
    trained = sorted({t for seq in train_tags for t in seq})  # after the held-out split and --exclude-words
    unseen = sorted({t for seq in eval_tags for t in seq} - set(trained))
    if unseen:
        why = (f" once --exclude-words removed {exclusion['n_dropped']} training sentences" if exclusion and
               exclusion.get("n_dropped") else "")
        raise BertologyError(f"The eval data has {field} tags never seen in training{why}: {', '.join(map(repr, unseen[:10]))} "
                             f"(training tags: {', '.join(map(repr, trained))}).")
    split.update(n_train=len(train), n_eval=len(eval_corpus))

    device = resolve_device(config.device)
    seed_everything(config.seed)
    loaded, label2id, reused_head = _load_tagger(config, tag_set)
    model, tokenizer = loaded.model, loaded.tokenizer
    model.config.label2id = dict(label2id)
    model.config.id2label = {i: t for t, i in label2id.items()}
    setattr(model.config, CONFIG_KEY, field)  # ablate / compare read the same field back
    task = task.for_model(model)
    surgery = prepare_model(model, config, device)
    pad_id = padding_id(tokenizer)
    use_token_types = uses_token_types(model)

    y_train, y_eval = _targets(train_tags, label2id), _targets(eval_tags, label2id)
    enc_train = encode_corpus(train, tokenizer, max_length=config.data.max_length, overlong=config.data.overlong)
    enc_eval = encode_corpus(eval_corpus, tokenizer, max_length=config.data.max_length, overlong=config.data.overlong)
    schedule = plan_schedule(config, len(enc_train.items))
    logger.info("Fine-tuning %s (%s, %d tags) on %d sentences (%d held out): %d steps", loaded.name, task.name,
                len(tag_set), len(enc_train.items), len(enc_eval.items), schedule.total_steps)

    checkpoint_dir = checkpoint_folder(config, train, eval_corpus, resume)
    head = HeadTask(task, tokenizer, enc_train, y_train, enc_eval, y_eval, batch_size=config.batch_size,
                    pad_id=pad_id, use_token_types=use_token_types, device=device, slices=slices)
    metric = config.early_stopping_metric or task.primary
    outcome = train_loop(model, head, loop_config(config, schedule, metric, checkpoint_dir, resume),
                         progress=progress, on_step=on_step)
    final_metrics = outcome.metrics
    if head.last_preds is None or (outcome.best_step is not None and outcome.best_step != outcome.last_step):
        final_metrics, _ = head.evaluate(model)  # the metrics of the weights that are saved
    predictions = word_predictions(model, enc_eval, eval_corpus, eval_tags, model.config.id2label,
                                   batch_size=config.batch_size, pad_id=pad_id, use_token_types=use_token_types,
                                   device=device)
    if slices:
        predictions["slice"] = np.where(slices[SLICE_WITH][predictions["index"].to_numpy()], SLICE_WITH, SLICE_WITHOUT)
    model_dir = save_atomically(model, tokenizer, Path(config.out))
    details = {
        **objective_record(config, head),
        "task": task.name,
        "task_choice": reason,
        "tag_field": field,
        "split": split,
        "labels": tag_set,
        "reused_checkpoint_head": reused_head,
        **training_record(config, schedule, outcome, metric, model, surgery, device=device, token_types=use_token_types,
                          exclusion=exclusion, slicing=slicing, encoded=(enc_train, enc_eval)),
        "label_placement": "each word's first piece; -100 on its other pieces, special tokens and padding",
        "words": {"train": _scored_words(enc_train, train), "eval": _scored_words(enc_eval, eval_corpus)},
        "label_counts": {"train": dict(sorted(Counter(t for s in train_tags for t in s).items())),
                         "eval": dict(sorted(Counter(t for s in eval_tags for t in s).items()))},
        "base_model": loaded.describe(),
    }
    wall = time.perf_counter() - t0
    return FinetuneResult(
        model_dir=model_dir, table=make_table(outcome.rows), metrics=final_metrics, n_train=len(train),
        n_eval=len(eval_corpus), wall_time_s=wall, label2id=label2id, predictions=predictions, details=details,
        extra_tables={INTERVALS_TABLE: interval_table(task, head.last_scored, seed=config.seed)},
    )
