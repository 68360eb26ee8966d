"""The crosscoder: which latents fine-tuning added (tuned-only, confirmed by Latent Scaling), with their contexts."""
from __future__ import annotations

import pandas as pd

from bertology.report.format import sortable
from bertology.report.sections.base import Section, SectionInput

#: Non-shared latents listed per layer, most frequent first.
SHOWN = 12


def _contexts(examples: pd.DataFrame | None, layer: int, latent: int, n: int = 3) -> tuple[str, str]:
    """The latent's most common top tokens and its best context (the token in brackets), or dashes."""
    if examples is None:
        return "—", "—"
    rows = examples[(examples["layer"] == layer) & (examples["latent"] == latent)].sort_values("rank")
    if rows.empty:
        return "—", "—"
    tokens = ", ".join(rows["token"].value_counts().index[:n])
    return tokens, str(rows.iloc[0]["context"]) if "context" in rows else str(rows.iloc[0]["token"])


def latent_rows(latents: pd.DataFrame, examples: pd.DataFrame | None) -> list[list]:
    """Per layer, the live non-shared latents (confirmed tuned-only first, then by frequency)."""
    live = latents[(latents["kind"] != "shared") & ~latents["dead"].astype(bool)].copy()
    live["confirmed"] = live["tuned_only_verified"].fillna(False).astype(bool) if "tuned_only_verified" in live else False
    rows = []
    for layer, part in live.groupby("layer", sort=True):
        part = part.sort_values(["confirmed", "frequency"], ascending=[False, False]).head(SHOWN)
        for _, r in part.iterrows():
            tokens, context = _contexts(examples, int(layer), int(r["latent"]))
            verdict = "confirmed" if r["confirmed"] else ("not confirmed" if r["kind"] == "tuned_only" else "—")
            rows.append([int(layer), int(r["latent"]), str(r["kind"]), verdict, r["relative_norm"], r["frequency"],
                         tokens, context])
    return rows


def crosscoder_section(inp: SectionInput) -> dict | None:
    """Fit per layer, the relative-norm histogram and the non-shared latents with their contexts."""
    from bertology.viz.crosscoder import relative_norm_histogram

    latents, fit, examples = inp.table("crosscoder_latents"), inp.table("crosscoder"), inp.table("crosscoder_examples")
    if latents is None:
        return None
    record = (inp.manifest.get("analyses") or {}).get("crosscoder") or {}
    threshold = (record.get("settings") or {}).get("only_threshold")
    figure = inp.figures.make("crosscoder_relative_norm", lambda: relative_norm_histogram(latents, threshold),
                              "Live latents of each layer by relative decoder norm, tuned / (base + tuned): 0.5 is "
                              "shared, near 1 the tuned model's alone, near 0 the base's (Lindsey et al. 2024); "
                              "dashed: the thresholds for tuned-only and base-only.", "Crosscoder relative norms")
    facts = []
    if fit is not None:
        for _, r in fit.iterrows():
            facts.append((f"Layer {int(r['layer'])}", f"variance explained {r['fve_base']:.2f} (base), "
                          f"{r['fve_tuned']:.2f} (tuned); dead {r['dead_share']:.0%}"))
    confirmed = int(latents["tuned_only_verified"].fillna(False).astype(bool).sum()) \
        if "tuned_only_verified" in latents else 0
    inp.derived.append({"label": "Tuned-only latents (crosscoder)", "text": str(confirmed),
                        "note": "confirmed by Latent Scaling (Minder et al. 2025): the base model does not carry them"})
    table = sortable([("layer", "Layer", "num"), ("latent", "Latent", "num"), ("kind", "Kind", "text"),
                      ("verdict", "Latent Scaling", "text"), ("rel", "relative norm", "num"),
                      ("freq", "frequency", "num"), ("tokens", "top tokens", "text"),
                      ("context", "best context", "text")], latent_rows(latents, examples))
    return {"figures": [f for f in (figure,) if f], "table": table, "facts": facts}


SECTION = Section(
    id="crosscoder",
    title="Crosscoder: what fine-tuning added",
    tables={"crosscoder_latents": ("layer", "latent", "relative_norm", "kind", "frequency", "dead"),
            "crosscoder": ("layer", "fve_base", "fve_tuned", "dead_share"),
            "crosscoder_examples": ("layer", "latent", "rank", "token")},
    build=crosscoder_section,
    template="sections/crosscoder.html.j2",
)
