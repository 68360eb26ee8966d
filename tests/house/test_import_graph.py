"""The package's import graph: no circle, no arrow back up, computing never imports drawing (grimp).

The layers, top to bottom, are the rooms of ARCHITECTURE.md: a module may import from its own room
and from rooms below it, never from a room above. Lazy imports inside functions count too (grimp
reads every ``import`` statement), so a circle cannot hide behind a function-level import.
"""
from __future__ import annotations

import grimp
import pytest

#: Top to bottom. Rooms on one line (a set) are independent siblings: neither may import the other.
LAYERS: list[str | set[str]] = [
    "cli",
    {"api", "signatures"},  # signatures: writes keywords.py from every declaration (a generator, not imported)
    "demo",
    "integrations",
    "studies",
    {"commands.ablate", "commands.probe", "commands.track", "commands.absa", "commands.patterns", "commands.view"},
    "commands.inputs",
    "multicompare",
    "pipeline",
    "report",
    "viz",
    {"experiments", "training"},
    "tasks",
    "analyses",
    "activations",
    {"models", "data", "metrics"},
    {"commands.base", "commands.compat"},  # the lifecycle, below every command that runs in it
    {"runs", "conventions"},
    {"results", "config", "progress", "assets", "catalog", "view_format", "blas", "memory", "transfer", "state_files",
     "extremes"},
    "reach",
    "settings",
    {"errors", "keywords"},  # keywords: generated TypedDicts and defaults, no imports
]
#: Rooms that compute: none of them may import the drawing or reporting rooms.
COMPUTING = ("models", "data", "metrics", "activations", "analyses", "tasks", "experiments", "training")
DRAWING = ("viz", "report")


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph("bertology", include_external_packages=False)


def _layers() -> list[grimp.Layer]:
    out = []
    for entry in LAYERS:
        names = sorted(entry) if isinstance(entry, set) else [entry]
        out.append(grimp.Layer(*names, independent=isinstance(entry, set)))
    return out


def test_every_room_is_in_a_layer(graph):
    """A new top-level module or package must be placed in LAYERS, not slip past the check."""
    placed = {n for e in LAYERS for n in (e if isinstance(e, set) else {e})}
    ignored = {"__main__", "testing", "warmup"}  # entry point and test/benchmark helpers
    split = {n.split(".")[0] for n in placed if "." in n}  # rooms placed module by module (commands)
    unplaced = set()
    for module in graph.modules:
        parts = module.split(".")[1:]
        if not parts or parts[0] in ignored or (len(parts) == 1 and parts[0] in split):
            continue
        if not any(".".join(parts[:k]) in placed for k in range(1, len(parts) + 1)):
            unplaced.add(".".join(parts[:2]) if parts[0] in split else parts[0])
    assert unplaced == set()


def test_no_arrow_back_up(graph):
    illegal = graph.find_illegal_dependencies_for_layers(layers=_layers(), containers={"bertology"})
    lines = [f"{d.importer} -> {d.imported}: " + "; ".join(" -> ".join([*sorted(r.heads), *r.middle, *sorted(r.tails)])
                                                            for r in d.routes)
             for d in sorted(illegal, key=lambda d: (d.importer, d.imported))]
    assert not lines, "imports that go up a layer (or between siblings):\n" + "\n".join(lines)


def test_no_import_circle(graph):
    """No module imports (directly or through others) a module that imports it back."""
    circles = set()
    for module in graph.modules:
        for imported in graph.find_modules_directly_imported_by(module):
            if graph.chain_exists(imported, module):
                circles.add(tuple(sorted((module, imported))))
    assert not circles, f"import circles through: {sorted(circles)}"


@pytest.mark.parametrize("room", COMPUTING)
def test_computing_never_imports_drawing(graph, room):
    for drawing in DRAWING:
        chain = graph.find_shortest_chain(f"bertology.{room}", f"bertology.{drawing}", as_packages=True)
        assert chain is None, f"{room} reaches {drawing}: {' -> '.join(chain)}"
