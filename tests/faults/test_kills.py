"""Kill -9 in the middle of a run, then the same command again: it resumes, and its tables equal an
uninterrupted run's (no row lost or duplicated).

The command runs in a subprocess that is killed with SIGKILL (no clean-up code runs) once the run
folder shows the point to kill at: the manifest saying ``running`` (the shared extraction), or some
finished ablation units in ``partial/`` (the ablation sweep). A kill that came too late (the run had
already finished) fails the test rather than passing it vacuously.
"""
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

from bertology.errors import BertologyError
from bertology.testing import SENTENCES, tiny_bert_pair

pytestmark = [pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL"), pytest.mark.slow]


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


def _compare_args(base, tuned, data, out) -> list[str]:
    return ["compare", "--base", str(base), "--tuned", str(tuned), "--data", str(data), "--out", str(out),
            "--analyses", "attention_change,representation_similarity,ablation", "--max-examples", "600",
            "--ablation-examples", "300", "--ablation-bootstrap", "50", "--view-examples", "0", "--no-report"]


def _run(args: list[str]) -> subprocess.CompletedProcess:
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "bertology", *args], capture_output=True, text=True, env=env, timeout=300)


def _kill_when(args: list[str], ready, timeout: float = 120.0) -> None:
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


def _status(out: Path) -> str | None:
    try:
        return json.loads((out / "manifest.json").read_text(encoding="utf-8")).get("status")
    except (OSError, ValueError):
        return None


def _tables(out: Path) -> dict[str, pd.DataFrame]:
    return {p.stem: pd.read_parquet(p) for p in sorted((out / "tables").glob("*.parquet"))}


@pytest.fixture(scope="module")
def reference(setup):
    folder, base, tuned, data = setup
    out = folder / "uninterrupted"
    done = _run(_compare_args(base, tuned, data, out))
    assert done.returncode == 0, done.stderr
    return _tables(out)


def _units(out: Path) -> int:
    return len(list((out / "partial" / "ablation" / "units").glob("*.npz")))


@pytest.mark.parametrize("point", ["extraction", "ablation sweep"])
def test_a_killed_compare_resumes_and_ends_with_the_same_tables(setup, reference, point, tmp_path):
    _, base, tuned, data = setup
    out = tmp_path / "run"
    args = _compare_args(base, tuned, data, out)
    if point == "extraction":
        _kill_when(args, lambda: _status(out) == "running" and not (out / "tables").exists())
        assert _status(out) == "running" and not (out / "tables").exists()
    else:
        _kill_when(args, lambda: _units(out) >= 3)
        assert _status(out) == "running" and (out / "tables" / "attention_change.parquet").exists()
        killed_units = _units(out)
        assert 3 <= killed_units
    again = _run(args)
    assert again.returncode == 0, again.stderr
    assert _status(out) == "complete"
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    if point == "ablation sweep":
        assert set(manifest["resumed_tables"]) >= {"attention_change", "representation_similarity"}
        assert manifest["analyses"]["ablation"]["settings"]["n_bootstrap"] == 50
    tables = _tables(out)
    assert tables.keys() == reference.keys()
    for name, table in reference.items():
        pd.testing.assert_frame_equal(tables[name], table, check_exact=True, obj=name)


def test_a_killed_ablate_resumes_its_sweep_and_ends_with_the_same_tables(setup, tmp_path):
    _, _, tuned, data = setup
    args = lambda out: ["ablate", "--model", str(tuned), "--data", str(data), "--out", str(out),  # noqa: E731
                        "--max-examples", "300", "--bootstrap", "50", "--no-report"]
    full = _run(args(tmp_path / "full"))
    assert full.returncode == 0, full.stderr
    out = tmp_path / "cut"
    _kill_when(args(out), lambda: _units(out) >= 3)
    assert _status(out) == "running" and not (out / "tables").exists()
    again = _run(args(out))
    assert again.returncode == 0, again.stderr
    assert "ablations reused" in again.stderr + again.stdout
    for name, table in _tables(tmp_path / "full").items():
        pd.testing.assert_frame_equal(_tables(out)[name], table, check_exact=True, obj=name)


