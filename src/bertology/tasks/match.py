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
  They are another task's classes when the regressor was fine-tuned on scores (its ``bertology finetune``
  manifest, beside the model folder, lists the training labels: :func:`training_labels`), or when another
  model of the same run is a classifier that reads them as its labels. Without either, the regressor is
  scored on them (a hub regressor alone on 0/1 labels: nothing says they are not its task's).
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

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
    return kind_of_labels([str(v) for v in corpus.label_set()])


def kind_of_labels(labels: Sequence[str]) -> LabelKind:
    """:func:`label_kind` of a list of distinct labels (e.g. those a fine-tuning manifest lists)."""
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


#: Words of a fine-tune's warnings that are about the model it made (a manifest written before ``model_warnings``).
_MODEL_WARNING_WORDS = ("beat chance", "for every eval example", "under-trained")


def finetune_manifest(model_path: str | Path) -> dict | None:
    """The ``bertology finetune`` manifest of the run folder holding ``model_path`` (``RUN/model``), or None."""
    folder = Path(model_path).expanduser()
    if folder.name != "model":
        return None
    try:
        manifest = json.loads((folder.parent / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return manifest if isinstance(manifest, dict) and manifest.get("kind") == "finetune" else None


def training_warnings(model_path: str | Path, name: str | None = None) -> list[str]:
    """What the fine-tune that made ``model_path`` warned of the model (one class for every example, not above
    chance, under-trained), each prefixed with the model's name: a command analysing that model repeats them, so a
    model that learned nothing is never analysed without a word. Empty for a model not made by ``bertology
    finetune``."""
    manifest = finetune_manifest(model_path)
    if manifest is None:
        return []
    found = manifest.get("model_warnings")
    if found is None:  # written before the key existed
        found = [w for w in manifest.get("warnings") or [] if any(k in w for k in _MODEL_WARNING_WORDS)]
    who = name or str(model_path)
    return [f"From the fine-tune of {who}: {w}" for w in found if isinstance(w, str)]


def training_labels(model_path: str | Path) -> LabelKind | None:
    """The kind of labels a model was fine-tuned on, from the ``bertology finetune`` manifest of the run folder
    that holds it (``RUN/model`` beside ``RUN/manifest.json``); None for any other model (a hub id, a given folder).

    The manifest lists the training labels, or for many numbers says ``"N distinct numbers from a to b"``.
    """
    manifest = finetune_manifest(model_path)
    if manifest is None:
        return None
    train = ((manifest.get("data") or {}).get("train") or {}).get("labels")
    if isinstance(train, str) and "distinct numbers" in train:
        return LabelKind("scores", train)
    return kind_of_labels([str(v) for v in train]) if isinstance(train, list) else None


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


def mismatch(model: torch.nn.Module, corpus: Corpus, peers: Sequence[tuple[str, torch.nn.Module]] = (),
             trained_on: LabelKind | None = None) -> str | None:
    """Why ``model``'s head should not be scored on ``corpus``'s labels (one sentence), or None.

    ``peers``: the other tuned models of the same run, by name; ``trained_on``: the labels the model was
    fine-tuned on, when known (:func:`training_labels`). Either can make a few whole numbers another task's
    classes (see the module's rules).
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
    if labels.kind == "numbers" and trained_on is not None and trained_on.kind == "scores":
        return (f"{where} are whole numbers, a classification task's classes by the rule `bertology finetune --task "
                f"auto` uses, and the tuned model is {words} fine-tuned on scores ({trained_on.words}); "
                "ablate it on its own task's data")
    owner = next((name for name, other in peers if labels.kind == "numbers" and reads_labels(other, corpus)), None)
    if owner is not None:
        return (f"{where} are the classes of {owner}, a classifier of this run, not scores; the tuned model is {words}, "
                "so its Pearson r on them would measure nothing of its task; ablate it on its own task's data")
    return None


def is_sentence_classifier(config) -> bool:
    """Whether a model's config (read alone, before its weights) names a single-label sentence classifier: a
    ``*ForSequenceClassification`` architecture with two labels or more, not a regressor nor multi-label."""
    archs = getattr(config, "architectures", None) or []
    if not any(str(a).endswith("ForSequenceClassification") for a in archs):
        return False
    problem = getattr(config, "problem_type", None)
    return int(getattr(config, "num_labels", 2) or 0) >= 2 and problem not in ("regression", "multi_label_classification")


def config_label_problem(config, corpus: Corpus, what: str = "data") -> str | None:
    """Why the sentence classifier of ``config`` cannot score ``corpus``'s labels, from its config alone (the labels
    it knows; :func:`~bertology.tasks.classification.unknown_labels`): one sentence that suggests ``--label-map``,
    or None when it can, when ``corpus`` has no labels (said by its own check), or when ``config`` is not a sentence
    classifier's. ``corpus``: its labels as they will be scored (a ``--label-map`` already applied)."""
    from bertology.tasks.classification import unknown_labels

    if config is None or not is_sentence_classifier(config) or not any(ex.label is not None for ex in corpus):
        return None
    return unknown_labels(corpus, config, what=what)
