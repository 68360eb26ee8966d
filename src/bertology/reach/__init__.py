"""A table's reach, declared on its spec: how studies judge it against seed noise, how a many-model run shows
it, whether tracking records it. The built-in tables' functions are :mod:`bertology.reach.changes` (seed noise)
and :mod:`bertology.reach.views` (many-model views, tracking scalars).

An :class:`~bertology.analyses.registry.AnalysisSpec` or :class:`~bertology.experiments.registry.ExperimentSpec`
carries ``seed_noise=SeedNoise(...)``, ``many_view=ManyView(...)`` and (analyses) ``track=Track(...)``; the
study's seed-noise rule (:mod:`bertology.studies.noise`), the many-model index page (:mod:`bertology.report.many`)
and tracking (:mod:`bertology.integrations.tracker`, the ``track_analyses`` setting) read them through
:func:`declared`. This room sits below the catalogs (config's ``track_analyses`` choices read it), so it names none:
the package's root, the one module above every room, hands them down (:func:`hand_down`, as ``module:attribute``),
and they are imported when a reach is first asked for, as :class:`~bertology.catalog.Catalog` imports its modules.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

#: The catalogs whose specs declare a reach, as ``module:attribute``, handed down by the package's root
#: (:func:`hand_down`); read when a reach is asked for.
CATALOGS: list[str] = []


def hand_down(*catalogs: str) -> None:
    """Add ``module:attribute`` catalogs to :data:`CATALOGS` (the package's root hands down the analyses' and the
    experiments'; a room above this one names them, so no import points up)."""
    CATALOGS.extend(c for c in catalogs if c not in CATALOGS)


@dataclass(frozen=True)
class SeedNoise:
    """How a study judges a table against seed noise (:mod:`bertology.studies.noise`).

    ``extract(df, keys)`` turns the table (``keys`` = ``task, seed`` or ``task, seed_a, seed_b``) into one
    ``change`` per unit (columns ``level, unit, layer, head, metric, change`` and optionally ``base, tuned,
    ci_low, ci_high``); ``pairwise``: the change is a distance between two models, so the seed distances come from
    ``seedpair_<table>`` (the same extract on seed-vs-seed pairs); else from two seeds' changes, |c_a - c_b|.
    ``table``: the table judged (default: the spec's own).
    """

    pairwise: bool
    extract: Callable[["pd.DataFrame", list[str]], "pd.DataFrame"]
    table: str | None = None


@dataclass(frozen=True)
class ManyView:
    """How a many-model run's index page shows a table: ``caption`` over ``view(table)``, a frame with one row
    per layer and one column per tuned model (:mod:`bertology.report.many`). ``table``: default the spec's own."""

    caption: str
    view: Callable[["pd.DataFrame"], "pd.DataFrame"]
    table: str | None = None


@dataclass(frozen=True)
class Track:
    """Tracking may record the analysis while a model trains; ``scalars(table)`` are its per-layer numbers worth a
    line in a tracker (``bertology/<metric>/layer_<l>``; None: none)."""

    scalars: Callable[["pd.DataFrame"], dict[str, float]] | None = None


def per_model_change(df: "pd.DataFrame", keys: list[str], index: list[str], value: str) -> "pd.DataFrame":
    """``tuned - base`` of ``value`` per key and ``index`` (rows of other models, e.g. ``random``, left out), with
    ``base`` and ``tuned`` kept beside it; rows where either is missing dropped: the usual ``extract`` of a table
    with a ``model`` column."""
    import numpy as np

    wide = (
        df[df["model"].isin(["base", "tuned"])]
        .pivot_table(index=[*keys, *index], columns="model", values=value, aggfunc="mean")
        .reset_index()
    )
    wide.columns.name = None
    for model in ("base", "tuned"):
        if model not in wide:
            wide[model] = np.nan
    wide["change"] = wide["tuned"] - wide["base"]
    return wide.dropna(subset=["change"])


def as_units(df: "pd.DataFrame", level: str) -> "pd.DataFrame":
    """``df`` with ``level``, ``unit`` (``L5H3`` for a head, ``L5`` for a layer, else ``all``) and nullable
    ``layer``/``head`` columns: the unit columns a :class:`SeedNoise` ``extract`` returns."""
    import pandas as pd

    df = df.copy()
    df["level"] = level
    layer = df["layer"].astype("Int64") if "layer" in df else pd.Series(pd.NA, index=df.index, dtype="Int64")
    head = df["head"].astype("Int64") if "head" in df else pd.Series(pd.NA, index=df.index, dtype="Int64")
    df["layer"], df["head"] = layer, head
    if level == "head":
        df["unit"] = "L" + layer.astype(str) + "H" + head.astype(str)
    elif level == "layer":
        df["unit"] = "L" + layer.astype(str)
    else:
        df["unit"] = "all"
    return df


def _catalogs() -> Iterator[Any]:
    for entry in CATALOGS:
        module, attribute = entry.split(":")
        yield getattr(importlib.import_module(module), attribute)


def declared(attribute: str) -> dict[str, Any]:
    """``table -> reach`` of every spec in the catalogs that declares ``attribute`` (``seed_noise``, ``many_view``,
    ``track``), in catalog order; a reach's own ``table`` (if any) names the table, else the spec's name. A spec with
    several tables declares a tuple (``seed_noise=(SeedNoise(...), SeedNoise(..., table="transplant"))``)."""
    out: dict[str, Any] = {}
    for catalog in _catalogs():
        if not catalog.may_declare(attribute):  # e.g. no experiment declares ``track``: none is imported to ask
            continue
        for spec in catalog.specs():
            reach = getattr(spec, attribute, None)
            for one in reach if isinstance(reach, tuple) else (() if reach is None else (reach,)):
                out[getattr(one, "table", None) or spec.name] = one
    return out


def catalog_entries(attribute: str) -> tuple[str, ...]:
    """The name of every catalog entry whose spec may declare ``attribute``, in order (no spec imported)."""
    return tuple(name for c in _catalogs() if c.may_declare(attribute) for name in c.names())


def tracked_names() -> tuple[str, ...]:
    """The analyses whose spec declares ``track``, in catalog order.

    Read from :data:`bertology.keywords.TRACKABLE` (written by ``python -m bertology.signatures`` from the specs) while
    the catalogs hold exactly the names it was read from: asking for tracking's choices (``finetune --help``, any
    fine-tuning setting's check) then imports no analysis module and so no torch. A catalog with an entry added or
    changed since (a toy in a test, a plugin) is read from its specs; ``tests/house/test_keywords_current.py`` fails
    when the snapshot is stale.
    """
    from bertology import keywords

    if catalog_entries("track") == getattr(keywords, "TRACKABLE_FROM", None):
        return keywords.TRACKABLE
    return tuple(declared("track"))


class Trackable(Sequence[str]):
    """The analyses tracking may record, as a setting's ``choices``: :func:`tracked_names`, read when first needed (a
    setting declared below the catalogs names none)."""

    def _all(self) -> tuple[str, ...]:
        return tracked_names()

    def __contains__(self, name: object) -> bool:
        return name in self._all()

    def __bool__(self) -> bool:
        return bool(self._all())

    def __iter__(self) -> Iterator[str]:
        return iter(self._all())

    def __len__(self) -> int:
        return len(self._all())

    def __getitem__(self, index):  # type: ignore[override]
        return self._all()[index]
