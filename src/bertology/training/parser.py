"""Fine-tuning a biaffine dependency parser on CoNLL-U trees (``finetune --task parsing``).

The same lab as the sequence heads (:mod:`bertology.training.finetune`): the model surgery
(``drop_layers``, ``freeze_layers``, ``freeze_embeddings``), the shared loop (gradient accumulation,
early stopping, checkpoints and exact resumption), the held-out evaluation at step 0, every
``eval_every`` steps, every epoch end and the last step, and word slices (``exclude_words``,
``slice_words``). Only what is the parser's own lives here: the trees as targets, the label set (the
training data's relations, sorted), the seeded sentence split, and the predicted trees of the
held-out sentences. The loss is the sum of the arc and label cross-entropies, averaged over the words
of each micro-batch (so with ``grad_accum`` micro-batches are weighted by their sentences, not their words).
"""
from __future__ import annotations

import logging
import time
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
from bertology.models.parser import BiaffineParser, ParserConfig
from bertology.models.sites import encoder, uses_token_types
from bertology.tasks.catalog import get_task
from bertology.tasks.parsing import PUNCT_UPOS, check_trees, coverage, deprel_set, predicted_trees, word_targets
from bertology.training.common import (
    INTERVALS_TABLE, check_config, checkpoint_folder, FinetuneResult, interval_table, loop_config, make_table, objective_record,
    padding_id, plan_schedule, prepare_model, save_atomically, training_record,
)
from bertology.training.data import SLICE_ALL, eval_slices, exclude_examples, parse_word_list
from bertology.training.loop import seed_everything, train_loop

logger = logging.getLogger(__name__)


