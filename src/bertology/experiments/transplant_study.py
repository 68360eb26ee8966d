"""Transplant as a mode of the ablation study (``bertology ablate --mode transplant --base B``, compare's
``--ablation-mode transplant``): the sweep of :mod:`bertology.experiments.transplant_sweep`, its manifest section
and its one-line headline."""
from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from bertology.errors import BertologyError
from bertology.experiments.scoring import HeadScoring
from bertology.experiments.transplant_score import TABLE
from bertology.tasks.catalog import task_of_table

#: Why the transplant mode runs no head importance (the manifest's ``head_importance`` then says so).
NO_IMPORTANCE = ("not run in transplant mode: head importance and pruning remove heads (Michel et al. 2019), "
                 "they do not transplant them")
HEADS_HELP = ("With --mode transplant: also every head transplanted alone (one full forward of the corpus per head, "
              "L x H in all, so off by default).")


def run_transplant_study(model: torch.nn.Module, base: torch.nn.Module | None, encoded, label_ids, scoring: HeadScoring,
                         settings, partial: Path | None, on_progress: Callable[[str, int, int], None] | None):
    """The transplant sweep with ``settings`` (:class:`~bertology.experiments.ablation.AblationSettings`): the result,
    its tables (``transplant``) and the manifest's summary (the ablation study wraps them)."""
    from bertology.experiments.transplant_sweep import TransplantUnits, run_transplant

    if base is None:
        raise BertologyError("Ablation mode transplant needs the base model (--base): the pretrained model the tuned "
                             "one was fine-tuned from.")
    result = run_transplant(
        model, base, encoded, label_ids, scoring, units=TransplantUnits(settings.layers, settings.transplant_heads),
        n_bootstrap=settings.n_bootstrap, seed=settings.seed,
        progress_dir=None if partial is None else partial / "transplant",
        on_unit=(lambda _k, d, t: on_progress("ablation", d, t)) if on_progress else None)
    tables = {TABLE: result.table}
    summary = {
        "settings": settings.to_dict(), "ablation": result.params, "task": result.params["task"],
        "n_examples": int(result.params["n_examples"]), "tokenisation": encoded.describe(),
        "timing_s": {k: round(v, 3) for k, v in result.timing.items()}, "tables": list(tables),
    }
    if settings.importance:
        summary["head_importance"] = {"skipped": NO_IMPORTANCE}
    return result, tables, summary


def _pct(x: float) -> str:
    return f"{100 * x:.0f}"


def _best_k(curve: pd.DataFrame, direction: str, level: float = 0.8) -> pd.Series | None:
    """The smallest k < L of ``direction`` whose gain recovered reaches ``level``, else the largest gain below L."""
    part = curve[(curve["direction"] == direction) & (curve["k"] > 0) & (curve["k"] < curve["k"].max())]
    part = part.dropna(subset=["gain_recovered"]).sort_values("k")
    if part.empty:
        return None
    reached = part[part["gain_recovered"] >= level]
    return reached.iloc[0] if len(reached) else part.loc[part["gain_recovered"].idxmax()]


def summary(tables: Mapping[str, pd.DataFrame], note: str = "") -> str:
    """The transplant headlines: the three reference scores, then per curve the fewest layers that recover 80% of
    the gain (or the most any k < L recovers), and the best single unit; or why the gain is undefined."""
    t = tables[TABLE]
    main = task_of_table(t).primary
    m = t[t["metric"] == main]
    first = m.iloc[0]
    lines = [f"transplant ({main}, n={int(first['n_examples'])}{note}): tuned {first['value_tuned']:.4f}, "
             f"head alone (base encoder under the tuned head) {first['value_head_alone']:.4f}"]
    if m["reason"].astype(bool).all():
        return "\n".join(lines + [f"gain recovered undefined: {first['reason']}"])
    curve = m[m["unit_kind"] == "layers"]
    for direction in ("top", "bottom"):
        row = _best_k(curve, direction)
        if row is not None:
            ci = "" if np.isnan(row["ci_low"]) else f" [{_pct(row['ci_low'])}, {_pct(row['ci_high'])}]"
            lines.append(f"transplanting the {direction} {int(row['k'])} layers recovers {_pct(row['gain_recovered'])}%"
                         f"{ci} of the gain")
    singles = m[(m["unit_kind"] != "layers")].dropna(subset=["gain_recovered"])
    if len(singles):
        best = singles.loc[singles["gain_recovered"].idxmax()]
        ci = "" if np.isnan(best["ci_low"]) else f" [{_pct(best['ci_low'])}, {_pct(best['ci_high'])}]"
        lines.append(f"best single unit: {best['label']} recovers {_pct(best['gain_recovered'])}%{ci} of the gain")
    return "\n".join(lines)
