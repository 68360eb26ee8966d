"""Run folders under concurrency and failure: one writer at a time, marked from the first write,
failed runs recorded and replaceable, unwritable folders refused before any work, and a report
that shows only the tables its own manifest lists."""
from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pandas as pd
import pytest

from bertology.errors import BertologyError
from bertology.results import write_table
from bertology.runs import LOCK, open_run


def _manifest(folder) -> dict:
    return json.loads((folder / "manifest.json").read_text(encoding="utf-8"))


def test_the_folder_is_marked_running_before_any_work(tmp_path):
    with open_run(tmp_path / "run", "compare", "f1") as opened:
        m = _manifest(opened.path)
        assert (m["kind"], m["fingerprint"], m["status"]) == ("compare", "f1", "running")
        assert not opened.resumed
    # killed here (nothing else written): the same command resumes, another one is refused
    with open_run(tmp_path / "run", "compare", "f1") as again:
        assert again.resumed
    with pytest.raises(BertologyError, match="holds another run"):
        open_run(tmp_path / "run", "compare", "f2")


def test_a_second_writer_gets_one_clear_error_and_the_lock_is_released(tmp_path):
    with open_run(tmp_path / "run", "compare", "f1"):
        with pytest.raises(BertologyError, match="Another bertology run is writing into"):
            open_run(tmp_path / "run", "compare", "f1")
    with open_run(tmp_path / "run", "compare", "f1") as after:  # released on exit
        assert after.resumed


def test_a_failed_run_says_so_and_a_corrected_run_may_replace_it(tmp_path):
    with pytest.raises(ValueError):
        with open_run(tmp_path / "run", "finetune", "bad-labels"):
            raise ValueError("label column 'y' not found")
    m = _manifest(tmp_path / "run")
    assert m["status"] == "failed" and m["error"] == "ValueError: label column 'y' not found" and "finished" in m
    write_table(tmp_path / "run", "finetune", pd.DataFrame({"step": [1]}))
    with open_run(tmp_path / "run", "finetune", "fixed-labels") as fixed:  # other settings, no --overwrite needed
        assert not fixed.resumed and not (tmp_path / "run/tables/finetune.parquet").exists()
    # a failed run of another kind is still another run
    with pytest.raises(ValueError):
        with open_run(tmp_path / "other", "probe", "p"):
            raise ValueError("x")
    with pytest.raises(BertologyError, match="holds another run"):
        open_run(tmp_path / "other", "compare", "c")


