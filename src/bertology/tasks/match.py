"""Whose task a corpus's labels are, and whether a tuned model's head can be scored on them.

In a many-model compare (``compare --tuned A=... --tuned B=...``, a study's compare job) models of several
tasks share one corpus, whose labels belong to one task at most. Scoring an STS-B regressor against SST-2's
0/1 labels runs (they are numbers) and gives a Pearson r that means nothing for either task. This module
reads what the labels are (:func:`label_kind`, by the rule ``bertology finetune --task auto`` uses to pick a
task, :func:`~bertology.tasks.catalog.choose_task`), what the model's head is (:func:`describe_head`, from its
config as :func:`~bertology.tasks.catalog.task_of_model` reads it) and says, in one sentence, why they do not
belong together (:func:`mismatch`), or None when they may.

The rules, for sentence-level heads (a tagger, parser or QA model needs data of a kind that a sentence corpus
is not, and says so through its own targets):

- a classifier on scores (numbers with decimals, or many distinct numbers) it has no label for: a mismatch;
- a regressor on classes (labels that are not numbers): a mismatch;
- a regressor on a few whole numbers (``0``/``1``; a 1-5 rating): they may be class ids or integer scores.
  When another model of the same run is a classifier that reads them as its labels, they are that
  classifier's classes and the regressor is the mismatch; alone, the regressor is scored on them.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from bertology.data.corpus import Corpus
from bertology.errors import BertologyError
from bertology.tasks.catalog import choose_task, task_of_model

#: How many distinct labels a reason shows.
SHOWN = 4


@dataclass(frozen=True)
class LabelKind:
    """What a corpus's labels are: ``none``, ``classes`` (not all numbers), ``scores`` (numbers a regression
    task has) or ``numbers`` (a few whole numbers: class ids or integer scores), and the words for them."""

    kind: str
    words: str


def label_kind(corpus: Corpus) -> LabelKind:
    """The kind of ``corpus``'s labels, by the rule ``bertology finetune --task auto`` chooses a task with."""
    labels = corpus.label_set()
    if not labels:
        return LabelKind("none", "no labels")
    shown = ", ".join(repr(str(v)) for v in labels[:SHOWN]) + (", ..." if len(labels) > SHOWN else "")
    words = f"{len(labels)} distinct label{'s' if len(labels) != 1 else ''}: {shown}"
    task, _ = choose_task("auto", [str(v) for v in labels])
    if task.name == "regression":
        return LabelKind("scores", words)
    try:
        [float(v) for v in labels]
    except ValueError:
        return LabelKind("classes", words)
    return LabelKind("numbers", words)


def describe_head(model: torch.nn.Module) -> tuple[str, str] | None:
    """The head's task name and how a reason names it (``a classifier over 2 labels ('0', '1')``); None
    when the model has no head bertology can score (the ablation's own reason covers that)."""
    try:
        task = task_of_model(model)
    except BertologyError:
        return None
    if task.name == "classification":
        id2label = getattr(model.config, "id2label", None) or {}
        names = [str(v) for _, v in sorted(id2label.items(), key=lambda kv: int(kv[0]))]
        shown = ", ".join(map(repr, names[:SHOWN])) + (", ..." if len(names) > SHOWN else "")
        return task.name, f"a classifier over {len(names)} labels ({shown})"
    words = {"regression": "a regressor (one output)", "qa": "a question-answering model", "parsing": "a parser"}
    return task.name, words.get(task.name, "a tagger")


def reads_labels(model: torch.nn.Module, corpus: Corpus) -> bool:
    """Whether ``model`` is a classifier that knows every label of ``corpus`` (its targets can be made)."""
    head = describe_head(model)
    if head is None or head[0] != "classification":
        return False
    try:
        task_of_model(model).targets(corpus, model)
    except BertologyError:
        return False
    return True


def mismatch(model: torch.nn.Module, corpus: Corpus, peers: Sequence[tuple[str, torch.nn.Module]] = ()) -> str | None:
    """Why ``model``'s head should not be scored on ``corpus``'s labels (one sentence), or None.

    ``peers``: the other tuned models of the same run, by name; a classifier among them that reads the labels
    makes a few whole numbers its classes (see the module's rules).
    """
    head, labels = describe_head(model), label_kind(corpus)
    if head is None or labels.kind == "none":
        return None
    task, words = head
    where = f"the labels of {corpus.source} ({labels.words})"
    if task == "classification" and labels.kind == "scores" and not reads_labels(model, corpus):
        return f"{where} are a regression task's scores, and the tuned model is {words}; ablate it on its own task's data"
    if task != "regression":
        return None
    if labels.kind == "classes":
        return f"{where} are a classification task's classes, and the tuned model is {words}; ablate it on its own task's data"
    owner = next((name for name, other in peers if labels.kind == "numbers" and reads_labels(other, corpus)), None)
    if owner is not None:
        return (f"{where} are the classes of {owner}, a classifier of this run, not scores; the tuned model is {words}, "
                "so its Pearson r on them would measure nothing of its task; ablate it on its own task's data")
    return None
