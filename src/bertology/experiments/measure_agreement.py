"""Measure agreement: which attention findings survive a contribution measure?

A table derived from the attention analyses' tables of a run with several ``--attention-measures`` (their
``measure`` column), no model call. Per analysis, its headline under ``weights`` (the attention probabilities)
beside the same headline under each other measure:

- ``attention_change`` / ``top_changed_heads``: the heads ranked by JS divergence (base vs tuned); Spearman's rho
  of the change across heads, and the share of the weights' top-k changed heads that are the measure's top-k too.
- ``attention_targets`` / ``cls_share``, ``sep_share``, ``punct_share``: per model and layer, the share of
  attention on the target (the head mean); a layer agrees when the two shares are within ``SHARE_TOLERANCE``.
  One more row per model with ``layer`` empty: rho across layers (does the layer profile hold?).
- ``relation_heads`` / ``best_head <relation> <direction>``: per model, relation and direction, the weights' best
  head (accuracy; ``weights_unit``) and the measure's (``measure_unit``). ``weights_value`` and ``measure_value``:
  the weights' best head's accuracy under each; it agrees when that head is a best head under the measure too
  (ties count); rho of the accuracy across heads.
- ``attention_patterns`` / ``<pattern>_share``: per model, the mean fraction of examples classified as the pattern
  (over heads); it agrees within ``SHARE_TOLERANCE``.

A per-layer measure (``rollout``, ``value_zeroing``: its rows have ``head = -1``) has one map per layer, so it is
compared per layer (``level = layer``): its layer row beside the head mean of the weights' rows of that layer
(relation heads: the layer of the weights' best head). Only in a run that asked for more than one measure.
"""
from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping

import numpy as np
import pandas as pd

from bertology.experiments.registry import ExperimentContext, ExperimentOutcome, ExperimentSpec
from bertology.results import Result

TABLE = "measure_agreement"
#: The analyses whose headlines are compared, in the order rows are written.
SOURCES = ("attention_change", "attention_targets", "relation_heads", "attention_patterns")
#: The reference measure: the attention probabilities.
REFERENCE = "weights"
#: The head of a per-layer measure's rows (``analyses.per_measure.LAYER_HEAD``).
LAYER_HEAD = -1
#: How many of the most-changed heads (layers, for a per-layer measure) the top-k overlap reads.
TOP_K = 5
#: Two shares (fractions of attention, or of examples) agree when they differ by at most this much.
SHARE_TOLERANCE = 0.1
#: Rho at or above which a ranking (of heads by change, of layers by share) is said to hold.
RHO_AGREES = 0.5
#: The attention-target shares compared (the ``target`` of the share rows).
TARGETS = ("cls", "sep", "punct")
#: Two accuracies this close are a tie (a best head under a measure may share its score with others).
TIE = 1e-9
COLUMNS = ["analysis", "headline", "measure", "model", "level", "layer", "weights_unit", "measure_unit",
           "weights_value", "measure_value", "rank_correlation", "top_k_overlap", "n_units", "agrees"]


def spearman(a: pd.Series | np.ndarray, b: pd.Series | np.ndarray) -> float:
    """Spearman's rho of two paired samples (NaN when fewer than two units or one side is constant)."""
    from scipy.stats import spearmanr

    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if len(a) < 2 or np.ptp(a) == 0 or np.ptp(b) == 0:
        return float("nan")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return float(spearmanr(a, b).statistic)


def top_k_overlap(a: pd.Series, b: pd.Series, k: int = TOP_K) -> float:
    """The share of ``a``'s ``k`` largest units (index) that are among ``b``'s ``k`` largest (ties: index order)."""
    k = min(k, len(a), len(b))
    if k == 0:
        return float("nan")
    top = [set(s.sort_values(ascending=False, kind="stable").index[:k]) for s in (a, b)]
    return len(top[0] & top[1]) / k


def is_per_layer(table: pd.DataFrame) -> bool:
    """Whether one measure's rows are a per-layer measure's (every head is ``LAYER_HEAD``)."""
    return bool(len(table)) and bool((table["head"] == LAYER_HEAD).all())


def on_layers(weights: pd.DataFrame, value: str) -> pd.DataFrame:
    """The weights' rows as a per-layer measure's: the head mean of ``value`` per layer (and the other keys)."""
    keys = [c for c in weights.columns if c not in (value, "head")]
    return weights.groupby(keys, as_index=False, sort=False)[value].mean().assign(head=LAYER_HEAD)


def _measures(table: pd.DataFrame) -> list[str]:
    """The measures compared with weights in ``table`` (empty when it has no weights rows or no other measure)."""
    if "measure" not in table.columns or REFERENCE not in set(table["measure"]):
        return []
    return [m for m in table["measure"].unique().tolist() if m != REFERENCE]


