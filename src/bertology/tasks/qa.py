"""Extractive question answering (SQuAD v1.1 / v2.0): a start/end head; exact match, F1 and the span loss.

The model is a Hugging Face ``*ForQuestionAnswering``; its head output, as bertology passes it around
(:func:`bertology.tasks.base.head_logits`), is ``[batch, tokens, 2]`` (start and end logits).

**Items and examples.** One question is cut into one or more windows (features,
:mod:`bertology.data.qa_features`); the model scores features, the metrics score questions. So a
feature's records (:meth:`QuestionAnswering.record`) hold its loss, its null score and its best span,
and :meth:`QuestionAnswering.example_records` folds the features of each question into one record:
the best span over all its windows, its exact match and F1 against the gold answers, and the mean of
its windows' losses. The bootstrap of the ablation therefore resamples questions, never windows.

**Decoding** (BERT's ``run_squad.py``): a span's score is start logit + end logit over context tokens
with ``start <= end`` and at most ``max_answer_length`` tokens (30 by default); the best span over every
window of the question wins. On SQuAD v2.0 data the null score is the smallest over the windows of the
start and end logits at [CLS], and the question is answered "no answer" (the empty string) when
``null - best span > null_threshold`` (0 by default). On v1.1 data a span is always predicted.

**Metrics** (:mod:`bertology.metrics.squad`, the official scripts' rules): ``f1`` (primary: it moves in
finer steps than exact match), ``exact_match``, and ``loss`` (the mean over questions of the mean over
windows of (start cross-entropy + end cross-entropy) / 2, what training minimises per window).

**Batch targets** (:meth:`QuestionAnswering.collate_targets`): a long tensor ``[B, 4 + T]``: columns
0-1 the target start/end token, 2 the max answer length, 3 the [CLS] position, then 1 on the context
tokens of the window (the tokens a span may start or end on), 0 elsewhere.

Degenerate: a model that predicts the same answer position for every question, or whose F1 is not
shown above chance. Chance is what always answering "no answer" scores (the share of unanswerable
questions; 0 on v1.1); the interval is Wilson's with F1 treated as a proportion (a mean of values in
[0, 1] has at most the variance of a proportion with the same mean, so the interval is not too narrow).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from bertology.data.encode import EncodedCorpus, EncodedExample
from bertology.data.qa_features import QAFeatures
from bertology.errors import BertologyError
from bertology.metrics.chance import accuracy_interval
from bertology.metrics.squad import best_scores
from bertology.tasks.base import Degeneracy, Task

#: Columns before the context mask in a batch's target tensor.
_HEADER = 4


def _features(encoded: EncodedCorpus | None, what: str = "data") -> QAFeatures:
    if not isinstance(encoded, QAFeatures):
        raise BertologyError(
            f"A question-answering model is scored on SQuAD data (a SQuAD v1.1/v2.0 JSON file), not on this {what}."
        )
    return encoded


def best_span(start: torch.Tensor, end: torch.Tensor, context: torch.Tensor, max_len: torch.Tensor):
    """Per row, the best-scoring valid span: ``(score, start, end)`` (score -inf and -1 when there is none).

    ``start``/``end`` are ``[B, T]`` logits, ``context`` ``[B, T]`` bool, ``max_len`` ``[B]`` tokens.
    Valid: both ends on context tokens, ``start <= end < start + max_len``.
    """
    b, t = start.shape
    scores = start[:, :, None] + end[:, None, :]  # [B, s, e]
    pos = torch.arange(t, device=start.device)
    length = pos[None, :] - pos[:, None]  # e - s
    valid = (length >= 0)[None] & (length[None] < max_len[:, None, None])
    valid = valid & context[:, :, None] & context[:, None, :]
    scores = scores.masked_fill(~valid, float("-inf")).view(b, -1)
    best, flat = scores.max(dim=1)
    s, e = flat // t, flat % t
    none = torch.isinf(best)
    return best, torch.where(none, -1, s), torch.where(none, -1, e)


class QuestionAnswering(Task):
    name = "qa"
    example_unit = "questions"
    metrics = ("f1", "exact_match", "loss")
    higher_is_better = {"f1": True, "exact_match": True, "loss": False}
    loss_metric = "loss"
    loss_name = "start + end cross-entropy"
    problem_type = None  # type: ignore[assignment]  # Hugging Face's config knows no QA problem type
    target_dtype = torch.long

    def check_model(self, model: torch.nn.Module, name: str = "the model") -> None:
        if not type(model).__name__.endswith("ForQuestionAnswering"):
            raise BertologyError(
                f"{name} has no question-answering head; pass a fine-tuned QA model (e.g. `bertology finetune --task qa`)."
            )

    def targets(self, corpus, model: torch.nn.Module, what: str = "data") -> np.ndarray:
        """Each feature's ``(start, end)`` target tokens (feature order); ``corpus`` is the featurised SQuAD data."""
        feats = _features(corpus, what)
        return np.array([[it.start, it.end] for it in feats.items], dtype=np.int64).reshape(-1, 2)

    def collate_targets(self, items: Sequence[EncodedExample], targets: Sequence[Any]) -> torch.Tensor:
        width = max(len(it) for it in items)
        out = np.zeros((len(items), _HEADER + width), dtype=np.int64)
        for row, (it, tgt) in enumerate(zip(items, targets)):
            out[row, :2] = np.asarray(tgt, dtype=np.int64)[:2]
            out[row, 2] = it.max_answer_length
            out[row, 3] = it.cls_index
            out[row, _HEADER : _HEADER + len(it)] = it.segment == 1
        return torch.from_numpy(out)

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        lg = outputs.float()
        per = (F.cross_entropy(lg[..., 0], targets[:, 0], reduction="none")
               + F.cross_entropy(lg[..., 1], targets[:, 1], reduction="none")) / 2
        return {"mean": per.mean, "sum": per.sum, "none": lambda: per}[reduction]()

    def record(self, outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, np.ndarray]:
        """Per feature: ``loss``, ``null`` (score at [CLS]), ``score``/``start``/``end`` of the best span, ``pred`` (= start)."""
        lg = outputs.detach().double()
        t = lg.shape[1]
        start, end = lg[..., 0], lg[..., 1]
        context = targets[:, _HEADER : _HEADER + t].bool()
        score, s, e = best_span(start, end, context, targets[:, 2])
        cls = targets[:, 3:4]
        null = start.gather(1, cls)[:, 0] + end.gather(1, cls)[:, 0]
        loss = self.loss(lg, targets, reduction="none").double()
        return {"pred": s.cpu().numpy(), "loss": loss.cpu().numpy(), "null": null.cpu().numpy(),
                "score": score.cpu().numpy(), "start": s.cpu().numpy(), "end": e.cpu().numpy()}

    def example_records(self, records: Mapping[str, np.ndarray], encoded: EncodedCorpus | None) -> dict[str, np.ndarray]:
        """Per question (data order): ``pred``/``pred_end`` (character span in the context, -1 for no answer),
        ``exact_match``, ``f1``, ``loss``, ``null_margin`` (null score minus best span score)."""
        feats = _features(encoded)
        data, groups = feats.data, feats.groups
        n = len(data)
        score, null = np.asarray(records["score"], np.float64), np.asarray(records["null"], np.float64)
        loss_sum = np.bincount(groups, weights=np.asarray(records["loss"], np.float64), minlength=n)
        loss = loss_sum / np.maximum(np.bincount(groups, minlength=n), 1)
        out = {k: np.full(n, -1, dtype=np.int64) for k in ("pred", "pred_end")}
        out.update({k: np.zeros(n) for k in ("exact_match", "f1")})
        out["loss"] = loss
        out["null_margin"] = np.full(n, np.nan)
        best_feat = np.full(n, -1, dtype=np.int64)
        best_score = np.full(n, -np.inf)
        min_null = np.full(n, np.inf)
        for i, q in enumerate(groups):
            min_null[q] = min(min_null[q], null[i])
            if score[i] > best_score[q]:
                best_score[q], best_feat[q] = score[i], i
        for q, ex in enumerate(data):
            i = best_feat[q]
            text = ""
            if i >= 0:
                item = feats.items[i]
                s_char, e_char = item.offsets[int(records["start"][i]), 0], item.offsets[int(records["end"][i]), 1]
                margin = min_null[q] - best_score[q]
                out["null_margin"][q] = margin
                if not (feats.with_negative and margin > feats.null_threshold):
                    out["pred"][q], out["pred_end"][q] = s_char, e_char
                    text = ex.context[s_char:e_char]
            out["exact_match"][q], out["f1"][q] = best_scores(text, ex.answer_texts)
        return out

    def example_targets(self, y: np.ndarray, encoded: EncodedCorpus | None) -> np.ndarray:
        """Per question: 1.0 when it has an answer, 0.0 when it is unanswerable."""
        return np.array([0.0 if ex.is_impossible else 1.0 for ex in _features(encoded).data])

    def scores(self, weights: np.ndarray, records: Mapping[str, np.ndarray], y: np.ndarray) -> dict[str, np.ndarray]:
        w = np.asarray(weights, dtype=np.float64)
        total = w.sum(axis=1, keepdims=True)
        return {m: (w @ np.asarray(records[m], dtype=np.float64).T) / total for m in self.metrics}

    def n_predicted(self, pred: np.ndarray) -> int:
        """Distinct predicted answer positions (character starts; -1 = no answer)."""
        return int(np.unique(np.asarray(pred)).size)

    def chance(self, y: np.ndarray) -> float:
        """What always answering "no answer" scores: the share of unanswerable questions (0 on SQuAD v1.1)."""
        y = np.asarray(y, dtype=np.float64)
        return float((1 - y).mean()) if y.size else 0.0

    def degeneracy(self, value: float, n: int, n_predicted: int, chance: float) -> Degeneracy:
        lo, hi = accuracy_interval(round(value * n), n)
        return Degeneracy(
            metric="f1", value=float(value), n=int(n), ci=(lo, hi), ci_method="wilson 95% (F1 treated as a proportion)",
            chance=float(chance), chance_method="always answering 'no answer' (share of unanswerable questions)",
            n_predicted=int(n_predicted), constant_predictions=int(n_predicted) <= 1, at_chance=bool(lo <= chance),
            what="question-answering model",
        )

    def prediction_summary(self, pred: np.ndarray, config: Any) -> dict:
        """The manifest's word on the intact predictions: how many questions got an answer."""
        pred = np.asarray(pred)
        return {"answered": int((pred >= 0).sum()), "no_answer": int((pred < 0).sum())}


TASK = QuestionAnswering()
