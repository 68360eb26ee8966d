"""Fine-tuning curves, final metrics, evaluation slices and anisotropy before/after training."""
from __future__ import annotations

import pandas as pd

from bertology.report.format import fmt_value, sort_key, sortable
from bertology.report.sections.base import Figures, Section, SectionInput

#: The table of final held-out metrics with bootstrap intervals (``training.common.INTERVALS_TABLE``).
INTERVALS = "finetune_intervals"

def _slices_table(sl: pd.DataFrame) -> dict | None:
    """Final evaluation per slice (e.g. with / without the words a bias experiment removed)."""
    from bertology.viz.figures import METRIC_LABELS

    last = sl[sl["split"] == "eval"].sort_values("step").groupby(["slice", "metric"], as_index=False).tail(1)
    if last.empty:
        return None
    wide = last.pivot_table(index="slice", columns="metric", values="value", aggfunc="first")
    metrics = [m for m in ("accuracy", "macro_f1", "entity_f1", "uas", "las", "loss", "pearson", "spearman", "mse", "n_eval")
               if m in wide.columns]
    return sortable([("slice", "Slice", "text")] + [(m, METRIC_LABELS.get(m, m.replace("_", " ")), "num") for m in metrics],
                    [[str(i)] + [r[m] for m in metrics] for i, r in wide.iterrows()])


def heldout_label(metric: str) -> str:
    """A held-out metric's card label: ``Held-out accuracy``, ``Held-out macro F1``."""
    from bertology.viz.figures import METRIC_LABELS

    return f"Held-out {METRIC_LABELS.get(metric, metric.replace('_', ' '))}"


def _final_intervals(intervals: pd.DataFrame | None) -> dict[str, tuple[float, float, float, int]]:
    """Each final held-out metric: (value, 95% CI low, high, examples), from the ``finetune_intervals`` table."""
    if intervals is None or intervals.empty:
        return {}
    ev = intervals[intervals["split"] == "eval"]
    return {str(r.metric): (float(r.value), float(r.ci_low), float(r.ci_high), int(r.n_eval)) for r in ev.itertuples()}


def finetune_section(df: pd.DataFrame, figs: Figures, derived: list[dict],
                      anisotropy: pd.DataFrame | None = None, intervals: pd.DataFrame | None = None,
                      unit: str = "examples", objective: str | None = None) -> dict:
    """Training curves, final metrics per split, evaluation slices and (contrastive runs) anisotropy;
    ``objective`` (the manifest's ``training_objective``) names what the ``loss`` rows measure."""
    from bertology.viz.figures import METRIC_LABELS, training_curve

    df = df.copy()
    df["step"] = pd.to_numeric(df["step"], errors="coerce")
    df = df.dropna(subset=["step"])
    slices = None
    if "slice" in df.columns:  # per-slice eval rows (bias experiments) are shown apart from the curves
        is_all = df["slice"].fillna("all").astype(str) == "all"
        slices = _slices_table(df[~is_all]) if (~is_all).any() else None
        df = df[is_all]
    aniso_fig = None
    if anisotropy is not None and len(anisotropy):
        from bertology.viz.geometry import geometry_figure

        aniso_fig = figs.make(
            "finetune_anisotropy", lambda: geometry_figure(anisotropy, metrics=["anisotropy"], ncols=1),
            "Anisotropy per layer (mean cosine of random token pairs from different sentences, Ethayarajh 2019) "
            "before and after contrastive training.",
            "Anisotropy per layer before and after fine-tuning",
        )
    curve = figs.make(
        "finetune_curves",
        lambda: training_curve(df),
        "Training (faint) and evaluation (markers) metrics against the optimisation step.",
        "Fine-tuning curves per metric and split",
    )
    last = df.sort_values("step").groupby(["split", "metric"], as_index=False).tail(1)
    splits = [s for s in ("train", "eval") if s in set(last["split"])] + sorted(
        str(s) for s in set(last["split"]) if s not in ("train", "eval")
    )
    metrics = list(pd.unique(last.sort_values("metric", key=lambda s: s != "loss")["metric"]))
    rows = []
    for metric in metrics:
        cells = [{"text": METRIC_LABELS.get(metric, str(metric)), "value": str(metric)}]
        for split in splits:
            hit = last[(last["metric"] == metric) & (last["split"] == split)]
            v = hit["value"].iloc[0] if len(hit) else None
            cells.append({"text": fmt_value(v), "value": sort_key(v)})
        rows.append(cells)
    table = {
        "columns": [{"key": "metric", "label": "Metric", "type": "text"}]
        + [{"key": s, "label": f"final {s}", "type": "num"} for s in splits],
        "rows": rows,
    }
    evals = last[last["split"] == "eval"]
    cis = _final_intervals(intervals)
    for metric in ("accuracy", "macro_f1", "entity_f1", "pearson", "spearman", "f1", "exact_match", "uas", "las",
                   "uas_argmax", "las_argmax"):
        hit = evals[evals["metric"] == metric]
        if len(hit):
            ci = cis.get(metric)
            # the held-out headline of the run; the overview leaves out the summary's copy of it (same ``key``)
            derived.append({"key": f"heldout.{metric}", "label": heldout_label(metric),
                            "text": fmt_value(hit["value"].iloc[0]),
                            "note": f"step {fmt_value(hit['step'].iloc[0])}"
                            + (f"; 95% CI [{fmt_value(ci[1])}, {fmt_value(ci[2])}] over {ci[3]:,} {unit}"
                               if ci is not None else "")})
    facts = ([("Objective", objective)] if objective else []) + [
        ("Steps logged", f"{int(df['step'].max()):,}" if len(df) else "—")]
    ci_rows = [[METRIC_LABELS.get(m, m), v, lo, hi, n] for m, (v, lo, hi, n) in cis.items()]
    ci_table = sortable([("metric", "Metric", "text"), ("value", "Final held-out value", "num"),
                         ("ci_low", "95% CI low", "num"), ("ci_high", "95% CI high", "num"),
                         ("n", f"Held-out {unit}", "num")], ci_rows) if ci_rows else None
    if "epoch" in df:
        facts.append(("Epochs", fmt_value(pd.to_numeric(df["epoch"], errors="coerce").max())))
    return {"curve": curve, "table": table, "facts": facts, "slices": slices, "anisotropy": aniso_fig,
            "intervals": ci_table, "interval_unit": unit,
            "interval_method": None if intervals is None or intervals.empty else str(intervals["ci_method"].iloc[0])}


def build(inp: SectionInput) -> dict | None:
    """The section's dict, or None when the run lacks its table."""
    df = inp.table("finetune")
    if df is None:
        return None
    from bertology.tasks.catalog import TASKS, get_task

    result = inp.manifest.get("result") or {}
    task = result.get("task")
    unit = get_task(task).example_unit if task in TASKS else "examples"  # what the intervals resample, never tokens
    return finetune_section(df, inp.figures, inp.derived, inp.table("anisotropy"), inp.table(INTERVALS), unit,
                            result.get("training_objective"))


SECTION = Section(
    id="finetune",
    title="Fine-tuning",
    tables={
        "finetune": ("step", "split", "metric", "value"),
        "anisotropy": ("model", "layer", "metric", "value"),
        INTERVALS: ("split", "metric", "value", "ci_low", "ci_high", "n_eval"),
    },
    build=build,
    template="sections/finetune.html.j2",
)
