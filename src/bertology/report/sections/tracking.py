"""Tracking during training: each tracked analysis (and the per-layer gradient norms) over the training steps.

The tables of a ``track`` run folder: ``bertology track`` (checkpoints analysed after training), ``bertology finetune
--track-every N`` (``RUN/tracking/``) and :class:`~bertology.integrations.BertologyCallback` (a Trainer run's ``out=``).
The figures are :func:`bertology.viz.track.track_figures`, the ones those commands also save as
``figures/track_*.svg``; here the report draws them, and a notebook gets them from ``Run.plot``.
"""
from __future__ import annotations

from bertology.report.sections.base import Section, SectionInput

#: The tracked tables in page order, with what their figure shows.
TRACKED = {
    "track_representation_similarity": "CKA and RSA between each layer of the model in training and the same layer of "
                                       "its base (Merchant et al. 2020): 1 = the layer's geometry as before training.",
    "track_attention_change": "Mean cosine and Jensen-Shannon divergence between each layer's attention maps and the "
                              "base's (Kovaleva et al. 2019): cosine 1 and divergence 0 = unchanged.",
    "track_geometry": "Each layer's embedding geometry (Ethayarajh 2019) as training goes on: anisotropy and "
                      "self-similarity.",
    "track_gradient_norms": "The norm of each layer's gradient at every recorded step (Mosbach et al. 2021's stability "
                            "check): spikes or vanishing lower layers mark an unstable run.",
}


def build(inp: SectionInput) -> dict | None:
    """One figure per tracked table the run has, or None when it has none."""
    from bertology.viz.track import track_figures

    figures, steps = [], set()
    for name, caption in TRACKED.items():
        table = inp.table(name)
        if table is None:
            continue
        steps.update(int(s) for s in table["step"].dropna())
        what = name.removeprefix("track_")
        figures.append(inp.figures.make(
            name, lambda t=table, w=what: track_figures({w: t})[w], caption + " One line per layer, over training steps.",
            f"Line charts of {what.replace('_', ' ')} per layer over training steps"))
    figures = [f for f in figures if f]
    if not figures:
        return None
    facts = [("Steps tracked", f"{len(steps)} ({min(steps)} to {max(steps)})")] if steps else []
    return {"figures": figures, "facts": facts}


SECTION = Section(
    id="tracking",
    title="Tracking during training",
    tables={"track_representation_similarity": ("step", "layer_base", "layer_tuned", "metric", "value"),
            "track_attention_change": ("step", "layer", "cosine", "js_divergence"),
            "track_geometry": ("step", "layer", "metric", "value"),
            "track_gradient_norms": ("step", "layer", "metric", "value")},
    build=build,
    template="sections/tracking.html.j2",
)
