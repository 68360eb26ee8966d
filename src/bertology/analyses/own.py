"""Your own analysis from a notebook: an object with the streaming contract, run beside the catalog's.

``bt.compare(base, tuned, data, analyses=[MyNorm(), "attention_change"])`` takes, beside names, any object with

- ``name``: its table's name (letters, digits and ``_``, not a built-in analysis's, experiment's or table's);
- ``requires``: which activations it reads, a subset of ``{"hidden_states", "attentions"}``;
- ``update(batch)``: called once per :class:`~bertology.activations.batch.PairBatch` (both models' activations
  for the same padded tokens);
- ``compute()``: its tables, as a DataFrame (the table ``name``), a ``{table: DataFrame}`` dict (every table
  named ``name`` or ``name_...``), or a :class:`~bertology.results.Result`;
- optionally ``params()`` (a JSON-able dict of what changes its numbers, recorded in the manifest and the
  fingerprint) and ``extraction_options()``.

A subclass of :class:`~bertology.analyses.base.Analysis` has that shape already. :class:`OwnAnalysis` wraps
such an object for the extraction loop; nothing here knows which object it wraps.
"""
from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping
from typing import Any

import pandas as pd

from bertology.activations.batch import PairBatch
from bertology.analyses.base import Analysis
from bertology.errors import BertologyError
from bertology.results import Result

#: What an own analysis may ask the extraction loop for.
REQUIRABLE = frozenset({"hidden_states", "attentions"})
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def is_own(value: Any) -> bool:
    """True when ``value`` is an analysis object, not a name (an ``analyses=`` entry)."""
    return not isinstance(value, str) and hasattr(value, "update")


def split_analyses(analyses: Any) -> tuple[tuple[str, ...], list]:
    """``analyses=`` split into the names (catalog order is the run's) and the analysis objects (in the order
    given); anything else refused in one line."""
    given = (analyses,) if isinstance(analyses, str) else tuple(analyses)
    names = tuple(a for a in given if isinstance(a, str))
    odd = [a for a in given if not isinstance(a, str) and not is_own(a)]
    if odd:
        raise BertologyError(f"analyses takes names and analysis objects (with update(batch) and compute()); not "
                             f"{type(odd[0]).__name__} {str(odd[0])[:60]!r}.")
    return names, [a for a in given if is_own(a)]


#: Where an analysis object cannot go, and why (:func:`refused_here`).
_NOT_HERE = {
    "many": "Your own analysis objects run with one tuned model: an object accumulates one pair's batches, and a "
            "many-model run would need one per tuned model; call bt.compare once per tuned model",
    "track": "track takes analyses by name: each checkpoint builds its analyses afresh from the catalog, which an "
             "object made in a notebook is not in",
}


def refused_here(where: str) -> BertologyError:
    """The one line refusing analysis objects ``where`` (``many``: a many-model compare, ``track``)."""
    return BertologyError(f"{_NOT_HERE[where]}; or make it a module of the catalog (docs: Development, Adding an "
                          "analysis).")


def _refuse(obj: Any, why: str) -> BertologyError:
    return BertologyError(f"The analysis {type(obj).__name__} object {why} (docs: Notebook API, Your own analysis).")


def checked_name(obj: Any, taken: Collection[str]) -> str:
    """The object's ``name``, refused when it is not a plain identifier or is taken by a built-in."""
    name = getattr(obj, "name", None)
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise _refuse(obj, f"needs a name made of letters, digits and '_' (its table's name), not {name!r}")
    if name in taken:
        raise _refuse(obj, f"is named {name!r}, which a built-in analysis, experiment or table (or another analysis of this run) has; rename it")
    return name


