"""Kovaleva et al.'s attention pattern classes per layer and head, base and tuned."""
from __future__ import annotations

import pandas as pd

from bertology.report.format import fmt_value, sortable
from bertology.report.sections.base import Figures, Section, SectionInput


def patterns_section(df: pd.DataFrame, figs: Figures, derived: list[dict]) -> dict:
    """Pattern mix per layer, each head's main pattern, and the share of maps per pattern."""
    from bertology.analyses.attention_patterns import dominant_patterns, layer_mix
    from bertology.metrics.patterns import PATTERNS
    from bertology.viz.patterns import pattern_heads_figure, pattern_mix_figure

    df = df.copy()
    mix = layer_mix(df)
    figures = [
        figs.make("patterns_mix", lambda: pattern_mix_figure(mix),
                  "Share of attention maps of each pattern class (Kovaleva et al. 2019, §4.1) per layer, averaged over "
                  "heads and examples; left the base model, right the tuned one.",
                  "Attention pattern classes per layer, base and tuned"),
        figs.make("patterns_heads", lambda: pattern_heads_figure(df),
                  "Each head's most frequent pattern class; outlined heads changed their main class in fine-tuning.",
                  "Main pattern class per head"),
    ]
    overall = df.groupby(["model", "pattern"])["fraction"].mean().unstack("model")
    rows = []
    for pattern in [p for p in PATTERNS if p in overall.index]:
        b = overall.at[pattern, "base"] if "base" in overall.columns else None
        t = overall.at[pattern, "tuned"] if "tuned" in overall.columns else None
        rows.append([pattern, b, t, (t - b) if b is not None and t is not None else None])
    table = sortable([("pattern", "Pattern", "text"), ("base", "base share", "num"), ("tuned", "tuned share", "num"),
                      ("change", "change", "num")], rows)
    dom = dominant_patterns(df)
    changed = 0
    if {"model", "layer", "head", "pattern"} <= set(dom.columns):
        wide = dom.pivot_table(index=["layer", "head"], columns="model", values="pattern", aggfunc="first")
        if {"base", "tuned"} <= set(wide.columns):
            changed = int((wide["base"] != wide["tuned"]).sum())
    if "heterogeneous" in overall.index and {"base", "tuned"} <= set(overall.columns):
        derived.append({"label": "Heterogeneous attention maps", "text":
                        f"{overall.at['heterogeneous', 'base']:.0%} → {overall.at['heterogeneous', 'tuned']:.0%}",
                        "note": f"{changed} heads changed their main pattern"})
    first = df.iloc[0]
    facts = [("Classifier", str(first.get("classifier", "rules"))), ("Maps per head", fmt_value(first.get("n_examples"))),
             ("Heads whose main pattern changed", str(changed))]
    return {"figures": [f for f in figures if f], "table": table, "facts": facts}


def build(inp: SectionInput) -> dict | None:
    """The section's dict, or None when the run lacks its table."""
    df = inp.table("attention_patterns")
    return None if df is None else patterns_section(df, inp.figures, inp.derived)


SECTION = Section(
    id="attention-patterns",
    title="Attention patterns",
    tables={
        "attention_patterns": ("model", "layer", "head", "pattern", "fraction"),
    },
    build=build,
    template="sections/attention_patterns.html.j2",
)
