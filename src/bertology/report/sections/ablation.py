"""Single head and layer ablations of the tuned classifier, regressor or QA model, head importance and pruning curves.

Every number is in the task's own metrics (accuracy and cross-entropy for a classifier, Pearson and
mean squared error for a regressor, SQuAD F1 / exact match and the span cross-entropy for extractive
QA: :mod:`bertology.tasks`)."""
from __future__ import annotations

from collections.abc import Mapping

import pandas as pd

from bertology.experiments.interventions import INTERVENTIONS, intervention, words_of
from bertology.report.format import fmt_value, sortable
from bertology.report.sections.base import Figures, Section, SectionInput
from bertology.tasks.catalog import higher_is_better, task_of_table

#: How the section's prose names each metric.
_WHAT = {"accuracy": "accuracy", "loss": "cross-entropy loss", "macro_f1": "macro-F1", "pearson": "Pearson r",
         "spearman": "Spearman rho", "mse": "mean squared error", "f1": "SQuAD F1", "exact_match": "exact match",
         "uas": "UAS (punctuation excluded)", "las": "LAS (punctuation excluded)", "entity_f1": "entity F1",
         "uas_argmax": "UAS of the per-word argmax", "las_argmax": "LAS of the per-word argmax",
         "entity_precision": "entity precision", "entity_recall": "entity recall", "mcc": "Matthews correlation (MCC)"}
#: A classifier's own words where a name means another thing for another task (QA's ``f1`` is SQuAD's).
_CLASSIFIER_WHAT = {"f1": "F1 of the positive class"}


def _words(t: pd.DataFrame) -> dict[str, str]:
    """How the prose names each metric of table ``t``'s task."""
    return {**_WHAT, **_CLASSIFIER_WHAT} if task_of_table(t).name == "classification" else _WHAT
#: Metrics shown beside the primary one in the table of removals, with their own delta and interval (a BIO
#: tagger's entity F1: its primary metric is the word accuracy).
_ALSO = ("entity_f1",)


def _needed_unit_card(t: pd.DataFrame, mode: str) -> dict:
    """The overview card naming the unit (head or layer) whose removal or revert costs most of the primary metric
    beyond its 95% interval; "none" when no unit's interval lies below zero (never a head at +0.000 [+0.000, +0.000])."""
    from bertology.experiments.ablation import harmful

    main = task_of_table(t).primary
    worst = harmful(t, main)
    words = words_of(mode)
    label = words.needed
    if not len(worst):
        return {"label": label, "text": "none beyond its interval",
                "note": f"no {words.noun} lowers {main} beyond its 95% interval"}
    w = worst.iloc[0]
    how = words.needed_how.format(mode=mode)
    more = f"; {len(worst) - 1} more beyond their intervals" if len(worst) > 1 else ""
    return {"label": label, "text": str(w["label"]),
            "note": f"Δ{main} {w['delta']:+.3f} [{w['ci_low']:+.3f}, {w['ci_high']:+.3f}] when {how}{more}"}


#: This section's id (an intervention's ``section`` names it).
SECTION_ID = "ablation"


def _degenerate_warning(t: pd.DataFrame) -> str | None:
    """The warning when the intact classifier is constant or at chance (None when it is not, or unknown)."""
    from bertology.experiments.degenerate import table_degeneracy

    verdict = table_degeneracy(t)
    if verdict is None or not verdict.flagged:
        return None
    what = "predictions constant" if verdict.constant_predictions else f"{verdict.metric} at chance"
    return f"Ablation: {what}, so ablation deltas cannot say which heads the task needs: {verdict.note}."


def _how(first: pd.Series, mode: str) -> str:
    """How the ablation disabled a head, in words (for the captions)."""
    special = " other than [CLS]/[SEP]" if bool(first.get("exclude_special")) else ""
    return words_of(mode).how.format(mode=mode, special=special)


#: The section's opening paragraph: what a removal is, by mode (revert puts weights back; the others disable).
LEDE = ("What the task loses, or gains, when one head or one layer of the tuned classifier is disabled (Kovaleva et "
        "al. 2019, §4.6; Michel et al. 2019). Every head is disabled alone, and every layer is skipped or has all its "
        "heads disabled; the change in {metrics} is measured on the same examples, with 95% intervals from a paired "
        "bootstrap over the examples. A removal \"helps\" only when its whole interval lies on the better side of zero. "
        "Head importance is the expected absolute gradient of the loss with respect to a gate on each head; the pruning "
        "curve removes the least important heads first.")
