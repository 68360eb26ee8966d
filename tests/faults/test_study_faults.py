"""A study under faults: kill -9 inside each kind of job, a second study into the same folder, a deleted or
truncated model, a corrupted job table or study table, a failing fine-tune or comparison. After each, the
same command again completes, and its tables equal those of a study that ran without any fault.

The kills run the CLI in a subprocess, SIGKILLed (no clean-up code runs) once the study folder shows the
job of that kind under way; a kill that came after the job finished fails the test (the job's finish
record must be absent), so no kill passes vacuously. The other faults are made on copies of the finished
reference study and run in this process.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from bertology.errors import BertologyError
from bertology.studies import runner
from bertology.studies.jobs import CompareJob, FinetuneJob
from bertology.studies.runner import run_study

sys.path.insert(0, str(Path(__file__).parents[1] / "integration"))
from study_helpers import labelled, tiny_study  # noqa: E402

pytestmark = [pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL"), pytest.mark.usefixtures("one_thread"),
              pytest.mark.slow]
ALL_JOBS = ["finetune:a/s0", "finetune:a/s1", "finetune:b/s0", "finetune:b/s1", "compare", "compare_own:a",
            "compare_own:b", "seed_compare:a/s0", "seed_compare:b/s0", "seed_compare_own:a/s0", "seed_compare_own:b/s0"]


def _make_study(root: Path) -> Path:
    """The tiny two-task, two-seed study, with enough training rows that a fine-tune lasts long enough to kill."""
    spec = tiny_study(root, extra="report = false\n")
    labelled(root / "a_train.tsv", ("good", "bad"), n=240)
    labelled(root / "b_train.tsv", ("fun", "boring"), n=240, seed=2)
    return spec


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """A study that ran without any fault (its root: spec, data, base, out/)."""
    root = tmp_path_factory.mktemp("reference")
    result = run_study(_make_study(root))
    assert result.manifest["status"] == "complete"
    return root


def _tables(study: Path) -> dict[str, pd.DataFrame]:
    return {p.stem: pd.read_parquet(p) for p in sorted((study / "tables").glob("*.parquet"))}


def _assert_same_tables(study: Path, reference: Path) -> None:
    got, want = _tables(study), _tables(reference / "out")
    assert sorted(got) == sorted(want)
    for name in want:
        pd.testing.assert_frame_equal(got[name], want[name], obj=name)


def _copy(reference: Path, tmp_path: Path) -> Path:
    """A copy of the finished reference study (copytree keeps modification times, as a backup would)."""
    root = tmp_path / "study"
    shutil.copytree(reference, root)
    return root


def _manifest(root: Path) -> dict:
    try:
        return json.loads((root / "out" / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def _finished(root: Path, job_id: str) -> bool:
    return (root / "out" / "jobs" / (job_id.replace(":", "__").replace("/", "~") + ".json")).exists()


# ------------------------------------------------------------------------------------------------ kills
def _study_cli(root: Path) -> subprocess.Popen:
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "bertology", "study", str(root / "study.toml")],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)


def _wait_for(proc: subprocess.Popen, ready, timeout: float = 240.0) -> None:
    start = time.monotonic()
    while not ready():
        assert proc.poll() is None, "the study finished before the kill point: give its jobs more work"
        assert time.monotonic() - start < timeout, "the kill point never came"
        time.sleep(0.01)


def _running(root: Path, folder: str) -> bool:
    """A run folder of the study exists with its manifest saying ``running`` (its job is under way)."""
    try:
        return json.loads((root / "out" / folder / "manifest.json").read_text(encoding="utf-8")).get("status") == "running"
    except (OSError, ValueError):
        return False


#: Where each kind of job is killed: (the job, the run folder whose ``running`` manifest shows it under way).
KILLS = [("finetune:a/s1", "finetune/a/s1"), ("compare", "compare/pairs/a~s1"), ("compare_own:b", "compare_own/b"),
         ("seed_compare:a/s0", "seeds/a/s0"), ("seed_compare_own:b/s0", "seeds_own/b/s0")]


def test_killed_in_every_kind_of_job_each_rerun_resumes_and_the_tables_equal_an_uninterrupted_study(tmp_path, reference):
    root = tmp_path / "killed"
    spec = _make_study(root)
    for i, (job, folder) in enumerate(KILLS):
        proc = _study_cli(root)
        try:
            if i == 0:  # a second study into the same folder while the first writes: refused, nothing touched
                _wait_for(proc, lambda: _manifest(root).get("status") == "running")
                with pytest.raises(BertologyError, match="Another bertology run is writing into --out"):
                    run_study(spec)
            _wait_for(proc, lambda: _running(root, folder))
            proc.send_signal(signal.SIGKILL)
        finally:
            proc.wait(timeout=60)
        assert proc.returncode == -signal.SIGKILL
        assert not _finished(root, job), f"{job} finished before the kill: the kill did not land inside it"
        assert _manifest(root)["status"] == "running"
    result = run_study(spec)
    assert result.manifest["status"] == "complete"
    assert {j.id for j in result.jobs} == set(ALL_JOBS)
    assert result.statuses()["finetune:a/s0"] == "cached"  # finished before the first kill: not run again
    _assert_same_tables(root / "out", reference)


# --------------------------------------------------------------------------------------- lost outputs
@pytest.mark.parametrize("damage, reason", [
    (lambda f: f.unlink(), "finetune/b/s0/model/model.safetensors is missing"),
    (lambda f: f.write_bytes(f.read_bytes()[:1000]), "finetune/b/s0/model/model.safetensors has 1,000 bytes, not the"),
])
def test_a_deleted_or_truncated_model_is_trained_again_not_trusted(tmp_path, reference, damage, reason):
    root = _copy(reference, tmp_path)
    damage(root / "out/finetune/b/s0/model/model.safetensors")
    result = run_study(root / "study.toml")
    statuses = result.statuses()
    assert statuses["finetune:b/s0"] == "done"
    record = next(j for j in result.jobs if j.id == "finetune:b/s0")
    assert record.reason.startswith("run again from scratch: ") and reason in record.reason
    # retrained with the same seed: the same weights, so every comparison of it is still valid and cached
    assert all(s == "cached" for k, s in statuses.items() if k != "finetune:b/s0")
    assert result.manifest["status"] == "complete" and result.manifest["stale_tables"] == {}
    assert reason in (root / "out/report.html").read_text(encoding="utf-8")
    _assert_same_tables(root / "out", reference)


def test_a_job_table_changed_in_place_is_caught_by_its_hash_and_its_job_runs_again(tmp_path, reference):
    root = _copy(reference, tmp_path)
    table = root / "out/compare/tables/attention_change.parquet"
    table.write_bytes(b"\0" * table.stat().st_size)  # same size: only the contents tell
    result = run_study(root / "study.toml")
    record = next(j for j in result.jobs if j.id == "compare")
    assert record.status == "done"
    assert record.reason == ("run again from scratch: compare/tables/attention_change.parquet was changed after "
                             "the job wrote it (its contents differ)")
    _assert_same_tables(root / "out", reference)


def test_a_corrupted_study_table_is_written_again_from_the_jobs(tmp_path, reference):
    root = _copy(reference, tmp_path)
    (root / "out/tables/study_effects.parquet").write_bytes(b"not a parquet file")
    result = run_study(root / "study.toml")
    assert set(result.statuses().values()) == {"cached"}
    _assert_same_tables(root / "out", reference)


# ------------------------------------------------------------------------------------------ failing jobs
def test_a_failing_comparison_keeps_the_finished_tables_and_flags_them_stale(tmp_path, reference, monkeypatch):
    root = _copy(reference, tmp_path)
    (root / "out/jobs/compare.json").unlink()  # as if its settings had changed: it must run
    real_run = CompareJob.run

    def failing(self, progress=False):
        if self.id == "compare":
            raise RuntimeError("worker lost (injected)")
        return real_run(self, progress)

    monkeypatch.setattr(CompareJob, "run", failing)
    result = run_study(root / "study.toml")
    assert [(j.id, j.error) for j in result.failed] == [("compare", "RuntimeError: worker lost (injected)")]
    assert result.manifest["status"] == "incomplete"
    stale = result.manifest["stale_tables"]
    # the base-vs-tuned tables and their verdicts could not be remade: kept, each with why
    assert {"attention_change", "representation_similarity", "study_effects"} <= set(stale)
    assert "not remade because job(s) compare did not finish" in stale["study_effects"]
    _assert_same_tables(root / "out", reference)  # nothing lost
    page = (root / "out/report.html").read_text(encoding="utf-8")
    assert "Stale tables attention_change, representation_similarity, study_counts, study_effects" in page
    assert "worker lost (injected)" in page

    monkeypatch.setattr(CompareJob, "run", real_run)
    again = run_study(root / "study.toml")
    assert again.manifest["status"] == "complete" and again.manifest["stale_tables"] == {}
    assert again.statuses()["compare"] == "done"
    _assert_same_tables(root / "out", reference)


def test_a_failing_seed_leaves_verdicts_from_the_seeds_that_exist_and_a_rerun_completes(tmp_path, reference, monkeypatch):
    root = _copy(reference, tmp_path)
    shutil.rmtree(root / "out/finetune/b/s1")  # as if never trained
    real_run = FinetuneJob.run

    def failing(self, progress=False):
        if self.id == "finetune:b/s1":
            raise RuntimeError("out of memory (injected)")
        return real_run(self, progress)

    monkeypatch.setattr(FinetuneJob, "run", failing)
    result = run_study(root / "study.toml")
    statuses = result.statuses()
    assert statuses["finetune:b/s1"] == "failed" and statuses["seed_compare:b/s0"] == "skipped"
    assert statuses["compare"] == "done"  # without b/s1
    effects = pd.read_parquet(root / "out/tables/study_effects.parquet")
    b = effects[effects["task"] == "b"]
    assert len(b) and b["beyond_noise"].isna().all() and set(b["reason"]) == {"1 seed: no seed-noise estimate"}
    a = effects[effects["task"] == "a"]
    assert a["n_seeds"].eq(2).all()

    monkeypatch.setattr(FinetuneJob, "run", real_run)
    again = run_study(root / "study.toml")
    assert again.manifest["status"] == "complete"
    _assert_same_tables(root / "out", reference)


def _all_data_deleted_after_the_checks(monkeypatch, root: Path) -> None:
    """The tasks' data files go once the up-front checks have passed (a disk unmounted while the study waits)."""
    real = runner.check_study

    def then_delete(spec, **kw):
        real(spec, **kw)
        for name in ("a_train.tsv", "a_dev.tsv", "b_train.tsv", "b_dev.tsv"):
            (root / name).unlink()

    monkeypatch.setattr(runner, "check_study", then_delete)


