"""Fine-tuning a biaffine dependency parser on CoNLL-U trees (``finetune --task parsing``).

The same run as every head (:class:`~bertology.training.skeleton.TaskTrainer`): the model surgery
(``drop_layers``, ``freeze_layers``, ``freeze_embeddings``), the shared loop (gradient accumulation,
early stopping, checkpoints and exact resumption), the held-out evaluation at step 0, every
``eval_every`` steps, every epoch end and the last step, and word slices (``exclude_words``,
``slice_words``). Only what is the parser's own lives here: the trees as targets, the label set (the
training data's relations, sorted), the seeded sentence split, and the predicted trees of the
held-out sentences. The loss is the sum of the arc and label cross-entropies, averaged over the words
of each micro-batch (so with ``grad_accum`` micro-batches are weighted by their sentences, not their words).
"""
from __future__ import annotations

import dataclasses
import logging

import numpy as np
import pandas as pd
import torch

from bertology.config import FinetuneConfig
from bertology.data.batching import length_batches
from bertology.data.corpus import Corpus
from bertology.data.encode import encode_corpus
from bertology.models.parser import BiaffineParser, ParserConfig
from bertology.models.sites import encoder
from bertology.tasks.catalog import get_task
from bertology.tasks.parsing import PUNCT_UPOS, check_trees, coverage, deprel_set, predicted_trees, word_targets
from bertology.training.common import FinetuneResult, resolve_config
from bertology.training.heads import Batching, HeadTask
from bertology.training.loop import LoopOutcome
from bertology.training.skeleton import Finish, ModelToTrain, RunData, TaskTrainer, random_split

logger = logging.getLogger(__name__)


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
    sizes = {k: v for k, v in dataclasses.asdict(config.parsing).items() if v is not None}
    head = ParserConfig(labels=tuple(labels), hidden_size=int(enc.config.hidden_size), **sizes)
    return BiaffineParser(enc, head), loaded.tokenizer, loaded.describe(), False


class ParserTraining(HeadTask):
    """The training loop's view of the parser: the parsing task's loss, UAS/LAS/loss on the held-out sentences
    (and slices) as every head's (:class:`~bertology.training.heads.HeadTask`), and the predicted trees."""

    def predictions(self, model: BiaffineParser, corpus: Corpus, labels: list[str]) -> pd.DataFrame:
        """One row per held-out sentence: its words, the gold and predicted heads and labels (of the decoded tree), and
        the counts UAS/LAS use (of the tree, and ``*_argmax`` of the per-word argmax)."""
        rows: dict[int, dict] = {}
        model.eval()
        with torch.inference_mode():
            for items in length_batches(self.enc_eval.items, self.batching.batch_size):
                outputs, targets = self.outputs(model, items, self.y_eval)
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
                        "correct_argmax": int(rec["correct_argmax"][k]),
                        "correct_labelled_argmax": int(rec["correct_labelled_argmax"][k]),
                    }
        return pd.DataFrame([rows[i] for i in sorted(rows)])


class ParserTrainer(TaskTrainer):
    """A biaffine parser on CoNLL-U trees: the relations of the training data as labels, a seeded sentence split."""

    recipe_name = "parsing"

    unit = "sentences"
    task = get_task("parsing")
    task_choice = "parsing (--task)"

    def prepare_data(self, train: Corpus, eval: Corpus | None) -> RunData:  # noqa: A002
        config = self.config
        check_trees(train, "training data")
        if eval is not None:
            check_trees(eval, "eval data")
        max_n = config.data.max_examples
        if max_n is not None and len(train) > max_n:
            keep = np.sort(np.random.default_rng(config.seed).choice(len(train), size=max_n, replace=False))
            train = train.subset([int(i) for i in keep])
            train.stats["sampled_to"] = max_n
            logger.info("Using a seeded sample of %d of the training sentences (max_examples)", max_n)
        data = self.held_out(train, eval, lambda t: (*random_split(len(t), config.eval_fraction, config.seed), {
            "stratified": False, "seed": config.seed, "strata": "sentences (seeded, not stratified)"}))
        self.labels = deprel_set(data.train)
        return data

    def load(self, data: RunData) -> ModelToTrain:
        model, tokenizer, base_record, reused_head = build_parser(self.config, self.labels)
        return ModelToTrain(model, tokenizer, lambda: base_record, self.config.model, reused_head,
                            {lab: i for i, lab in enumerate(self.labels)})

    def make_head(self, loaded: ModelToTrain, data: RunData, device: torch.device) -> ParserTraining:
        config = self.config
        y = [word_targets(data.train, self.labels, "training data"), word_targets(data.eval, self.labels, "eval data")]
        enc = [encode_corpus(c, loaded.tokenizer, max_length=config.data.max_length, overlong=config.data.overlong)
               for c in (data.train, data.eval)]
        self.cover = {"train": coverage(enc[0], y[0]), "eval": coverage(enc[1], y[1])}
        if self.cover["eval"]["n_unknown_labels"]:
            logger.warning("%d held-out words have a relation the training data lacks; they count as labelled errors",
                           self.cover["eval"]["n_unknown_labels"])
        return ParserTraining(self.task, loaded.tokenizer, (enc[0], y[0]), (enc[1], y[1]),
                              Batching.of(config.batch_size, loaded.model, loaded.tokenizer, device), data.slices)

    def finish(self, loaded: ModelToTrain, head: ParserTraining, data: RunData, outcome: LoopOutcome) -> Finish:
        return Finish(predictions=head.predictions(loaded.model, data.eval, self.labels), record={
            "parser": {**loaded.model.parser_config.to_dict(), "decoding": "the best one-root tree (Chu-Liu-Edmonds); uas_argmax/las_argmax: the "
                                                                     "per-word argmax (no tree constraint)",
                       "word_representation": "first piece of each word, last layer",
                       "punctuation": f"UPOS {', '.join(PUNCT_UPOS)} left out of UAS/LAS (trained on)",
                       "reused_checkpoint_head": loaded.reused_head},
            "words": self.cover,
        })


def finetune_parser(config: FinetuneConfig, train: Corpus, eval: Corpus | None = None,  # noqa: A002
                    progress: bool = False, *, resume: bool = True, on_step=None) -> FinetuneResult:
    """Fine-tune ``config.model`` as a biaffine parser on ``train``'s trees (:class:`ParserTrainer`); the parser is
    saved to ``out/model`` (the encoder as a Hugging Face folder plus the head, :mod:`bertology.models.parser`), the
    ``finetune`` table has eval rows of ``uas``, ``las`` (of the decoded one-root tree), ``loss``, ``uas_argmax`` and
    ``las_argmax``, and ``predictions`` one row per held-out sentence."""
    return ParserTrainer(resolve_config(config, train)).run(train, eval, progress=progress, resume=resume, on_step=on_step)