REVERT_LEDE = ("What the task loses when one unit of the tuned model is put back to the base model's weights (revert; "
               "Tamkin et al. 2020): every head alone (its query, key and value rows and its columns of the output "
               "projection), every layer's attention block, feed-forward block and whole layer, and the embeddings "
               "(layer 0). A unit whose revert costs the task is one whose fine-tuning change the task depends on. The "
               "change in {metrics} is measured on the same examples, with 95% intervals from a paired bootstrap over "
               "the examples; a revert \"helps\" only when its whole interval lies on the better side of zero.")
#: The opening paragraph by report section (a new intervention drawn in the ablation section reads LEDE).
LEDES = {"ablation": LEDE, "revert": REVERT_LEDE}
#: The layer bars' caption by report section: what a layer unit is.
LAYER_CAPTIONS = {
    "ablation": ("Change in {what} when a whole layer is disabled: skipped (the block returns its input) or with all its "
                 "heads disabled"),
    "revert": ("Change in {what} when one unit of a layer is put back to the base model's weights: its attention block, "
               "feed-forward block or the whole layer (the embeddings at layer 0)"),
}
#: Layer-unit words for the figures and the table (``revert_attention`` -> ``attention``).
LAYER_UNIT_WORDS = {"revert_attention": "attention block", "revert_ffn": "feed-forward block",
                    "revert_layer": "whole layer", "revert_embeddings": "embeddings"}


def _figures(t: pd.DataFrame, imp: pd.DataFrame | None, curve: pd.DataFrame | None, figs: Figures, how: str,
             prefix: str = "ablation", mode: str = "uniform") -> list:
    """The section's figures: per-head and per-layer deltas, head importance, importance vs delta, pruning curve
    (``prefix`` names the delta figures' files: ``ablation_heads_accuracy``, ``revert_heads_accuracy``)."""
    from bertology.viz.ablation import ablation_heatmap, importance_scatter, layer_ablation_bars, pruning_curve_figure
    from bertology.viz.figures import ColourScale, head_heatmap

    task = task_of_table(t)
    main, loss = task.primary, task.loss_metric
    words = _words(t)
    has_heads = bool((t["target"] == "head").any())
    figures = []
    if has_heads:
        for metric, what in ((main, words[main]), (loss, words[loss])):
            figures.append(figs.make(
                f"{prefix}_heads_{metric}", lambda m=metric: ablation_heatmap(t, m),
                f"Change in {what} when one head is {words_of(mode).participle} ({how}); "
                "blue: the task gains, red: it loses. "
                "Outlined cells: the 95% bootstrap interval excludes zero (solid: removal helps, dotted: it hurts).",
                f"Per-head ablation change in {what}",
            ))
    if (t["target"] == "layer").any():
        caption = words_of(mode).layer_caption or LAYER_CAPTIONS.get(_section_of(mode), LAYER_CAPTIONS["ablation"])
        figures.append(figs.make(
            f"{prefix}_layers_{main}", lambda: layer_ablation_bars(t, main, names=LAYER_UNIT_WORDS),
            caption.format(what=words[main]) + "; bars show the 95% bootstrap interval.",
            f"Per-layer ablation change in {words[main]}",
        ))
    if imp is not None and len(imp):
        figures.append(figs.make(
            "head_importance", lambda: head_heatmap(imp, value="importance", title="Head importance (normalised per layer)",
                                                    scale=ColourScale("viridis", vmin=0.0), colorbar_label="importance"),
            "Head importance (Michel et al. 2019): the mean absolute gradient of the loss with respect to a gate on "
            "each head's output, per example, normalised per layer (L2).",
            "Head importance per layer and head",
        ))
        if has_heads:
            figures.append(figs.make(
                "importance_vs_ablation", lambda: importance_scatter(imp, t, loss),
                f"Each head's importance against the {words[loss]} change its removal causes: agreement means important "
                "heads are the ones whose loss the task feels.",
                f"Head importance against the single-head ablation change in {words[loss]}",
            ))
    if curve is not None and len(curve):
        figures.append(figs.make(
            f"pruning_curve_{main}", lambda: pruning_curve_figure(curve, main),
            f"{words[main].capitalize()} as heads are removed step by step, least important first (re-estimated after "
            "every step), against a random order as the control.",
            f"Pruning curve: {words[main]} against the share of heads removed",
        ))
    return figures


