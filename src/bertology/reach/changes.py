"""What a change is, per built-in table: the seed-noise extracts the tables' specs declare
(``seed_noise=SeedNoise(pairwise, extract)``, :class:`bertology.reach.SeedNoise`), read by the study's rule
(:mod:`bertology.studies.noise`). Each turns the table (``keys`` = ``task, seed`` or ``task, seed_a, seed_b``) into one
``change`` per unit (columns ``level, unit, layer, head, metric, change`` and optionally ``base, tuned, ci_low,
ci_high``).

- ``attention_change``: ``cosine_distance`` = 1 - cosine and ``js_divergence``, per head and per
  layer (mean over its heads); pairwise: seed distances from ``seedpair_attention_change``.
- ``representation_similarity``: 1 - value on the diagonal (``layer_base == layer_tuned``), per layer
  and metric; pairwise: seed distances from ``seedpair_representation_similarity``.
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
  projections (level ``head``, unit ``L5H3 query``); pairwise: seed distances from ``seedpair_weight_change``, the
  same quantity between two seeds' weights.
- ``transplant``: ``gain_recovered`` per transplanted unit and per point of the top/bottom layer curves (level = the
  table's ``unit_kind``, unit = its label: ``L3 attention``, ``top 2 layers``); ``changed_vs_needed``: Spearman's rho
  between change and revert drop (level ``model``, unit ``heads: weight``), per metric. Per-model tables: is the gain
  (the rho) consistently away from 0 by more than two seeds' values differ?

Pure pandas, no model; the specs import this module (it sits below the analyses and the experiments).
"""
from __future__ import annotations

import pandas as pd

from bertology.errors import BertologyError
from bertology.reach import as_units, per_model_change

PROBE_METRICS = {"distance": ("uuas", "dspr"), "depth": ("root_acc", "nspr")}


def need(df: pd.DataFrame, table: str, columns: tuple[str, ...]) -> None:
    """One clear error when ``table`` lacks a column its extract reads."""
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise BertologyError(f"Study table {table!r} lacks column(s) {', '.join(missing)}; have {list(df.columns)}.")


def attention_change(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """1 - cosine and JS divergence per head, and their mean over each layer's heads."""
    need(df, "attention_change", ("layer", "head", "cosine", "js_divergence"))
    heads = df.groupby([*keys, "layer", "head"], as_index=False)[["cosine", "js_divergence"]].mean()
    heads["cosine_distance"] = 1.0 - heads["cosine"]
    long = heads.melt(id_vars=[*keys, "layer", "head"], value_vars=["cosine_distance", "js_divergence"],
                      var_name="metric", value_name="change")
    layers = long.groupby([*keys, "layer", "metric"], as_index=False)["change"].mean()
    return pd.concat([as_units(long, "head"), as_units(layers, "layer")], ignore_index=True)


def representation_similarity(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """1 - similarity on the diagonal (the same layer of base and tuned), per layer and metric."""
    need(df, "representation_similarity", ("layer_base", "layer_tuned", "metric", "value"))
    diag = df[df["layer_base"] == df["layer_tuned"]]
    out = diag.groupby([*keys, "layer_base", "metric"], as_index=False)["value"].mean()
    out = out.rename(columns={"layer_base": "layer"})
    out["change"] = 1.0 - out.pop("value")
    return as_units(out, "layer")


def attention_patterns(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Tuned - base fraction per head and pattern, and the share over all heads (level ``model``)."""
    need(df, "attention_patterns", ("model", "layer", "head", "pattern", "fraction"))
    heads = per_model_change(df, keys, ["layer", "head", "pattern"], "fraction").rename(columns={"pattern": "metric"})
    share = heads.groupby([*keys, "metric"], as_index=False)[["base", "tuned", "change"]].mean()
    return pd.concat([as_units(heads, "head"), as_units(share, "model")], ignore_index=True)


def probe(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Tuned - base of each probe's metrics per layer, on the test split (dev when there is no test)."""
    need(df, "probe", ("model", "layer", "probe", "split"))
    split = "test" if (df["split"] == "test").any() else ("dev" if (df["split"] == "dev").any() else None)
    part = df if split is None else df[df["split"] == split]
    frames = []
    for probe, metrics in PROBE_METRICS.items():
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


def geometry(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Tuned - base per layer and metric."""
    need(df, "geometry", ("model", "layer", "metric", "value"))
    out = per_model_change(df, keys, ["layer", "metric"], "value")
    return as_units(out, "layer")


def ablation(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """``delta`` (ablated - intact) per head, and per layer and whole-layer ablation (``L5 skip``)."""
    need(df, "ablation", ("target", "layer", "head", "metric", "delta"))
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


def weight_change(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Relative weight change per layer and module (``L5 query``) and per head of the projections."""
    need(df, "weight_change", ("layer", "module", "head", "relative_change"))
    rows = df.dropna(subset=["relative_change"])
    rows = rows.groupby([*keys, "layer", "module", "head"], dropna=False, as_index=False)["relative_change"].mean()
    rows = rows.rename(columns={"relative_change": "change"}).assign(metric="relative_change")
    whole, heads = rows[rows["head"].isna()].drop(columns="head"), rows[rows["head"].notna()]
    parts = [as_units(whole, "layer").assign(level="module"), as_units(heads, "head")]
    for part in parts:  # the module names the unit: L5 query, L5H3 query
        part["unit"] = part["unit"] + " " + part["module"].astype(str)
    return pd.concat(parts, ignore_index=True).drop(columns="module")


def transplant(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Gain recovered per transplanted unit (``L3 attention``) and per point of the layer curves (``top 2 layers``):
    level = the table's ``unit_kind``; a gain that is undefined for a seed (the tuned model no better than the head
    alone) is left out for that seed."""
    need(df, "transplant", ("unit_kind", "layer", "head", "label", "metric", "gain_recovered"))
    rows = df.dropna(subset=["gain_recovered"])
    rows = rows.groupby([*keys, "unit_kind", "label", "layer", "head", "metric"], dropna=False, as_index=False)[
        "gain_recovered"].mean()
    out = as_units(rows.rename(columns={"gain_recovered": "change"}), "unit")
    single_head = out["unit_kind"] == "head"
    out["head"] = out["head"].where(single_head)  # a layer, block or curve point names no head
    out["level"], out["unit"] = out.pop("unit_kind").astype(str), out.pop("label").astype(str)
    return out


def changed_vs_needed(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Spearman's rho between change and revert drop, one whole-run unit per level and change measure
    (``heads: weight``), per metric; a rho that is undefined for a seed is left out for that seed."""
    need(df, "changed_vs_needed", ("level", "change_measure", "metric", "spearman"))
    rows = df.dropna(subset=["spearman"])
    rows = rows.groupby([*keys, "level", "change_measure", "metric"], as_index=False)["spearman"].mean()
    out = as_units(rows.rename(columns={"spearman": "change"}).drop(columns="level"), "model")
    out["unit"] = rows["level"].astype(str).values + "s: " + rows["change_measure"].astype(str).values
    return out.drop(columns="change_measure")
