"""An attention analysis run once per contribution measure (``--attention-measures``), its tables stacked.

Every attention analysis reads ``Captured.attentions``; under a measure it reads that measure's maps instead
(:meth:`bertology.activations.batch.PairBatch.measured`), unchanged, so its arithmetic is the one it does on the
attention probabilities. A spec that declares ``per_measure=True`` is built once per measure the run asks for; with
more than ``weights`` its tables gain a ``measure`` column (first). A per-layer measure (``rollout``,
``value_zeroing``, ``norm_residual``, ``alti``: one map per layer) is fed to an analysis built for one head, whose rows get ``head = -1``.
With ``weights`` alone (the default) the analysis is built as it always was: same tables, same numbers.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import pandas as pd

from bertology.activations.batch import PairBatch
from bertology.activations.contributions import PER_LAYER
from bertology.activations.extract import MEASURE_PREFIX
from bertology.analyses.base import Analysis
from bertology.analyses.registry import AnalysisSpec, BuildContext
from bertology.config import CompareConfig
from bertology.results import Result

#: The ``head`` of a per-layer measure's rows (its one map stands for the layer, not for a head).
LAYER_HEAD = -1
#: The columns that name a head (the head map's distances name two).
HEAD_COLUMNS = ("head", "head_a", "head_b")


def build(spec: AnalysisSpec, config: CompareConfig, ctx: BuildContext) -> Analysis:
    """``spec``'s analysis for this run: one per attention measure when the spec reads maps and the run asks for more
    than ``weights``, else the one it always was."""
    measures = tuple(config.attention_measures)
    if not spec.per_measure or measures == ("weights",):
        return spec.build(config, ctx)
    return PerMeasure({m: spec.build(config, dataclasses.replace(ctx, num_heads=1) if m in PER_LAYER else ctx)
                       for m in measures})


def stack(tables: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """One table of the measures' tables (``measure -> table``): a ``measure`` column first, ``head = -1`` for a
    per-layer measure's rows, in the measures' order."""
    parts = []
    for measure, table in tables.items():
        table = table.copy()
        if measure in PER_LAYER:
            for column in (c for c in HEAD_COLUMNS if c in table.columns):
                table[column] = LAYER_HEAD
        table.insert(0, "measure", measure)
        parts.append(table)
    return pd.concat(parts, ignore_index=True)


class PerMeasure(Analysis):
    """One analysis per measure (``parts``, in the order asked), fed one batch each under its measure."""

    requires = frozenset({"attentions"})

    def __init__(self, parts: dict[str, Analysis]):
        if not parts:
            raise ValueError("PerMeasure needs at least one measure")
        self.parts = dict(parts)
        first = next(iter(self.parts.values()))
        self.name = first.name
        self.requires = frozenset().union(*(a.requires for a in self.parts.values())) | {
            MEASURE_PREFIX + m for m in self.parts if m != "weights"}

    @property
    def measures(self) -> tuple[str, ...]:
        return tuple(self.parts)

    def params(self) -> dict:
        first = next(iter(self.parts.values()))
        return {**first.params(), "attention_measures": list(self.parts),
                "per_layer_measures": [m for m in self.parts if m in PER_LAYER], "per_layer_head": LAYER_HEAD}

    def extraction_options(self) -> dict:
        options: dict = {}
        for part in self.parts.values():
            options.update(part.extraction_options())
        return options

    def update(self, batch: PairBatch) -> None:
        for measure, part in self.parts.items():
            part.update(batch.measured(measure))

    def merge(self, other: "PerMeasure") -> "PerMeasure":
        self._check_mergeable(other)
        for measure, part in self.parts.items():
            part.merge(other.parts[measure])
        return self

    def results(self) -> list[Result]:
        """Each table of the analysis, the measures' rows stacked (:func:`stack`); the provenance of the first
        measure's, with the measures."""
        per = {m: part.results() for m, part in self.parts.items()}
        return [_stacked([per[m][i] for m in self.parts], self.measures) for i in range(len(next(iter(per.values()))))]

    def compute(self) -> Result:
        return self.results()[0]

    def extra_results(self) -> list[Result]:
        return self.results()[1:]


def _stacked(results: Sequence[Result], measures: Sequence[str]) -> Result:
    """One table's results under each measure as one result."""
    first = results[0]
    table = stack({m: r.table for m, r in zip(measures, results)})
    return Result(first.name, table, {**first.params, "attention_measures": list(measures)})