def sentence_split(n: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Sorted indices of a seeded train / held-out split of ``n`` sentences."""
    from sklearn.model_selection import train_test_split

    if not 0 < fraction < 1:
        raise BertologyError(f"eval_fraction must be between 0 and 1 (exclusive) when no eval data is given, not {fraction!r}.")
    try:
        tr, ev = train_test_split(np.arange(n), test_size=fraction, random_state=seed, shuffle=True)
    except ValueError as err:
        raise BertologyError(f"Cannot split {n} sentences with eval_fraction={fraction}: {err}") from None
    return np.sort(tr), np.sort(ev)


def build_parser(config: FinetuneConfig, labels: list[str]) -> tuple[BiaffineParser, object, dict, bool]:
    """The encoder of ``config.model`` with a fresh (seeded) parser head for ``labels``, or the checkpoint's own
    parser when it already parses with exactly these labels. Returns the model, tokenizer, provenance and
    whether the checkpoint's head was kept."""
    from bertology.models.loading import load_model

    loaded = load_model(config.model, kind="auto", trust_remote_code=config.trust_remote_code)
    model = loaded.model
    if isinstance(model, BiaffineParser) and list(model.labels) == labels:
        logger.info("Continuing the checkpoint's parser head (same %d labels)", len(labels))
        return model, loaded.tokenizer, loaded.describe(), True
    enc = encoder(model)
    head = ParserConfig(labels=tuple(labels), hidden_size=int(enc.config.hidden_size))
    return BiaffineParser(enc, head), loaded.tokenizer, loaded.describe(), False


class ParserTraining:
    """The training loop's view of the parser (:class:`bertology.training.loop.TrainTask`): the parsing task's
    loss on a micro-batch of sentences, UAS/LAS/loss on the held-out sentences (and slices), the folder save."""

    objective = "supervised"

    @property
    def loss_name(self) -> str:
        """The parsing task's loss by name."""
        return self.task.loss_name

    def __init__(self, tokenizer, enc_train: EncodedCorpus, y_train: np.ndarray, enc_eval: EncodedCorpus,
                 y_eval: np.ndarray, *, batch_size: int, pad_id: int, use_token_types: bool, device: torch.device,
                 slices: dict[str, np.ndarray] | None = None) -> None:
        self.task = get_task("parsing")
        self.tokenizer = tokenizer
        self.enc_train, self.y_train, self.enc_eval, self.y_eval = enc_train, y_train, enc_eval, y_eval
        self.batch_size, self.pad_id, self.use_token_types, self.device = batch_size, pad_id, use_token_types, device
        self.slices = slices
        self.n_items = len(enc_train.items)
        #: the records and targets of the held-out sentences scored at the last evaluation (skipped ones left out)
        self.last_scored: tuple[dict[str, np.ndarray], np.ndarray] | None = None

    def _outputs(self, model: torch.nn.Module, items, y: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        t = collate(items, self.pad_id)
        kwargs = {k: t[k].to(self.device) for k in ("input_ids", "attention_mask")}
        if self.use_token_types:
            kwargs["token_type_ids"] = t["token_type_ids"].to(self.device)
        targets = self.task.collate_targets(items, [y[it.index] for it in items]).to(self.device)
        return model(**kwargs).logits, targets

    def loss(self, model: torch.nn.Module, indices: list[int]) -> torch.Tensor:
        outputs, targets = self._outputs(model, [self.enc_train.items[i] for i in indices], self.y_train)
        return self.task.loss(outputs, targets)

    def records(self, model: torch.nn.Module) -> dict[str, np.ndarray]:
        """The task's per-sentence records of the held-out set, by corpus index (NaN: skipped as over-long)."""
        was_training = model.training
        model.eval()
        out: dict[str, np.ndarray] = {}
        try:
            with torch.inference_mode():
                for items in length_batches(self.enc_eval.items, self.batch_size):
                    index = np.array([it.index for it in items])
                    for k, v in self.task.record(*self._outputs(model, items, self.y_eval)).items():
                        out.setdefault(k, np.full(len(self.y_eval), np.nan))[index] = v
        finally:
            model.train(was_training)
        return out

    def evaluate(self, model: torch.nn.Module) -> tuple[dict, list[dict]]:
        rec = self.records(model)
        kept = np.array(sorted(it.index for it in self.enc_eval.items), dtype=np.int64)

        def scores(sel: np.ndarray) -> dict:
            if len(sel) == 0:
                return {**{m: float("nan") for m in self.task.metrics}, "n_eval": 0}
            return {**self.task.point_scores({k: v[sel] for k, v in rec.items()}, self.y_eval[sel]), "n_eval": int(len(sel))}

        metrics = scores(kept)
        self.last_scored = ({k: v[kept] for k, v in rec.items()}, self.y_eval[kept])
        rows = [{"split": "eval", "metric": m, "value": float(metrics[m]), "slice": SLICE_ALL} for m in self.task.metrics]
        if self.slices:
            metrics["slices"] = {name: scores(kept[mask[kept]]) for name, mask in self.slices.items()}
            for name, sm in metrics["slices"].items():
                rows += [{"split": "eval", "metric": m, "value": float(sm[m]), "slice": name} for m in (*self.task.metrics, "n_eval")]
        return metrics, rows

    def save(self, model: torch.nn.Module, folder: Path) -> None:
        model.save_pretrained(folder, safe_serialization=True)
        self.tokenizer.save_pretrained(folder)

    def predictions(self, model: BiaffineParser, corpus: Corpus, labels: list[str]) -> pd.DataFrame:
        """One row per held-out sentence: its words, the gold and predicted heads and labels, and the counts UAS/LAS use."""
        rows: dict[int, dict] = {}
        model.eval()
        with torch.inference_mode():
            for items in length_batches(self.enc_eval.items, self.batch_size):
                outputs, targets = self._outputs(model, items, self.y_eval)
                rec = self.task.record(outputs, targets)
                trees = predicted_trees(outputs, targets, items, [len(self.y_eval[it.index]) for it in items])
                for k, (it, (heads, labs)) in enumerate(zip(items, trees)):
                    ex = corpus[it.index]
                    rows[it.index] = {
                        "index": it.index, "text": ex.text, "words": " ".join(ex.words),
                        "gold_heads": " ".join(map(str, ex.heads)), "predicted_heads": " ".join(map(str, heads)),
                        "gold_labels": " ".join(ex.deprels),
                        "predicted_labels": " ".join(labels[i] if i >= 0 else "_" for i in labs),
                        "n_scored": int(rec["n_scored"][k]), "correct": int(rec["correct"][k]),
                        "correct_labelled": int(rec["correct_labelled"][k]),
                    }
        return pd.DataFrame([rows[i] for i in sorted(rows)])


def finetune_parser(
    config: FinetuneConfig,
    train: Corpus,
    eval: Corpus | None = None,  # noqa: A002 - the public name of finetune()
    progress: bool = False,
    *,
    resume: bool = True,
    on_step=None,
) -> FinetuneResult:
    """Fine-tune ``config.model`` as a biaffine parser on ``train``'s trees; evaluate UAS/LAS on ``eval`` or a split.

    Returns a :class:`FinetuneResult` like :func:`bertology.training.finetune.finetune`; the parser is saved to
    ``out/model`` (the encoder as a Hugging Face folder plus the head, :mod:`bertology.models.parser`), the
    ``finetune`` table has eval rows of ``uas``, ``las`` and ``loss``, and ``predictions`` one row per
    held-out sentence.
    """
    t0 = time.perf_counter()
    check_config(config)
    task = get_task("parsing")
    check_trees(train, "training data")
    if eval is not None:
        check_trees(eval, "eval data")
    if config.early_stopping_metric is not None and config.early_stopping_metric not in task.metrics:
        raise BertologyError(f"--early-stopping-metric {config.early_stopping_metric!r} is not a metric of the "
                             f"parsing task; choose from {', '.join(task.metrics)}.")
    max_n = config.data.max_examples
    if max_n is not None and len(train) > max_n:
        keep = np.sort(np.random.default_rng(config.seed).choice(len(train), size=max_n, replace=False))
        train = train.subset([int(i) for i in keep])
        train.stats["sampled_to"] = max_n
        logger.info("Using a seeded sample of %d of the training sentences (max_examples)", max_n)

    if eval is None:
        tr_idx, ev_idx = sentence_split(len(train), config.eval_fraction, config.seed)
        eval_corpus = train.subset([int(i) for i in ev_idx], name=f"{train.name} (held out)")
        train = train.subset([int(i) for i in tr_idx], name=f"{train.name} (train)")
        split: dict = {"source": "split", "eval_fraction": config.eval_fraction, "stratified": False, "seed": config.seed,
                       "strata": "sentences (seeded, not stratified)"}
    else:
        eval_corpus = eval
        split = {"source": "eval_data"}

    exclusion: dict | None = None
    if config.exclude_words:
        words = parse_word_list(list(config.exclude_words))
        train, exclusion = exclude_examples(train, words)
        if len(train) == 0:
            raise BertologyError(f"Every training sentence mentions one of {', '.join(words)}; nothing is left to train on.")
    slices, slicing = eval_slices(eval_corpus, parse_word_list(list(config.slice_words or config.exclude_words)),
                                  exclusion)  # the record gains the held-out counts, as finetune's and tagging's
    split.update(n_train=len(train), n_eval=len(eval_corpus))

    labels = deprel_set(train)
    device = resolve_device(config.device)
    seed_everything(config.seed)
    model, tokenizer, base_record, reused_head = build_parser(config, labels)
    surgery = prepare_model(model, config, device)
    pad_id, use_token_types = padding_id(tokenizer), uses_token_types(model)

    y_train, y_eval = word_targets(train, labels, "training data"), word_targets(eval_corpus, labels, "eval data")
    enc_train = encode_corpus(train, tokenizer, max_length=config.data.max_length, overlong=config.data.overlong)
    enc_eval = encode_corpus(eval_corpus, tokenizer, max_length=config.data.max_length, overlong=config.data.overlong)
    cover = {"train": coverage(enc_train, y_train), "eval": coverage(enc_eval, y_eval)}
    if cover["eval"]["n_unknown_labels"]:
        logger.warning("%d held-out words have a relation the training data lacks; they count as labelled errors",
                       cover["eval"]["n_unknown_labels"])
    schedule = plan_schedule(config, len(enc_train.items))
    logger.info("Fine-tuning a parser on %s: %d sentences (%d held out), %d labels, %d steps",
                config.model, len(enc_train.items), len(enc_eval.items), len(labels), schedule.total_steps)

    head = ParserTraining(tokenizer, enc_train, y_train, enc_eval, y_eval, batch_size=config.batch_size,
                          pad_id=pad_id, use_token_types=use_token_types, device=device, slices=slices)
    metric = config.early_stopping_metric or task.primary
    checkpoint_dir = checkpoint_folder(config, train, eval_corpus, resume)
    outcome = train_loop(model, head, loop_config(config, schedule, metric, checkpoint_dir, resume),
                         progress=progress, on_step=on_step)
    final_metrics = outcome.metrics  # of the saved weights (the best evaluation's when early stopping restored them)
    if head.last_scored is None or (outcome.best_step is not None and outcome.best_step != outcome.last_step):
        final_metrics, _ = head.evaluate(model)  # the records of the weights that are saved, for the intervals
    predictions = head.predictions(model, eval_corpus, labels)
    model_dir = save_atomically(model, tokenizer, Path(config.out))
    details = {
        **objective_record(config, head),
        "task": task.name,
        "task_choice": "parsing (--task)",
        "split": split,
        "labels": labels,
        "parser": {**model.parser_config.to_dict(), "decoding": "per-word argmax (no tree constraint)",
                   "word_representation": "first piece of each word, last layer",
                   "punctuation": f"UPOS {', '.join(PUNCT_UPOS)} left out of UAS/LAS (trained on)",
                   "reused_checkpoint_head": reused_head},
        "words": cover,
        "reused_checkpoint_head": reused_head,
        **training_record(config, schedule, outcome, metric, model, surgery, device=device, token_types=use_token_types,
                          exclusion=exclusion, slicing=slicing, encoded=(enc_train, enc_eval)),
        "base_model": base_record,
    }
    wall = time.perf_counter() - t0
    logger.info("Saved the parser to %s (%.1f s)", model_dir, wall)
    return FinetuneResult(model_dir=model_dir, table=make_table(outcome.rows), metrics=final_metrics, n_train=len(train),
                          n_eval=len(eval_corpus), wall_time_s=wall, label2id={lab: i for i, lab in enumerate(labels)},
                          predictions=predictions, details=details,
                          extra_tables={INTERVALS_TABLE: interval_table(task, head.last_scored, seed=config.seed)})
