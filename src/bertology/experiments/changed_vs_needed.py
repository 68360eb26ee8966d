"""Changed vs needed: does the task need the units fine-tuning changed most?

A table derived from other tables of the same run, no model call: per head and per layer, Spearman's rho
between how much a unit changed and how much the task loses when that unit alone is reverted to the base.

- **change** (``change_measure``): ``weight`` — the weight-change table's ``relative_change`` (a head: the mean
  over its query, key and value rows and its attention-output columns; a layer: the whole block,
  ``sqrt(sum ||D||^2) / sqrt(sum ||W_base||^2)`` over its weight matrices); ``attention_js`` and
  ``attention_1_minus_cosine`` — the attention-change table's per-head JS divergence and 1 - cosine (a layer:
  the mean over its heads).
- **need** (``needed_measure`` ``revert_drop``): the ablation table in revert mode, per metric, signed so that
  larger = needed more: the drop of a higher-is-better metric (``-delta``), the rise of a loss (``delta``).
  Heads: the head rows; layers: the ``revert_layer`` rows (layers 1..N; the embeddings are left out).

The interval resamples units (:func:`bertology.metrics.rank_link.spearman_interval`); heads of one layer are
not independent, so it is optimistic. Two tables: ``changed_vs_needed`` (one row per level, change measure and
metric) and ``changed_vs_needed_units`` (the points behind each rho, which the report's scatter draws).
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd

from bertology.experiments.interventions import REVERT
from bertology.experiments.registry import ExperimentContext, ExperimentOutcome, ExperimentSpec
from bertology.metrics.rank_link import spearman_interval
from bertology.reach import SeedNoise, changes
from bertology.results import Result, weights_rows
from bertology.tasks.catalog import higher_is_better, task_of_table

TABLE = "changed_vs_needed"
UNITS = "changed_vs_needed_units"
#: The attention projections whose per-head slices make up a head in the weight-change table.
HEAD_MODULES = ("query", "key", "value", "attention_output")
#: The change measures, in the order rows are written and the summary prefers them.
CHANGE_MEASURES = ("weight", "attention_js", "attention_1_minus_cosine")
UNIT_KEYS = ["level", "layer", "head"]


def weight_change_units(table: pd.DataFrame) -> pd.DataFrame:
    """Per head (mean relative change of its projection slices) and per block (pooled over its matrices)."""
    t = table.assign(head=pd.to_numeric(table["head"], errors="coerce"))
    rows = t[t["head"].notna() & t["module"].isin(HEAD_MODULES)].dropna(subset=["relative_change"])
    heads = rows.groupby(["layer", "head"], as_index=False)["relative_change"].mean()
    blocks = t[t["head"].isna() & (t["layer"] > 0)].dropna(subset=["delta_norm", "base_norm"])
    sums = blocks.assign(d2=blocks["delta_norm"] ** 2, b2=blocks["base_norm"] ** 2).groupby("layer", as_index=False)[
        ["d2", "b2"]].sum()
    sums["relative_change"] = np.sqrt(sums["d2"]) / np.sqrt(sums["b2"]).where(sums["b2"] > 0)
    out = pd.concat([heads.assign(level="head"), sums[["layer", "relative_change"]].assign(level="layer", head=np.nan)])
    return out.rename(columns={"relative_change": "change"}).assign(change_measure="weight")


def attention_change_units(table: pd.DataFrame) -> pd.DataFrame:
    """Per head its JS divergence and 1 - cosine; per layer their means over its heads."""
    heads = table[["layer", "head"]].assign(attention_js=table["js_divergence"], attention_1_minus_cosine=1 - table["cosine"])
    layers = heads.groupby("layer", as_index=False)[["attention_js", "attention_1_minus_cosine"]].mean()
    both = pd.concat([heads.assign(level="head"), layers.assign(level="layer", head=np.nan)])
    return both.melt(id_vars=UNIT_KEYS, value_vars=["attention_js", "attention_1_minus_cosine"],
                     var_name="change_measure", value_name="change")


def revert_needs(table: pd.DataFrame) -> pd.DataFrame:
    """Per head and per reverted layer (``revert_layer``) and metric, the harm of reverting it (larger = needed more)."""
    better = higher_is_better()
    t = table[table["mode"] == REVERT.name]
    heads = t[t["target"] == "head"].assign(level="head")
    layer_mode = t["layer_mode"] if "layer_mode" in t else pd.Series("", index=t.index)
    layers = t[(t["target"] == "layer") & (layer_mode == "revert_layer")].assign(level="layer", head=np.nan)
    both = pd.concat([heads, layers])
    sign = np.where(both["metric"].map(lambda m: better.get(m, True)), -1.0, 1.0)
    return both.assign(needed=sign * both["delta"].astype(float))[[*UNIT_KEYS, "metric", "needed"]]


def change_units(tables: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """Every change measure the run has, per unit: ``level, layer, head, change_measure, change``."""
    parts = []
    if "weight_change" in tables:
        parts.append(weight_change_units(tables["weight_change"]))
    if "attention_change" in tables:
        parts.append(attention_change_units(weights_rows(tables["attention_change"])))  # the probabilities' change
    return pd.concat(parts, ignore_index=True) if parts else pd.DataFrame(columns=[*UNIT_KEYS, "change_measure", "change"])


def paired_units(tables: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """Change and need side by side, one row per unit, change measure and metric (units with both)."""
    change = change_units(tables).astype({"layer": int})
    need = revert_needs(tables["ablation"]).astype({"layer": int})
    keys = ["level", "layer", "head"]
    merged = change.assign(_h=change["head"].fillna(-1)).merge(need.assign(_h=need["head"].fillna(-1)).drop(columns="head"),
                                                              on=["level", "layer", "_h"])
    order = {m: i for i, m in enumerate(CHANGE_MEASURES)}
    merged = merged.drop(columns="_h").assign(needed_measure="revert_drop")
    merged = merged.sort_values(["level", "change_measure", "metric", "layer", "head"],
                                key=lambda s: s.map(order) if s.name == "change_measure" else s)
    return merged[[*keys, "change_measure", "change", "needed_measure", "metric", "needed"]].reset_index(drop=True)


def rank_links(units: pd.DataFrame, n_bootstrap: int, seed: int) -> pd.DataFrame:
    """One row per level, change measure and metric: Spearman's rho, its interval, the unit count, and why not."""
    rows = []
    for (level, measure, metric), part in units.groupby(["level", "change_measure", "metric"], sort=False):
        link = spearman_interval(part["change"], part["needed"], n_bootstrap=n_bootstrap, seed=seed,
                                 names=(f"{measure} change", f"drop in {metric} when reverted"))
        rows.append({"level": level, "change_measure": measure, "needed_measure": "revert_drop", "metric": metric,
                     "spearman": link.spearman, "ci_low": link.ci_low, "ci_high": link.ci_high,
                     "n_units": link.n_units, "n_bootstrap": n_bootstrap, "reason": link.reason})
    cols = ["level", "change_measure", "needed_measure", "metric", "spearman", "ci_low", "ci_high", "n_units",
            "n_bootstrap", "reason"]
    return pd.DataFrame(rows, columns=cols).astype({"spearman": float, "ci_low": float, "ci_high": float})


