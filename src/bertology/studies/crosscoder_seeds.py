"""``study_crosscoder_seed_features``: which tuned-only crosscoder latents are task features, recurring across seeds.

Each seed's fine-tune has its own crosscoder (one compare pair each); its ``crosscoder_directions`` table holds the
tuned-side decoder direction of every tuned-only latent. For every task and layer, each seed's directions are
matched against every other seed's by best-match cosine, and a latent is a **task feature** when it recurs (best
match at least the null threshold: the ``1 - alpha`` quantile of the same matching on random unit directions of
the other seed's count and the model's width) in at least ``m`` of the other seeds (default: all of them). The rule
and why best match: :mod:`bertology.metrics.crosscoder_seeds`.

A seed whose crosscoder found no tuned-only latent at a layer still counts: nothing recurs in it (its rows in the
``crosscoder`` fit table say which seeds ran), so a feature two of three seeds share needs all three, not two.

One row per task, layer, seed, latent and other seed: ``best_match_cosine``, ``null_threshold``, ``recurs``;
and per latent ``recurs_in`` (other seeds it recurs in), ``needed`` (``m``) and ``task_feature``.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from bertology.metrics.crosscoder_seeds import ALPHA, DRAWS, recurrence

DIRECTIONS = "crosscoder_directions"
FIT = "crosscoder"
TABLE = "study_crosscoder_seed_features"
COLUMNS = ["task", "layer", "seed", "latent", "other_seed", "best_match_cosine", "null_threshold", "recurs",
           "recurs_in", "needed", "task_feature"]


def _direction_columns(df: pd.DataFrame) -> list[str]:
    return [c for c in df.columns if c.startswith("d") and c[1:].isdigit()]


def needed_seeds(n_other: int, m: int | None) -> int:
    """How many other seeds a latent must recur in: ``m`` (at most ``n_other``), or all of them when ``m`` is None."""
    return n_other if m is None else max(1, min(int(m), n_other))


def layer_rows(task: str, layer: int, part: pd.DataFrame, *, m: int | None, alpha: float, draws: int,
               ran: frozenset[int] = frozenset()) -> list[dict]:
    """The rows of one task and layer (``part``: the directions of every seed at that layer; ``ran``: seeds whose
    crosscoder ran there, the ones without a tuned-only latent included)."""
    cols = _direction_columns(part)
    seeds = {int(s): g for s, g in part.groupby("seed")}
    seeds.update({int(s): part.iloc[:0] for s in ran if int(s) not in seeds})
    if len(seeds) < 2:
        return []
    found = recurrence({s: g[cols].to_numpy(np.float64) for s, g in seeds.items()}, alpha=alpha, draws=draws)
    need = needed_seeds(len(seeds) - 1, m)
    rows = []
    for s, res in found.items():
        latents = seeds[s]["latent"].to_numpy()
        for i, latent in enumerate(latents):
            for t, best in res["best"].items():
                rows.append({"task": task, "layer": int(layer), "seed": s, "latent": int(latent), "other_seed": t,
                             "best_match_cosine": float(best[i]), "null_threshold": res["thresholds"][t],
                             "recurs": bool(np.nan_to_num(best[i], nan=-np.inf) >= res["thresholds"][t]),
                             "recurs_in": int(res["recurs_in"][i]), "needed": need,
                             "task_feature": bool(res["recurs_in"][i] >= need)})
    return rows


def ran_seeds(fit: pd.DataFrame | None) -> dict[tuple[str, int], frozenset[int]]:
    """(task, layer) -> the seeds whose crosscoder ran there, from the ``crosscoder`` fit table (one row each)."""
    if fit is None or fit.empty or not {"task", "seed", "layer"} <= set(fit.columns):
        return {}
    return {(str(t), int(layer)): frozenset(int(s) for s in g["seed"])
            for (t, layer), g in fit.dropna(subset=["seed"]).groupby(["task", "layer"])}


def seed_feature_table(directions: pd.DataFrame, *, m: int | None = None, alpha: float = ALPHA,
                       draws: int = DRAWS, fit: pd.DataFrame | None = None) -> pd.DataFrame:
    """``study_crosscoder_seed_features`` from the study's ``crosscoder_directions`` (tuned, task, seed first) and,
    when given, its ``crosscoder`` fit table (which seeds ran, those without a tuned-only latent too)."""
    ran = ran_seeds(fit)
    rows: list[dict] = []
    for (task, layer), part in directions.groupby(["task", "layer"], sort=True):
        rows += layer_rows(str(task), int(layer), part, m=m, alpha=alpha, draws=draws,
                           ran=ran.get((str(task), int(layer)), frozenset()))
    return pd.DataFrame(rows, columns=COLUMNS)


def task_features(table: pd.DataFrame) -> pd.DataFrame:
    """One row per latent (task, layer, seed, latent, recurs_in, needed, task_feature, mean best-match cosine)."""
    keys = ["task", "layer", "seed", "latent"]
    if table.empty:
        return pd.DataFrame(columns=[*keys, "recurs_in", "needed", "task_feature", "mean_best_match"])
    agg = table.groupby(keys, sort=True).agg(recurs_in=("recurs_in", "first"), needed=("needed", "first"),
                                             task_feature=("task_feature", "first"),
                                             mean_best_match=("best_match_cosine", "mean"))
    return agg.reset_index()


def verdict_counts(table: pd.DataFrame) -> pd.DataFrame:
    """Per task and layer: tuned-only latents judged (over seeds) and how many are task features."""
    per = task_features(table)
    if per.empty:
        return pd.DataFrame(columns=["task", "layer", "n_tuned_only", "n_task_features"])
    out = per.groupby(["task", "layer"], sort=True).agg(n_tuned_only=("latent", "size"),
                                                        n_task_features=("task_feature", "sum"))
    return out.reset_index()


def study_seed_tables(tables: dict[str, pd.DataFrame], *, alpha: float = ALPHA) -> dict[str, pd.DataFrame]:
    """``{TABLE: ...}`` when the study has crosscoder directions of at least two seeds of a task, else ``{}``."""
    directions = tables.get(DIRECTIONS)
    if directions is None or directions.empty:
        return {}
    table = seed_feature_table(directions, alpha=alpha, fit=tables.get(FIT))
    return {TABLE: table} if not table.empty else {}