def _unit(layer: int, head: int) -> str:
    """``L3H2``, or ``L3`` for a per-layer measure's row."""
    return f"L{int(layer)}" if int(head) == LAYER_HEAD else f"L{int(layer)}H{int(head)}"


def _row(**values) -> dict:
    """One row of the table, the columns not given empty."""
    return {c: values.get(c) for c in COLUMNS}


def _paired(weights: pd.DataFrame, other: pd.DataFrame, value: str) -> tuple[pd.DataFrame, str]:
    """``weights`` and ``other`` joined per unit on ``value`` (``value_w``, ``value_m``), the weights' rows taken to
    layers first when ``other`` is a per-layer measure's; and the level (``head`` or ``layer``)."""
    level = "layer" if is_per_layer(other) else "head"
    if level == "layer":
        weights = on_layers(weights, value)
    keys = [c for c in weights.columns if c in other.columns and c != value]
    keep = [*keys, value]
    return weights[keep].merge(other[keep], on=keys, suffixes=("_w", "_m")), level


def change_rows(table: pd.DataFrame) -> list[dict]:
    """attention_change: per measure, rho of the JS divergence across heads (layers) and the top-k overlap."""
    table = table[table["mode"] == table["mode"].iloc[0]] if "mode" in table.columns and len(table) else table
    rows = []
    for measure in _measures(table):
        parts = {m: table[table["measure"] == m][["layer", "head", "js_divergence"]] for m in (REFERENCE, measure)}
        joined, level = _paired(parts[REFERENCE], parts[measure], "js_divergence")
        a = joined.set_index(["layer", "head"])["js_divergence_w"]
        b = joined.set_index(["layer", "head"])["js_divergence_m"]
        overlap, rho = top_k_overlap(a, b), spearman(a, b)
        top_w, top_m = (s.idxmax() if len(s) else (0, LAYER_HEAD) for s in (a, b))
        rows.append(_row(analysis="attention_change", headline="top_changed_heads", measure=measure, level=level,
                         weights_unit=_unit(*top_w), measure_unit=_unit(*top_m), weights_value=a.max(),
                         measure_value=b.max(), rank_correlation=rho, top_k_overlap=overlap, n_units=len(joined),
                         agrees=bool(overlap >= 0.5)))
    return rows


def target_rows(table: pd.DataFrame) -> list[dict]:
    """attention_targets: per measure, model and layer, the [CLS]/[SEP]/punctuation share (head mean) under both;
    per model, rho across layers."""
    shares = table[(table["variant"] == "share") & table["target"].isin(TARGETS)]
    rows = []
    for measure in _measures(shares):
        for (model, target), group in shares.groupby(["model", "target"], sort=False):
            parts = {m: group[group["measure"] == m][["layer", "head", "value"]] for m in (REFERENCE, measure)}
            joined, level = _paired(on_layers(parts[REFERENCE], "value"), on_layers(parts[measure], "value"), "value")
            common = dict(analysis="attention_targets", headline=f"{target}_share", measure=measure, model=model,
                          level="layer" if is_per_layer(parts[measure]) else "head")
            for r in joined.itertuples(index=False):
                rows.append(_row(**common, layer=int(r.layer), weights_value=r.value_w, measure_value=r.value_m,
                                 n_units=1, agrees=bool(abs(r.value_w - r.value_m) <= SHARE_TOLERANCE)))
            rho = spearman(joined["value_w"], joined["value_m"])
            rows.append(_row(**common, rank_correlation=rho, n_units=len(joined),
                             agrees=bool(rho >= RHO_AGREES) if not np.isnan(rho) else None))
    return rows


def relation_rows(table: pd.DataFrame) -> list[dict]:
    """relation_heads: per measure, model, relation and direction, the best head under weights and under the measure."""
    rows = []
    for measure in _measures(table):
        for (model, relation, direction), group in table.groupby(["model", "relation", "direction"], sort=False):
            w = group[group["measure"] == REFERENCE].sort_values(["accuracy", "layer", "head"],
                                                                 ascending=[False, True, True], kind="stable")
            m = group[group["measure"] == measure].sort_values(["accuracy", "layer", "head"],
                                                               ascending=[False, True, True], kind="stable")
            if w.empty or m.empty:
                continue
            best_w, best_m, level = w.iloc[0], m.iloc[0], "layer" if is_per_layer(m) else "head"
            joined, _ = _paired(w[["layer", "head", "accuracy"]], m[["layer", "head", "accuracy"]], "accuracy")
            at = m[(m["layer"] == best_w["layer"]) & ((m["head"] == best_w["head"]) | (level == "layer"))]["accuracy"]
            score = float(at.iloc[0]) if len(at) else float("nan")
            rows.append(_row(analysis="relation_heads", headline=f"best_head {relation} {direction}", measure=measure,
                             model=model, level=level, weights_unit=_unit(best_w["layer"], best_w["head"]),
                             measure_unit=_unit(best_m["layer"], best_m["head"]),
                             weights_value=best_w["accuracy"], measure_value=score,
                             rank_correlation=spearman(joined["accuracy_w"], joined["accuracy_m"]),
                             n_units=len(joined), agrees=bool(score >= best_m["accuracy"] - TIE)))
    return rows


