"""What the extraction loop feeds: anything with ``requires``, ``update`` and ``extraction_options``.

The loop depends on this protocol only, so ``activations`` never imports ``analyses`` (the streaming
analyses build on the loop, not the other way round).
"""
from __future__ import annotations

from typing import Protocol

from bertology.activations.batch import PairBatch


class Consumer(Protocol):
    """One party fed by the extraction loop: an analysis, a store, a test probe."""

    #: Subset of {"hidden_states", "attentions"}: what the loop must capture for it.
    requires: frozenset[str]

    def extraction_options(self) -> dict:
        """Requests to the loop, e.g. ``{"pad_to": 200}``."""
        ...

    def update(self, batch: PairBatch) -> None:
        """Take one batch."""
        ...
