"""Every task, one line each (name -> the module ending with ``TASK``), and which task a model or data is."""
from __future__ import annotations

import importlib
from collections.abc import Mapping

import torch

from bertology.errors import BertologyError, did_you_mean
from bertology.tasks.base import Task

#: In the order they are listed to the user.
TASKS: Mapping[str, str] = {
    "classification": "bertology.tasks.classification",
    "regression": "bertology.tasks.regression",
    "qa": "bertology.tasks.qa",
    "parsing": "bertology.tasks.parsing",
    "tagging": "bertology.tasks.tagging",
    "bio_tagging": "bertology.tasks.bio_tagging",
}


def get_task(name: str) -> Task:
    """The task called ``name``; one clear error for an unknown name."""
    if name not in TASKS:
        raise BertologyError(f"Unknown task {name!r}{did_you_mean(name, TASKS)}; choose from: {', '.join(TASKS)}.")
    task: Task = importlib.import_module(TASKS[name]).TASK
    return task


def all_tasks() -> tuple[Task, ...]:
    return tuple(get_task(n) for n in TASKS)


def higher_is_better() -> dict[str, bool]:
    """Every task's metric directions in one map (metric names are shared only where they agree)."""
    out: dict[str, bool] = {}
    for task in all_tasks():
        out.update(task.higher_is_better)
    return out


def task_of_model(model: torch.nn.Module, name: str = "the model") -> Task:
    """The task a fine-tuned model's head was trained for; one clear error for a model with no task head."""
    from bertology.models.parser import BiaffineParser

    if isinstance(model, BiaffineParser):  # a dependency parser (an encoder plus a biaffine head)
        return get_task("parsing")
    from bertology.tasks.regression import is_regressor

    from bertology.tasks.tagging import is_bio

    kind = type(model).__name__
    if kind.endswith("ForSequenceClassification"):
        task = get_task("regression" if is_regressor(model) else "classification")
    elif kind.endswith("ForTokenClassification"):
        labels = (getattr(model.config, "id2label", None) or {}).values()
        task = get_task("bio_tagging" if is_bio(labels) else "tagging")
    elif kind.endswith("ForQuestionAnswering"):
        task = get_task("qa")
    else:
        raise BertologyError(
            f"{name} has no task head bertology can score ({kind}); pass a fine-tuned classifier, regressor, "
            "tagger, question-answering model or parser (e.g. from `bertology finetune`)."
        )
    task.check_model(model, name)
    return task.for_model(model)


def task_of_table(table) -> Task:
    """The task whose metrics an ``ablation`` / ``finetune`` table holds (its ``task`` column, else its metrics), with
    the table's main metric first (its ``main_metric`` column, where it has one)."""
    columns = getattr(table, "columns", ())
    if "task" in columns and len(table):
        task = get_task(str(table["task"].iloc[0]))
        main = table["main_metric"].iloc[0] if "main_metric" in columns else None
        return task.with_main(str(main)) if isinstance(main, str) and main else task
    metrics = set(table["metric"]) if "metric" in getattr(table, "columns", ()) else set()
    for task in all_tasks():
        if task.primary in metrics:
            return task
    return get_task("classification")


#: More distinct whole-number labels than this make ``auto`` choose regression (a 1-5 rating stays a class).
MAX_AUTO_CLASSES = 20


def choose_task(name: str, labels: list[str]) -> tuple[Task, str]:
    """The task to fine-tune for ``labels`` (``name`` = auto, classification or regression) and why, in words.

    ``auto`` chooses regression when every label is a number and some have a decimal point (GLUE STS-B's
    ``3.800``) or there are more than :data:`MAX_AUTO_CLASSES` distinct whole numbers; classification
    otherwise (``0``/``1``, ``-1``/``1``, ``entailment``, star ratings 1-5).
    """
    if name != "auto":
        return get_task(name), f"{name} (--task)"
    distinct = sorted(set(labels))
    try:
        [float(v) for v in distinct]
    except ValueError:
        return get_task("classification"), "auto: the labels are not all numbers"
    decimals = [v for v in distinct if any(c in v for c in ".eE")]
    if decimals:
        return get_task("regression"), f"auto: numeric labels with decimals (e.g. {decimals[0]!r})"
    if len(distinct) > MAX_AUTO_CLASSES:
        return get_task("regression"), f"auto: {len(distinct)} distinct numeric labels (more than {MAX_AUTO_CLASSES})"
    return get_task("classification"), f"auto: {len(distinct)} distinct labels"
