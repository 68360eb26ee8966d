"""Token probes per layer: accuracy, control task, selectivity, MDL and LEACE erasure for base, tuned and random."""
from __future__ import annotations

import pandas as pd

from bertology.report.format import sortable
from bertology.report.sections.base import Figures, Section, SectionInput


def _best_rows(df: pd.DataFrame) -> list[list]:
    """Per (task, model): the best layer's accuracy, the most selective layer, the best compression and the
    highest accuracy left after erasure, each with its layer (None where the run has no such column)."""
    rows = []
    for (task, model), part in df.groupby(["probe_task", "model"], sort=False):
        best = part.loc[part["accuracy"].idxmax()]
        cells = [task, model, best["accuracy"], int(best["layer"]), best["majority_rate"]]
        for column in ("selectivity", "compression", "erased_accuracy"):
            values = part[column].dropna() if column in part else pd.Series(dtype=float)
            if len(values):
                at = values.idxmax()
                cells += [values[at], int(part.loc[at, "layer"])]
            else:
                cells += [None, None]
        rows.append(cells)
    return rows


def token_probe_section(df: pd.DataFrame, figs: Figures, derived: list[dict]) -> dict:
    """The section's dict: one figure per probe task and the best-layer table."""
    from bertology.viz.token_probe import token_probe_figure

    tasks = list(pd.unique(df["probe_task"]))
    figures = [figs.make(f"token_probe_{task}", lambda task=task: token_probe_figure(df, task),
                         f"Token probe {task} on the test words, per layer and model: the probe's accuracy, its "
                         "control task's (each word type a fixed random label; Hewitt & Liang 2019), selectivity "
                         "(their difference) and, when erasure was asked, the accuracy of a fresh probe after LEACE "
                         "erasure (Belrose et al. 2023), which should sit on the dashed majority rate.",
                         f"Token probe {task} scores per layer") for task in tasks]
    rows = _best_rows(df)
    table = sortable([("task", "Task", "text"), ("model", "Model", "text"), ("acc", "best accuracy", "num"),
                      ("acc_l", "layer", "num"), ("maj", "majority rate", "num"), ("sel", "best selectivity", "num"),
                      ("sel_l", "layer", "num"), ("mdl", "best compression (MDL)", "num"), ("mdl_l", "layer", "num"),
                      ("er", "highest erased accuracy", "num"), ("er_l", "layer", "num")], rows)
    best = {(r[0], r[1]): r[5] for r in rows if r[5] is not None}
    for task in tasks:
        if (task, "base") in best and (task, "tuned") in best:
            control = f"; random init {best[(task, 'random')]:+.3f}" if (task, "random") in best else ""
            derived.append({"label": f"Best {task} selectivity, base → tuned",
                            "text": f"{best[(task, 'base')]:+.3f} → {best[(task, 'tuned')]:+.3f}",
                            "note": f"token probe, task minus control accuracy{control}"})
    first = df.iloc[0]
    facts = [("Probe", str(first.get("classifier", "linear"))), ("Test words", f"{int(first['n_words']):,}"),
             ("Test sentences", f"{int(first['n_sentences']):,}"), ("Tasks", ", ".join(tasks))]
    return {"figures": [f for f in figures if f], "table": table, "facts": facts}


def build(inp: SectionInput) -> dict | None:
    """The section's dict, or None when the run has no token probes."""
    df = inp.table("token_probe")
    return None if df is None else token_probe_section(df, inp.figures, inp.derived)


SECTION = Section(
    id="token-probe",
    title="Token probes",
    tables={"token_probe": ("model", "layer", "probe_task", "accuracy", "majority_rate", "n_words", "n_sentences")},
    build=build,
    template="sections/token_probe.html.j2",
)
