"""Fine-tuning a tagger: ``AutoModelForTokenClassification`` on words with one tag each (the fine-tuning lab).

The tags are a CoNLL-U file's UPOS or XPOS column (``tag_column``) or a CoNLL-2003-style tag file's tag
column (:mod:`bertology.data.tagfile`). Each word's tag sits on its first word piece, -100 elsewhere
(:mod:`bertology.tasks.tagging`); a BIO tag set makes the task ``bio_tagging`` (entity P/R/F1 by seqeval).
The run is the shared one (:class:`~bertology.training.skeleton.TaskTrainer`) with these differences: the held-out split is a
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
from collections import Counter

import numpy as np
import pandas as pd
import torch

from bertology.config import FinetuneConfig
from bertology.data.batching import length_batches
from bertology.data.corpus import Corpus
from bertology.data.encode import EncodedCorpus, encode_corpus
from bertology.errors import BertologyError
from bertology.tasks.base import Task
from bertology.tasks.bio_tagging import TASK as BIO_TAGGING
from bertology.tasks.tagging import CONFIG_KEY, TASK as TAGGING, check_tags, first_pieces, is_bio
from bertology.training.common import FinetuneResult, resolve_config
from bertology.training.data import SLICE_WITH, SLICE_WITHOUT
from bertology.training.heads import Batching, HeadTask
from bertology.training.loop import LoopOutcome
from bertology.training.skeleton import Finish, ModelToTrain, RunData, TaskTrainer, random_split

logger = logging.getLogger(__name__)


def tag_field(config: FinetuneConfig, corpus: Corpus) -> str:
    """The example field to learn: a tag file's ``tags``, else the CoNLL-U column ``config.tag_column``."""
    return "tags" if len(corpus) and all(ex.tags is not None for ex in corpus) else config.tag_column


def is_tagging_run(config: FinetuneConfig, train: Corpus) -> bool:
    """Whether ``config`` on ``train`` trains a tagger: ``--task tagging``, or ``auto`` on data with word tags
    and no sentence labels (a tag file, a CoNLL-U file)."""
    if config.objective == "contrastive":
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
                     id2label: dict[int, str], batching: Batching) -> pd.DataFrame:
    """One row per word of ``corpus``: ``index, word_index, word, label, predicted, correct`` (``predicted`` is
    None for a word without a first piece)."""
    predicted: dict[int, np.ndarray] = {}
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            for items in length_batches(enc.items, batching.batch_size):
                pred = model(**batching.inputs(items)).logits.argmax(-1).cpu().numpy()
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


class TaggerTrainer(TaskTrainer):
    """A token head: one tag per word on its first piece; a seeded random sentence split (no label to stratify by)."""

    recipe_name = "tagging"

    unit = "sentences"

    def prepare_data(self, train: Corpus, eval: Corpus | None) -> RunData:  # noqa: A002
        config = self.config
        if len(train) == 0:
            raise BertologyError(f"The training data {train.name!r} ({train.source}) has no examples.")
        self.field = field = tag_field(config, train)
        check_tags(train, field, "training data")
        self.labels = sorted({t for ex in train for t in getattr(ex, field)})
        if len(self.labels) < 2:
            raise BertologyError(f"The training data has a single {field} tag ({self.labels[0]!r}); a tagger needs at least two.")
        self.task = choose_tagging_task(self.labels)
        self.task_choice = (f"tagging ({'--task' if config.task == 'tagging' else 'auto: the data has word tags and no sentence labels'}); "
                            f"tags from {field}" + ("; BIO tags: entity-level P/R/F1 (seqeval)" if self.task.name == "bio_tagging" else ""))
        logger.info("Task: %s", self.task_choice)
        max_n = config.data.max_examples
        if max_n is not None and len(train) > max_n:
            train = train.stratified_sample(max_n, config.seed)  # no labels: a seeded sample of sentences
            logger.info("Using a seeded sample of %d of the training sentences (max_examples)", max_n)
        data = self.held_out(train, eval, lambda t: (*random_split(len(t), config.eval_fraction, config.seed), {
            "stratified": False, "seed": config.seed, "strata": "none: a seeded random split of sentences"}))
        self.tags = (check_tags(data.train, field, "training data"), check_tags(data.eval, field, "eval data"))
        trained = sorted({t for seq in self.tags[0] for t in seq})  # after the held-out split and --exclude-words
        unseen = sorted({t for seq in self.tags[1] for t in seq} - set(trained))
        if unseen:
            why = (f" once --exclude-words removed {data.exclusion['n_dropped']} training sentences"
                   if data.exclusion and data.exclusion.get("n_dropped") else "")
            raise BertologyError(f"The eval data has {field} tags never seen in training{why}: {', '.join(map(repr, unseen[:10]))} "
                                 f"(training tags: {', '.join(map(repr, trained))}).")
        return data

    def load(self, data: RunData) -> ModelToTrain:
        loaded, label2id, reused_head = _load_tagger(self.config, self.labels)
        model = loaded.model
        model.config.label2id = dict(label2id)
        model.config.id2label = {i: t for t, i in label2id.items()}
        setattr(model.config, CONFIG_KEY, self.field)  # ablate / compare read the same field back
        self.task = self.task.for_model(model)
        return ModelToTrain(model, loaded.tokenizer, loaded.describe, loaded.name, reused_head, label2id)

    def make_head(self, loaded: ModelToTrain, data: RunData, device: torch.device) -> HeadTask:
        config = self.config
        y = [_targets(tags, loaded.label2id) for tags in self.tags]
        enc = [encode_corpus(c, loaded.tokenizer, max_length=config.data.max_length, overlong=config.data.overlong)
               for c in (data.train, data.eval)]
        return HeadTask(self.task, loaded.tokenizer, (enc[0], y[0]), (enc[1], y[1]),
                        Batching.of(config.batch_size, loaded.model, loaded.tokenizer, device), data.slices)

    def finish(self, loaded: ModelToTrain, head: HeadTask, data: RunData, outcome: LoopOutcome) -> Finish:
        predictions = word_predictions(loaded.model, head.enc_eval, data.eval, self.tags[1], loaded.model.config.id2label,
                                       head.batching)
        if data.slices:
            predictions["slice"] = np.where(data.slices[SLICE_WITH][predictions["index"].to_numpy()], SLICE_WITH, SLICE_WITHOUT)
        train_tags, eval_tags = self.tags
        return Finish(predictions=predictions, record={
            "tag_field": self.field,
            "label_placement": "each word's first piece; -100 on its other pieces, special tokens and padding",
            "words": {"train": _scored_words(head.enc_train, data.train), "eval": _scored_words(head.enc_eval, data.eval)},
            "label_counts": {"train": dict(sorted(Counter(t for s in train_tags for t in s).items())),
                             "eval": dict(sorted(Counter(t for s in eval_tags for t in s).items()))},
        })


def finetune_tagger(config: FinetuneConfig, train: Corpus, eval: Corpus | None = None,  # noqa: A002
                    progress: bool = False, *, resume: bool = True, on_step=None) -> FinetuneResult:
    """Fine-tune ``config.model`` as a tagger on ``train``'s word tags (:class:`TaggerTrainer`; the ``finetune``
    table carries the task's metrics: accuracy and loss, plus entity F1/precision/recall for BIO tags)."""
    return TaggerTrainer(resolve_config(config, train)).run(train, eval, progress=progress, resume=resume, on_step=on_step)