def missing_inputs(tables: Mapping[str, pd.DataFrame] | None, ablation_mode: str | tuple[str, ...]) -> str | None:
    """Why the run lacks what changed-vs-needed reads (None when it has it; before the run, only the modes are known)."""
    if REVERT.name not in ((ablation_mode,) if isinstance(ablation_mode, str) else ablation_mode):
        return "it needs the ablation in revert mode (--ablation-mode revert, or a list with revert)"
    if tables is None:
        return None
    if "ablation" not in tables or not (tables["ablation"]["mode"] == REVERT.name).any():
        return "the run has no revert ablation table"
    if "weight_change" not in tables and "attention_change" not in tables:
        return "it needs weight_change or attention_change in the same run"
    return None


def _tables(ctx: ExperimentContext) -> dict[str, pd.DataFrame] | None:
    """The run's finished tables as DataFrames (None before the experiments ran)."""
    return None if ctx.tables is None else {name: res.table for name, res in ctx.tables.items()}


def skip_reason(ctx: ExperimentContext) -> str | None:
    """Why it cannot run: no revert ablation, or no change table."""
    return missing_inputs(_tables(ctx), ctx.config.ablation_mode)


def _run(ctx: ExperimentContext) -> ExperimentOutcome:
    """Both tables from the run's weight/attention change and revert ablation tables."""
    tables = _tables(ctx) or {}
    units = paired_units(tables)
    n_bootstrap, seed = int(ctx.config.ablation_bootstrap), int(ctx.config.seed)
    links = rank_links(units, n_bootstrap, seed)
    params = {"n_bootstrap": n_bootstrap, "seed": seed, "interval": "95% percentile bootstrap over units"}
    section = {"settings": params, "inputs": sorted(n for n in ("weight_change", "attention_change") if n in tables),
               "note": "units are resampled as if independent (heads of one layer are not): the interval is optimistic"}
    return ExperimentOutcome({TABLE: Result(TABLE, links, params), UNITS: Result(UNITS, units, params)}, section)


