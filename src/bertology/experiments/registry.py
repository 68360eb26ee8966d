"""How an experiment declares itself: one :class:`ExperimentSpec` at the end of its module.

An experiment re-runs the model (ablation sweeps, probes trained on features) instead of listening
to the shared extraction. Every experiment has the same entry shape: settings come from the run's
config, data from an :class:`ExperimentContext`, and ``run`` returns an :class:`ExperimentOutcome`
(result tables + the manifest section); the caller writes the tables, so resuming, the run folder
and the manifest are handled once, by the pipeline. :mod:`bertology.experiments.catalog` lists them.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:  # types only: the registry must not import what it registers
    import pandas as pd

    from bertology.config import CompareConfig
    from bertology.data.corpus import Corpus
    from bertology.models.pair import ModelPair
    from bertology.results import Result

from bertology.reach import ManyView, SeedNoise
from bertology.settings import Setting


class Settings(Protocol):
    """An experiment's settings object: what changes its numbers, recorded in the manifest."""

    def to_dict(self) -> dict: ...


@dataclass(frozen=True)
class ExperimentContext:
    """What an experiment inside ``compare`` works on.

    ``corpus`` holds the original texts (not a parser's words); ``work_dir`` keeps unfinished work
    (finished ablations, cached features) so that an interrupted run resumes where it stopped. ``peers``:
    in a many-model run, the other tuned models by name (a classifier among them that reads the labels
    says which task they belong to: :func:`bertology.tasks.match.mismatch`). ``tables``: the run's tables
    written so far (the analyses', then each earlier experiment's), so that an experiment listed after others
    may derive a table from theirs (changed vs needed); None before the experiments run (the refusal check).
    """

    config: "CompareConfig"
    pair: "ModelPair"
    corpus: "Corpus"
    work_dir: Path
    progress: bool = False
    peers: tuple[tuple[str, "ModelPair"], ...] = ()
    tables: Mapping[str, "Result"] | None = None


@dataclass
class ExperimentOutcome:
    """What an experiment produced: its tables (by name), its section of the manifest and what the run must warn of."""

    results: dict[str, "Result"]
    manifest: dict = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class ExperimentSpec:
    """One experiment, declared once.

    ``tables(config)``: the tables it writes with these settings (a run that has them all resumes
    without re-running); ``skip_reason(ctx)``: why it cannot run on this model and data (None when
    it can) — an error when the user named it, else a warning (``skipped_note``, formatted with the
    reason) or nothing when ``skipped_note`` is None; ``params(config)``: its settings object (what its
    manifest section records); ``settings``: the declarations of the settings it reads from the config
    (flags, manifest, fingerprint and report are generated from them); ``precheck(config, corpus,
    tuned_config)``: what can be said from the data and the tuned model's config alone, before any weights
    load (``tuned_config`` is None when it cannot be read cheaply): a reason it will be skipped (an error when
    named, as ``skip_reason``'s), or a :class:`~bertology.errors.BertologyError` for what is wrong whatever was
    named. Its reach (:mod:`bertology.reach`): ``seed_noise`` (how a study judges its table against seed noise; a
    tuple, one per table with its ``table=``, for a spec with several),
    ``many_view`` (how a many-model run's index page shows it).
    """

    name: str
    title: str
    tables: Callable[["CompareConfig"], tuple[str, ...]]
    params: Callable[["CompareConfig"], Settings]
    skip_reason: Callable[[ExperimentContext], str | None]
    run: Callable[[ExperimentContext], ExperimentOutcome]
    skipped_note: str | None = None
    summary: Callable[[Mapping[str, "pd.DataFrame"]], str | None] | None = None
    settings: tuple[Setting, ...] = ()
    precheck: Callable[["CompareConfig", "Corpus", Any], str | None] | None = None
    seed_noise: SeedNoise | tuple[SeedNoise, ...] | None = None
    many_view: ManyView | None = None

    def refusal(self, reason: str) -> str:
        """The error when the user named the experiment and it cannot run."""
        return f"Cannot run {self.title}: {reason}."


def jsonable(summary: Mapping[str, Any]) -> dict:
    """A manifest section with NumPy scalars made plain (``json.dumps`` would refuse them)."""
    import json

    return json.loads(json.dumps(summary, default=lambda o: o.item() if hasattr(o, "item") else str(o)))
