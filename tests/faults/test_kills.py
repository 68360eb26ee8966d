"""Kill -9 in the middle of a run, then the same command again: it resumes, and its tables equal an
uninterrupted run's (no row lost or duplicated).

The command runs in a subprocess that is killed with SIGKILL (no clean-up code runs) once the run
folder shows the point to kill at: the manifest saying ``running`` (the shared extraction), or some
finished ablation units in ``partial/`` (the ablation sweep). A kill that came too late (the run had
already finished) fails the test rather than passing it vacuously.

The kills of fine-tuning and of probe training are in ``test_kills_training.py`` (two files, so that
``--dist loadfile`` gives them to two workers: together they were the suite's longest file).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from kill_helpers import ablation_units, compare_args, kill_when, run_command, run_status, run_tables  # noqa: E402
from kill_helpers import setup  # noqa: E402, F401 (a module fixture)

pytestmark = [pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL"), pytest.mark.slow]


@pytest.fixture(scope="module")
def reference(setup):
    folder, base, tuned, data = setup
    out = folder / "uninterrupted"
    done = run_command(compare_args(base, tuned, data, out))
    assert done.returncode == 0, done.stderr
    return run_tables(out)



@pytest.mark.parametrize("point", ["extraction", "ablation sweep"])
def test_a_killed_compare_resumes_and_ends_with_the_same_tables(setup, reference, point, tmp_path):
    _, base, tuned, data = setup
    out = tmp_path / "run"
    args = compare_args(base, tuned, data, out)
    if point == "extraction":
        kill_when(args, lambda: run_status(out) == "running" and not (out / "tables").exists())
        assert run_status(out) == "running" and not (out / "tables").exists()
    else:
        kill_when(args, lambda: ablation_units(out) >= 3)
        assert run_status(out) == "running" and (out / "tables" / "attention_change.parquet").exists()
        killed_units = ablation_units(out)
        assert 3 <= killed_units
    again = run_command(args)
    assert again.returncode == 0, again.stderr
    assert run_status(out) == "complete"
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    if point == "ablation sweep":
        assert set(manifest["resumed_tables"]) >= {"attention_change", "representation_similarity"}
        assert manifest["analyses"]["ablation"]["settings"]["n_bootstrap"] == 50
    tables = run_tables(out)
    assert tables.keys() == reference.keys()
    for name, table in reference.items():
        pd.testing.assert_frame_equal(tables[name], table, check_exact=True, obj=name)


def test_a_killed_ablate_resumes_its_sweep_and_ends_with_the_same_tables(setup, tmp_path):
    _, _, tuned, data = setup
    args = lambda out: ["ablate", "--model", str(tuned), "--data", str(data), "--out", str(out),  # noqa: E731
                        "--max-examples", "300", "--bootstrap", "50", "--no-report"]
    full = run_command(args(tmp_path / "full"))
    assert full.returncode == 0, full.stderr
    out = tmp_path / "cut"
    kill_when(args(out), lambda: ablation_units(out) >= 3)
    assert run_status(out) == "running" and not (out / "tables").exists()
    again = run_command(args(out))
    assert again.returncode == 0, again.stderr
    assert "ablations reused" in again.stderr + again.stdout
    for name, table in run_tables(tmp_path / "full").items():
        pd.testing.assert_frame_equal(run_tables(out)[name], table, check_exact=True, obj=name)
