"""How a streaming analysis declares itself: one :class:`AnalysisSpec` at the end of its module.

The spec says everything the rest of the house needs to know — the name the user selects, how to
build the analysis from the run's settings, the tables it writes, what it needs from the data, and
its one-line summary for the command line — so the pipeline, the CLI and resuming loop over specs
instead of naming analyses. :mod:`bertology.analyses.catalog` lists the specs.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # types only: the registry must not import what it registers
    import pandas as pd

    from bertology.analyses.base import Analysis
    from bertology.config import CompareConfig
    from bertology.data.corpus import Corpus
    from bertology.data.encode import EncodedCorpus

from bertology.reach import ManyView, SeedNoise, Track
from bertology.settings import Setting

#: What an analysis can need from the data (``AnalysisSpec.needs``).
#: ``pos_tags``: uses POS tags and trees when there are any (CoNLL-U, else spaCy), runs without;
#: ``trees``: cannot run without dependency trees.
NEEDS = frozenset({"pos_tags", "trees"})


@dataclass(frozen=True)
class BuildContext:
    """What an analysis is built from besides the settings: the model shape and the data it will see."""

    num_layers: int
    num_heads: int
    tokenizer: Any
    corpus: "Corpus"
    encoded: "EncodedCorpus"


@dataclass(frozen=True)
class AnalysisSpec:
    """One streaming analysis, declared once.

    ``tables``: the tables it writes, its own (``name``) first; ``needs``: a subset of :data:`NEEDS`;
    ``summary``: the command line's line(s) from the finished tables (None when there is nothing to say);
    ``settings``: every setting ``build`` reads from the config besides the run's own (seed, batch size):
    the command line's flags, the manifest, the fingerprint and the report are generated from them.
    Its reach (:mod:`bertology.reach`): ``seed_noise`` (how a study judges its table against seed noise; a tuple,
    one per table with its ``table=``, for a spec with several),
    ``many_view`` (how a many-model run's index page shows it), ``track`` (tracking may record it while a model
    trains). ``per_measure``: it reads attention maps and is built once per ``--attention-measures`` measure
    (:mod:`bertology.analyses.per_measure`).
    """

    name: str
    build: Callable[["CompareConfig", BuildContext], "Analysis"]
    tables: tuple[str, ...]
    needs: frozenset[str] = frozenset()
    summary: Callable[[Mapping[str, "pd.DataFrame"]], str | None] | None = None
    settings: tuple[Setting, ...] = ()
    seed_noise: SeedNoise | tuple[SeedNoise, ...] | None = None
    many_view: ManyView | None = None
    track: Track | None = None
    per_measure: bool = False

    def __post_init__(self) -> None:
        if not self.tables or self.tables[0] != self.name:
            raise ValueError(f"analysis {self.name!r}: its own table must come first in tables={self.tables}")
        if not self.needs <= NEEDS:
            raise ValueError(f"analysis {self.name!r}: unknown needs {sorted(self.needs - NEEDS)}; known: {sorted(NEEDS)}")