def _removals_table(t: pd.DataFrame, main: str, also: list[str], verb: str = "Removed") -> dict:
    """The table of removals: the heads that hurt and help most, then every layer, with the ``also`` metrics beside."""
    from bertology.experiments.ablation import ranked

    keyed = {m: t[t["metric"] == m].set_index(["target", "layer", "head", "layer_mode"]) for m in also}
    words = _words(t)

    def row(r, kind: str) -> list:
        cells = [r.label, kind, r.delta, r.ci_low, r.ci_high, "yes" if r.helps else ("hurts" if r.hurts else "no")]
        for m in also:
            o = keyed[m].loc[(r.target, r.layer, r.head, r.layer_mode)]
            cells += [o["delta"], o["ci_low"], o["ci_high"]]
        return cells

    rows = []
    if (t["target"] == "head").any():
        better = 1.0 if higher_is_better().get(main, True) else -1.0
        helping = ranked(t, main, target="head", harmful=False, top=5)
        for kind, part in (("hurts most", ranked(t, main, target="head", harmful=True, top=8)),
                           ("helps most", helping[better * helping["delta"] > 0])):  # only heads whose removal helps
            rows += [row(r, kind) for r in part.itertuples()]
    rows += [row(r, "layer") for r in t[(t["target"] == "layer") & (t["metric"] == main)].itertuples()]
    return sortable([("unit", verb, "text"), ("kind", "Kind", "text"), ("delta", f"Δ {words[main]}", "num"),
                     ("lo", "95% CI low", "num"), ("hi", "95% CI high", "num"), ("sig", "Beyond the CI", "text")]
                    + [c for m in also for c in ((f"d_{m}", f"Δ {words[m]}", "num"), (f"lo_{m}", f"{words[m]} CI low", "num"),
                                                 (f"hi_{m}", f"{words[m]} CI high", "num"))], rows)


def ablation_section(tables: Mapping[str, pd.DataFrame], figs: Figures, derived: list[dict],
                     warnings: list[str] | None = None) -> dict:
    """Single head and layer ablations of the tuned classifier, head importance and pruning curves (or, when the
    rows are a revert sweep's, the reverts: the same table shape, their own words and figure names).

    When the intact classifier is degenerate, the section and the overview say so (and ``warnings``
    gets the line) instead of naming a head the task needs.
    """
    from bertology.experiments.ablation import harmful, helpful
    from bertology.experiments.head_importance import importance_vs_deltas

    t = tables["ablation"].copy()
    task = task_of_table(t)
    main, loss = task.primary, task.loss_metric
    words = _words(t)
    imp = tables.get("head_importance")
    first = t.iloc[0]
    mode = str(first.get("mode", "uniform"))
    has_heads = bool((t["target"] == "head").any())
    said = words_of(mode)
    section = _section_of(mode)
    figures = _figures(t, imp, tables.get("pruning_curve"), figs, _how(first, mode), prefix=section, mode=mode)
    intact = t[t["target"] == "intact"].set_index("metric")["value"]
    also = [m for m in _ALSO if m in task.metrics and m != main]
    noun = said.plural
    table = _removals_table(t, main, also, said.done)
    good_acc, good_loss = helpful(t, main), helpful(t, loss)
    bad_acc = harmful(t, main)
    facts = [("Task", task.name),
             ("Mode", mode + (" ([CLS]/[SEP] excluded)" if bool(first.get("exclude_special")) else "")),
             ("Examples", fmt_value(first.get("n_examples"))),
             (f"Intact {words[main]}", fmt_value(intact.get(main))), (f"Intact {words[loss]}", fmt_value(intact.get(loss))),
             *((f"Intact {words[m]}", fmt_value(intact.get(m))) for m in also),
             (f"{noun} that hurt {words[main]} (beyond CI)", str(len(bad_acc))),
             (f"{noun} that help {words[main]} (beyond CI)", str(len(good_acc))),
             (f"{noun} that lower the {words[loss]} (beyond CI)", str(len(good_loss)))]
    if imp is not None and len(imp) and has_heads:
        rho = importance_vs_deltas(imp, t)[loss]["spearman"]
        facts.append((f"Spearman, importance vs Δ{loss}", fmt_value(rho, 3)))
    warning = _degenerate_warning(t)
    degenerate = None if warning is None else warning.removeprefix("Ablation: ")
    if degenerate is not None:
        facts.insert(0, (f"Degenerate {'classifier' if task.name == 'classification' else 'model'}", degenerate))
        derived.append({"label": "Unit the task needs most", "text": "none can be named", "note": degenerate})
        if warnings is not None:
            warnings.append(warning)
    else:
        derived.append(_needed_unit_card(t, mode))
    derived.append({"label": f"{noun} that help", "text": f"{len(good_acc)} ({main}), {len(good_loss)} ({loss})",
                    "note": f"units whose {said.helps} improves the task beyond "
                            "the 95% interval"})
    metrics = ", ".join(words[m] for m in dict.fromkeys([main, *also, loss]))
    lede = (said.lede or LEDES.get(section, LEDE)).format(metrics=metrics)
    return {"figures": [f for f in figures if f], "table": table, "facts": facts, "degenerate": degenerate,
            "lede": lede,
            "table_title": f"{noun} that matter most"}