def headline(table: pd.DataFrame, level: str = "head") -> pd.Series | None:
    """The row the summary states at ``level``: a defined rho before an undefined one, then the task's primary
    metric before the others, then weight change before attention change."""
    rows = table[table["level"] == level]
    if rows.empty:
        return None
    primary, order = task_of_table(table).primary, {m: i for i, m in enumerate(CHANGE_MEASURES)}
    keys = pd.DataFrame({"undefined": rows["spearman"].isna(), "other_metric": rows["metric"] != primary,
                         "measure": rows["change_measure"].map(order).fillna(len(order))})
    return rows.loc[keys.sort_values(["undefined", "other_metric", "measure"], kind="stable").index[0]]


def describe_link(row: pd.Series) -> str:
    """``Spearman 0.41 [0.12, 0.63]``, or ``undefined (reason)``: never a NaN printed as a number."""
    if pd.isna(row["spearman"]):
        return f"undefined ({row['reason']})"
    ci = "" if pd.isna(row["ci_low"]) else f" [{row['ci_low']:.2f}, {row['ci_high']:.2f}]"
    return f"Spearman {row['spearman']:.2f}{ci}"


MEASURE_WORDS = {"weight": "weight change", "attention_js": "attention change (JS)",
                 "attention_1_minus_cosine": "attention change (1 - cosine)"}


def summary(tables: Mapping[str, pd.DataFrame]) -> str | None:
    """One line per level: the rho between weight (else attention) change and the drop when the unit is reverted."""
    t = tables[TABLE]
    lines = []
    for level, plural in (("head", "heads"), ("layer", "layers")):
        row = headline(t, level)
        if row is not None:
            lines.append(f"changed vs needed ({plural}): {describe_link(row)} between "
                         f"{MEASURE_WORDS.get(row['change_measure'], row['change_measure'])} and revert delta "
                         f"({row['metric']}, n={int(row['n_units'])})")
    return "\n".join(lines) or None


class _Settings:
    """No settings of its own: the ablation's bootstrap count and the run's seed (both in its manifest section)."""

    def to_dict(self) -> dict:
        return {}


SPEC = ExperimentSpec("changed_vs_needed", "changed vs needed", lambda config: (TABLE, UNITS), lambda config: _Settings(),
                      skip_reason, _run, skipped_note=None, summary=summary,
                      seed_noise=SeedNoise(False, changes.changed_vs_needed))
