"""Tracking's choices come from the specs that declare ``track``; asking for them imports no analysis (and no torch)
while the catalog holds the entries the generated snapshot was read from."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bertology import keywords
from bertology.analyses.catalog import ANALYSES
from bertology.reach import catalog_entries, declared, tracked_names

TOYS = Path(__file__).parents[1] / "house" / "toys"


def test_the_snapshot_equals_the_specs():
    assert keywords.TRACKABLE == tuple(declared("track"))
    assert keywords.TRACKABLE_FROM == catalog_entries("track")
    assert tracked_names() == keywords.TRACKABLE


def test_an_added_analysis_is_read_from_its_spec(monkeypatch):
    monkeypatch.syspath_prepend(str(TOYS))
    with ANALYSES.added("toy_norm", "toy_reach_analysis"):
        names = tracked_names()
    sys.modules.pop("toy_reach_analysis", None)
    assert names[-1] == "toy_norm" and names[:-1] == keywords.TRACKABLE


@pytest.mark.parametrize("argv", [["finetune", "--help"], ["track", "--help"]])
def test_help_imports_no_torch(argv):
    code = ("import sys, runpy; sys.argv = ['bertology', *%r]\n"
            "try:\n    runpy.run_module('bertology', run_name='__main__')\nexcept SystemExit:\n    pass\n"
            "print('torch' in sys.modules, file=sys.stderr)" % (argv,))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert "analyses" in done.stdout, done.stdout[-500:]  # the flag whose choices are tracking's
    assert done.stderr.strip().splitlines()[-1] == "False", done.stderr[-2000:]
