"""Nothing bertology reads back is unpickled: every ``torch.load`` passes ``weights_only=True``, every ``np.load``
``allow_pickle=False``, and no ``pickle``/``joblib``/``dill``/``pandas`` pickle reader is called. A run folder, a
checkpoint or a model folder may come from someone else, and unpickling runs whatever code the file names."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest
import torch

from bertology.errors import BertologyError
from bertology.state_files import load_state, save_state

SRC = Path(__file__).resolve().parents[2] / "src" / "bertology"
#: (module or object name, function) pairs that unpickle whatever the file holds
UNSAFE = {("pickle", "load"), ("pickle", "loads"), ("pickle", "Unpickler"), ("joblib", "load"), ("dill", "load"),
          ("dill", "loads"), ("pd", "read_pickle"), ("pandas", "read_pickle"), ("cloudpickle", "load")}


def _keyword(call: ast.Call, name: str) -> object:
    """The constant value of keyword ``name`` of ``call`` (``...`` when absent or not a constant)."""
    for kw in call.keywords:
        if kw.arg == name:
            return kw.value.value if isinstance(kw.value, ast.Constant) else ...
    return ...


def unsafe_loads(source: str) -> list[tuple[int, str]]:
    """(line, what) of every call in ``source`` that could unpickle."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)):
            continue
        owner, attr = node.func.value.id, node.func.attr
        if (owner, attr) == ("torch", "load") and _keyword(node, "weights_only") is not True:
            found.append((node.lineno, "torch.load without weights_only=True"))
        elif (owner, attr) == ("np", "load") and _keyword(node, "allow_pickle") is not False:
            found.append((node.lineno, "np.load without allow_pickle=False"))
        elif (owner, attr) in UNSAFE:
            found.append((node.lineno, f"{owner}.{attr}"))
    return found


def test_the_scanner_finds_each_kind_of_unpickling():
    bad = ("torch.load(p)\ntorch.load(p, weights_only=False)\nnp.load(p)\npickle.load(f)\npd.read_pickle(p)\n"
           "torch.load(p, weights_only=True)\nnp.load(p, allow_pickle=False)\n")
    assert [line for line, _ in unsafe_loads(bad)] == [1, 2, 3, 4, 5]


def test_no_source_file_unpickles():
    found = [f"{path.relative_to(SRC)}:{line}: {what}" for path in sorted(SRC.rglob("*.py"))
             for line, what in unsafe_loads(path.read_text(encoding="utf-8"))]
    assert not found, "\n".join(found)


class _Payload:
    """Unpickling this calls ``os.system``-like code: here it writes a marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "ran"))


def test_a_pickled_payload_in_a_state_file_runs_no_code_and_is_refused_naming_the_file(tmp_path):
    marker, state = tmp_path / "marker", tmp_path / "trainer_state.pt"
    torch.save({"step": 3, "evil": _Payload(marker)}, state)
    with pytest.raises(BertologyError, match="trainer_state.pt") as err:
        load_state(state, remedy="Delete it.")
    assert not marker.exists()
    assert "Delete it." in str(err.value) and "\n" not in str(err.value)


def test_a_state_with_numpy_round_trips_exactly(tmp_path):
    import numpy as np

    rng = np.random.RandomState(7).get_state()
    state = {"rng": rng, "active": np.array([True, False]), "lr": np.array([1e-3, 5e-4]), "x": np.float64(0.25),
             "w": torch.arange(6.0).reshape(2, 3), "rows": [{"value": np.float32(0.5)}]}
    save_state(state, tmp_path / "s.pt")
    back = load_state(tmp_path / "s.pt")
    assert back["rng"][0] == "MT19937" and back["rng"][1].dtype == np.uint32
    assert np.array_equal(back["rng"][1], rng[1]) and back["rng"][2:] == rng[2:]
    restored = np.random.RandomState()
    restored.set_state(back["rng"])
    assert restored.rand() == np.random.RandomState(7).rand()
    assert back["active"].dtype == bool and back["active"].tolist() == [True, False]
    assert back["lr"].tolist() == [1e-3, 5e-4] and back["x"] == 0.25 and back["rows"][0]["value"] == 0.5
    assert torch.equal(back["w"], state["w"])
