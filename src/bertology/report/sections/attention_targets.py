"""Where attention goes per layer ([CLS], [SEP], punctuation, neighbours, word categories), base and tuned."""
from __future__ import annotations

import pandas as pd

from bertology.report.format import sortable
from bertology.report.sections.base import Figures, Section, SectionInput


TARGET_LABELS = {
    "cls": "[CLS]", "sep": "[SEP]", "punct": "punctuation", "self": "self", "prev": "previous token",
    "next": "next token", "noun": "nouns", "verb": "verbs", "pron": "pronouns", "subject": "subjects",
    "object": "objects", "negation": "negation", "entropy": "entropy (nats)",
}


#: The special tokens the overview's card chooses from.
SPECIAL = ("cls", "sep")


def special_token_card(per_layer: pd.DataFrame, last: int) -> dict | None:
    """The overview's card of the special token whose share of last-layer attention changed most (largest
    ``|tuned − base|``, ties to [CLS]), the other one's in its note; None without both models' numbers."""
    at = per_layer[per_layer["layer"] == last].pivot_table(index="target", columns="model", values="value",
                                                          aggfunc="mean")
    if not {"base", "tuned"} <= set(at.columns):
        return None
    shares = {t: (float(at.at[t, "base"]), float(at.at[t, "tuned"])) for t in SPECIAL
              if t in at.index and not at.loc[t, ["base", "tuned"]].isna().any()}
    if not shares:
        return None
    ranked = sorted(shares, key=lambda t: -abs(shares[t][1] - shares[t][0]))  # stable: ties keep [CLS] first
    changes = [abs(shares[t][1] - shares[t][0]) for t in ranked]
    d = 2
    while d < 4 and len(ranked) > 1 and f"{changes[0]:.{d}f}" == f"{changes[1]:.{d}f}" and changes[0] != changes[1]:
        d += 1  # the decimals that show why this token was chosen over the other
    pick = ranked[0]
    base, tuned = shares[pick]
    others = "; ".join(f"{TARGET_LABELS[t]} {shares[t][0]:.{d}f} → {shares[t][1]:.{d}f}" for t in ranked[1:])
    return {"label": f"Attention to {TARGET_LABELS[pick]}, layer {last}", "text": f"{base:.{d}f} → {tuned:.{d}f}",
            "note": "base → tuned, mean over heads; the special token whose share changed most"
                    + (f" ({others})" if others else "")}


def targets_section(df: pd.DataFrame, figs: Figures, derived: list[dict]) -> dict:
    """Per-layer attention to tokens and word categories, their means, and what [CLS] attends to last."""
    from bertology.viz.figures import CurveStyle, layer_curve

    df = df.copy()
    df["layer"] = pd.to_numeric(df["layer"], errors="coerce").astype(int)
    per_layer = df.groupby(["model", "layer", "target"], as_index=False)["value"].mean()
    token = [t for t in ("cls", "sep", "punct", "self", "prev", "next") if t in set(per_layer["target"])]
    words = [t for t in ("noun", "verb", "pron", "subject", "object", "negation") if t in set(per_layer["target"])]
    curves = []
    for name, targets, what in (("targets_tokens", token, "special tokens, punctuation and neighbours"),
                                ("targets_words", words, "word categories")):
        if not targets:
            continue
        sub = per_layer[per_layer["target"].isin(targets)].assign(target=lambda d: d["target"].map(TARGET_LABELS))
        curves.append(figs.make(
            name,
            lambda sub=sub, targets=targets: layer_curve(
                sub, x="layer", y="value", hue="target", facet="model", title=f"Attention to {what}, mean over heads",
                style=CurveStyle(ylabel="share of attention", sharey=True, facet_order=["base", "tuned"],
                                 hue_order=[TARGET_LABELS[t] for t in targets])),
            f"Share of each query's attention that goes to {what}, averaged over heads, per layer; "
            "left the base model, right the tuned one.",
            f"Per-layer attention to {what}, base and tuned",
        ))
    wide = per_layer.pivot_table(index=["target"], columns="model", values="value", aggfunc="mean")
    last = int(df["layer"].max())
    rows = []
    for target in [t for t in TARGET_LABELS if t in wide.index]:
        base = wide.at[target, "base"] if "base" in wide.columns else None
        tuned = wide.at[target, "tuned"] if "tuned" in wide.columns else None
        delta = tuned - base if base is not None and tuned is not None else None
        rows.append([TARGET_LABELS[target], base, tuned, delta])
    table = sortable([("target", "Target", "text"), ("base", "base (mean over heads and layers)", "num"),
                      ("tuned", "tuned", "num"), ("delta", "tuned − base", "num")], rows)
    cls = df[(df["layer"] == last) & df["target"].str.startswith("from_cls_")]
    cls_table = None
    if len(cls):
        c = cls.groupby(["target", "model"])["value"].mean().unstack("model")
        cls_rows = [[t.removeprefix("from_cls_"), c.at[t, "base"] if "base" in c else None,
                     c.at[t, "tuned"] if "tuned" in c else None] for t in c.index]
        cls_table = sortable([("target", "Category", "text"), ("base", "base", "num"), ("tuned", "tuned", "num")], cls_rows)
    card = special_token_card(per_layer, last)
    if card is not None:
        derived.append(card)
    return {"curves": [c for c in curves if c], "table": table, "cls_table": cls_table, "last_layer": last,
            "facts": [("Layers", str(last)), ("Targets", str(df["target"].nunique()))]}


def build(inp: SectionInput) -> dict | None:
    """The section's dict, or None when the run lacks its table."""
    df = inp.table("attention_targets")
    return None if df is None else targets_section(df, inp.figures, inp.derived)


SECTION = Section(
    id="attention-targets",
    title="Attention targets",
    tables={
        "attention_targets": ("model", "layer", "head", "target", "value"),
    },
    build=build,
    template="sections/attention_targets.html.j2",
)