def mode_rows(tables: Mapping[str, pd.DataFrame], mode: str) -> dict[str, pd.DataFrame] | None:
    """The run's tables with the ablation table cut to the rows of ``mode`` (head importance and the pruning curve go
    with a head mode only); None when there are no such rows."""
    t = tables.get("ablation")
    if t is None:
        return None
    rows = t[t["mode"].astype(str) == mode].reset_index(drop=True) if "mode" in t else t
    if rows.empty:
        return None
    importance = mode not in INTERVENTIONS or intervention(mode).head_importance
    own = {k: v for k, v in tables.items() if importance or k not in ("head_importance", "pruning_curve")}
    return {**own, "ablation": rows}


def _section_of(mode: str) -> str:
    """The report section that draws ``mode``'s rows (a mode the registry does not know: this one)."""
    return INTERVENTIONS[mode].section if mode in INTERVENTIONS else SECTION_ID


def section_modes(tables: Mapping[str, pd.DataFrame], section: str) -> list[str]:
    """The modes whose rows the ablation table holds and ``section`` draws, in table order."""
    t = tables.get("ablation")
    if t is None or "mode" not in t:
        return ["uniform"] if t is not None and section == SECTION_ID else []
    return [m for m in dict.fromkeys(t["mode"].astype(str)) if _section_of(m) == section]


def head_modes(tables: Mapping[str, pd.DataFrame]) -> list[str]:
    """The modes this section draws (uniform, zero, mean; any intervention whose section is ``ablation``), in table
    order."""
    return section_modes(tables, SECTION_ID)


def build(inp: SectionInput) -> dict | None:
    """The section's dict for the first head mode (the one head importance goes with), or None when the run has no
    head-mode ablation; a revert sweep has its own section (:mod:`bertology.report.sections.revert`). Other head modes
    of the same run are named in a warning: their rows are in the table and the command's summary."""
    modes = head_modes(inp.tables)
    if not modes:
        return None
    if len(modes) > 1:
        inp.warnings.append(f"Ablation: the report draws mode {modes[0]}; the rows of mode(s) {', '.join(modes[1:])} are "
                            "in tables/ablation (column mode) and the summary.")
    tables = mode_rows(inp.tables, modes[0])
    return None if tables is None else ablation_section(tables, inp.figures, inp.derived, inp.warnings)


SECTION = Section(
    id=SECTION_ID,
    title="Ablation and head importance",
    tables={
        "ablation": ("target", "layer", "head", "label", "mode", "layer_mode", "metric", "value", "delta", "ci_low",
                     "ci_high", "n_examples", "helps", "hurts"),
        "head_importance": ("layer", "head", "importance"),
        "pruning_curve": ("order", "fraction_removed", "metric", "value"),
    },
    build=build,
    template="sections/ablation.html.j2",
)
