"""The package's import graph: no circle, no arrow back up, computing never imports drawing (grimp).

The layers, top to bottom, are the rooms of ARCHITECTURE.md: a module may import from its own room
and from rooms below it, never from a room above. Lazy imports inside functions count too (grimp
reads every ``import`` statement), so a circle cannot hide behind a function-level import. So do the
imports a string hides: a literal ``importlib.import_module("bertology.x")`` and a catalog's
``"bertology.x"`` or ``"bertology.x:NAME"`` entry are read as arrows from the module that holds the string
(:func:`hidden_imports`). The package's root (``bertology/__init__``, the face: its strings name
what ``bt.NAME`` imports when first used) sits above every room and is not read.
"""
from __future__ import annotations

import ast
from pathlib import Path

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
    "commands.compare",
    {"commands.selection", "commands.compare_data"},  # what compare selects; its data (both read by others)
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


def hidden_imports(source: str, modules: set[str]) -> set[str]:
    """The modules of ``modules`` that ``source`` names in a string literal (docstrings aside): the argument of
    ``import_module("bertology.x")``, a catalog entry ``"bertology.x"`` or ``"bertology.x:NAME"``."""
    tree = ast.parse(source)
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    named = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            name = node.value.split(":")[0]
            if name in modules:
                named.add(name)
    return named


def _graph_with_hidden_imports() -> grimp.ImportGraph:
    """grimp's graph of the package, plus an arrow for every module a string of a module names."""
    graph = grimp.build_graph("bertology", include_external_packages=False)
    import bertology

    root = Path(bertology.__file__).parent
    modules = set(graph.modules)
    for module in sorted(modules - {"bertology"}):  # the root's strings are the face's lazy names, above every room
        path = root.joinpath(*module.split(".")[1:])
        path = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        for imported in hidden_imports(path.read_text(encoding="utf-8"), modules) - {module, "bertology"}:
            graph.add_import(importer=module, imported=imported, line_number=0, line_contents="(a string)")
    return graph


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    """The imports and the arrows strings hide (for the layers and the computing/drawing rule)."""
    return _graph_with_hidden_imports()


@pytest.fixture(scope="module")
def import_graph() -> grimp.ImportGraph:
    """The import statements only (for circles: a catalog names its members lazily, and a member may read its own
    catalog, as ablation reads the probe's spec; that is the registry, not a circle in what loads what)."""
    return grimp.build_graph("bertology", include_external_packages=False)


def test_strings_that_name_modules_are_read_as_imports():
    """The two ways a string hides an import are found; docstrings and other strings are not."""
    source = '''"""bertology.api is named here, in a docstring."""
import importlib
ENTRIES = {"a": "bertology.analyses.catalog:ANALYSES"}
def up():
    """bertology.cli"""
    return importlib.import_module("bertology.api").study, "bertology.nowhere", "bertology"
'''
    modules = {"bertology", "bertology.api", "bertology.cli", "bertology.analyses.catalog"}
    assert hidden_imports(source, modules) == {"bertology.api", "bertology.analyses.catalog", "bertology"}


def test_an_arrow_a_string_hides_is_refused_when_it_points_up():
    """A low room naming a catalog by a string (as ``reach`` once did) is an arrow back up."""
    hidden = _graph_with_hidden_imports()
    hidden.add_import(importer="bertology.reach", imported="bertology.analyses.catalog", line_number=0,
                      line_contents="(a string)")
    illegal = hidden.find_illegal_dependencies_for_layers(layers=_layers(), containers={"bertology"})
    assert {(d.importer, d.imported) for d in illegal} == {("bertology.reach", "bertology.analyses")}


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


def test_no_import_circle(import_graph):
    """No module imports (directly or through others) a module that imports it back."""
    graph = import_graph
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


def test_no_runtime_room_imports_the_test_helpers(graph):
    """``bertology.testing`` (tiny models, tokenizers, a synthetic study) is for tests: no other room imports it."""
    helpers = {m for m in graph.modules if m == "bertology.testing" or m.startswith("bertology.testing.")}
    importers = {(importer, imported) for imported in helpers for importer in graph.find_modules_that_directly_import(imported)
                 if importer not in helpers}
    assert not importers, f"runtime modules importing the test helpers: {sorted(importers)}"
