"""A catalog: names mapped to the modules that declare them (``SPEC`` at the module's end).

The analyses and the experiments each keep one. Names are read without importing anything (the
command line's help lists them, and importing an analysis pulls in torch); a module is imported
when its spec is asked for.
"""
from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class Catalog(Generic[T]):
    """Ordered ``name -> module`` entries of one kind (``"analysis"``, ``"experiment"``); ``spec_type``: the class of
    its specs, which says what they may declare without importing one (a reader of a reach the class lacks skips the
    catalog)."""

    def __init__(self, kind: str, modules: dict[str, str], spec_type: type | None = None) -> None:
        self.kind = kind
        self.modules = modules
        self.spec_type = spec_type

    def may_declare(self, attribute: str) -> bool:
        """Whether a spec of this catalog can declare ``attribute`` (True when the spec class is not known)."""
        return self.spec_type is None or hasattr(self.spec_type, attribute)

    def names(self) -> tuple[str, ...]:
        """Every name, in catalog order (nothing imported)."""
        return tuple(self.modules)

    def spec(self, name: str) -> T:
        """The spec declared by ``name``'s module (KeyError for a name not in the catalog)."""
        module = self.modules[name]
        found: Any = importlib.import_module(module).SPEC
        if found.name != name:
            raise ValueError(f"{module} declares the {self.kind} {found.name!r}, not {name!r}")
        return found

    def specs(self) -> tuple[T, ...]:
        """Every spec, in catalog order."""
        return tuple(self.spec(n) for n in self.modules)

    @contextmanager
    def added(self, name: str, module: str) -> Iterator[None]:
        """``name -> module`` in the catalog for the block's length (a test registers a toy one so), then removed."""
        if name in self.modules:
            raise ValueError(f"the {self.kind} {name!r} is in the catalog already")
        self.modules[name] = module
        try:
            yield
        finally:
            del self.modules[name]
