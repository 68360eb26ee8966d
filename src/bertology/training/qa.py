"""Fine-tuning extractive question answering (SQuAD v1.1 / v2.0): ``finetune --task qa``.

:func:`finetune_qa` trains ``AutoModelForQuestionAnswering`` (a start/end head on the encoder) on
:class:`~bertology.data.squad.SquadData` with the lab's loop (:mod:`bertology.training.loop`: AdamW,
warm-up, gradient accumulation, early stopping, checkpoints and exact resumption) and its model
surgery (``drop_layers`` / ``freeze_layers`` / ``freeze_embeddings``). The loop's items are the
windows of the questions (:mod:`bertology.data.qa_features`); the evaluation folds them back into
questions (:meth:`bertology.tasks.qa.QuestionAnswering.example_records`) and reports F1, exact match
and the span loss over questions.

Without an eval file, a seeded share (``eval_fraction``) of the training data is held out, whole
articles at a time by default (``qa_split="article"``: questions about one paragraph never sit on both
sides) or by question (``"question"``, stratified by answerable / unanswerable).

Word filters (``exclude_words`` / ``slice_words``) are a classification experiment and are refused here.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from bertology.config import FinetuneConfig
from bertology.data.batching import length_batches
from bertology.data.qa_features import QAFeatures, encode_squad
from bertology.data.squad import SquadData
from bertology.errors import BertologyError
from bertology.models.loading import save_model
from bertology.tasks.base import head_logits
from bertology.tasks.catalog import get_task
from bertology.training.common import FinetuneResult, resolve_config
from bertology.training.data import SLICE_ALL
from bertology.training.heads import Batching
from bertology.training.loop import LoopOutcome
from bertology.training.skeleton import Finish, ModelToTrain, RunData, TaskTrainer

logger = logging.getLogger(__name__)


def split_questions(data: SquadData, fraction: float, seed: int, by: str = "article") -> tuple[np.ndarray, np.ndarray, dict]:
    """Seeded train / held-out question indices: whole articles (``by="article"``) or single questions."""
    from sklearn.model_selection import GroupShuffleSplit, train_test_split

    idx = np.arange(len(data))
    if by == "article":
        groups = np.array([ex.article for ex in data])
        if len(np.unique(groups)) < 2:
            raise BertologyError(f"{data.source} has a single article; split by question instead (--qa-split question).")
        tr, ev = next(GroupShuffleSplit(n_splits=1, test_size=fraction, random_state=seed).split(idx, groups=groups))
        record = {"unit": "article", "n_articles_eval": int(len(np.unique(groups[ev])))}
    elif by == "question":
        strata = [ex.is_impossible for ex in data]
        try:
            tr, ev = train_test_split(idx, test_size=fraction, random_state=seed, stratify=strata)
        except ValueError:
            tr, ev = train_test_split(idx, test_size=fraction, random_state=seed)
        record = {"unit": "question"}
    else:
        raise BertologyError(f"Unknown qa_split {by!r} (--qa-split); choose article or question.")
    if len(tr) == 0 or len(ev) == 0:
        raise BertologyError(f"eval_fraction={fraction} leaves {len(tr)} training and {len(ev)} held-out questions; "
                             "use more data or a different --eval-fraction.")
    return np.sort(tr), np.sort(ev), record


class QAHead:
    """The training loop's view of a question-answering head: span loss on windows; F1 / EM over questions."""

    objective = "supervised"

    @property
    def loss_name(self) -> str:
        """The QA task's loss by name."""
        return self.task.loss_name

    def __init__(self, tokenizer, train: QAFeatures, evaluation: QAFeatures, batching: Batching) -> None:
        self.task = get_task("qa")
        self.tokenizer, self.train, self.eval, self.batching = tokenizer, train, evaluation, batching
        self.use_token_types = batching.use_token_types
        self.n_items = len(train.items)
        self.last_records: dict[str, np.ndarray] | None = None
        #: the per-question records and targets of the last evaluation (what the final intervals resample)
        self.last_scored: tuple[dict[str, np.ndarray], np.ndarray] | None = None

    def _run(self, model: torch.nn.Module, items) -> tuple[torch.Tensor, torch.Tensor]:
        targets = self.task.collate_targets(items, [(it.start, it.end) for it in items]).to(self.batching.device)
        return head_logits(model(**self.batching.inputs(items))), targets

    def loss(self, model: torch.nn.Module, indices: list[int]) -> torch.Tensor:
        outputs, targets = self._run(model, [self.train.items[i] for i in indices])
        return self.task.loss(outputs, targets)

    def evaluate(self, model: torch.nn.Module) -> tuple[dict, list[dict]]:
        was_training = model.training
        model.eval()
        per_item: dict[str, np.ndarray] = {}
        try:
            with torch.inference_mode():
                for items in length_batches(self.eval.items, self.batching.batch_size):
                    outputs, targets = self._run(model, items)
                    pos = np.array([it.index for it in items])
                    for k, v in self.task.record(outputs, targets).items():
                        per_item.setdefault(k, np.empty(len(self.eval.items), dtype=v.dtype))[pos] = v
        finally:
            model.train(was_training)
        records = self.task.example_records(per_item, self.eval)
        self.last_records = records
        y = self.task.example_targets(np.empty(0), self.eval)
        self.last_scored = ({m: records[m] for m in self.task.metrics}, y)
        metrics = {**self.task.point_scores({m: records[m] for m in self.task.metrics}, y), "n_eval": len(y)}
        rows = [{"split": "eval", "metric": m, "value": float(metrics[m]), "slice": SLICE_ALL} for m in self.task.metrics]
        return metrics, rows

    def save(self, model: torch.nn.Module, folder: Path) -> None:
        save_model(model, self.tokenizer, folder)

    def tokenisation(self) -> dict:
        """The manifest's ``tokenisation``: the windows of the training and eval questions."""
        return {"train": self.train.describe(), "eval": self.eval.describe()}


