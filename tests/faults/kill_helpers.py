"""What the kill -9 suites share: a tiny classifier pair and labelled data, the command run in a subprocess, the
kill at a point the run folder shows, and the tables it left (tests/faults/test_kills*.py)."""
from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from bertology.testing import SENTENCES, tiny_bert_pair


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    folder = tmp_path_factory.mktemp("kills")
    base, tuned = tiny_bert_pair(folder / "pair", classifier=True)
    data = folder / "d.csv"
    with data.open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["text", "label"])
        for i in range(600):  # enough work that the kill lands before the end
            w.writerow([SENTENCES[i % len(SENTENCES)] + " " + SENTENCES[(3 * i) % len(SENTENCES)], i % 2])
    return folder, base, tuned, data


def compare_args(base, tuned, data, out) -> list[str]:
    return ["compare", "--base", str(base), "--tuned", str(tuned), "--data", str(data), "--out", str(out),
            "--analyses", "attention_change,representation_similarity,ablation", "--max-examples", "600",
            "--ablation-examples", "300", "--ablation-bootstrap", "50", "--view-examples", "0", "--no-report"]


def run_command(args: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "bertology", *args], capture_output=True, text=True, env=env, timeout=300)


def kill_when(args: list[str], ready, timeout: float = 120.0) -> None:
    """Start the command and SIGKILL it as soon as ``ready()`` is true; fail if it finished first."""
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "bertology", *args], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=env)
    start = time.monotonic()
    try:
        while not ready():
            assert proc.poll() is None, "the run finished before the kill point: give it more work"
            assert time.monotonic() - start < timeout, "the kill point never came"
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(timeout=30)


def run_status(out: Path) -> str | None:
    try:
        return json.loads((out / "manifest.json").read_text(encoding="utf-8")).get("status")
    except (OSError, ValueError):
        return None


def run_tables(out: Path) -> dict[str, pd.DataFrame]:
    return {p.stem: pd.read_parquet(p) for p in sorted((out / "tables").glob("*.parquet"))}




def ablation_units(out: Path) -> int:
    return len(list((out / "partial" / "ablation" / "units").glob("*.npz")))
