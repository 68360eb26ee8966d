"""Seed noise as the yardstick: is a base-vs-tuned change (or a task difference) bigger than seeds differ?

A study fine-tunes each task with several seeds. For every *unit* (a head, a layer, or the whole model)
and *metric* of every pair table this module puts side by side

- the base-vs-tuned **change** of each seed (``c_s``, one per seed), and
- the seed-vs-seed **distance** of each pair of seeds of the same task (``d_ab``, one per pair),

and calls the change *beyond seed noise* when the one-sided exact Mann-Whitney test of
"base-vs-tuned magnitudes |c_s| are larger than seed-vs-seed distances d_ab" gives ``p <= alpha``.
Under the null that the k magnitudes and the k(k-1)/2 seed distances are exchangeable (fine-tuning
moved this unit no farther from the base than one seed lies from another) the false-positive rate is
the test's attained level, the largest achievable p-value <= alpha; :func:`attained_level` computes it
(k = 3 seeds: 1/20 = 0.05, reached only when every |c_s| exceeds every d_ab). With fewer seeds than
the test needs (k = 2: the smallest p is 1/3) or one seed (no seed distance at all) ``beyond_noise``
is None and ``reason`` says why. Under other nulls the rate differs (``benchmarks/seed_noise_null.py``):
when each seed moves the model its own random way with no shared change, the base lies amid the seeds
and the rule is conservative (k = 3: 0.037 in 1-D, ~0 in many dimensions); were the base just one more
i.i.d. draw like the seeds, distances sharing it correlate and the rule fires more often (0.08-0.13).

What the change is, per table (``CHANGES`` below):

- ``attention_change``: ``cosine_distance`` = 1 - cosine and ``js_divergence``, per head and per
  layer (mean over its heads); seed distances from ``seedpair_attention_change``.
- ``representation_similarity``: 1 - value on the diagonal (``layer_base == layer_tuned``), per layer
  and metric; seed distances from ``seedpair_representation_similarity``.
- ``attention_patterns``: tuned fraction - base fraction per head and pattern, and the share of all
  heads' maps (level ``model``); ``probe``: tuned - base of ``uuas``/``dspr`` (distance probe) and
  ``root_acc``/``nspr`` (depth probe) per layer on the test split (dev when no test); ``geometry``:
  tuned - base per layer and metric; ``ablation``: ``delta`` (ablated - intact) per head and per layer and
  whole-layer ablation (unit ``L5 skip``, ``L5 uniform_heads``, ``L5 revert_ffn``, ``L0 revert_embeddings``: the
  table's ``layer_mode``; a revert run's deltas are reverted - tuned).
  For these per-model tables the seed distance is |c_a - c_b| between two seeds' changes, computed
  from the base-vs-tuned table itself (the seed-pair tables are not needed).
- ``weight_change``: ``relative_change`` (||W_t - W_b||_F / ||W_b||_F) per layer and module (level ``module``,
  unit ``L5 query``; ALBERT's shared block is one unit at its first depth) and per head of the attention
  projections (level ``head``, unit ``L5H3 query``); seed distances from ``seedpair_weight_change``, the same
  quantity between two seeds' weights.
- ``transplant``: ``gain_recovered`` per transplanted unit and per point of the top/bottom layer curves (level = the
  table's ``unit_kind``, unit = its label: ``L3 attention``, ``top 2 layers``); ``changed_vs_needed``: Spearman's rho
  between change and revert drop (level ``model``, unit ``heads: weight``), per metric. Per-model tables: is the gain
  (the rho) consistently away from 0 by more than two seeds' values differ?

Task differences compare the per-seed changes of two tasks with the two-sided exact Mann-Whitney test
(exact under the null that the two tasks' per-seed changes are exchangeable). Many units mean many
tests: ``study_counts`` gives, per family (table, task, metric, level), how many units are beyond noise
next to how many the rule would flag by chance (``alpha`` x tested), and ``beyond_noise_fdr`` applies
the Benjamini-Hochberg procedure (``scipy.stats.false_discovery_control``) within each family.

Everything here is pure pandas/numpy/scipy: no model, no figure (the declared tables are read from the specs in
the catalogs, :func:`judged`, which imports their modules).
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from itertools import combinations
from math import comb

import numpy as np
import pandas as pd
from scipy.stats import false_discovery_control, mannwhitneyu

from bertology.errors import BertologyError
from bertology.reach import as_units, declared, per_model_change
from bertology.results import weights_rows

logger = logging.getLogger(__name__)

__all__ = [
    "ALPHA",
    "CHANGES",
    "judged",
    "STUDY_TABLES",
    "UNIT_COLUMNS",
    "CORPORA",
    "attained_level",
    "corpus_study_tables",
    "corpus_table",
    "seed_changes",
    "seed_distances",
    "study_tables",
]

#: Default significance level of the seed-noise rule.
ALPHA = 0.05
#: Columns naming one unit of one metric of one table (tidy key of every ``study_*`` table).
UNIT_COLUMNS = ("table", "metric", "level", "unit", "layer", "head")
#: The tables :func:`study_tables` returns.
STUDY_TABLES = ("study_summary", "study_seed_noise", "study_effects", "study_counts", "study_rule",
                "study_task_differences")

#: The corpora a study measures on, as (prefix, suffix) of their tables' names: the shared corpus
#: (``attention_change``, ``seedpair_attention_change``, ``study_effects``), each task's own dev data
#: (``own_attention_change``, ``own_seedpair_attention_change``, ``own_study_effects``) and the
#: out-of-domain corpus (``representation_similarity_ood``, ``seedpair_representation_similarity_ood``,
#: ``study_effects_ood``).
CORPORA: dict[str, tuple[str, str]] = {"shared": ("", ""), "own": ("own_", ""), "ood": ("", "_ood")}

_PROBE_METRICS = {"distance": ("uuas", "dspr"), "depth": ("root_acc", "nspr")}


# ------------------------------------------------------------------------------------ the error rate
def min_p(m: int, n: int, two_sided: bool = False) -> float:
    """Smallest p-value the exact Mann-Whitney test can give with samples of m and n values."""
    if m < 1 or n < 1:
        return 1.0
    p = 1.0 / comb(m + n, m)
    return min(1.0, 2 * p) if two_sided else p


@lru_cache(maxsize=256)
def u_distribution(m: int, n: int) -> np.ndarray:
    """Null probabilities of the Mann-Whitney U statistic (0..m*n) for samples of m and n untied values.

    Counts the rank arrangements giving each U with the recursion f(m, n, u) = f(m-1, n, u-n) +
    f(m, n-1, u) (the largest value is an x, beating all n y's, or a y), divided by C(m+n, m).
    """
    f = np.zeros((m + 1, n + 1, m * n + 1))
    f[0, :, 0] = 1.0
    f[:, 0, 0] = 1.0
    for i in range(1, m + 1):
        for j in range(1, n + 1):
            f[i, j, j:] += f[i - 1, j, : m * n + 1 - j]
            f[i, j, :] += f[i, j - 1, :]
    out = f[m, n] / comb(m + n, m)
    out.flags.writeable = False  # cached: callers must not change it
    return out


@lru_cache(maxsize=1024)
def attained_level(m: int, n: int, alpha: float = ALPHA, two_sided: bool = False) -> float:
    """The exact false-positive rate of "p <= alpha" for the exact Mann-Whitney test with m and n values.

    Under exchangeability every arrangement of the m + n ranks is equally likely, so the rate is the
    null probability of the set of U values whose p-value is <= ``alpha`` (0 when even the smallest p
    exceeds it). For a study with k seeds, m = k and n = k(k-1)/2.
    """
    if m < 1 or n < 1:
        return 0.0
    prob = u_distribution(m, n)
    upper = prob[::-1].cumsum()[::-1]  # P(U >= u)
    p = np.minimum(1.0, 2 * np.minimum(upper, prob.cumsum())) if two_sided else upper
    return float(prob[p <= alpha + 1e-12].sum())


# ----------------------------------------------------------------------------------- change tables
@dataclass(frozen=True)
class Change:
    """How one pair table turns into changes: ``pairwise`` tables compare two models in every row
    (seed noise from the seed-pair table); per-model tables hold one value per model."""

    table: str
    pairwise: bool
    extract: Callable[[pd.DataFrame, list[str]], pd.DataFrame]


def _need(df: pd.DataFrame, table: str, columns: tuple[str, ...]) -> None:
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise BertologyError(f"Study table {table!r} lacks column(s) {', '.join(missing)}; have {list(df.columns)}.")


def _attention_change(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    _need(df, "attention_change", ("layer", "head", "cosine", "js_divergence"))
    heads = df.groupby([*keys, "layer", "head"], as_index=False)[["cosine", "js_divergence"]].mean()
    heads["cosine_distance"] = 1.0 - heads["cosine"]
    long = heads.melt(id_vars=[*keys, "layer", "head"], value_vars=["cosine_distance", "js_divergence"],
                      var_name="metric", value_name="change")
    layers = long.groupby([*keys, "layer", "metric"], as_index=False)["change"].mean()
    return pd.concat([as_units(long, "head"), as_units(layers, "layer")], ignore_index=True)


def _representation_similarity(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    _need(df, "representation_similarity", ("layer_base", "layer_tuned", "metric", "value"))
    diag = df[df["layer_base"] == df["layer_tuned"]]
    out = diag.groupby([*keys, "layer_base", "metric"], as_index=False)["value"].mean()
    out = out.rename(columns={"layer_base": "layer"})
    out["change"] = 1.0 - out.pop("value")
    return as_units(out, "layer")


def _attention_patterns(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    _need(df, "attention_patterns", ("model", "layer", "head", "pattern", "fraction"))
    heads = per_model_change(df, keys, ["layer", "head", "pattern"], "fraction").rename(columns={"pattern": "metric"})
    share = heads.groupby([*keys, "metric"], as_index=False)[["base", "tuned", "change"]].mean()
    return pd.concat([as_units(heads, "head"), as_units(share, "model")], ignore_index=True)


def _probe(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    _need(df, "probe", ("model", "layer", "probe", "split"))
    split = "test" if (df["split"] == "test").any() else ("dev" if (df["split"] == "dev").any() else None)
    part = df if split is None else df[df["split"] == split]
    frames = []
    for probe, metrics in _PROBE_METRICS.items():
        rows = part[part["probe"] == probe]
        for metric in metrics:
            if metric not in rows or rows[metric].isna().all():
                continue
            one = per_model_change(rows, keys, ["layer"], metric)
            one["metric"] = metric
            frames.append(one)
    if not frames:
        return pd.DataFrame()
    return as_units(pd.concat(frames, ignore_index=True), "layer")


def _geometry(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    _need(df, "geometry", ("model", "layer", "metric", "value"))
    out = per_model_change(df, keys, ["layer", "metric"], "value")
    return as_units(out, "layer")


def _ablation(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    _need(df, "ablation", ("target", "layer", "head", "metric", "delta"))
    df = df[df["target"].isin(["head", "layer"])].copy()
    modes = df["mode"].dropna().unique() if "mode" in df else []
    if len(modes) > 1:
        df["metric"] = df["mode"].astype(str) + "/" + df["metric"].astype(str)
    cols = ["delta"] + [c for c in ("ci_low", "ci_high") if c in df]
    frames = []
    if "layer_mode" not in df:  # tables written before layer_mode existed: one kind of layer row
        df["layer_mode"] = ""
    for target, level in (("head", "head"), ("layer", "layer")):
        rows = df[df["target"] == target]
        if rows.empty:
            continue
        index = [*keys, "layer", "head", "metric"] if level == "head" else [*keys, "layer", "layer_mode", "metric"]
        one = rows.groupby(index, as_index=False)[cols].mean()
        one["base"] = 0.0  # the intact model
        one["tuned"] = one["delta"]
        one["change"] = one.pop("delta")
        one = as_units(one, level)
        if level == "layer":  # each whole-layer ablation its own unit: L5 skip, L5 uniform_heads, L0 revert_embeddings
            named = one["layer_mode"].fillna("").astype(str)
            one["unit"] = one["unit"].where(named == "", one["unit"] + " " + named)
            one = one.drop(columns="layer_mode")
        frames.append(one)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def _weight_change(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    _need(df, "weight_change", ("layer", "module", "head", "relative_change"))
    rows = df.dropna(subset=["relative_change"])
    rows = rows.groupby([*keys, "layer", "module", "head"], dropna=False, as_index=False)["relative_change"].mean()
    rows = rows.rename(columns={"relative_change": "change"}).assign(metric="relative_change")
    whole, heads = rows[rows["head"].isna()].drop(columns="head"), rows[rows["head"].notna()]
    parts = [as_units(whole, "layer").assign(level="module"), as_units(heads, "head")]
    for part in parts:  # the module names the unit: L5 query, L5H3 query
        part["unit"] = part["unit"] + " " + part["module"].astype(str)
    return pd.concat(parts, ignore_index=True).drop(columns="module")


def _transplant(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Gain recovered per transplanted unit (``L3 attention``) and per point of the layer curves (``top 2 layers``):
    level = the table's ``unit_kind``; a gain that is undefined for a seed (the tuned model no better than the head
    alone) is left out for that seed."""
    _need(df, "transplant", ("unit_kind", "layer", "head", "label", "metric", "gain_recovered"))
    rows = df.dropna(subset=["gain_recovered"])
    rows = rows.groupby([*keys, "unit_kind", "label", "layer", "head", "metric"], dropna=False, as_index=False)[
        "gain_recovered"].mean()
    out = as_units(rows.rename(columns={"gain_recovered": "change"}), "unit")
    single_head = out["unit_kind"] == "head"
    out["head"] = out["head"].where(single_head)  # a layer, block or curve point names no head
    out["level"], out["unit"] = out.pop("unit_kind").astype(str), out.pop("label").astype(str)
    return out


def _changed_vs_needed(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Spearman's rho between change and revert drop, one whole-run unit per level and change measure
    (``heads: weight``), per metric; a rho that is undefined for a seed is left out for that seed."""
    _need(df, "changed_vs_needed", ("level", "change_measure", "metric", "spearman"))
    rows = df.dropna(subset=["spearman"])
    rows = rows.groupby([*keys, "level", "change_measure", "metric"], as_index=False)["spearman"].mean()
    out = as_units(rows.rename(columns={"spearman": "change"}).drop(columns="level"), "model")
    out["unit"] = rows["level"].astype(str).values + "s: " + rows["change_measure"].astype(str).values
    return out.drop(columns="change_measure")


#: The pair tables whose change functions live here; a table that is absent is skipped. A spec that declares
#: ``seed_noise=`` (:class:`bertology.reach.SeedNoise`) adds its table: :func:`judged` is both.
CHANGES: dict[str, Change] = {
    "attention_change": Change("attention_change", True, _attention_change),
    "representation_similarity": Change("representation_similarity", True, _representation_similarity),
    "attention_patterns": Change("attention_patterns", False, _attention_patterns),
    "probe": Change("probe", False, _probe),
    "geometry": Change("geometry", False, _geometry),
    "ablation": Change("ablation", False, _ablation),
    "weight_change": Change("weight_change", True, _weight_change),
    "transplant": Change("transplant", False, _transplant),
    "changed_vs_needed": Change("changed_vs_needed", False, _changed_vs_needed),
}



def judged() -> dict[str, Change]:
    """Every table a study judges against seed noise: :data:`CHANGES`, then each table whose spec declares
    ``seed_noise`` (read from the catalogs; a declaration of a table above takes its place)."""
    out = dict(CHANGES)
    for table, reach in declared("seed_noise").items():
        out[table] = Change(table, reach.pairwise, reach.extract)
    return out


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
        _need(df, name, ("task", "seed"))
        _check_keys(df, name, ["task", "seed"])
        # several --attention-measures: the weights rows are judged (each measure against seed noise: not yet)
        frames.append(_finish(spec.extract(weights_rows(df), ["task", "seed"]), name, ["task", "seed"]))
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
            _need(df, f"seedpair_{name}", ("task", "seed_a", "seed_b"))
            _check_keys(df, f"seedpair_{name}", ["task", "seed_a", "seed_b"])
            pairs = ["task", "seed_a", "seed_b"]
            d = _finish(spec.extract(weights_rows(df), pairs), name, pairs)
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


# -------------------------------------------------------------------------------------- statistics
def _summary(changes: pd.DataFrame) -> pd.DataFrame:
    """Mean, sd (ddof 1), min, max and n over seeds of ``change``, ``base`` and ``tuned`` per unit."""
    key = ["table", "task", "metric", "level", "unit", "layer", "head"]
    long = changes.melt(id_vars=[*key, "seed"], value_vars=["change", "base", "tuned", "ci_low", "ci_high"],
                        var_name="quantity", value_name="value").dropna(subset=["value"])
    out = (
        long.groupby([*key, "quantity"], dropna=False, sort=True)["value"]
        .agg(mean="mean", sd="std", min="min", max="max", n_seeds="count")
        .reset_index()
    )
    return out


def _noise(distances: pd.DataFrame) -> pd.DataFrame:
    key = ["table", "task", "metric", "level", "unit", "layer", "head"]
    if distances.empty:
        return pd.DataFrame(columns=[*key, "n_seed_pairs", "mean", "sd", "min", "max"])
    return (
        distances.groupby(key, dropna=False, sort=True)["distance"]
        .agg(n_seed_pairs="count", mean="mean", sd="std", min="min", max="max")
        .reset_index()
    )


def _mwu_by_size(x: list[np.ndarray], y: list[np.ndarray], alternative: str) -> np.ndarray:
    """Exact Mann-Whitney p-values of many small samples, vectorised over units with equal sizes."""
    p = np.full(len(x), np.nan)
    sizes: dict[tuple[int, int], list[int]] = {}
    for i, (a, b) in enumerate(zip(x, y)):
        if len(a) and len(b):
            sizes.setdefault((len(a), len(b)), []).append(i)
    for (m, n), idx in sizes.items():
        xs = np.vstack([x[i] for i in idx])
        ys = np.vstack([y[i] for i in idx])
        p[idx] = mannwhitneyu(xs, ys, alternative=alternative, method="exact", axis=1).pvalue
    return p


def _untested_effect(k: int, n_pairs: int, alpha: float) -> str:
    """Why a task's change cannot be tested against its seed noise ("" when it can)."""
    if k < 2:
        return "1 seed: no seed-noise estimate"
    if n_pairs == 0:
        return "no seed-vs-seed comparison for this unit"
    if min_p(k, n_pairs) > alpha:
        return f"{k} seeds: the smallest possible p is {min_p(k, n_pairs):.3g} > alpha {alpha:g}"
    return ""


def _untested_difference(a: str, b: str, na: int, nb: int, alpha: float) -> str:
    """Why tasks ``a`` and ``b`` (``na``, ``nb`` seeds) cannot be told apart by the two-sided test ("" when they can)."""
    if min(na, nb) < 2:
        return f"{a if na < 2 else b} has 1 seed: no seed-noise estimate"
    if min_p(na, nb, two_sided=True) > alpha:
        return f"{na} vs {nb} seeds: the smallest possible p is {min_p(na, nb, True):.3g} > alpha {alpha:g}"
    return ""


def _add_verdicts(frame: pd.DataFrame, untested: list[str], alpha: float) -> None:
    """The ``alpha``, ``beyond_noise`` and ``reason`` columns: no verdict (null) where ``untested`` gives the
    reason the test cannot decide, else whether ``p_value <= alpha``."""
    frame["alpha"] = alpha
    frame["beyond_noise"] = pd.Series([None if why else bool(p <= alpha) for why, p in zip(untested, frame["p_value"])],
                                      index=frame.index, dtype="boolean")
    frame["reason"] = untested


def _effects(changes: pd.DataFrame, distances: pd.DataFrame, alpha: float) -> pd.DataFrame:
    """Per task and unit: the mean change, the seed-noise yardstick and the rule's verdict."""
    key = ["table", "task", "metric", "level", "unit", "layer", "head"]
    c = changes.assign(magnitude=changes["change"].abs()).dropna(subset=["change"])
    by_unit = (
        c.groupby(key, dropna=False, sort=True)
        .agg(n_seeds=("change", "count"), change_mean=("change", "mean"), change_sd=("change", "std"),
             magnitude_min=("magnitude", "min"), magnitudes=("magnitude", list))
        .reset_index()
    )
    if distances.empty:
        d = pd.DataFrame(columns=[*key, "n_seed_pairs", "noise_mean", "noise_max", "noises"])
    else:
        d = (
            distances.dropna(subset=["distance"]).groupby(key, dropna=False, sort=True)
            .agg(n_seed_pairs=("distance", "count"), noise_mean=("distance", "mean"),
                 noise_max=("distance", "max"), noises=("distance", list))
            .reset_index()
        )
    out = by_unit.merge(d, on=key, how="left")
    out["n_seed_pairs"] = out["n_seed_pairs"].fillna(0).astype(int)
    xs = [np.asarray(v, float) for v in out["magnitudes"]]
    ys = [np.asarray(v, float) if isinstance(v, list) else np.empty(0) for v in out["noises"]]
    out["p_value"] = _mwu_by_size(xs, ys, "greater")
    _add_verdicts(out, [_untested_effect(k, n_pairs, alpha) for k, n_pairs in zip(out["n_seeds"], out["n_seed_pairs"])],
                  alpha)
    out["q_value"] = np.nan
    fam = ["table", "task", "metric", "level"]
    for _, idx in out.groupby(fam, dropna=False).groups.items():
        tested = [i for i in idx if not pd.isna(out.at[i, "beyond_noise"])]
        if tested:
            out.loc[tested, "q_value"] = false_discovery_control(out.loc[tested, "p_value"].to_numpy(float))
    out["beyond_noise_fdr"] = pd.Series(
        [None if pd.isna(v) else bool(q <= alpha) for v, q in zip(out["beyond_noise"], out["q_value"])],
        index=out.index, dtype="boolean",
    )
    return out.drop(columns=["magnitudes", "noises"])


def _counts(effects: pd.DataFrame) -> pd.DataFrame:
    """Per family (table, task, metric, level): units, units tested, beyond noise, expected by chance."""
    fam = ["table", "task", "metric", "level"]
    cols = [*fam, "n_units", "n_tested", "n_beyond", "expected_false", "n_beyond_fdr", "reason"]
    if effects.empty:
        return pd.DataFrame(columns=cols)
    rows = []
    for key, g in effects.groupby(fam, dropna=False, sort=True):
        tested = g["beyond_noise"].notna()
        level = sum(attained_level(int(k), int(n), float(a)) for k, n, a in
                    zip(g.loc[tested, "n_seeds"], g.loc[tested, "n_seed_pairs"], g.loc[tested, "alpha"]))
        reasons = g.loc[~tested, "reason"].unique()
        rows.append({**dict(zip(fam, key)), "n_units": len(g), "n_tested": int(tested.sum()),
                     "n_beyond": int(g["beyond_noise"].fillna(False).sum()), "expected_false": level,
                     "n_beyond_fdr": int(g["beyond_noise_fdr"].fillna(False).sum()),
                     "reason": "; ".join(r for r in reasons if r)})
    return pd.DataFrame(rows, columns=cols)


def _rule(effects: pd.DataFrame, alpha: float) -> pd.DataFrame:
    """The rule's smallest p and exact false-positive rate for each seed count of the study."""
    cols = ["n_seeds", "n_seed_pairs", "tasks", "alpha", "smallest_p", "false_positive_rate",
            "task_difference_smallest_p", "task_difference_rate"]
    if effects.empty:
        return pd.DataFrame(columns=cols)
    rows = []
    for k, g in effects.groupby("n_seeds", sort=True):
        k = int(k)
        n = k * (k - 1) // 2
        rows.append({"n_seeds": k, "n_seed_pairs": n, "tasks": ", ".join(sorted(map(str, g["task"].unique()))),
                     "alpha": alpha, "smallest_p": min_p(k, n) if n else np.nan,
                     "false_positive_rate": attained_level(k, n, alpha) if n else np.nan,
                     "task_difference_smallest_p": min_p(k, k, two_sided=True) if k > 1 else np.nan,
                     "task_difference_rate": attained_level(k, k, alpha, two_sided=True) if k > 1 else np.nan})
    return pd.DataFrame(rows, columns=cols)


def _task_differences(changes: pd.DataFrame, alpha: float) -> pd.DataFrame:
    """Task A vs task B per unit: difference of mean changes, two-sided exact Mann-Whitney over seeds."""
    key = ["table", "metric", "level", "unit", "layer", "head"]
    cols = [*key, "task_a", "task_b", "n_a", "n_b", "mean_a", "mean_b", "difference", "p_value", "alpha",
            "beyond_noise", "reason"]
    tasks = sorted(changes["task"].dropna().unique()) if not changes.empty else []
    if len(tasks) < 2:
        return pd.DataFrame(columns=cols)
    per = (
        changes.dropna(subset=["change"]).groupby([*key, "task"], dropna=False, sort=True)["change"]
        .agg(values=list, mean="mean").reset_index()
    )
    frames = []
    for a, b in combinations(tasks, 2):
        pa = per[per["task"] == a].drop(columns="task")
        pb = per[per["task"] == b].drop(columns="task")
        m = pa.merge(pb, on=key, suffixes=("_a", "_b"))
        if m.empty:
            continue
        m["task_a"], m["task_b"] = a, b
        m["n_a"] = m["values_a"].map(len)
        m["n_b"] = m["values_b"].map(len)
        m["difference"] = m["mean_a"] - m["mean_b"]
        xs = [np.asarray(v, float) for v in m["values_a"]]
        ys = [np.asarray(v, float) for v in m["values_b"]]
        m["p_value"] = _mwu_by_size(xs, ys, "two-sided")
        _add_verdicts(m, [_untested_difference(a, b, na, nb, alpha) for na, nb in zip(m["n_a"], m["n_b"])], alpha)
        frames.append(m[cols])
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=cols)


def study_tables(
    base_tables: Mapping[str, pd.DataFrame],
    seed_tables: Mapping[str, pd.DataFrame],
    *,
    alpha: float = ALPHA,
) -> dict[str, pd.DataFrame]:
    """The tidy ``study_*`` tables from the study's base-vs-tuned and seed-vs-seed tables.

    ``base_tables``: ``{name: table}`` with columns ``tuned, task, seed`` + the pair table's own
    (``attention_change``, ``representation_similarity``, ``attention_patterns``, ``probe``,
    ``geometry``, ``ablation``, ``weight_change``, ``transplant``, ``changed_vs_needed``; absent ones are skipped). ``seed_tables``: ``{seedpair_<name>: table}``
    with ``task, seed_a, seed_b`` first (only the pairwise tables need them). Returns
    ``study_summary``, ``study_seed_noise``, ``study_effects``, ``study_counts``, ``study_rule``
    and ``study_task_differences`` (schemas in docs/studies.md, "Seed noise").
    """
    if not 0 < alpha < 1:
        raise BertologyError(f"alpha must be between 0 and 1, not {alpha}.")
    changes = seed_changes(base_tables)
    distances = seed_distances(changes, seed_tables)
    effects = _effects(changes, distances, alpha) if not changes.empty else pd.DataFrame()
    return {
        "study_summary": _summary(changes) if not changes.empty else pd.DataFrame(),
        "study_seed_noise": _noise(distances),
        "study_effects": effects,
        "study_counts": _counts(effects),
        "study_rule": _rule(effects, alpha),
        "study_task_differences": _task_differences(changes, alpha),
    }


def corpus_table(name: str, corpus: str) -> str:
    """The name of table ``name`` (as on the shared corpus) on ``corpus``: ``own_study_effects``, ``study_effects_ood``."""
    prefix, suffix = CORPORA[corpus]
    return f"{prefix}{name}{suffix}"


def corpus_study_tables(tables: Mapping[str, pd.DataFrame], *, alpha: float = ALPHA) -> dict[str, pd.DataFrame]:
    """:func:`study_tables` on every corpus present in ``tables`` (a study's tables by name), named per :data:`CORPORA`.

    Each corpus gets the same rule from its own base-vs-tuned and seed-vs-seed tables (``own_attention_change``
    with ``own_seedpair_attention_change`` give ``own_study_effects``). A corpus without seed-vs-seed tables
    still gets its summary, and its pairwise units say "no seed-vs-seed comparison". Left out: ``study_rule``
    off the shared corpus (it depends on the seed counts only, which are the same), and task differences on
    the tasks' own data (each task is measured on other data there, so a difference would mix task and corpus).
    """
    out: dict[str, pd.DataFrame] = {}
    names = judged()
    for corpus in CORPORA:
        base = {name: tables[corpus_table(name, corpus)] for name in names if corpus_table(name, corpus) in tables}
        if not base:
            continue
        seeds = {f"seedpair_{name}": tables[corpus_table(f"seedpair_{name}", corpus)] for name in names
                 if corpus_table(f"seedpair_{name}", corpus) in tables}
        for name, table in study_tables(base, seeds, alpha=alpha).items():
            if corpus != "shared" and (name == "study_rule" or (corpus == "own" and name == "study_task_differences")):
                continue
            out[corpus_table(name, corpus)] = table
    return out