def pattern_rows(table: pd.DataFrame) -> list[dict]:
    """attention_patterns: per measure, model and pattern class, the mean fraction over heads (layers) under both."""
    rows = []
    for measure in _measures(table):
        for (model, pattern), group in table.groupby(["model", "pattern"], sort=False):
            w, m = (group[group["measure"] == x]["fraction"] for x in (REFERENCE, measure))
            level = "layer" if is_per_layer(group[group["measure"] == measure]) else "head"
            a, b = float(w.mean()), float(m.mean())
            rows.append(_row(analysis="attention_patterns", headline=f"{pattern}_share", measure=measure, model=model,
                             level=level, weights_value=a, measure_value=b, n_units=len(m),
                             agrees=bool(abs(a - b) <= SHARE_TOLERANCE)))
    return rows


#: Each source table's rows of the agreement table.
ROWS: dict[str, Callable[[pd.DataFrame], list[dict]]] = {
    "attention_change": change_rows, "attention_targets": target_rows, "relation_heads": relation_rows,
    "attention_patterns": pattern_rows}


def agreement(tables: Mapping[str, pd.DataFrame]) -> pd.DataFrame:
    """The measure-agreement table of a run's tables (the analyses in ``SOURCES`` it has, with a measure column)."""
    rows = [row for name in SOURCES if name in tables for row in ROWS[name](tables[name])]
    out = pd.DataFrame(rows, columns=COLUMNS)
    out["layer"] = out["layer"].astype("Int64")
    out["n_units"] = out["n_units"].astype("Int64")
    out["agrees"] = out["agrees"].astype("boolean")
    for column in ("weights_value", "measure_value", "rank_correlation", "top_k_overlap"):
        out[column] = out[column].astype(float)
    return out


def missing_inputs(tables: Mapping[str, pd.DataFrame] | None, measures: tuple[str, ...]) -> str | None:
    """Why the run lacks what measure agreement reads (None when it has it; before the run, only the measures)."""
    if len(measures) < 2 or REFERENCE not in measures:
        return "it needs --attention-measures with weights and at least one other measure"
    if tables is None:
        return None
    if not any(name in tables and _measures(tables[name]) for name in SOURCES):
        return f"it needs one of {', '.join(SOURCES)} in the same run"
    return None


def _tables(ctx: ExperimentContext) -> dict[str, pd.DataFrame] | None:
    """The run's finished tables as DataFrames (None before the experiments ran)."""
    return None if ctx.tables is None else {name: res.table for name, res in ctx.tables.items()}


def skip_reason(ctx: ExperimentContext) -> str | None:
    """Why it cannot run: one measure only, or no attention analysis table."""
    return missing_inputs(_tables(ctx), tuple(ctx.config.attention_measures))


def _run(ctx: ExperimentContext) -> ExperimentOutcome:
    """The table from the run's attention analyses' tables."""
    tables = _tables(ctx) or {}
    params = {"reference": REFERENCE, "top_k": TOP_K, "share_tolerance": SHARE_TOLERANCE, "rho_agrees": RHO_AGREES}
    section = {"settings": params, "inputs": [n for n in SOURCES if n in tables],
               "note": "a per-layer measure is compared per layer, against the head mean of the weights"}
    return ExperimentOutcome({TABLE: Result(TABLE, agreement(tables), params)}, section)


def summary(tables: Mapping[str, pd.DataFrame]) -> str | None:
    """One line per measure: how many headlines agree with weights."""
    t = tables[TABLE]
    t = t[t["agrees"].notna()]
    lines = [f"measure agreement ({measure} vs weights): {int(g['agrees'].sum())} of {len(g)} headlines agree"
             for measure, g in t.groupby("measure", sort=False)]
    return "\n".join(lines) or None


class _Settings:
    """No settings of its own (its constants are in its manifest section)."""

    def to_dict(self) -> dict:
        return {}


SPEC = ExperimentSpec("measure_agreement", "measure agreement", lambda config: (TABLE,), lambda config: _Settings(),
                      skip_reason, _run, skipped_note=None, summary=summary)
