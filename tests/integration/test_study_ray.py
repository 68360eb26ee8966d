"""``bertology study --executor ray``: a local Ray instance with 2 CPUs gives the local executor's tables exactly."""
from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parent))
from study_helpers import tiny_study  # noqa: E402

ray = pytest.importorskip("ray")
pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]  # tests/conftest.py; Ray's workers run one thread too (OMP_NUM_THREADS=1)


@pytest.fixture
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def test_ray_executor_gives_the_local_executors_tables(tmp_path, local_ray):
    import bertology.cli  # noqa: F401
    from bertology.cli.app import app

    spec = tiny_study(tmp_path, extra="report = false\n")
    result = CliRunner().invoke(app, ["study", str(spec), "--executor", "ray", "--out", str(tmp_path / "ray")])
    assert result.exit_code == 0, result.output
    assert ray.is_initialized()  # a Ray the caller started is left running
    m = json.loads((tmp_path / "ray" / "manifest.json").read_text())
    assert m["executor"] == "ray" and {j["status"] for j in m["jobs"]} == {"done"} and len(m["jobs"]) == 11  # 4 fine-tunes, 7 comparisons

    from bertology.studies.runner import run_study

    local = run_study(spec, tmp_path / "local")
    assert local.manifest["executor"] == "local"
    names = sorted(p.stem for p in (tmp_path / "local" / "tables").glob("*.parquet"))
    assert names == sorted(p.stem for p in (tmp_path / "ray" / "tables").glob("*.parquet"))
    assert {"seedpair_attention_change", "own_attention_change", "own_seedpair_attention_change", "own_study_effects"} <= set(names)
    for name in names:
        pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "ray" / "tables" / f"{name}.parquet"),
                                      pd.read_parquet(tmp_path / "local" / "tables" / f"{name}.parquet"))
    for run in ("a/s0", "b/s1"):  # the fine-tunes themselves: same held-out metrics
        a = json.loads((tmp_path / "ray" / "finetune" / run / "manifest.json").read_text())["metrics"]
        b = json.loads((tmp_path / "local" / "finetune" / run / "manifest.json").read_text())["metrics"]
        assert a == b
    shutil.rmtree(tmp_path / "ray")
