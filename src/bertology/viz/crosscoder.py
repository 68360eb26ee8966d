"""The crosscoder's figure: each layer's latents by relative decoder norm (Lindsey et al. 2024's histogram).

A latent at 0.5 is shared (both models' decoders write it alike), near 1 the tuned model's alone, near 0 the
base's; the dashed lines are the run's thresholds for calling a latent tuned-only or base-only. Returns a
:class:`~matplotlib.figure.Figure` on an Agg canvas, like :mod:`bertology.viz.figures`.
"""
from __future__ import annotations

import matplotlib as mpl
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from bertology.viz.style import _STYLE, _new_figure, _require

__all__ = ["relative_norm_histogram"]


def relative_norm_histogram(latents: pd.DataFrame, threshold: float | None = None, bins: int = 40) -> Figure:
    """One panel per layer: how many live latents sit at each relative norm (log count), dead latents left out;
    ``threshold``: the tuned-only threshold (base-only at 1 minus it), drawn dashed."""
    _require(latents, ["layer", "relative_norm", "dead"], "relative_norm_histogram")
    layers = sorted(int(x) for x in pd.unique(latents["layer"]))
    edges = np.linspace(0.0, 1.0, bins + 1)
    with mpl.rc_context(_STYLE):
        fig = _new_figure((min(9.6, 3.3 * len(layers) + 0.4), 2.6))
        axes = fig.subplots(1, len(layers), squeeze=False, sharey=True)[0]
        for ax, layer in zip(axes, layers):
            live = latents[(latents["layer"] == layer) & ~latents["dead"].astype(bool)]["relative_norm"].dropna()
            ax.hist(live.to_numpy(), bins=edges, color="#4c72b0", log=True)
            for x in ([] if threshold is None else [threshold, 1.0 - threshold]):
                ax.axvline(x, color="0.4", linestyle="--", linewidth=0.8)
            ax.set_title(f"layer {layer} ({len(live)} live latents)")
            ax.set_xlabel("relative norm: tuned / (base + tuned)")
            ax.set_xlim(0, 1)
        axes[0].set_ylabel("latents (log)")
    return fig