def test_ctrl_c_is_recorded_as_interrupted_and_a_finished_run_is_left_alone(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        with open_run(tmp_path / "run", "compare", "f1"):
            raise KeyboardInterrupt
    assert _manifest(tmp_path / "run")["status"] == "interrupted"
    with pytest.raises(RuntimeError):
        with open_run(tmp_path / "done", "compare", "f1") as opened:
            opened.dir.write_manifest({**_manifest(opened.path), "status": "complete"})
            raise RuntimeError("the report failed after the run finished")
    assert _manifest(tmp_path / "done")["status"] == "complete"


def test_a_foreign_folder_is_refused_before_anything_is_written_into_it(tmp_path):
    foreign = tmp_path / "photos"
    foreign.mkdir()
    (foreign / "cat.jpg").write_bytes(b"jpg")
    with pytest.raises(BertologyError, match="holds no bertology run"):
        open_run(foreign, "compare", "f1")
    assert sorted(p.name for p in foreign.iterdir()) == ["cat.jpg"]  # no lock file, no manifest left behind


@pytest.mark.skipif(sys.platform == "win32" or os.geteuid() == 0, reason="root writes anywhere")
def test_an_unwritable_folder_is_refused_before_the_work(tmp_path):
    locked = tmp_path / "ro"
    locked.mkdir()
    locked.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        with pytest.raises(BertologyError, match="Cannot write into --out"):
            open_run(locked / "run", "compare", "f1")
    finally:
        locked.chmod(stat.S_IRWXU)


def test_an_unwritable_folder_is_refused_even_as_root(tmp_path, monkeypatch):
    """Root ignores permission bits, so the refusal is checked by making the first write fail."""
    import bertology.runs as runs

    def refuse(*_a, **_k):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(runs.RunDirectory, "write_manifest", refuse)
    with pytest.raises(BertologyError, match="Cannot write into --out .*Permission denied"):
        open_run(tmp_path / "run", "compare", "f1")
    monkeypatch.undo()
    with open_run(tmp_path / "run", "compare", "f1") as opened:  # the refused attempt left the lock free
        assert not opened.resumed


def test_the_lock_file_does_not_count_as_content(tmp_path):
    with open_run(tmp_path / "run", "compare", "f1"):
        assert (tmp_path / "run" / LOCK).exists()


def test_the_report_shows_only_the_tables_its_manifest_lists(tmp_path):
    from bertology.report.render import build_context

    run = tmp_path / "run"
    run.mkdir()
    table = pd.DataFrame({"layer": [1], "head": [0], "cosine": [0.9], "js_divergence": [0.1]})
    write_table(run, "attention_change", table)
    (run / "manifest.json").write_text(json.dumps({"kind": "compare", "tables": []}), encoding="utf-8")
    ctx = build_context(run)
    assert "attention-change" not in ctx["sections"]
    assert any("not in this run's manifest" in w for w in ctx["overview"]["warnings"])


@pytest.fixture(scope="module")
def classifier_pair(tmp_path_factory):
    from bertology.testing import tiny_bert_pair

    return tiny_bert_pair(tmp_path_factory.mktemp("classifier"), classifier=True)


def _labelled():
    from bertology.data.corpus import Corpus
    from bertology.testing import SENTENCES

    return Corpus.from_list(SENTENCES, labels=[i % 2 for i in range(len(SENTENCES))])


def test_an_interrupted_compare_resumes_from_its_finished_tables(classifier_pair, tmp_path, monkeypatch):
    """Stopped after the streaming pass (as a kill between stages would), the same command reuses its tables."""
    import bertology.commands.compare as pipeline
    from bertology.config import CompareConfig, DataConfig

    config = CompareConfig(base=str(classifier_pair[0]), tuned=str(classifier_pair[1]), data=DataConfig(path=""),
                           out=str(tmp_path / "run"), analyses=("attention_change", "ablation"), view_examples=0,
                           ablation_bootstrap=10)

    def stop(*_a, **_k):
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline, "_experiment", stop)
    with pytest.raises(KeyboardInterrupt):
        pipeline.compare(config, corpus=_labelled(), report=False)
    m = _manifest(tmp_path / "run")
    table = tmp_path / "run/tables/attention_change.parquet"
    assert m["status"] == "interrupted" and table.exists()
    written = table.stat().st_mtime_ns
    monkeypatch.undo()
    run = pipeline.compare(config, corpus=_labelled(), report=False)  # the same command resumes
    assert run.manifest["status"] == "complete" and run.resumed == ["attention_change"]
    assert table.stat().st_mtime_ns == written  # the finished table was reused, not recomputed
    assert (tmp_path / "run/tables/ablation.parquet").exists()


def test_a_named_experiment_that_cannot_run_is_refused_before_any_work(identical_pair, tmp_path):
    """The ablation of an encoder without a classifier is refused before the streaming pass, not after it."""
    from bertology.config import CompareConfig, DataConfig
    from bertology.commands.compare import compare

    config = CompareConfig(base=str(identical_pair[0]), tuned=str(identical_pair[1]), data=DataConfig(path=""),
                           out=str(tmp_path / "run"), analyses=("attention_change", "ablation"), view_examples=0)
    with pytest.raises(BertologyError, match="Cannot run the ablation of the tuned classifier: the tuned model has no"):
        compare(config, corpus=_labelled(), report=False)
    assert not (tmp_path / "run").exists()  # nothing written, no run folder to clean up
    fixed = CompareConfig(**{**config.__dict__, "analyses": ("attention_change",)})
    assert compare(fixed, corpus=_labelled(), report=False).manifest["status"] == "complete"