def _every_fine_tune_raises(monkeypatch, root: Path) -> None:
    def failing(self, progress=False):
        raise RuntimeError(f"no GPU left for {self.id} (injected)")

    monkeypatch.setattr(FinetuneJob, "run", failing)


@pytest.mark.parametrize("fault, error", [(_all_data_deleted_after_the_checks, "_train.tsv"),
                                          (_every_fine_tune_raises, "RuntimeError: no GPU left for")],
                         ids=["data deleted after the checks", "every fine-tune raises"])
def test_a_study_whose_every_job_fails_writes_its_manifest_and_a_report_saying_why_and_exits_1(tmp_path, monkeypatch,
                                                                                            fault, error):
    from typer.testing import CliRunner

    import bertology.cli  # noqa: F401  (registers every command)
    from bertology.cli.app import app

    root = tmp_path / "study"
    spec = tiny_study(root, extra="report = false\n")
    fault(monkeypatch, root)
    result = CliRunner().invoke(app, ["study", str(spec)])
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output and "internal error" not in result.output, result.output
    fine_tunes = ["finetune:a/s0", "finetune:a/s1", "finetune:b/s0", "finetune:b/s1"]
    lines = result.output.splitlines()
    assert "4 of 11 job(s) failed; run the same command again to retry them:" in lines
    failed = [line for line in lines if line.startswith("failed: ")]
    assert [line.split(": ")[1] for line in failed] == fine_tunes  # one line per failed job, naming it
    assert all(error in line for line in failed), failed  # with its own error
    manifest = _manifest(root)
    assert manifest["status"] == "incomplete"
    statuses = {j["id"]: j["status"] for j in manifest["jobs"]}
    assert [k for k, v in statuses.items() if v == "failed"] == fine_tunes
    assert {v for k, v in statuses.items() if k not in fine_tunes} == {"skipped"}
    assert manifest["tables"] == [] and "no fine-tuned model finished" in manifest["no_verdicts"]
    page = " ".join((root / "out/report.html").read_text(encoding="utf-8").split())
    assert ("No seed-noise verdicts on the shared corpus: the base-vs-tuned comparison was skipped (no fine-tuned "
            "model finished); 4 of 11 job(s) failed: " + ", ".join(fine_tunes)) in page
    assert page.count(error.replace("RuntimeError: ", "")) >= 4  # each failed job's error, in the Jobs table


def test_the_cli_names_every_failed_job_with_its_error_and_exits_1(tmp_path, reference, monkeypatch):
    from typer.testing import CliRunner

    import bertology.cli  # noqa: F401  (registers every command)
    from bertology.cli.app import app

    root = _copy(reference, tmp_path)
    for job in ("compare_own__a", "compare_own__b"):
        (root / "out/jobs" / f"{job}.json").unlink()

    def failing(self, progress=False):
        raise RuntimeError(f"disk full at {self.id} (injected)")

    monkeypatch.setattr(CompareJob, "run", failing)
    result = CliRunner().invoke(app, ["study", str(root / "study.toml")])
    assert result.exit_code == 1, result.output
    text = " ".join(result.output.split())
    lines = result.output.splitlines()  # one line per failed job
    assert "2 of 11 job(s) failed; run the same command again to retry them:" in lines
    assert "failed: compare_own:a: RuntimeError: disk full at compare_own:a (injected)" in lines
    assert "failed: compare_own:b: RuntimeError: disk full at compare_own:b (injected)" in lines
    assert "Stale tables own_attention_change, own_representation_similarity" in text
    assert "from the run finished" in text
    assert runner.KIND == _manifest(root)["kind"]
