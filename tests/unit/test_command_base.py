"""commands/base.py: the one lifecycle a command gets by declaring its inputs, manifest and work."""
from __future__ import annotations

import json
from dataclasses import dataclass, field

import pandas as pd
import pytest

from bertology.commands.base import Command, OpenRun, hold
from bertology.errors import BertologyError
from bertology.results import read_table
from bertology.runs import build_manifest, fingerprint


@dataclass
class Toy(Command[dict]):
    """Squares of ``n`` numbers; counts how often it worked, and can be told to fail."""

    name = "toy"
    n: int = 3
    fail: bool = False
    calls: list = field(default_factory=list)

    def inputs(self):
        return [{"n": self.n}]

    def reuse(self, run: OpenRun):
        if run.resumed and run.previous.get("status") == "complete":
            return {"reused": True, "created": run.previous["created"]}
        return None

    def manifest(self, run: OpenRun) -> dict:
        return build_manifest(self.name, self.fingerprint(), created=run.created, config={"n": self.n})

    def work(self, run: OpenRun):
        self.calls.append(run.path)
        assert json.loads((run.path / "manifest.json").read_text())["status"] == "running"  # marked before the work
        if self.fail:
            raise RuntimeError("boom")
        return {"squares": pd.DataFrame({"x": range(self.n), "y": [i * i for i in range(self.n)]})}

    def finished(self, run, manifest, tables):
        return {"tables": list(tables), "rows": sum(len(t) for t in tables.values())}

    def result(self, run, manifest, tables):
        assert run.opened.lock is None  # the folder is released before the result (the report may take it again)
        return {"reused": False, "manifest": manifest, "tables": dict(tables)}


def _manifest(path):
    return json.loads((path / "manifest.json").read_text())


def test_run_writes_tables_and_a_finished_manifest(tmp_path):
    done = Toy().run(tmp_path / "run")
    m = _manifest(tmp_path / "run")
    assert m["status"] == "complete" and m["kind"] == "toy" and m["tables"] == ["squares"] and m["rows"] == 3
    assert m["fingerprint"] == fingerprint({"n": 3}) == done["manifest"]["fingerprint"]
    assert m["wall_time_s"] >= 0 and "finished" in m
    assert read_table(tmp_path / "run", "squares")["y"].tolist() == [0, 1, 4]


def test_an_identical_finished_run_is_reused_without_working(tmp_path):
    first = Toy()
    first.run(tmp_path / "run")
    created = _manifest(tmp_path / "run")["created"]
    again = Toy()
    assert again.run(tmp_path / "run") == {"reused": True, "created": created}
    assert again.calls == []


def test_other_inputs_are_refused_and_a_failure_is_recorded(tmp_path):
    Toy().run(tmp_path / "run")
    with pytest.raises(BertologyError, match="holds another run"):
        Toy(n=4).run(tmp_path / "run")
    with pytest.raises(RuntimeError, match="boom"):
        Toy(n=4, fail=True).run(tmp_path / "run", overwrite=True)
    m = _manifest(tmp_path / "run")
    assert m["status"] == "failed" and "boom" in m["error"]
    fixed = Toy(n=4)  # a failed run of the same kind is replaced without --overwrite, and its work done again
    fixed.run(tmp_path / "run")
    assert fixed.calls and _manifest(tmp_path / "run")["rows"] == 4


def test_hold_keeps_created_only_when_resuming_and_lists_tables_in_order(tmp_path):
    with hold(tmp_path / "run", "toy", "f1") as run:
        assert run.created is None and not run.resumed
        run.write_tables({"b": pd.DataFrame({"v": [1]}), "a": pd.DataFrame({"v": [2]})})
        run.complete({**run.header(), "tables": run.tables})
    assert _manifest(tmp_path / "run")["tables"] == ["b", "a"]
    created = _manifest(tmp_path / "run")["created"]
    with hold(tmp_path / "run", "toy", "f1") as run:
        assert run.resumed and run.created == created and run.header()["created"] == created
    with hold(tmp_path / "run", "toy", "f1", fresh=True) as run:
        assert not run.resumed and run.created is None