FAILING_RUNS = {
    # an eval file with labels the training data never had, then the same run without it
    "finetune": (["--eval-data", "unseen_eval.csv"], []),
    # a layer the model does not have (found after the run folder is marked), then the model's layers
    "probe": (["--layers", "0,9"], ["--layers", "0,1"]),
}


@pytest.mark.parametrize("command", list(FAILING_RUNS))
def test_a_failed_command_ends_failed_and_the_corrected_command_is_accepted(command, tmp_path):
    """finetune and probe (issue 21): the failed run's manifest says ``failed`` with its error, and the
    corrected command into the same --out runs without --overwrite."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "integration"))
    from cli_checks import assert_user_error, invoke

    from bertology.testing import SENTENCES, save_tiny_bert

    model = save_tiny_bert(tmp_path / "model")
    pd.DataFrame({"text": SENTENCES, "label": [i % 2 for i in range(len(SENTENCES))]}).to_csv(tmp_path / "d.csv",
                                                                                             index=False)
    (tmp_path / "unseen_eval.csv").write_text("text,label\nthe cat sat,2\nthe dog ran,3\n", encoding="utf-8")
    words = [s.split() for s in SENTENCES]
    (tmp_path / "t.conllu").write_text("".join(
        "\n".join("\t".join([str(i), w, w, "X", "_", "_", str(i - 1), "dep", "_", "_"]) for i, w in enumerate(ws, 1))
        + "\n\n" for ws in words), encoding="utf-8")
    base = (["finetune", "--model", model, "--data", tmp_path / "d.csv", "--epochs", "1"] if command == "finetune" else
            ["probe", "--base", model, "--train", tmp_path / "t.conllu", "--test", tmp_path / "t.conllu", "--epochs", "1"])
    bad, good = FAILING_RUNS[command]
    out = tmp_path / "run"
    result = invoke(*base, "--out", out, "--no-report", *[tmp_path / a if a.endswith(".csv") else a for a in bad])
    assert_user_error(result)
    failed = _manifest(out)
    assert failed["status"] == "failed" and failed["error"].startswith("BertologyError: ")
    fixed = invoke(*base, "--out", out, "--no-report", *good)
    assert fixed.exit_code == 0, fixed.output
    finished = "done" if command == "finetune" else "complete"  # finetune's word for a finished run
    assert _manifest(out)["status"] == finished and (out / "tables" / f"{command}.parquet").exists()


def _with_umask(mask: int):
    old = os.umask(mask)  # the test sets it; the package never does
    return old


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX permissions")
def test_atomic_writers_give_the_umask_permissions_and_leave_no_temp_behind(tmp_path):
    from bertology.results import atomic_folder, atomic_write

    old = _with_umask(0o027)
    try:
        atomic_write(tmp_path / "f.txt", lambda p: p.write_text("one"))
        folder = atomic_folder(tmp_path / "model", lambda p: (p / "w.bin").write_bytes(b"1"))
        assert os.umask(0o027) == 0o027  # neither writer changed it
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "f.txt").stat().st_mode) == 0o640
    assert stat.S_IMODE(folder.stat().st_mode) == 0o750

    def fail(p: Path) -> None:
        (p / "w.bin").write_bytes(b"half")
        raise RuntimeError("killed")

    with pytest.raises(RuntimeError):
        atomic_folder(tmp_path / "model", fail)
    assert (tmp_path / "model" / "w.bin").read_bytes() == b"1"  # the old folder stays whole
    atomic_folder(tmp_path / "model", lambda p: (p / "w2.bin").write_bytes(b"2"))  # replaces the old folder
    assert sorted(q.name for q in (tmp_path / "model").iterdir()) == ["w2.bin"]
    assert sorted(q.name for q in tmp_path.iterdir()) == ["f.txt", "model"]  # no temp file or folder left


def test_the_package_never_sets_the_umask():
    """``os.umask`` is process-wide: setting it (even to read it) races with other threads writing files."""
    import bertology

    root = Path(bertology.__file__).parent
    assert not [str(p) for p in root.rglob("*.py") if "os.umask(" in p.read_text(encoding="utf-8")]
