"""Every experiment, one line each: its name and the module that ends with its ``SPEC``."""
from __future__ import annotations

from bertology.catalog import Catalog
from bertology.experiments.registry import ExperimentSpec

#: In the order they run after the shared extraction.
EXPERIMENTS: Catalog[ExperimentSpec] = Catalog("experiment", {
    "weight_change": "bertology.experiments.weight_change",
    "probe": "bertology.experiments.probe",
    "ablation": "bertology.experiments.ablation",
    "crosscoder": "bertology.experiments.crosscoder",  # runs only when named (it trains a dictionary)
    "activation_difference": "bertology.experiments.activation_difference",  # runs only when named
    "changed_vs_needed": "bertology.experiments.changed_vs_needed",  # derived: reads the tables above
    "measure_agreement": "bertology.experiments.measure_agreement",  # derived: the attention analyses' measures
}, ExperimentSpec)
