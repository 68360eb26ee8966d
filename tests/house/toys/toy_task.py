"""A toy task in one module ending with its TASK: classification judged by a metric of its own name. Registered by
``tests/house/test_extension_points.py`` with one line in ``tasks/catalog.py:TASKS``."""
from __future__ import annotations

from bertology.tasks.classification import Classification


class ToyClassification(Classification):
    """Classification under another name: what a new task module declares first."""

    name = "toy_classification"


TASK = ToyClassification()