def test_a_killed_finetune_resumes_from_its_checkpoint_with_the_same_weights(setup, tmp_path):
    from safetensors.torch import load_file

    folder, base, _, data = setup
    args = lambda out: ["finetune", "--model", str(base), "--data", str(data), "--out", str(out), "--epochs", "2",  # noqa: E731
                        "--batch-size", "8", "--save-every", "20", "--max-examples", "400", "--no-report"]
    full = _run(args(tmp_path / "full"))
    assert full.returncode == 0, full.stderr
    out = tmp_path / "cut"
    _kill_when(args(out), lambda: (out / "checkpoints" / "step-20" / "trainer_state.json").exists()
               or any((out / "checkpoints").glob("step-20/*.safetensors")))
    assert _status(out) == "running" and not (out / "model").exists()
    again = _run(args(out))
    assert again.returncode == 0, again.stderr
    a, b = load_file(str(tmp_path / "full/model/model.safetensors")), load_file(str(out / "model/model.safetensors"))
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)
    cols = ["step", "split", "metric", "value"]
    pd.testing.assert_frame_equal(_tables(out)["finetune"][cols], _tables(tmp_path / "full")["finetune"][cols])


# --------------------------------------------------------------------------------------------------
# probe: killed while extracting word features, and again between training epochs


def _chain_conllu(sentences: list[str]) -> str:
    """Each word headed by the one before: a valid tree for any sentence."""
    blocks = []
    for s in sentences:
        rows = [f"# text = {s}"] + ["\t".join([str(i), w, w, "PUNCT" if w in ".,!?" else "X", "_", "_", str(i - 1),
                                               "root" if i == 1 else "dep", "_", "_"]) for i, w in enumerate(s.split(), 1)]
        blocks.append("\n".join(rows))
    return "\n\n".join(blocks) + "\n\n"


def _trees(folder: Path, n: int) -> Path:
    """A treebank of ``n`` two-sentence examples."""
    k = len(SENTENCES)
    path = folder / f"trees-{n}.conllu"
    path.write_text(_chain_conllu([SENTENCES[i % k] + " " + SENTENCES[(3 * i + 1) % k] for i in range(n)]),
                    encoding="utf-8")
    return path


def _probe_epochs(partial: Path) -> int:
    """Epochs finished so far, read from the probes' training checkpoint in ``partial`` (0 when there is none yet)."""
    from bertology.state_files import load_state

    try:
        checkpoint = next(partial.glob("**/probe-training.pt"))
        return int(load_state(checkpoint)["state"]["epoch"])
    except StopIteration:
        return 0
    except (OSError, EOFError, KeyError, RuntimeError, BertologyError):  # replaced while read
        return 0


def test_a_probe_killed_twice_resumes_and_ends_with_the_same_table(setup, tmp_path):
    """Killed while extracting word features, then (the same command again) killed between training epochs:
    the third run resumes from the cached features and the finished epochs and ends with the table of an
    uninterrupted run."""
    folder, base, tuned, _ = setup
    trees = _trees(tmp_path, 240)
    args = lambda out: ["probe", "--base", str(base), "--tuned", str(tuned), "--train", str(trees),  # noqa: E731
                        "--test", str(trees), "--out", str(out), "--epochs", "6", "--patience", "6", "--rank", "8",
                        "--extract-batch-size", "8", "--no-report"]
    full = _run(args(tmp_path / "full"))
    assert full.returncode == 0, full.stderr
    out = tmp_path / "cut"
    features = out / "partial" / "features"
    _kill_when(args(out), lambda: len(list(features.glob("*.safetensors"))) >= 1)
    n_features = len(list(features.glob("*.safetensors")))
    # the cache holds 3 splits x (base, tuned); the random control's features are recomputed from its seed
    assert 1 <= n_features < 6 and _probe_epochs(out / "partial") == 0
    _kill_when(args(out), lambda: _probe_epochs(out / "partial") >= 2)
    assert 2 <= _probe_epochs(out / "partial") < 6 and len(list(features.glob("*.safetensors"))) == 6
    assert _status(out) == "running" and not (out / "tables").exists()
    again = _run(args(out))
    assert again.returncode == 0, again.stderr
    assert "resuming the run" in again.stdout + again.stderr
    assert _status(out) == "complete"
    reference, tables = _tables(tmp_path / "full"), _tables(out)
    assert tables.keys() == reference.keys() == {"probe", "probe_baseline"}
    for name in ("probe", "probe_baseline"):
        pd.testing.assert_frame_equal(tables[name], reference[name], check_exact=True)


