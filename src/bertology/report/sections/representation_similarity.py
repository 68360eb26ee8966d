"""CKA and RSA between base and tuned layers, on the task data and (optionally) out of domain."""
from __future__ import annotations

import pandas as pd

from bertology.report.format import fmt_value, sort_key, unique_text
from bertology.report.sections.base import Figures, Section, SectionInput

SIMILARITY_METRICS = ("cka_linear", "cka_debiased", "rsa_pearson", "rsa_spearman")


def _domains_figure(df: pd.DataFrame, ood: pd.DataFrame, figs: Figures) -> dict | None:
    """Same-layer similarity on the task's data and on the out-of-domain corpus, side by side (Merchant et al.)."""
    from bertology.viz.figures import METRIC_LABELS, CurveStyle, layer_curve

    both = []
    for frame, domain in ((df, "in domain"), (ood, "out of domain")):
        d = frame[(frame["layer_base"] == frame["layer_tuned"]) & frame["metric"].isin(["cka_linear", "rsa_pearson"])]
        both.append(d.rename(columns={"layer_base": "layer"}).assign(domain=domain)[["layer", "metric", "value", "domain"]])
    data = pd.concat(both, ignore_index=True)
    data["metric"] = data["metric"].map(lambda m: METRIC_LABELS.get(m, m))
    return figs.make(
        "similarity_domains",
        lambda: layer_curve(data, x="layer", y="value", hue="domain", facet="metric",
                            title="Base vs tuned on the task's data and out of domain",
                            style=CurveStyle(xlabel="layer (0 = embeddings)", ylabel="same-layer similarity",
                                             reference=1.0, min_span=0.1)),
        "Same-layer similarity of base and tuned on the task's data and on the second corpus, as in Merchant "
        "et al. (2020): fine-tuning changes out-of-domain representations less when the curve stays higher.",
        "Same-layer similarity in and out of domain",
    )


def similarity_section(df: pd.DataFrame, figs: Figures, derived: list[dict], ood: pd.DataFrame | None = None) -> dict:
    """Same-layer curves, every-layer matrices and a same-layer table of CKA/RSA (plus out of domain when given)."""
    from bertology.viz.figures import METRIC_LABELS, ColourScale, CurveStyle, layer_curve, layer_matrix

    df = df.copy()
    for col in ("layer_base", "layer_tuned", "value"):
        df[col] = pd.to_numeric(df[col], errors="coerce")
    df = df.dropna(subset=["layer_base", "layer_tuned"])
    df["layer_base"] = df["layer_base"].astype(int)
    df["layer_tuned"] = df["layer_tuned"].astype(int)
    metrics_present = [m for m in SIMILARITY_METRICS if m in set(df["metric"])] + sorted(
        m for m in set(df["metric"]) if m not in SIMILARITY_METRICS
    )
    diag = df[df["layer_base"] == df["layer_tuned"]].rename(columns={"layer_base": "layer"})
    curve = None
    if not diag.empty:
        curve = figs.make(
            "similarity_same_layer",
            lambda: layer_curve(diag, x="layer", y="value", hue="metric",
                                title="Same-layer similarity, base vs tuned",
                                style=CurveStyle(xlabel="layer (0 = embeddings)", ylabel="similarity",
                                                 reference=1.0, min_span=0.1, hue_order=metrics_present)),
            "Similarity of each base layer with the same tuned layer; 1 = identical geometry. "
            "Layer 0 is the embedding output.",
            "Per-layer same-layer similarity for each metric",
        )
    matrices = []
    for metric in ("cka_linear", "rsa_pearson"):
        if metric not in set(df["metric"]):
            continue
        vmax = 1.0 if df.loc[df["metric"] == metric, "value"].max() <= 1.0 + 1e-6 else None
        matrices.append(figs.make(
            f"similarity_matrix_{metric}",
            lambda metric=metric, vmax=vmax: layer_matrix(
                df, metric, title=f"{METRIC_LABELS.get(metric, metric)}: every layer pair",
                scale=ColourScale("viridis", vmax=vmax, min_span=0.1)),
            f"{METRIC_LABELS.get(metric, metric)} between every base layer (rows) and tuned layer "
            "(columns); the diagonal is the same-layer curve.",
            f"Layer by layer matrix of {metric}",
        ))
    domains = _domains_figure(df, ood, figs) if ood is not None else None
    # same-layer table: layer x metric (and, with an out-of-domain corpus, its linear CKA and RSA)
    table = None
    if not diag.empty:
        pivot = diag.pivot_table(index="layer", columns="metric", values="value", aggfunc="mean")
        cols = [m for m in metrics_present if m in pivot.columns]
        labels = {m: METRIC_LABELS.get(m, m) for m in cols}
        if ood is not None:
            od = ood[ood["layer_base"] == ood["layer_tuned"]].pivot_table(index="layer_base", columns="metric", values="value")
            for m in ("cka_linear", "rsa_pearson"):
                if m in od.columns:
                    pivot[f"{m}_ood"] = od[m].reindex(pivot.index)
                    cols.append(f"{m}_ood")
                    labels[f"{m}_ood"] = f"{METRIC_LABELS.get(m, m)}, out of domain"
        table = {
            "columns": [{"key": "layer", "label": "Layer", "type": "num"}]
            + [{"key": m, "label": labels[m], "type": "num"} for m in cols],
            "rows": [
                [{"text": str(int(layer)), "value": sort_key(int(layer))}]
                + [{"text": fmt_value(pivot.at[layer, m]), "value": sort_key(pivot.at[layer, m])}
                   for m in cols]
                for layer in pivot.index
            ],
        }
        if "cka_linear" in pivot.columns:
            last = int(pivot.index.max())
            derived.append({"label": f"Linear CKA, layer {last}", "text": fmt_value(pivot.at[last, "cka_linear"]),
                            "note": "same layer, base vs tuned"})
    facts = [("Tokens compared", unique_text(df["n_tokens"]))]
    if ood is not None:
        facts.append(("Out-of-domain corpus", unique_text(ood["corpus"]) if "corpus" in ood else "yes"))
    facts.append(("Seed", unique_text(df["seed"]) if "seed" in df else "not recorded"))
    facts.append(("Metrics", ", ".join(METRIC_LABELS.get(m, m) for m in metrics_present)))
    return {
        "curve": curve,
        "domains": domains,
        "matrices": [m for m in matrices if m],
        "table": table,
        "facts": facts,
    }


def build(inp: SectionInput) -> dict | None:
    """The section's dict, or None when the run lacks its table."""
    df = inp.table("representation_similarity")
    if df is None:
        return None
    return similarity_section(df, inp.figures, inp.derived, inp.table("representation_similarity_ood"))


SECTION = Section(
    id="representation-similarity",
    title="Representation similarity",
    tables={
        "representation_similarity": ("layer_base", "layer_tuned", "metric", "value", "n_tokens"),
        "representation_similarity_ood": ("layer_base", "layer_tuned", "metric", "value", "n_tokens", "domain"),
    },
    build=build,
    template="sections/representation_similarity.html.j2",
)
