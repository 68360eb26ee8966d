"""How much each head's attention changed in fine-tuning (Kovaleva et al. 2019, §4.3).

Per head and example: the cosine similarity of the flattened base and tuned attention maps, and the
mean Jensen-Shannon divergence (base 2) of their query rows; both averaged over examples.

``mode="cropped"`` (default) compares the maps of real tokens only. ``mode="padded"`` reproduces
Kovaleva's notebook: every example is padded to ``pad_length`` tokens and the whole map is flattened,
so the rows of padding queries count in the cosine (the JS divergence always uses real query rows).
"""
from __future__ import annotations

from collections.abc import Mapping
import math
from typing import Literal

import numpy as np
import pandas as pd
import torch

from bertology.activations.batch import PairBatch
from bertology.analyses.base import Analysis
from bertology.analyses.device_state import moved as _moved, to_device, zeros
from bertology.analyses.registry import AnalysisSpec, BuildContext
from bertology.settings import Setting
from bertology.conventions import setting as convention
from bertology.config import CompareConfig
from bertology.extremes import picks_text
from bertology.metrics.attention import map_cosine
from bertology.reach import ManyView, SeedNoise, Track, changes, views
from bertology.results import Result, weights_rows


class AttentionChange(Analysis):
    """Per-head cosine similarity and JS divergence between base and tuned attention maps.

    The three ``[layers, heads]`` float64 sums live where the maps are: they are added to on the
    maps' device each batch and cross to the host once, in ``compute``. The per-batch terms are the shared
    layer statistics' float64 (``dots``, ``js``), so the sums are float64 on every device but MPS (no
    float64 there: float32 sums, ~1e-7 relative per addition).
    """

    name = "attention_change"
    requires = frozenset({"attentions"})

    def __init__(self, num_layers: int, num_heads: int, mode: Literal["cropped", "padded"] = "cropped", pad_length: int = 200):
        if mode not in ("cropped", "padded"):
            raise ValueError(f"mode must be 'cropped' or 'padded', not {mode!r}")
        self.num_layers, self.num_heads = num_layers, num_heads
        self.mode, self.pad_length = mode, pad_length
        # [layers, heads] float64 sums (float32 on MPS, which has no float64), where the maps are once updated
        self.cos_sum, self.cos_sq, self.js_sum = (zeros((num_layers, num_heads), torch.float64) for _ in range(3))
        self.n = 0

    def _to(self, device: torch.device) -> None:
        """Move the accumulators to ``device`` (the first batch's, or a shard's when merging into an empty one)."""
        self.cos_sum, self.cos_sq, self.js_sum = (to_device(t, device, torch.float64)
                                                  for t in (self.cos_sum, self.cos_sq, self.js_sum))

    def params(self) -> dict:
        return {"mode": self.mode, "pad_length": self.pad_length if self.mode == "padded" else None,
                "js_base": 2, "num_layers": self.num_layers, "num_heads": self.num_heads}

    def extraction_options(self) -> dict:
        return {"pad_to": self.pad_length} if self.mode == "padded" else {}

    def update(self, batch: PairBatch) -> None:
        self._to(batch.base.attentions[1].device)
        n_rows = batch.mask.to(self.cos_sum.device, self.cos_sum.dtype).sum(-1)[:, None]  # [B, 1] real query rows
        for layer in range(1, self.num_layers + 1):
            a, b = batch.base.attentions[layer], batch.tuned.attentions[layer]  # [B, H, T, T]
            # Cosine parts and the JS divergence summed over real rows come with the statistics the
            # attention analyses share (one pass over both maps); JS = H(m) - (H(a) + H(b)) / 2.
            stats = batch.layer_stats(layer)
            if self.mode == "cropped":
                ab, aa, bb = stats.dots.unbind(-1)
                cos = ab / (aa.sqrt() * bb.sqrt()).clamp_min(1e-12)
            else:  # padded: the padding query rows count in the cosine
                cos = map_cosine(a, b, None, scratch=batch.scratch(a, 0))
            js = stats.js / n_rows / math.log(2.0)  # mean over real rows, bits
            self.cos_sum[layer - 1] += cos.sum(0)
            self.cos_sq[layer - 1] += (cos**2).sum(0)
            self.js_sum[layer - 1] += js.sum(0)
        self.n += batch.size

    def merge(self, other: "AttentionChange") -> "AttentionChange":
        self._check_mergeable(other)
        if other.n:
            if not self.n:
                self._to(other.cos_sum.device)
            with torch.inference_mode(False):
                for mine, theirs in ((self.cos_sum, other.cos_sum), (self.cos_sq, other.cos_sq), (self.js_sum, other.js_sum)):
                    mine += _moved(theirs, mine)
        self.n += other.n
        return self

    def compute(self) -> Result:
        if self.n == 0:
            raise ValueError("attention_change saw no examples")
        cos_sum, cos_sq, js_sum = (t.cpu().numpy().astype(np.float64) for t in (self.cos_sum, self.cos_sq, self.js_sum))
        mean = cos_sum / self.n
        var = np.maximum(cos_sq / self.n - mean**2, 0.0) * (self.n / max(self.n - 1, 1))
        layers, heads = np.meshgrid(np.arange(1, self.num_layers + 1), np.arange(self.num_heads), indexing="ij")
        df = pd.DataFrame(
            {
                "layer": layers.ravel(),
                "head": heads.ravel(),
                "cosine": mean.ravel(),
                "js_divergence": (js_sum / self.n).ravel(),
                "n_examples": self.n,
                "cosine_std": np.sqrt(var).ravel(),
                "mode": self.mode,
            }
        )
        return Result(self.name, df, self.params())


