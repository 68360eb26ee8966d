"""What a fine-tuning task is to bertology: its targets, loss, per-example records and metrics.

The experiments that score a model (the ablation sweep, head importance, pruning curves) and the
fine-tuning lab talk to a task only through :class:`Task`, so a new task is one module and one line in
:mod:`bertology.tasks.catalog`.

A task turns the model's outputs into **per-example records** (arrays over examples, e.g. the
prediction and the example's loss): the ablation sweep stores them per unit and resumes from them.
Its metrics are computed from the records under **example weights** ``[R, n]``: a row of ones gives
the plain metric, a row of multinomial counts a bootstrap resample. One function thus gives the point
values and the paired-bootstrap intervals, and the intervals of every task are made the same way.
"""
from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from bertology.data.corpus import Corpus
from bertology.data.encode import EncodedCorpus, EncodedExample


def head_logits(output: Any) -> torch.Tensor:
    """The head's output tensor of a Hugging Face model output: ``logits``, or for a question-answering head
    the start and end logits stacked on a last axis (``[batch, tokens, 2]``), so every task passes one tensor."""
    logits = getattr(output, "logits", None)
    if logits is not None:
        return logits
    return torch.stack([output.start_logits, output.end_logits], dim=-1)


@dataclass(frozen=True)
class Degeneracy:
    """The verdict on an intact model: can its ablation deltas say which heads the task needs?

    ``metric``/``value``/``ci`` are the task's primary metric, its 95% interval and how it was made;
    ``chance`` is what an uninformative model scores on that metric (the majority-class rate for
    accuracy, 0 for a correlation). ``to_dict`` is the manifest's ``degenerate`` section.
    """

    metric: str
    value: float
    n: int
    ci: tuple[float, float]
    ci_method: str
    chance: float
    chance_method: str
    n_predicted: int  # distinct predictions (classes, or values for regression)
    constant_predictions: bool  # one prediction for every example
    at_chance: bool  # the interval reaches down to chance: not shown to beat it
    what: str = "classifier"  # "classifier" / "regressor" / "tagger": how the note names the model

    @property
    def flagged(self) -> bool:
        """Whether ablation deltas cannot say which heads or layers the task needs."""
        return self.constant_predictions or self.at_chance

    @property
    def note(self) -> str:
        """One plain sentence: what is wrong (or that the model is above chance)."""
        facts = (f"{self.metric} {self.value:.3f}, 95% CI [{self.ci[0]:.3f}, {self.ci[1]:.3f}], n={self.n}; "
                 f"chance {self.chance:.3f}")
        if self.constant_predictions:
            one = {"classifier": "one class", "tagger": "one tag"}.get(self.what, "one value")
            every = "word" if self.what == "tagger" else "example"
            return f"the tuned model predicts {one} for every {every} ({facts}); no head or layer can be called needed"
        if self.at_chance:
            return f"the tuned model's {self.metric} is not above chance ({facts}); no head or layer can be called needed"
        return f"the tuned model is above chance ({facts})"

    def to_dict(self) -> dict:
        return {
            "flagged": self.flagged, "constant_predictions": self.constant_predictions, "n_predicted": self.n_predicted,
            "metric": self.metric, self.metric: self.value, "n": self.n, "ci": list(self.ci), "ci_method": self.ci_method,
            "chance": self.chance, "chance_method": self.chance_method, "at_chance": self.at_chance, "note": self.note,
        }


