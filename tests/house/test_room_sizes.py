"""Small rooms: no file over 600 lines, no function over 80 lines, none outside the CLI with more than 8 parameters.

What is still over a limit is listed below with its size today. An entry may only shrink: a listed file or
function that grows fails, one that comes within the limit (or is gone) fails too until its entry is removed, and
anything new over a limit fails. So the lists can only get shorter.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

import bertology

ROOT = Path(bertology.__file__).parent
MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 80
MAX_PARAMETERS = 8

#: Files over MAX_FILE_LINES, with their line count today.
FILES: dict[str, int] = {
}
#: Functions over MAX_FUNCTION_LINES (``path:qualified.name``), with their length today.
FUNCTIONS: dict[str, int] = {
}
#: Functions outside the CLI with more than MAX_PARAMETERS parameters (``self``/``cls`` not counted), with their
#: count today. Public functions of the notebook API keep their keywords (users call them so); ``study/`` and
#: ``training/`` are being reshaped by other work.
PARAMETERS: dict[str, int] = {
    "api.py:compare": 9,
    "api.py:probe": 11,
    "commands/compare.py:compare": 9,
    "experiments/ablation.py:run_ablation_study": 9,
    "experiments/ablation_sweep.py:run_ablation": 9,
    "experiments/intervention_sweep.py:run_intervention": 10,
    "experiments/transplant_sweep.py:run_transplant": 10,
    "integrations/tracker.py:Tracker.__init__": 9,
    "integrations/trainer.py:BertologyCallback.__init__": 9,
    "commands/ablate.py:ablate": 11,
    "commands/probe.py:probe": 11,
    "commands/track.py:track": 9,
}


def _functions(tree: ast.Module):
    """Every function and method of a module with its qualified name (``Class.method``, ``outer.inner``)."""
    def walk(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield f"{prefix}{child.name}", child
                yield from walk(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, f"{prefix}{child.name}.")
            else:
                yield from walk(child, prefix)

    yield from walk(tree, "")


def parameter_count(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Positional, keyword-only, ``*args`` and ``**kwargs`` parameters, less a leading ``self`` or ``cls``."""
    a = node.args
    n = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + (a.vararg is not None) + (a.kwarg is not None)
    first = (a.posonlyargs + a.args)[:1]
    return n - bool(first and first[0].arg in ("self", "cls"))


def measure() -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
    """What is over each limit in the package today: files, long functions, functions with many parameters."""
    files, functions, parameters = {}, {}, {}
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        source = path.read_text(encoding="utf-8")
        if (n := source.count("\n")) > MAX_FILE_LINES:
            files[rel] = n
        for name, node in _functions(ast.parse(source)):
            if (length := node.end_lineno - node.lineno + 1) > MAX_FUNCTION_LINES:
                functions[f"{rel}:{name}"] = length
            if not rel.startswith("cli/") and (k := parameter_count(node)) > MAX_PARAMETERS:
                parameters[f"{rel}:{name}"] = k
    return files, functions, parameters


def _verdicts(found: dict[str, int], allowed: dict[str, int], limit: int, what: str) -> list[str]:
    lines = [f"{key}: {n} {what} (limit {limit}, not on the list)" for key, n in found.items() if key not in allowed]
    lines += [f"{key}: {found[key]} {what}, grew from {allowed[key]}" for key in found
              if key in allowed and found[key] > allowed[key]]
    lines += [f"{key}: {found.get(key, 'gone')} now (was {n}): shrink or remove its entry" for key, n in allowed.items()
              if found.get(key) != n and not (key in found and found[key] > n)]
    return lines


@pytest.fixture(scope="module")
def measured():
    return measure()


def test_no_file_over_the_limit_beyond_the_list(measured):
    assert not (bad := _verdicts(measured[0], FILES, MAX_FILE_LINES, "lines")), "\n".join(bad)


def test_no_function_over_the_limit_beyond_the_list(measured):
    assert not (bad := _verdicts(measured[1], FUNCTIONS, MAX_FUNCTION_LINES, "lines")), "\n".join(bad)


def test_no_function_with_too_many_parameters_beyond_the_list(measured):
    assert not (bad := _verdicts(measured[2], PARAMETERS, MAX_PARAMETERS, "parameters")), "\n".join(bad)


def test_the_measure_counts_what_it_says():
    """The counting itself: a method's ``self`` is free, ``*args``/``**kwargs`` count, nested names are qualified."""
    tree = ast.parse("class A:\n    def m(self, a, /, b, *c, d, **e):\n        def inner(x):\n            pass\n")
    found = dict(_functions(tree))
    assert set(found) == {"A.m", "A.m.inner"}
    assert parameter_count(found["A.m"]) == 5 and parameter_count(found["A.m.inner"]) == 1
    files, functions, parameters = measure()
    assert all(n > MAX_FILE_LINES for n in files.values()) and all(n > MAX_FUNCTION_LINES for n in functions.values())
    assert all(n > MAX_PARAMETERS for n in parameters.values()) and not any(k.startswith("cli/") for k in parameters)