def checked_requires(obj: Any) -> frozenset[str]:
    """The object's ``requires`` as a frozenset, refused when it asks for what the loop cannot capture."""
    wanted = getattr(obj, "requires", None)
    if isinstance(wanted, str) or not isinstance(wanted, Collection):
        raise _refuse(obj, f"needs requires, a set of {sorted(REQUIRABLE)}, not {wanted!r}")
    unknown = sorted(set(wanted) - REQUIRABLE)
    if unknown:
        raise _refuse(obj, f"requires {unknown}; the extraction loop captures {sorted(REQUIRABLE)}")
    return frozenset(wanted)


class OwnAnalysis(Analysis):
    """A user's analysis object in the extraction loop: checked once, fed every batch, its tables checked.

    ``taken``: the names of every built-in analysis, experiment and table (a clash is refused, here and when its
    tables come back). Its tables are recomputed on every run (never read back from a resumed folder): the
    fingerprint records its name, class and ``params()``, not its code.
    """

    def __init__(self, obj: Any, taken: Collection[str] = ()) -> None:
        for method in ("update", "compute"):
            if not callable(getattr(obj, method, None)):
                raise _refuse(obj, f"has no {method}() method; an analysis has update(batch) and compute()")
        self.obj, self.taken = obj, frozenset(taken)
        self.name = checked_name(obj, self.taken)
        self.requires = checked_requires(obj)

    def params(self) -> dict:
        """The object's ``params()`` (``{}`` without one), as JSON reads it back (non-JSON values as text)."""
        own = getattr(self.obj, "params", None)
        value = own() if callable(own) else {}
        if not isinstance(value, Mapping):
            raise _refuse(self.obj, f"returned {type(value).__name__} from params(); it returns a dict")
        return json.loads(json.dumps(dict(value), default=str, sort_keys=True))

    def identity(self) -> dict:
        """What the manifest and the fingerprint record: name, class (module and qualified name) and params."""
        cls = type(self.obj)
        return {"name": self.name, "class": f"{cls.__module__}.{cls.__qualname__}", "params": self.params()}

    def extraction_options(self) -> dict:
        own = getattr(self.obj, "extraction_options", None)
        return dict(own()) if callable(own) else {}

    def update(self, batch: PairBatch) -> None:
        self.obj.update(batch)

    def compute(self) -> Result:
        return self.results()[0]

    def results(self) -> list[Result]:
        """The object's tables as Results, its own (``name``) first; a wrong shape or a taken name refused."""
        out = raw = self.obj.results() if isinstance(self.obj, Analysis) else self.obj.compute()
        if isinstance(out, (pd.DataFrame, Result)):
            out = [out]
        elif isinstance(out, Mapping):
            out = [Result(str(k), v) for k, v in out.items()]
        elif not isinstance(self.obj, Analysis):  # a list is what an Analysis's results() returns, not compute()
            out = None
        if not out:
            raise _refuse(self.obj, f"returned {type(raw).__name__} from compute(); it returns a DataFrame, "
                                    "a {table: DataFrame} dict or a Result")
        results = [r if isinstance(r, Result) else Result(self.name, r) for r in out]
        for res in results:
            self._check_table(res)
        return sorted(results, key=lambda r: r.name != self.name)

    def _check_table(self, res: Result) -> None:
        if not isinstance(res.table, pd.DataFrame):
            raise _refuse(self.obj, f"returned {type(res.table).__name__} as table {res.name!r}; tables are DataFrames")
        if res.name != self.name and not res.name.startswith(self.name + "_"):
            raise _refuse(self.obj, f"returned a table {res.name!r}; its tables are named {self.name!r} or "
                                    f"{self.name + '_...'!r}")
        if res.name in self.taken:
            raise _refuse(self.obj, f"returned a table {res.name!r}, which a built-in analysis writes; rename it")

    def merge(self, other: "Analysis") -> "Analysis":
        own = getattr(self.obj, "merge", None)
        if not callable(own) or not isinstance(other, OwnAnalysis):
            raise _refuse(self.obj, "cannot be merged: it has no merge(other)")
        own(other.obj)
        return self
