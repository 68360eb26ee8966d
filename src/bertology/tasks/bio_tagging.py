"""BIO tagging (named entities, chunks): the tagging task plus entity-level precision, recall and F1 (seqeval).

Entities are read from the tag sequences with ``seqeval.metrics.sequence_labeling.get_entities`` (the
conlleval-compatible default mode of ``seqeval.metrics.f1_score``: an ``I-X`` after ``O`` or after
another type opens an entity). Per sentence the records are ``tp`` (predicted entities equal to a gold
one: same type, start and end), ``n_pred`` and ``n_gold``; seqeval's micro average over a corpus is
``P = Σtp/Σn_pred``, ``R = Σtp/Σn_gold``, ``F1 = 2PR/(P+R)`` (0 where a denominator is 0, as seqeval's
``zero_division`` gives), so the same ratios under bootstrap weights give resampled values, and with
weights of one exactly seqeval's. Only the scored words (those with a first piece) enter the sequences.

Accuracy stays the primary metric (the degenerate check compares it with the majority-tag rate, usually
``O``'s); ``--early-stopping-metric entity_f1`` is the usual choice for NER.
"""
from __future__ import annotations

import copy
from collections.abc import Mapping

import numpy as np
import torch

from bertology.errors import BertologyError
from bertology.tasks.tagging import Tagging


def entity_set(tags: list[str]) -> set[tuple[str, int, int]]:
    """The ``(type, start, end)`` entities of one sentence's tag sequence, by seqeval's rule."""
    from seqeval.metrics.sequence_labeling import get_entities

    return set(get_entities(tags))


def entity_counts(gold: list[str], pred: list[str]) -> tuple[int, int, int]:
    """``(true positives, predicted entities, gold entities)`` of one sentence."""
    g, p = entity_set(gold), entity_set(pred)
    return len(g & p), len(p), len(g)


def prf(tp: np.ndarray, n_pred: np.ndarray, n_gold: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Precision, recall and F1 from (weighted) entity counts; 0 where a denominator is 0 (seqeval's default)."""
    def ratio(a, b):
        return np.where(b > 0, a / np.where(b > 0, b, 1.0), 0.0)

    return ratio(tp, n_pred), ratio(tp, n_gold), ratio(2 * tp, n_pred + n_gold)


class BioTagging(Tagging):
    name = "bio_tagging"
    metrics = ("accuracy", "entity_f1", "entity_precision", "entity_recall", "loss")
    higher_is_better = {"accuracy": True, "entity_f1": True, "entity_precision": True, "entity_recall": True, "loss": False}
    id2label: tuple[str, ...] | None = None

    def for_model(self, model: torch.nn.Module) -> "BioTagging":
        """A copy that knows the model's tag names (entities are read from tag strings)."""
        id2label = getattr(model.config, "id2label", None) or {}
        return self.with_labels([str(id2label[i]) for i in range(len(id2label))])

    def with_labels(self, labels: list[str]) -> "BioTagging":
        """A copy whose tag id ``i`` is ``labels[i]``."""
        bound = copy.copy(self)
        bound.id2label = tuple(labels)
        return bound

    def _entity_counts(self, pred: torch.Tensor, targets: torch.Tensor, scored: torch.Tensor) -> dict[str, np.ndarray]:
        if self.id2label is None:
            raise BertologyError("bio_tagging: the task is not bound to a model's tags (use task_of_model or with_labels).")
        names = np.asarray(self.id2label, dtype=object)
        p, t, s = pred.cpu().numpy(), targets.cpu().numpy(), scored.cpu().numpy()
        counts = np.array([entity_counts(list(names[t[i][s[i]]]), list(names[p[i][s[i]]])) for i in range(len(p))],
                          dtype=np.int64).reshape(-1, 3)
        return {"tp": counts[:, 0], "n_pred": counts[:, 1], "n_gold": counts[:, 2]}

    def scores(self, weights: np.ndarray, records: Mapping[str, np.ndarray], y: np.ndarray) -> dict[str, np.ndarray]:
        out = super().scores(weights, records, y)
        w = np.asarray(weights, dtype=np.float64)
        tp, n_pred, n_gold = (w @ np.asarray(records[k], dtype=np.float64).T for k in ("tp", "n_pred", "n_gold"))
        p, r, f = prf(tp, n_pred, n_gold)
        return {"accuracy": out["accuracy"], "entity_f1": f, "entity_precision": p, "entity_recall": r, "loss": out["loss"]}


TASK = BioTagging()