def test_a_compare_killed_in_its_probe_stage_keeps_its_tables_and_ends_with_the_same_ones(setup, tmp_path):
    """While the run writes, a second run with other settings into the same --out is refused and leaves the
    folder alone (issue 21). Then the run is killed after its streaming tables are written, while the probes
    train: the same command reuses those tables and the probes' cached features and finished epochs, and
    ends with an uninterrupted run's tables."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "integration"))
    from cli_checks import assert_user_error, invoke

    _, base, tuned, data = setup
    trees = _trees(tmp_path, 40)
    args = lambda out: ["compare", "--base", str(base), "--tuned", str(tuned), "--data", str(trees),  # noqa: E731
                        "--analyses", "attention_change,probe", "--probe-train", str(trees), "--probe-test", str(trees),
                        "--probe-rank", "8", "--view-examples", "0", "--no-report", "--out", str(out)]
    full = _run(args(tmp_path / "full"))
    assert full.returncode == 0, full.stderr
    out = tmp_path / "cut"
    seen: dict = {}

    def second_writer_then_probe_training() -> bool:
        if "second" not in seen and _status(out) == "running":
            seen["fingerprint"] = json.loads((out / "manifest.json").read_text(encoding="utf-8"))["fingerprint"]
            seen["second"] = invoke("compare", "--base", base, "--tuned", tuned, "--data", data, "--out", out,
                                    "--no-report", "--analyses", "attention_change", "--view-examples", "0")
        return _probe_epochs(out / "partial") >= 2

    _kill_when(args(out), second_writer_then_probe_training)
    assert_user_error(seen["second"], "Another bertology run is writing into --out", str(out))
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    assert (manifest["status"], manifest["fingerprint"]) == ("running", seen["fingerprint"])  # still the first run's
    assert (out / "tables" / "attention_change.parquet").exists() and not (out / "tables" / "probe.parquet").exists()
    again = _run(args(out))
    assert again.returncode == 0, again.stderr
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["status"] == "complete" and manifest["resumed_tables"] == ["attention_change"]
    reference = _tables(tmp_path / "full")
    assert _tables(out).keys() == reference.keys() >= {"attention_change", "probe"}
    for name, table in reference.items():
        pd.testing.assert_frame_equal(_tables(out)[name], table, check_exact=True, obj=name)


def test_a_killed_lora_finetune_resumes_with_the_same_adapter_bit_for_bit(setup, tmp_path):
    """``--method lora``: checkpoints hold the adapter (LoRA + head) and the optimiser; the resumed run's adapter
    equals an uninterrupted run's exactly."""
    pytest.importorskip("peft")
    from safetensors.torch import load_file

    folder, base, _, data = setup
    args = lambda out: ["finetune", "--model", str(base), "--data", str(data), "--out", str(out), "--epochs", "2",  # noqa: E731
                        "--batch-size", "8", "--save-every", "20", "--max-examples", "400", "--no-report",
                        "--method", "lora", "--lora-rank", "4"]
    full = _run(args(tmp_path / "full"))
    assert full.returncode == 0, full.stderr
    out = tmp_path / "cut"
    _kill_when(args(out), lambda: (out / "checkpoints" / "step-20" / "trainer_state.pt").exists())
    assert _status(out) == "running" and not (out / "model").exists()
    again = _run(args(out))
    assert again.returncode == 0, again.stderr
    assert "resumed from the checkpoint at step" in again.stdout + again.stderr
    weights = "model/adapter_model.safetensors"
    a, b = load_file(str(tmp_path / "full" / weights)), load_file(str(out / weights))
    assert a.keys() == b.keys() and any("lora_B" in k for k in a) and all((a[k] == b[k]).all() for k in a)
    cols = ["step", "split", "metric", "value"]
    pd.testing.assert_frame_equal(_tables(out)["finetune"][cols], _tables(tmp_path / "full")["finetune"][cols])


class _Payload:
    """A pickle that writes ``marker`` when it is loaded (a stand-in for any code a crafted file could run)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "ran"))


def test_a_crafted_checkpoint_in_an_interrupted_finetune_runs_no_code_on_resume(setup, tmp_path):
    import torch

    folder, base, _, data = setup
    out, marker = tmp_path / "cut", tmp_path / "marker"
    args = ["finetune", "--model", str(base), "--data", str(data), "--out", str(out), "--epochs", "2",
            "--batch-size", "8", "--save-every", "10", "--max-examples", "400", "--no-report"]
    _kill_when(args, lambda: (out / "checkpoints" / "step-10" / "trainer_state.pt").exists())
    state = next((out / "checkpoints").glob("step-*/trainer_state.pt"))
    torch.save({"step": 10, "payload": _Payload(marker)}, state)  # what a hostile copy of the folder could hold
    again = _run(args)
    assert again.returncode == 2, again.stderr  # a user error: one line, exit 2
    assert not marker.exists(), "unpickling the checkpoint ran code"
    last = again.stderr.strip().splitlines()[-1]
    assert "Refusing to read" in last and "trainer_state.pt" in last and "it holds getattr" in last
    assert "Traceback" not in again.stderr
