"""The study report's crosscoder section: tuned-only latents matched across seeds, task features first.

Reads ``study_crosscoder_seed_features`` (one row per task, layer, seed, latent and other seed; written by the
study's seed matching) and, for the tokens each latent fires on, the study's ``crosscoder_examples``. It computes
no statistic: the match cosines, the null thresholds and the verdicts are the table's. The rule is
:mod:`bertology.metrics.crosscoder_seeds`'s (its ``ALPHA`` is the quantile the threshold stands at).
"""
from __future__ import annotations

from pathlib import Path

import pandas as pd

from bertology.metrics.crosscoder_seeds import ALPHA
from bertology.report.format import sortable

TABLE = "study_crosscoder_seed_features"
EXAMPLES = "crosscoder_examples"
#: Latents listed (task features first).
SHOWN = 60
KEYS = ["task", "layer", "seed", "latent"]


def _read(study_dir: Path, name: str) -> pd.DataFrame | None:
    path = study_dir / "tables" / f"{name}.parquet"
    return pd.read_parquet(path) if path.exists() else None


def _top_tokens(examples: pd.DataFrame | None, key: tuple, n: int = 3) -> str:
    """The latent's most common top-context tokens in that seed's pair (a dash when none were kept)."""
    if examples is None or not set(KEYS) <= set(examples.columns):
        return "—"
    task, layer, seed, latent = key
    rows = examples[(examples["task"] == task) & (examples["layer"] == layer) & (examples["seed"] == seed)
                    & (examples["latent"] == latent)]
    return ", ".join(rows["token"].value_counts().index[:n]) if len(rows) else "—"


def _matches(part: pd.DataFrame) -> str:
    """``other seed: cosine`` for every other seed, the ones it recurs in marked with a check."""
    return "; ".join(f"s{int(r.other_seed)}: " + ("—" if pd.isna(r.best_match_cosine) else f"{r.best_match_cosine:.2f}")
                     + (" ✓" if r.recurs else "") for r in part.sort_values("other_seed").itertuples())


def latent_rows(table: pd.DataFrame, examples: pd.DataFrame | None) -> list[list]:
    """One row per judged latent: task, layer, seed, latent, verdict, recurs in (of the other seeds, and how many are
    needed), the best match per other seed, the null threshold (the largest over the other seeds), top tokens;
    task features first, then by task, layer and seed."""
    judged = []
    for key, part in table.groupby(KEYS, sort=True):
        first = part.iloc[0]
        recurs = sorted(int(s) for s in part.loc[part["recurs"].astype(bool), "other_seed"])
        row = [str(key[0]), int(key[1]), int(key[2]), int(key[3]),
               "task feature" if bool(first["task_feature"]) else "seed-specific",
               f"{int(first['recurs_in'])} of {len(part)}: {', '.join(f's{s}' for s in recurs) or 'none'}"
               f" (needed {int(first['needed'])})", _matches(part), part["null_threshold"].max(),
               _top_tokens(examples, key)]
        judged.append((not bool(first["task_feature"]), row))
    judged.sort(key=lambda j: (j[0], *j[1][:4]))
    return [row for _, row in judged[:SHOWN]]


def counts(table: pd.DataFrame) -> list[dict]:
    """Per task and layer: tuned-only latents judged (over all seeds), task features among them, seeds."""
    per = table.groupby(KEYS, sort=True).agg(task_feature=("task_feature", "first")).reset_index()
    out = []
    for (task, layer), part in per.groupby(["task", "layer"], sort=True):
        seeds = sorted(set(table.loc[(table["task"] == task) & (table["layer"] == layer), "other_seed"].astype(int))
                       | set(part["seed"].astype(int)))
        out.append({"task": str(task), "layer": int(layer), "seeds": len(seeds), "judged": len(part),
                    "features": int(part["task_feature"].astype(bool).sum())})
    return out


def crosscoder_seed_section(study_dir: str | Path) -> dict | None:
    """The section's body (None when the study matched no crosscoder latents across seeds)."""
    study_dir = Path(study_dir)
    table = _read(study_dir, TABLE)
    if table is None or table.empty:
        return None
    rows = latent_rows(table, _read(study_dir, EXAMPLES))
    columns = [("task", "Task", "text"), ("layer", "Layer", "num"), ("seed", "Seed", "num"),
               ("latent", "Latent", "num"), ("verdict", "Verdict", "text"), ("recurs", "Recurs in (other seeds)", "text"),
               ("matches", "Best-match cosine per other seed", "text"), ("null", "Null threshold", "num"),
               ("tokens", "Top tokens", "text")]
    n_judged = table.groupby(KEYS).ngroups
    return {"table": sortable(columns, rows), "counts": counts(table), "alpha": ALPHA, "n_judged": n_judged,
            "n_shown": len(rows)}
