"""A toy streaming analysis that declares its reach on its spec, and nothing else in the package names it.

``toy_norm``: each layer's mean hidden-state norm over the real tokens, per model (``model, layer, value``).
Its spec says: a study judges ``tuned - base`` per layer against seed noise (per-model: the seed distance is
two seeds' changes apart), a many-model run shows ``tuned - base`` per layer and tuned model, and tracking
may record it (scalar ``bertology/toy_norm/layer_<l>``: the tuned model's value).
"""
from __future__ import annotations

import pandas as pd

from bertology.analyses.base import Analysis
from bertology.analyses.registry import AnalysisSpec
from bertology.reach import ManyView, SeedNoise, Track
from bertology.results import Result

NAME = "toy_norm"


class ToyNorm(Analysis):
    name = NAME
    requires = frozenset({"hidden_states"})

    def __init__(self, num_layers: int) -> None:
        self.num_layers = num_layers
        self.sums = {m: [0.0] * (num_layers + 1) for m in ("base", "tuned")}
        self.tokens = 0

    def update(self, batch) -> None:
        mask = batch.mask.bool()
        self.tokens += int(mask.sum())
        for model, captured in (("base", batch.base), ("tuned", batch.tuned)):
            for layer, h in enumerate(captured.hidden_states):
                self.sums[model][layer] += float(h[mask].double().norm(dim=-1).sum())

    def compute(self) -> Result:
        rows = [{"model": m, "layer": layer, "value": s[layer] / self.tokens}
                for m, s in self.sums.items() for layer in range(self.num_layers + 1)]
        return Result(NAME, pd.DataFrame(rows))

    def merge(self, other):
        for m in self.sums:
            self.sums[m] = [a + b for a, b in zip(self.sums[m], other.sums[m])]
        self.tokens += other.tokens
        return self


def change(df: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """``tuned - base`` of ``value`` per layer: one unit per layer (``L<l>``), metric ``norm``."""
    wide = df.pivot_table(index=[*keys, "layer"], columns="model", values="value").reset_index()
    wide.columns.name = None
    wide["change"] = wide["tuned"] - wide["base"]
    wide["metric"], wide["level"], wide["head"] = "norm", "layer", pd.NA
    wide["unit"] = "L" + wide["layer"].astype(str)
    return wide


def side_by_side(df: pd.DataFrame) -> pd.DataFrame:
    """``tuned - base`` per layer (rows) and tuned model (columns; a many-model table names it in ``tuned``)."""
    per = change(df.rename(columns={"tuned": "tuned_model"}), ["tuned_model"])
    return per.pivot_table(index="layer", columns="tuned_model", values="change", sort=False)


def scalars(table: pd.DataFrame) -> dict[str, float]:
    """The tuned model's value per layer."""
    tuned = table[table["model"] == "tuned"]
    return {f"bertology/toy_norm/layer_{r.layer}": float(r.value) for r in tuned.itertuples()}


SPEC = AnalysisSpec(NAME, lambda config, ctx: ToyNorm(ctx.num_layers), (NAME,),
                    seed_noise=SeedNoise(pairwise=False, extract=change),
                    many_view=ManyView("Toy norm: tuned - base per layer", side_by_side),
                    track=Track(scalars))
