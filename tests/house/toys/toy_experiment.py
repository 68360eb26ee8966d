"""A toy experiment (one module ending with its SPEC): the tuned model's weights' squared distance from the base's,
per parameter tensor count. Registered by ``tests/house/test_extension_points.py`` with one catalog line."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import pandas as pd

from bertology.experiments.registry import ExperimentContext, ExperimentOutcome, ExperimentSpec
from bertology.results import Result
from bertology.settings import Setting

NAME = "toy_weight_distance"


@dataclass(frozen=True)
class ToySettings:
    toy_power: int = 2

    def to_dict(self) -> dict:
        return {"toy_power": self.toy_power}


def _run(ctx: ExperimentContext) -> ExperimentOutcome:
    base, tuned = dict(ctx.pair.base.model.named_parameters()), dict(ctx.pair.tuned.model.named_parameters())
    power = ctx.config.toy_power
    distance = sum(float(((tuned[n] - p).detach().abs() ** power).sum()) for n, p in base.items())
    table = pd.DataFrame({"metric": ["distance"], "value": [distance], "n_tensors": [len(base)]})
    return ExperimentOutcome({NAME: Result(NAME, table, {"toy_power": power})}, manifest={"toy_power": power})


def summary(tables: Mapping[str, pd.DataFrame]) -> str:
    return f"toy distance {float(tables[NAME]['value'].iloc[0]):g}"


SETTINGS = (Setting("toy_power", 2, "Power of the toy distance.", minimum=1),)

SPEC = ExperimentSpec(NAME, "the toy weight distance", lambda config: (NAME,), lambda config: ToySettings(config.toy_power),
                      lambda ctx: None, _run, summary=summary, settings=SETTINGS)
