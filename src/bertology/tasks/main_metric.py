"""Which metric a run is judged by: the one ``--metric`` names, the dataset's own (GLUE's), or the task's.

GLUE scores its tasks differently (Wang et al. 2019): CoLA by Matthews' correlation, MRPC and QQP by the F1 of
the positive class, STS-B by Pearson's and Spearman's correlations, the others by accuracy. :data:`DATASETS`
declares that once. :func:`dataset_of_corpus` reads a dataset's name from the data (an ``hf:glue:cola:...``
spec, a file in GLUE CoLA's header-less layout, a file or its folder named after the dataset:
``glue/CoLA/dev.tsv``, ``cola_dev.tsv``); :func:`dataset_of_model` reads it from the ``bertology finetune``
manifest beside a fine-tuned model. :func:`main_metric` decides, in this order: ``--metric`` when it names a
metric, the data's dataset, the fine-tune's dataset, the task's own primary metric (accuracy, Pearson ...).

The main metric is what the findings, the figures and the headlines use; the other metrics stay in the tables.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import PurePath
from typing import Any

from bertology.data.corpus import Corpus
from bertology.errors import BertologyError, did_you_mean
from bertology.tasks.base import Task


@dataclass(frozen=True)
class Dataset:
    """A dataset whose own metric differs from nothing but its task's: ``name`` as it is written, the ``metric``
    it is scored by, the ``task`` that metric belongs to, and the ``aliases`` a spec or a file name may use."""

    name: str
    metric: str
    task: str
    aliases: tuple[str, ...]


#: GLUE's tasks and their metrics (the first one GLUE lists for each: its leaderboard's main figure).
DATASETS: tuple[Dataset, ...] = (
    Dataset("CoLA", "mcc", "classification", ("cola",)),
    Dataset("SST-2", "accuracy", "classification", ("sst2",)),
    Dataset("MRPC", "f1", "classification", ("mrpc",)),
    Dataset("QQP", "f1", "classification", ("qqp",)),
    Dataset("STS-B", "pearson", "regression", ("stsb",)),
    Dataset("MNLI", "accuracy", "classification", ("mnli",)),
    Dataset("QNLI", "accuracy", "classification", ("qnli",)),
    Dataset("RTE", "accuracy", "classification", ("rte",)),
    Dataset("WNLI", "accuracy", "classification", ("wnli",)),
)

#: What ``--metric`` takes: auto, or any task's metric but its loss (tests/unit/test_main_metric.py checks the list
#: against the task catalog). A metric is refused, in one line, for a model whose task has no such metric.
METRIC_CHOICES: tuple[str, ...] = (
    "auto", "accuracy", "macro_f1", "mcc", "f1", "pearson", "spearman", "exact_match", "uas", "las", "uas_argmax",
    "las_argmax", "entity_f1", "entity_precision", "entity_recall",
)

METRIC_HELP = ("The main metric (findings, figures, headlines): auto = the dataset's GLUE metric when the data or the "
               "model's fine-tune names a GLUE dataset (mcc for CoLA, f1 of the positive class for MRPC and QQP, "
               "pearson for STS-B, accuracy for the others), else the task's own (accuracy for a classifier, pearson "
               "for a regressor ...); or a metric of the model's task, e.g. accuracy, macro_f1, mcc, f1, spearman.")

#: How a summary names a metric (a metric not listed is named as it is written).
METRIC_NAMES = {"macro_f1": "macro-F1", "mcc": "MCC", "f1": "F1"}


@dataclass(frozen=True)
class MainMetric:
    """The metric a run is judged by, why (in words), and the dataset that named it (None: none did)."""

    metric: str
    why: str
    dataset: str | None = None

    def to_dict(self) -> dict:
        """The manifest's ``main_metric`` record."""
        return {"metric": self.metric, "why": self.why, "dataset": self.dataset}


