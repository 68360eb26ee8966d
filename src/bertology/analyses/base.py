"""The one shape every analysis has: params in ``__init__``, streaming ``update``, ``compute``, ``merge``.

An analysis declares which activations it ``requires``; the extraction loop captures only those, runs
each model once per batch and calls ``update`` on every analysis. Accumulators hold sums, never
per-example ``[layers x heads x q x k]`` maps, so memory does not grow with the corpus. ``merge`` adds
the accumulators of an analysis run on another shard of the corpus, so shards combine exactly.
"""
from __future__ import annotations

import abc
from typing import ClassVar

from bertology.activations.batch import PairBatch
from bertology.results import Result


class Analysis(abc.ABC):
    """Base class of every streaming analysis."""

    #: Table name written to ``tables/<name>.parquet``.
    name: ClassVar[str]
    #: Subset of {"hidden_states", "attentions"}.
    requires: ClassVar[frozenset[str]]

    def params(self) -> dict:
        """The settings that change the numbers (recorded in the manifest and the table's provenance)."""
        return {}

    def extraction_options(self) -> dict:
        """Requests to the extraction loop, e.g. ``{"pad_to": 200}``."""
        return {}

    @abc.abstractmethod
    def update(self, batch: PairBatch) -> None:
        """Accumulate one batch."""

    @abc.abstractmethod
    def compute(self) -> Result:
        """Turn the accumulators into a tidy table."""

    def extra_results(self) -> list[Result]:
        """Tables written beside the analysis's own (declared in its spec's ``tables``), after ``compute``."""
        return []

    def results(self) -> list[Result]:
        """Every table of the analysis: its own first, then the extra ones."""
        return [self.compute(), *self.extra_results()]

    @abc.abstractmethod
    def merge(self, other: "Analysis") -> "Analysis":
        """Add another shard's accumulators into this one (in place) and return self."""

    def _check_mergeable(self, other: "Analysis") -> None:
        if type(other) is not type(self) or other.params() != self.params():
            raise ValueError(f"cannot merge {type(other).__name__}{other.params()} into {type(self).__name__}{self.params()}")
