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

What the change is, per table, each table's spec declares (``seed_noise=SeedNoise(...)``; the built-in tables'
extracts are :mod:`bertology.reach.changes`); :mod:`bertology.studies.changes` turns the study's tables into the
per-seed changes and seed distances this module judges.

Task differences compare the per-seed changes of two tasks with the two-sided exact Mann-Whitney test
(exact under the null that the two tasks' per-seed changes are exchangeable). Many units mean many
tests: ``study_counts`` gives, per family (table, task, metric, level), how many units are beyond noise
next to how many the rule would flag by chance (``alpha`` x tested), and ``beyond_noise_fdr`` applies
the Benjamini-Hochberg procedure (``scipy.stats.false_discovery_control``) within each family.

Everything here is pure pandas/numpy/scipy: no model, no figure.
"""
from __future__ import annotations

import logging
from collections.abc import Mapping
from functools import lru_cache
from itertools import combinations
from math import comb

import numpy as np
import pandas as pd
from scipy.stats import false_discovery_control, mannwhitneyu

from bertology.errors import BertologyError
from bertology.studies.changes import UNIT_COLUMNS, judged, seed_changes, seed_distances

logger = logging.getLogger(__name__)

__all__ = [
    "ALPHA",
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
#: The tables :func:`study_tables` returns.
STUDY_TABLES = ("study_summary", "study_seed_noise", "study_effects", "study_counts", "study_rule",
                "study_task_differences")

#: The corpora a study measures on, as (prefix, suffix) of their tables' names: the shared corpus
#: (``attention_change``, ``seedpair_attention_change``, ``study_effects``), each task's own dev data
#: (``own_attention_change``, ``own_seedpair_attention_change``, ``own_study_effects``) and the
#: out-of-domain corpus (``representation_similarity_ood``, ``seedpair_representation_similarity_ood``,
#: ``study_effects_ood``).
CORPORA: dict[str, tuple[str, str]] = {"shared": ("", ""), "own": ("own_", ""), "ood": ("", "_ood")}


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