def predictions_table(data: SquadData, records: dict[str, np.ndarray]) -> pd.DataFrame:
    """One row per held-out question: its id, the predicted answer ("" = no answer), the gold answers and the scores."""
    pred = [ex.context[s:e] if s >= 0 else "" for ex, s, e in zip(data, records["pred"], records["pred_end"])]
    return pd.DataFrame({
        "id": [ex.id for ex in data], "question": [ex.question for ex in data], "prediction": pred,
        "answers": [json.dumps(ex.answer_texts) for ex in data], "is_impossible": [ex.is_impossible for ex in data],
        "exact_match": records["exact_match"], "f1": records["f1"], "null_margin": records["null_margin"],
    })


def _load_qa_model(config: FinetuneConfig):
    """The model with a start/end head: the checkpoint's own when it has one, else a fresh (seeded) one."""
    from transformers import AutoConfig

    from bertology.models.loading import load_model

    loaded = load_model(config.model, kind="qa", trust_remote_code=config.trust_remote_code)
    archs = getattr(AutoConfig.from_pretrained(loaded.path, trust_remote_code=config.trust_remote_code), "architectures", None) or []
    return loaded, any(a.endswith("ForQuestionAnswering") for a in archs)


class QATrainer(TaskTrainer):
    """Extractive QA on SQuAD data: the loop's items are windows, the held-out split and the metrics are by question."""

    recipe_name = "qa"

    unit = "windows"
    task = get_task("qa")
    task_choice = "qa (--task)"

    def prepare_data(self, train: SquadData, eval: SquadData | None) -> RunData:  # noqa: A002
        config = self.config
        for data, role in ((train, "training"), (eval, "eval")):
            if data is not None and not isinstance(data, SquadData):
                raise BertologyError(f"--task qa reads SQuAD JSON files; the {role} data {getattr(data, 'source', data)!r} is not one.")
        if config.words.exclude or config.words.slices:
            raise BertologyError("--exclude-words / --eval-slices are not available for --task qa.")
        if config.data.max_examples is not None and len(train) > config.data.max_examples:
            train = train.stratified_sample(config.data.max_examples, config.seed)
        def split(data: SquadData) -> tuple[np.ndarray, np.ndarray, dict]:
            tr, ev, how = split_questions(data, config.eval_fraction, config.seed, config.qa.split)
            return tr, ev, {"seed": config.seed, **how}

        return self.held_out(train, eval, split)

    def load(self, data: RunData) -> ModelToTrain:
        loaded, reused_head = _load_qa_model(self.config)
        return ModelToTrain(loaded.model, loaded.tokenizer, loaded.describe, loaded.name, reused_head)

    def make_head(self, loaded: ModelToTrain, data: RunData, device: torch.device) -> QAHead:
        config = self.config
        settings = dict(max_length=config.data.max_length, doc_stride=config.qa.doc_stride,
                        max_answer_length=config.qa.max_answer_length, null_threshold=config.qa.null_threshold)
        feats = [encode_squad(d, loaded.tokenizer, **settings) for d in (data.train, data.eval)]
        return QAHead(loaded.tokenizer, feats[0], feats[1], Batching.of(config.batch_size, loaded.model, loaded.tokenizer, device))

    def finish(self, loaded: ModelToTrain, head: QAHead, data: RunData, outcome: LoopOutcome) -> Finish:
        config = self.config
        return Finish(predictions=predictions_table(data.eval, head.last_records), record={"qa": {
            "decoding": "best start+end logit span over the question's windows, start <= end, at most "
                        f"{config.qa.max_answer_length} tokens; no answer when null - best > {config.qa.null_threshold} "
                        "(SQuAD v2.0 data only); null = smallest [CLS] score over the windows",
            "metrics": "official SQuAD normalisation (lower-case, no punctuation, no a/an/the, single spaces); max over gold answers",
            "eval_no_answer_allowed": head.eval.with_negative}})


def finetune_qa(config: FinetuneConfig, train: SquadData, eval: SquadData | None = None,  # noqa: A002
                progress: bool = False, *, resume: bool = True, on_step=None) -> FinetuneResult:
    """Fine-tune ``config.model`` for extractive QA on ``train`` (SQuAD data; :class:`QATrainer`): the ``finetune``
    table has the eval rows ``f1``, ``exact_match``, ``loss`` (over questions) and the train rows of the loop; the
    predictions table has one row per held-out question."""
    return QATrainer(resolve_config(config, train)).run(train, eval, progress=progress, resume=resume, on_step=on_step)
