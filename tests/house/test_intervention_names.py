"""Interventions are objects: no module compares a mode string (``mode == "revert"``, ``"transplant" in modes``).

The sweep, the layer cache, scoring, the studies and the report read what they need from the intervention
(:mod:`bertology.experiments.interventions`: its table, its report section, its words, whether it needs the base
model or goes with head importance). A name is compared only where the interventions are named: the registry, and
the hooks that implement the head masks' three kinds (``models/ablate.py``, below the experiments).
"""
from __future__ import annotations

import ast
from pathlib import Path

import bertology
from bertology.config import ABLATION_MODES

SRC = Path(bertology.__file__).parent
#: The files allowed to compare an intervention's name: the registry, and the head-mask hooks (uniform/zero/mean).
ALLOWED = {"experiments/interventions.py", "models/ablate.py"}
#: Names that mean nothing but an intervention (``revert``, ``transplant``): any comparison with them counts.
ONLY_INTERVENTIONS = {"revert", "transplant"}


def _names(node: ast.AST) -> set[str]:
    """The intervention names a comparison operand spells as string literals (alone or in a tuple, list or set)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value} & set(ABLATION_MODES)
    if isinstance(node, ast.Tuple | ast.List | ast.Set):
        return set().union(*(_names(e) for e in node.elts)) if node.elts else set()
    return set()


def mode_comparisons(source: str) -> list[tuple[int, str]]:
    """``(line, text)`` of every comparison of a mode string: a literal intervention name against something whose
    source says ``mode`` (``uniform``, ``zero`` and ``mean`` are words of other settings too), or against anything
    when the name is ``revert`` or ``transplant``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        operands = [node.left, *node.comparators]
        for k, operand in enumerate(operands):
            names = _names(operand)
            others = " ".join(ast.unparse(o) for j, o in enumerate(operands) if j != k)
            if names & ONLY_INTERVENTIONS or (names and "mode" in others.lower()):
                found.append((node.lineno, ast.unparse(node)))
                break
    return found


def test_the_counter_finds_what_it_should():
    hits = mode_comparisons('if mode == "revert": pass\nif "transplant" in tables: pass\n'
                            'x = settings.mode in ("revert", "transplant")\nif pooling == "mean": pass\n'
                            'if t["mode"] == "zero": pass\nif REVERT.name == mode: pass\n')
    assert [line for line, _ in hits] == [1, 2, 3, 5]


def test_no_module_compares_a_mode_string():
    found = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel in ALLOWED:
            continue
        found += [f"{rel}:{line}: {text}" for line, text in mode_comparisons(path.read_text(encoding="utf-8"))]
    assert not found, ("mode strings compared outside the intervention registry (read the intervention's attributes "
                       "instead, bertology.experiments.interventions):\n" + "\n".join(found))
