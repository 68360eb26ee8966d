"""Fine-tuning curves, final metrics, evaluation slices and anisotropy before/after training."""
from __future__ import annotations

import pandas as pd

from bertology.report.format import fmt_value, sort_key, sortable
from bertology.report.sections.base import Figures, Section, SectionInput


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


def _question_intervals(predictions: pd.DataFrame | None) -> dict[str, tuple[float, float, float]]:
    """QA runs: each held-out metric's mean over questions with its 95% bootstrap interval (from the predictions)."""
    if predictions is None or not {"f1", "exact_match"} <= set(predictions.columns):
        return {}
    from bertology.tasks.qa import question_interval

    return {m: question_interval(predictions[m].to_numpy()) for m in ("f1", "exact_match")}


def finetune_section(df: pd.DataFrame, figs: Figures, derived: list[dict],
                      anisotropy: pd.DataFrame | None = None, predictions: pd.DataFrame | None = None) -> dict:
    """Training curves, final metrics per split, evaluation slices and (contrastive runs) anisotropy."""
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
    intervals = _question_intervals(predictions)
    for metric in ("accuracy", "macro_f1", "entity_f1", "pearson", "spearman", "f1", "exact_match", "uas", "las"):
        hit = evals[evals["metric"] == metric]
        if len(hit):
            ci = intervals.get(metric)
            derived.append({"label": f"Final eval {METRIC_LABELS.get(metric, metric)}",
                            "text": fmt_value(hit["value"].iloc[0]),
                            "note": f"step {fmt_value(hit['step'].iloc[0])}"
                            + (f"; 95% CI [{fmt_value(ci[1])}, {fmt_value(ci[2])}] over {len(predictions)} questions"
                               if ci is not None else "")})
    facts = [("Steps logged", f"{int(df['step'].max()):,}" if len(df) else "—")]
    for metric, (mean, lo, hi) in intervals.items():
        facts.append((f"Held-out {METRIC_LABELS.get(metric, metric)} (95% bootstrap CI over questions)",
                       f"{fmt_value(mean)} [{fmt_value(lo)}, {fmt_value(hi)}]"))
    if "epoch" in df:
        facts.append(("Epochs", fmt_value(pd.to_numeric(df["epoch"], errors="coerce").max())))
    return {"curve": curve, "table": table, "facts": facts, "slices": slices, "anisotropy": aniso_fig}


def build(inp: SectionInput) -> dict | None:
    """The section's dict, or None when the run lacks its table."""
    df = inp.table("finetune")
    return None if df is None else finetune_section(df, inp.figures, inp.derived, inp.table("anisotropy"),
                                                    inp.table("finetune_predictions"))


SECTION = Section(
    id="finetune",
    title="Fine-tuning",
    tables={
        "finetune": ("step", "split", "metric", "value"),
        "anisotropy": ("model", "layer", "metric", "value"),
        "finetune_predictions": (),  # QA: per-question f1 / exact_match give the final metrics' intervals
    },
    build=build,
    template="sections/finetune.html.j2",
)
