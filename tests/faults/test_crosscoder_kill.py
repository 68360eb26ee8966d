"""Kill -9 a compare while its crosscoder trains, then the same command again: training resumes from its last
checkpoint (the manifest says from which step) and the finished tables equal an uninterrupted run's, bit for bit."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from kill_helpers import kill_when, run_command, run_status, run_tables  # noqa: E402

from bertology.state_files import load_state  # noqa: E402
from bertology.testing import SENTENCES, tiny_bert_pair  # noqa: E402

pytestmark = [pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL"), pytest.mark.slow]


def _args(base, tuned, data, out) -> list[str]:
    """A streamed buffer (4096 tokens of a ~7000-token budget) and 800 steps: seconds of training to land in."""
    return ["compare", "--base", str(base), "--tuned", str(tuned), "--data", str(data), "--out", str(out),
            "--analyses", "attention_change,crosscoder", "--max-examples", "600", "--crosscoder-latents", "64",
            "--crosscoder-k", "4", "--crosscoder-steps", "800", "--crosscoder-batch", "128",
            "--crosscoder-buffer", "4096", "--crosscoder-tokens", "7000", "--view-examples", "0", "--no-report"]


def _step(checkpoint: Path) -> int:
    try:
        return int(load_state(checkpoint)["step"])
    except Exception:  # absent, or being replaced while read
        return 0


def test_a_compare_killed_mid_training_resumes_the_crosscoder_and_ends_with_the_same_tables(tmp_path):
    base, tuned = tiny_bert_pair(tmp_path / "pair", planted=(1, 0))
    data = tmp_path / "d.txt"
    data.write_text("\n".join(SENTENCES[i % len(SENTENCES)] + " " + SENTENCES[(3 * i) % len(SENTENCES)]
                              for i in range(600)) + "\n", encoding="utf-8")
    full = run_command(_args(base, tuned, data, tmp_path / "full"))
    assert full.returncode == 0, full.stderr
    out = tmp_path / "cut"
    checkpoint = out / "partial" / "crosscoder" / "training.pt"
    kill_when(_args(base, tuned, data, out), lambda: _step(checkpoint) >= 100)
    killed_at = _step(checkpoint)
    assert run_status(out) == "running" and 100 <= killed_at < 800
    assert not (out / "tables" / "crosscoder_latents.parquet").exists()
    again = run_command(_args(base, tuned, data, out))
    assert again.returncode == 0, again.stderr
    assert run_status(out) == "complete"
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    training = manifest["analyses"]["crosscoder"]["training"]
    assert killed_at <= training["resumed_from_step"] < 800 and training["checkpoint_every"] == 50
    reference, tables = run_tables(tmp_path / "full"), run_tables(out)
    assert tables.keys() == reference.keys() and "crosscoder_latents" in tables
    for name, table in reference.items():
        pd.testing.assert_frame_equal(tables[name], table, check_exact=True, obj=name)