def layer_summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per-layer means of the head table: where in the network attention changed most."""
    return (
        table.groupby("layer", as_index=False)
        .agg(cosine=("cosine", "mean"), cosine_min=("cosine", "min"), js_divergence=("js_divergence", "mean"))
        .sort_values("layer")
    )


def summary(tables: Mapping[str, pd.DataFrame]) -> str:
    """The heads whose maps changed most (lowest cosine, highest JS divergence) and the mean cosine per layer."""
    t = weights_rows(tables["attention_change"])
    by_cos = t.sort_values(["cosine", "layer", "head"])
    by_js = t.sort_values(["js_divergence", "cosine"], ascending=[False, True])
    per_layer = layer_summary(t)
    labels = lambda d: [f"L{r.layer}H{r.head}" for r in d.itertuples()]  # noqa: E731
    # each pick in the decimals that tell it from the next head (or "all 72 heads ≥ 0.9995" when none can be)
    return ("attention change: lowest cosine " + picks_text(labels(by_cos), by_cos["cosine"].tolist(), 3, lowest=True)
            + "; highest JS divergence "
            + picks_text(labels(by_js), by_js["js_divergence"].tolist(), 3, lowest=False)
            + "; mean cosine by layer " + " ".join(f"{c:.3f}" for c in per_layer["cosine"]))


def _build(config: CompareConfig, ctx: BuildContext) -> AttentionChange:
    return AttentionChange(ctx.num_layers, ctx.num_heads, config.attention_mode, config.pad_length)


SETTINGS = (
    convention("attention_mode", paper="Kovaleva et al. 2019"),
    Setting("pad_length", 200, "Length of the padded maps in --attention-mode padded.", minimum=1,
            paper="Kovaleva et al. 2019"),
)

SPEC = AnalysisSpec("attention_change", _build, ("attention_change",), summary=summary, settings=SETTINGS,
                    per_measure=True, seed_noise=SeedNoise(pairwise=True, extract=changes.attention_change),
                    many_view=ManyView("Attention change: mean 1 - cosine(base, tuned) over the heads of each layer",
                                       views.attention_change_view),
                    track=Track(views.attention_change_scalars))