class Task(ABC):
    """One kind of fine-tuning target. Subclasses set the class attributes and the methods below."""

    #: ``classification``, ``regression``, ...: the manifest's ``task`` and the tables' ``task`` column.
    name: str
    #: The metrics of the ``ablation`` / ``finetune`` tables, primary first.
    metrics: tuple[str, ...]
    #: Metrics computed only when named the main metric (:meth:`with_main`: ``--metric``, or a dataset's own metric
    #: such as CoLA's Matthews correlation), so the tables of runs that name none keep their rows.
    extra_metrics: tuple[str, ...] = ()
    #: Whether a larger value of each metric is better.
    higher_is_better: Mapping[str, bool]
    #: The metric that is the mean of the per-example ``loss`` record (what training minimises).
    loss_metric: str
    #: What :meth:`loss` is, as a person reads it (the manifest's and the report's training objective).
    loss_name: str
    #: The ``problem_type`` a Hugging Face config of this task carries.
    problem_type: str
    #: dtype of the target tensors the loss takes.
    target_dtype: torch.dtype
    #: Whether the head scores every token (targets per word): the ablation sweep then never runs the last
    #: block on the first token alone.
    token_level: bool = False
    #: What one example is (what the metrics count and the bootstrap resamples), as the report words it.
    example_unit: str = "examples"

    @property
    def primary(self) -> str:
        """The main metric: what headlines, findings and figures use (:meth:`with_main` may change it)."""
        return self.metrics[0]

    @property
    def default_metric(self) -> str:
        """The task's declared primary metric, whatever the main one: what the degenerate check and early stopping
        read by default (their chance levels and intervals are that metric's)."""
        return type(self).metrics[0]

    @property
    def main_choices(self) -> tuple[str, ...]:
        """The metrics this task can make its main one: every metric it reports or can add, but its loss."""
        return tuple(m for m in (*type(self).metrics, *self.extra_metrics) if m != self.loss_metric)

    def with_main(self, metric: str | None) -> "Task":
        """This task with ``metric`` as its main metric (first in :attr:`metrics`; an extra metric is added);
        the task itself for None or its current main metric. ``ValueError`` for a metric it cannot make main."""
        if metric is None or metric == self.primary:
            return self
        if metric not in self.main_choices:
            raise ValueError(f"the {self.name} task has no metric {metric!r}; it has {', '.join(self.main_choices)}")
        bound = copy.copy(self)
        bound.metrics = (metric, *(m for m in type(self).metrics if m != metric))
        return bound

    def for_model(self, model: torch.nn.Module) -> "Task":
        """This task bound to ``model``'s own labels, where :meth:`record` needs them (default: the task itself)."""
        return self

    def prediction_summary(self, pred: np.ndarray, config: Any) -> dict:
        """What the manifest's ``degenerate`` section says the intact model predicted: the class names of ``pred``."""
        id2label = getattr(config, "id2label", None) or {}
        return {"predicted_classes": [str(id2label.get(int(c), int(c))) for c in np.unique(pred)]}

    @abstractmethod
    def check_model(self, model: torch.nn.Module, name: str = "the model") -> None:
        """One clear :class:`~bertology.errors.BertologyError` unless ``model`` has this task's head."""

    @abstractmethod
    def targets(self, corpus: Corpus, model: torch.nn.Module, what: str = "data") -> np.ndarray:
        """Each example's target in the model's terms (corpus order), or one clear error."""

    def collate_targets(self, items: Sequence[EncodedExample], targets: Sequence[Any]) -> torch.Tensor:
        """The target tensor of one batch of encoded ``items`` (padded to the batch's longest), from each
        item's target (``targets[i]`` belongs to ``items[i]``).

        Sequence-level tasks stack one target per example; token-level tasks override this to place each
        word's target on the word's pieces (``EncodedExample.word_ids``), -100 elsewhere.
        """
        return torch.as_tensor(np.asarray(targets), dtype=self.target_dtype)

    @abstractmethod
    def loss(self, outputs: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        """The training loss of the head's ``outputs`` (logits) against ``targets``."""

    @abstractmethod
    def record(self, outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, np.ndarray]:
        """Per-example records of one batch: at least ``pred`` and ``loss`` (float64 where real-valued)."""

    @abstractmethod
    def scores(self, weights: np.ndarray, records: Mapping[str, np.ndarray], y: np.ndarray) -> dict[str, np.ndarray]:
        """Every metric ``[R, U]`` under example weights ``[R, n]`` for the records ``[U, n]`` of ``U`` units."""

    @abstractmethod
    def n_predicted(self, pred: np.ndarray) -> int:
        """How many distinct predictions ``pred`` holds (the constant-prediction check)."""

    @abstractmethod
    def chance(self, y: np.ndarray) -> float:
        """What an uninformative model scores on the primary metric for targets ``y``."""

    @abstractmethod
    def degeneracy(self, value: float, n: int, n_predicted: int, chance: float) -> Degeneracy:
        """The verdict from the intact primary metric over ``n`` examples (read back from the table alone)."""

    def example_records(self, records: Mapping[str, np.ndarray], encoded: EncodedCorpus | None) -> dict[str, np.ndarray]:
        """The per-example records from the per-item ones (``[n_items]`` each, item order of ``encoded``).

        An item is what the model reads in one row; an example is what the metrics count and the bootstrap
        resamples. They are the same for most tasks (identity); question answering cuts a long context
        into several windows (items) and folds them back into one record per question here.
        """
        return dict(records)

    def example_targets(self, y: np.ndarray, encoded: EncodedCorpus | None) -> np.ndarray:
        """The targets :meth:`scores` takes, per example, from the targets per item (identity for most tasks)."""
        return y

    def intervals(self, records: Mapping[str, np.ndarray], y: np.ndarray, *, n_bootstrap: int = 1000, seed: int = 0,
                  level: float = 0.95, chunk: int = 100) -> dict[str, tuple[float, float, float]]:
        """Each metric's plain value over the examples and its percentile-bootstrap interval over examples.

        The resamples are the ablation's (:func:`~bertology.metrics.bootstrap.bootstrap_counts` through
        :meth:`scores`), so a fine-tuned model's final metric and an ablation delta are resampled the
        same way: per example (a sentence for tagging and parsing, a question for QA), never per token.
        With fewer than two examples or ``n_bootstrap == 0`` the interval is NaN, not a point.
        """
        from bertology.metrics.bootstrap import bootstrap_counts, percentile_interval

        n = len(y)
        point = self.point_scores(records, y)
        if n < 2 or n_bootstrap <= 0:
            return {m: (point[m], float("nan"), float("nan")) for m in self.metrics}
        stacked = {k: np.asarray(v)[None, :] for k, v in records.items()}
        counts = bootstrap_counts(n, n_bootstrap, seed)
        boot: dict[str, list[np.ndarray]] = {m: [] for m in self.metrics}
        for s in range(0, n_bootstrap, chunk):
            for m, v in self.scores(counts[s:s + chunk], stacked, y).items():
                boot[m].append(v[:, 0])
        return {m: (point[m], *percentile_interval(np.concatenate(boot[m]), level)) for m in self.metrics}

    def point_scores(self, records: Mapping[str, np.ndarray], y: np.ndarray) -> dict[str, float]:
        """The plain metrics of one unit's records ``[n]`` (weights all one)."""
        stacked = {k: np.asarray(v)[None, :] for k, v in records.items()}
        out = self.scores(np.ones((1, len(y)), dtype=np.float32), stacked, y)
        return {m: float(v[0, 0]) for m, v in out.items()}