def _key(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def dataset_named(text: str) -> Dataset | None:
    """The dataset a name refers to (``SST-2``, ``sts_b``, ``cola``), or one of its words (``cola_dev``), or None."""
    words = {_key(text), *re.split(r"[^a-z0-9]+", text.lower())}
    return next((d for d in DATASETS if words & set(d.aliases)), None)


def _named_in(names: Iterable[str | None]) -> Dataset | None:
    return next((d for d in (dataset_named(n) for n in names if n) if d is not None), None)


def dataset_of(source: str | None, stats: Mapping[str, Any] | None = None) -> Dataset | None:
    """The dataset a corpus's ``source`` and ``stats`` name: a Hugging Face dataset's config or name, GLUE CoLA's
    header-less layout, or the file's name or its folder's (not the folders above: they name a project, not data)."""
    stats = stats or {}
    hf = stats.get("hf") or {}
    if isinstance(hf, Mapping) and (found := _named_in([hf.get("config"), str(hf.get("name") or "").split("/")[-1]])):
        return found
    if str(stats.get("layout") or "").startswith("GLUE "):
        return dataset_named(str(stats["layout"])[5:])
    if not source:
        return None
    if source.startswith("hf:"):
        return _named_in(reversed(source[3:].split(":")[:-1]))
    path = PurePath(source)
    return _named_in([path.stem, path.parent.name])


def dataset_of_corpus(corpus: Corpus | None) -> Dataset | None:
    """The dataset ``corpus`` is, read from where it came from (:func:`dataset_of`)."""
    return None if corpus is None else dataset_of(corpus.source, corpus.stats)


def dataset_of_model(model_path: Any) -> Dataset | None:
    """The dataset the ``bertology finetune`` run that made ``model_path`` trained on (its manifest's training
    data), or None for a model no such manifest describes."""
    from bertology.tasks.match import finetune_manifest

    if not model_path:
        return None
    manifest = finetune_manifest(model_path)
    train = ((manifest or {}).get("data") or {}).get("train") or {}
    return dataset_of(train.get("source"), train) if isinstance(train, Mapping) else None


def check_metric(task: Task, metric: str, model: Any = None) -> None:
    """One line unless ``metric`` can be ``task``'s main metric (``f1``, the positive class's, needs two classes)."""
    if metric not in task.main_choices:
        raise BertologyError(f"--metric (metric) {metric!r} is not a metric of the {task.name} task"
                             f"{did_you_mean(metric, task.main_choices)}; it has {', '.join(task.main_choices)}.")
    n_labels = int(getattr(getattr(model, "config", None), "num_labels", 2) or 2)
    if task.name == "classification" and metric == "f1" and n_labels != 2:
        raise BertologyError(f"--metric (metric) f1 is the F1 of the positive class of a two-class classifier; this "
                             f"one has {n_labels} labels: use macro_f1.")


def main_metric(task: Task, setting: str = "auto", *, corpus: Corpus | None = None, model: Any = None,
                model_path: Any = None) -> MainMetric:
    """The metric ``task`` is judged by on ``corpus`` for ``model``: ``setting`` unless ``auto``, else the dataset
    the data names, else the dataset ``model``'s fine-tune trained on (the manifest beside ``model_path``, default
    the folder the model was loaded from), else the task's primary metric. A dataset of another task (STS-B's
    Pearson for a classifier) names nothing."""
    if setting != "auto":
        check_metric(task, setting, model)
        return MainMetric(setting, "--metric")
    model_path = model_path or getattr(model, "name_or_path", None)
    for where, found in (("the data", dataset_of_corpus(corpus)), ("the model's fine-tune data", dataset_of_model(model_path))):
        if found is not None and found.task == task.name and _fits(task, found.metric, model):
            return MainMetric(found.metric, f"{found.name}'s GLUE metric ({found.name} named by {where})", found.name)
    return MainMetric(task.default_metric, f"the {task.name} task's own")


def _fits(task: Task, metric: str, model: Any) -> bool:
    """Whether ``metric`` can be ``task``'s main metric for ``model`` (:func:`check_metric` passes)."""
    try:
        check_metric(task, metric, model)
    except BertologyError:
        return False
    return True


def metric_name(metric: str) -> str:
    """How a summary names ``metric`` (``MCC``, ``macro-F1``)."""
    return METRIC_NAMES.get(metric, metric)
