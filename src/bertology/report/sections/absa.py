"""Aspect-based sentiment: the heads that track the question's aspect, its opinion words, the other
aspects, and the no-op heads that park on [SEP] when the aspect is absent (``bertology absa``)."""
from __future__ import annotations

import pandas as pd

from bertology.extremes import decimals_to_tell, fixed, ties
from bertology.report.format import sortable
from bertology.report.sections.base import Section, SectionInput

#: How many heads per relation the table names.
TOP = 3
RELATION_TEXT = {"aspect": "aspect terms", "aspect_opinion": "their opinion words", "other_aspect": "other aspects' terms"}


def _label(layer, head) -> str:
    return f"L{int(layer)}H{int(head)}"


def top_rows(heads: pd.DataFrame, k: int = TOP) -> list[list]:
    """The ``k`` best tuned heads per relation, each with the base model's accuracy for the same head and direction."""
    from bertology.analyses.absa_heads import top_heads

    best = top_heads(heads, k)
    base = heads[heads.model == "base"].set_index(["relation", "direction", "layer", "head"])["accuracy"]
    rows = []
    for r in best[best.model == "tuned"].itertuples():
        b = float(base.get((r.relation, r.direction, r.layer, r.head), float("nan")))
        which = max((("offset", r.baseline_accuracy), ("review position", r.position_accuracy), ("chance", r.chance)),
                    key=lambda kv: kv[1])
        rows.append([r.relation, _label(r.layer, r.head), r.direction, b, float(r.accuracy),
                     f"{r.best_baseline:.3f} ({which[0]})", int(r.n),
                     "yes" if b <= r.best_baseline < r.accuracy else "no"])
    return rows


def created_lines(heads: pd.DataFrame, k: int = 4) -> list[str]:
    """Per relation, the heads fine-tuning created (at or below the best baseline before, above it after)."""
    from bertology.analyses.absa_heads import head_change

    change = head_change(heads)
    out = []
    for rel, sub in change[change.created].groupby("relation", sort=True):
        sub = sub.sort_values("tuned", ascending=False).drop_duplicates(["layer", "head"]).head(k)
        shown = ", ".join(f"{_label(r.layer, r.head)} {r.direction} {r.base:.2f} → {r.tuned:.2f}" for r in sub.itertuples())
        out.append(f"{rel} (best baseline {sub.best_baseline.iloc[0]:.2f}): {shown}")
    return out


def sep_rows(sep: pd.DataFrame, k: int = 5) -> list[list]:
    """The ``k`` heads whose [SEP] share rises most when the aspect is absent (tuned), beside the base model's."""
    tuned = sep[sep.model == "tuned"].sort_values("difference", ascending=False).head(k)
    base = sep[sep.model == "base"].set_index(["layer", "head"])
    rows = []
    for r in tuned.itertuples():
        b = base.loc[(r.layer, r.head)]
        rows.append([_label(r.layer, r.head), float(b.sep_absent), float(b.sep_present), float(b.difference),
                     float(r.sep_absent), float(r.sep_present), float(r.difference)])
    return rows


def build(inp: SectionInput) -> dict | None:
    """The section's dict, or None when the run is not an ABSA study."""
    from bertology.viz.figures import ColourScale, head_heatmap

    heads = inp.table("absa_heads")
    if heads is None:
        return None
    absa = inp.manifest.get("absa") or {}
    metrics = absa.get("heldout_metrics") or {}
    rows = top_rows(heads)
    table = sortable([("relation", "Relation", "text"), ("head", "Head", "text"),
                      ("direction", "Direction", "text"), ("base", "base", "num"),
                      ("tuned", "tuned", "num"), ("bl", "best baseline", "text"),
                      ("n", "Pairs", "num"), ("created", "created", "text")], rows)
    sep = inp.table("absa_sep_share")
    sep_table = None
    if sep is not None and sep["sep_absent"].notna().any() and sep["sep_present"].notna().any():
        sep_table = sortable([("head", "Head", "text"), ("ba", "base: absent", "num"), ("bp", "base: present", "num"),
                              ("bd", "base: difference", "num"), ("ta", "tuned: absent", "num"),
                              ("tp", "tuned: present", "num"), ("td", "tuned: difference", "num")], sep_rows(sep))
    heatmaps = []
    for model in ("base", "tuned"):
        sub = heads[(heads.relation == "aspect") & (heads.direction == "from->to") & (heads.model == model)]
        if len(sub):
            heatmaps.append(inp.figures.make(
                f"absa_aspect_{model}",
                lambda sub=sub, model=model: head_heatmap(sub, value="accuracy", title=f"Aspect heads ({model})",
                                                         scale=ColourScale("viridis", vmin=0.0), colorbar_label="accuracy"),
                f"Share of pairs whose question aspect attends most to an aspect term of the review, per head ({model}).",
                f"Aspect-head accuracy per head, {model}"))
    named = [r for r in rows if r[0] == "aspect"]
    if named:
        accs = [r[4] for r in named]  # top_rows: the tuned heads best first
        d, tied = decimals_to_tell(accs, 1), ties(accs)
        note = f"{fixed(named[0][4], d)} vs best baseline {named[0][5]} (base {fixed(named[0][3], d)})"
        if tied:
            note += f"; tied with {tied} other head{'s' if tied > 1 else ''}"
        inp.derived.append({"label": "Top aspect head (tuned)", "text": named[0][1], "note": note})
    analysed = (absa.get("analysed") or {}).get("n_pairs")
    facts = [("Pairs analysed", str(analysed) if analysed is not None else "—")]
    if absa.get("config"):
        facts.insert(0, ("Task", f"{absa['config'].get('style')} from {absa['config'].get('data')}"))
    if "accuracy" in metrics:
        facts.append(("Held-out accuracy (category level)", f"{metrics['accuracy']:.3f} (macro-F1 {metrics.get('macro_f1', float('nan')):.3f})"))
    held = absa.get("held_out") or {}
    if held:
        facts.append(("Held-out pairs", f"{held.get('n_pairs')} from {held.get('n_sentences')} sentences; "
                                        f"{held.get('n_conflict', 0)} conflict, {held.get('n_terms_ambiguous_category', 0)} terms of no clear category"))
    return {"table": table, "created": created_lines(heads), "sep": sep_table, "heatmaps": [h for h in heatmaps if h], "facts": facts,
            "relations": RELATION_TEXT}


SECTION = Section(
    id="absa",
    title="Aspect-based sentiment heads",
    tables={
        "absa_heads": ("model", "relation", "direction", "layer", "head", "accuracy", "baseline_accuracy",
                       "position_accuracy", "chance", "best_baseline", "n", "rank"),
        "absa_sep_share": ("model", "layer", "head", "sep_absent", "sep_present", "difference"),
    },
    build=build,
    template="sections/absa.html.j2",
)
