"""bertology: what fine-tuning changed inside a BERT-family encoder.

One import is enough (``import bertology as bt``); it is light: torch and transformers are imported when
a function that needs a model is first called.

    run = bt.compare("minilm", "runs/demo-model/model", "reviews.txt", analyses=["attention_change"])
    run.attention_change          # a DataFrame
    bt.load_run("runs/demo")      # any run folder -> its result object
"""
from __future__ import annotations

from typing import Any

from bertology import reach as _reach
from bertology.errors import BertologyError

__version__ = "0.1.0"

#: The public functions and types, and the module each lives in (imported on first use).
_LAZY = {
    "compare": "bertology.api",
    "finetune": "bertology.api",
    "ablate": "bertology.api",
    "probe": "bertology.api",
    "absa": "bertology.api",
    "view": "bertology.api",
    "track": "bertology.api",
    "capture": "bertology.api",
    "render_report": "bertology.api",
    "demo_data": "bertology.api",
    "study": "bertology.api",
    "load_run": "bertology.api",
    "Run": "bertology.api",
}

__all__ = ["BertologyError", "__version__", *_LAZY]

#: The catalogs whose specs declare a table's reach, handed down to :mod:`bertology.reach`: this face sits above
#: every room, so rooms below the catalogs (config's ``track_analyses`` choices) read the specs with no import
#: pointing up. Nothing is imported here; a catalog is when a reach is first asked for.
_reach.hand_down("bertology.analyses.catalog:ANALYSES", "bertology.experiments.catalog:EXPERIMENTS")

def __getattr__(name: str) -> Any:
    """``bertology.compare`` and friends, imported when first used (PEP 562)."""
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'bertology' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
