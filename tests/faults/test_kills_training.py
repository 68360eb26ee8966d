"""Kill -9 while a model or a probe trains, then the same command again: it resumes from its checkpoint (or its
cached features and finished epochs) and ends as an uninterrupted run did; a crafted checkpoint runs no code.

The command and the kill are those of ``test_kills.py`` (:mod:`kill_helpers`); a kill that came too late fails
the test rather than passing it vacuously.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from kill_helpers import kill_when, run_command, run_status, run_tables  # noqa: E402
from kill_helpers import setup  # noqa: E402, F401 (a module fixture)

from bertology.errors import BertologyError  # noqa: E402
from bertology.testing import SENTENCES  # noqa: E402

pytestmark = [pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL"), pytest.mark.slow]


def test_a_killed_finetune_resumes_from_its_checkpoint_with_the_same_weights(setup, tmp_path):
    from safetensors.torch import load_file

    folder, base, _, data = setup
    args = lambda out: ["finetune", "--model", str(base), "--data", str(data), "--out", str(out), "--epochs", "2",  # noqa: E731
                        "--batch-size", "8", "--save-every", "20", "--max-examples", "400", "--no-report"]
    full = run_command(args(tmp_path / "full"))
    assert full.returncode == 0, full.stderr
    out = tmp_path / "cut"
    kill_when(args(out), lambda: (out / "checkpoints" / "step-20" / "trainer_state.json").exists()
               or any((out / "checkpoints").glob("step-20/*.safetensors")))
    assert run_status(out) == "running" and not (out / "model").exists()
    again = run_command(args(out))
    assert again.returncode == 0, again.stderr
    a, b = load_file(str(tmp_path / "full/model/model.safetensors")), load_file(str(out / "model/model.safetensors"))
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)
    cols = ["step", "split", "metric", "value"]
    pd.testing.assert_frame_equal(run_tables(out)["finetune"][cols], run_tables(tmp_path / "full")["finetune"][cols])


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
    full = run_command(args(tmp_path / "full"))
    assert full.returncode == 0, full.stderr
    out = tmp_path / "cut"
    features = out / "partial" / "features"
    kill_when(args(out), lambda: len(list(features.glob("*.safetensors"))) >= 1)
    n_features = len(list(features.glob("*.safetensors")))
    # the cache holds 3 splits x (base, tuned); the random control's features are recomputed from its seed
    assert 1 <= n_features < 6 and _probe_epochs(out / "partial") == 0
    kill_when(args(out), lambda: _probe_epochs(out / "partial") >= 2)
    assert 2 <= _probe_epochs(out / "partial") < 6 and len(list(features.glob("*.safetensors"))) == 6
    assert run_status(out) == "running" and not (out / "tables").exists()
    again = run_command(args(out))
    assert again.returncode == 0, again.stderr
    assert "resuming the run" in again.stdout + again.stderr
    assert run_status(out) == "complete"
    reference, tables = run_tables(tmp_path / "full"), run_tables(out)
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
    full = run_command(args(tmp_path / "full"))
    assert full.returncode == 0, full.stderr
    out = tmp_path / "cut"
    seen: dict = {}

    def second_writer_then_probe_training() -> bool:
        if "second" not in seen and run_status(out) == "running":
            seen["fingerprint"] = json.loads((out / "manifest.json").read_text(encoding="utf-8"))["fingerprint"]
            seen["second"] = invoke("compare", "--base", base, "--tuned", tuned, "--data", data, "--out", out,
                                    "--no-report", "--analyses", "attention_change", "--view-examples", "0")
        return _probe_epochs(out / "partial") >= 2

    kill_when(args(out), second_writer_then_probe_training)
    assert_user_error(seen["second"], "Another bertology run is writing into --out", str(out))
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    assert (manifest["status"], manifest["fingerprint"]) == ("running", seen["fingerprint"])  # still the first run's
    assert (out / "tables" / "attention_change.parquet").exists() and not (out / "tables" / "probe.parquet").exists()
    again = run_command(args(out))
    assert again.returncode == 0, again.stderr
    manifest = json.loads((out / "manifest.json").read_text(encoding="utf-8"))
    assert manifest["status"] == "complete" and manifest["resumed_tables"] == ["attention_change"]
    reference = run_tables(tmp_path / "full")
    assert run_tables(out).keys() == reference.keys() >= {"attention_change", "probe"}
    for name, table in reference.items():
        pd.testing.assert_frame_equal(run_tables(out)[name], table, check_exact=True, obj=name)


def test_a_killed_lora_finetune_resumes_with_the_same_adapter_bit_for_bit(setup, tmp_path):
    """``--method lora``: checkpoints hold the adapter (LoRA + head) and the optimiser; the resumed run's adapter
    equals an uninterrupted run's exactly."""
    pytest.importorskip("peft")
    from safetensors.torch import load_file

    folder, base, _, data = setup
    args = lambda out: ["finetune", "--model", str(base), "--data", str(data), "--out", str(out), "--epochs", "2",  # noqa: E731
                        "--batch-size", "8", "--save-every", "20", "--max-examples", "400", "--no-report",
                        "--method", "lora", "--lora-rank", "4"]
    full = run_command(args(tmp_path / "full"))
    assert full.returncode == 0, full.stderr
    out = tmp_path / "cut"
    kill_when(args(out), lambda: (out / "checkpoints" / "step-20" / "trainer_state.pt").exists())
    assert run_status(out) == "running" and not (out / "model").exists()
    again = run_command(args(out))
    assert again.returncode == 0, again.stderr
    assert "resumed from the checkpoint at step" in again.stdout + again.stderr
    weights = "model/adapter_model.safetensors"
    a, b = load_file(str(tmp_path / "full" / weights)), load_file(str(out / weights))
    assert a.keys() == b.keys() and any("lora_B" in k for k in a) and all((a[k] == b[k]).all() for k in a)
    cols = ["step", "split", "metric", "value"]
    pd.testing.assert_frame_equal(run_tables(out)["finetune"][cols], run_tables(tmp_path / "full")["finetune"][cols])


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
    kill_when(args, lambda: (out / "checkpoints" / "step-10" / "trainer_state.pt").exists())
    state = next((out / "checkpoints").glob("step-*/trainer_state.pt"))
    torch.save({"step": 10, "payload": _Payload(marker)}, state)  # what a hostile copy of the folder could hold
    again = run_command(args)
    assert again.returncode == 2, again.stderr  # a user error: one line, exit 2
    assert not marker.exists(), "unpickling the checkpoint ran code"
    last = again.stderr.strip().splitlines()[-1]
    assert "Refusing to read" in last and "trainer_state.pt" in last and "it holds getattr" in last
    assert "Traceback" not in again.stderr
