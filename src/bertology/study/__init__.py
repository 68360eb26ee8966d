"""Studies: one base against many tuned models (tasks x seeds, checkpoints of one run), and the commands above
``compare`` (ablate, probe, track, absa, patterns, view).

``bertology.study`` is also the notebook API's ``bt.study(spec)``: importing this package binds the name
``study`` on ``bertology`` to this module (Python always does so for a subpackage), so the module itself is
made callable and hands the call to :func:`bertology.api.study`.
"""
from __future__ import annotations

import importlib
import sys
import types
from typing import Any


class _CallableModule(types.ModuleType):
    """This package, callable as ``bt.study(spec, out=..., executor=...)``."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        # looked up by name: the api sits above this room, so a static import would point up the house
        return importlib.import_module("bertology.api").study(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
