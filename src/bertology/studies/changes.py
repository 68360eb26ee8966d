"""A study's tables as the seed-noise rule reads them: the base-vs-tuned change of every seed and the seed-vs-seed
distances, per unit (:mod:`bertology.studies.noise` judges them).

Which tables, and what their change is, each table's spec declares (``seed_noise=SeedNoise(pairwise, extract)``,
:class:`bertology.reach.SeedNoise`; the built-in tables' extracts are :mod:`bertology.reach.changes`): :func:`judged`
reads them from the catalogs.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from bertology.errors import BertologyError
from bertology.reach import SeedNoise, declared
from bertology.reach.changes import need

#: Columns naming one unit of one metric of one table (tidy key of every ``study_*`` table).
UNIT_COLUMNS = ("table", "metric", "level", "unit", "layer", "head")


def judged() -> dict[str, SeedNoise]:
    """Every table a study judges against seed noise, ``table -> SeedNoise``, in catalog order: each table whose spec
    declares ``seed_noise`` (read from the catalogs, which imports their modules)."""
    return declared("seed_noise")


def by_measure(spec: SeedNoise, df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """``spec``'s extract of ``df``, each attention measure on its own: a table without a ``measure`` column (a run
    of ``weights`` alone) as it always was; with several measures, the ``weights`` rows as they would be alone and
    every other measure's rows as their own units, its metrics named ``<measure>/<metric>`` (``norm/cosine_distance``),
    so each measure gets its own seed-noise verdicts (Kobayashi et al. 2020: does the finding hold under a
    contribution measure?)."""
    if "measure" not in df.columns or df.empty:
        return spec.extract(df, keys)
    frames = []
    for measure, rows in df.groupby("measure", sort=False):
        one = spec.extract(rows.drop(columns="measure").reset_index(drop=True), keys)
        if measure != "weights" and not one.empty:
            one = _per_layer_units(one.assign(metric=f"{measure}/" + one["metric"].astype(str)), keys)
        frames.append(one)
    return pd.concat(frames, ignore_index=True)


def _per_layer_units(one: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """A per-layer measure's rows (one map per layer, ``head = -1``) as layer units (``L5``), not heads ``L5H-1``;
    where the extract also gave the layer (the mean over its one head: the same number), that row is kept."""
    from bertology.analyses.per_measure import LAYER_HEAD  # only a run with several measures gets here

    per_layer = (one["level"] == "head") & (one["head"] == LAYER_HEAD).fillna(False).astype(bool)
    if not per_layer.any():
        return one
    moved = one[per_layer].copy()
    moved["level"], moved["unit"] = "layer", "L" + moved["layer"].astype(str)
    moved["head"] = pd.array([pd.NA] * len(moved), dtype="Int64")
    out = pd.concat([one[~per_layer], moved], ignore_index=True)
    return out.drop_duplicates(subset=[*keys, "metric", "level", "unit"], keep="first").reset_index(drop=True)


_CHANGE_COLS = [*UNIT_COLUMNS, "change", "base", "tuned", "ci_low", "ci_high"]


def _finish(frame: pd.DataFrame, table: str, keys: list[str]) -> pd.DataFrame:
    """Order columns: keys, unit columns, the values; add missing value columns as NaN."""
    if frame.empty:
        return pd.DataFrame(columns=[*keys, *_CHANGE_COLS])
    frame = frame.copy()
    frame["table"] = table
    for col in ("base", "tuned", "ci_low", "ci_high"):
        if col not in frame:
            frame[col] = np.nan
    return frame[[*keys, *_CHANGE_COLS]]


def _check_keys(df: pd.DataFrame, table: str, keys: list[str]) -> None:
    """Every row names its task and seed(s), and one tuned model per (task, seed): else rows would merge."""
    missing = [k for k in keys if df[k].isna().any()]
    if missing:
        raise BertologyError(
            f"Study table {table!r} has rows without {', '.join(missing)}; every tuned model of a study needs its "
            "task and seed (the manifest's tasks[].seeds)."
        )
    if "tuned" in df and keys == ["task", "seed"]:
        clash = df.groupby(keys)["tuned"].nunique()
        clash = clash[clash > 1]
        if len(clash):
            (task, seed), _ = next(iter(clash.items()))
            raise BertologyError(
                f"Study table {table!r}: task {task!r} seed {seed!r} holds several tuned models "
                f"({', '.join(map(str, df.loc[(df['task'] == task) & (df['seed'] == seed), 'tuned'].unique()))}); "
                "give each its own seed."
            )


def seed_changes(base_tables: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """The base-vs-tuned change of every seed: ``task, seed`` + unit columns + ``change, base, tuned``.

    ``base_tables`` are the study's concatenated pair tables (columns ``tuned, task, seed`` first).
    """
    frames = []
    for name, spec in judged().items():
        df = base_tables.get(name)
        if df is None or df.empty:
            continue
        need(df, name, ("task", "seed"))
        _check_keys(df, name, ["task", "seed"])
        frames.append(_finish(by_measure(spec, df, ["task", "seed"]), name, ["task", "seed"]))
    if not frames:
        return pd.DataFrame(columns=["task", "seed", *_CHANGE_COLS])
    return pd.concat(frames, ignore_index=True)


def seed_distances(
    changes: pd.DataFrame, seed_tables: Mapping[str, pd.DataFrame]
) -> pd.DataFrame:
    """Seed-vs-seed distances: ``task, seed_a, seed_b`` + unit columns + ``distance`` (>= 0).

    Pairwise tables take them from ``seedpair_<table>`` (seed a in the base role, b in the tuned
    role); per-model tables from ``changes`` (|c_a - c_b| for each pair of seeds of a task).
    """
    frames = []
    for name, spec in judged().items():
        if spec.pairwise:
            df = seed_tables.get(f"seedpair_{name}", seed_tables.get(name))
            if df is None or df.empty:
                continue
            need(df, f"seedpair_{name}", ("task", "seed_a", "seed_b"))
            _check_keys(df, f"seedpair_{name}", ["task", "seed_a", "seed_b"])
            pairs = ["task", "seed_a", "seed_b"]
            d = _finish(by_measure(spec, df, pairs), name, pairs)
            d = d[d["seed_a"] != d["seed_b"]].copy()
            # (a, b) and (b, a) are one pair of seeds: count it once (the mean when both were computed)
            lo, hi = d[["seed_a", "seed_b"]].min(axis=1), d[["seed_a", "seed_b"]].max(axis=1)
            d["seed_a"], d["seed_b"] = lo, hi
            d["distance"] = d["change"].abs()
            d = d.groupby(["task", "seed_a", "seed_b", *UNIT_COLUMNS], dropna=False, as_index=False)["distance"].mean()
            frames.append(d)
        else:
            part = changes[changes["table"] == name]
            if part.empty:
                continue
            key = ["task", *UNIT_COLUMNS]
            left = part[[*key, "seed", "change"]]
            pairs = left.merge(left, on=key, suffixes=("_a", "_b"))  # NA layer/head keys match each other
            pairs = pairs[pairs["seed_a"] < pairs["seed_b"]].copy()
            pairs["distance"] = (pairs["change_a"] - pairs["change_b"]).abs()
            frames.append(pairs)
    cols = ["task", "seed_a", "seed_b", *UNIT_COLUMNS, "distance"]
    if not frames:
        return pd.DataFrame(columns=cols)
    return pd.concat([f[cols] for f in frames], ignore_index=True)
