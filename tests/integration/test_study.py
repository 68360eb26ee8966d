"""``bertology study``: the spec's checks, a tiny study end to end, resumption, and a failing task."""
from __future__ import annotations

import json
import shutil
import sys

import pandas as pd
import pytest
from typer.testing import CliRunner

from bertology.errors import BertologyError
from bertology.study.runner import run_study
from bertology.study.spec import load_spec
from bertology.testing import save_tiny_bert, tiny_vocab

sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
from study_helpers import tiny_study  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py
NO_REPORT = "report = false\n"


def invoke(args):
    import bertology.cli  # noqa: F401  (registers every command)
    from bertology.cli.app import app

    return CliRunner().invoke(app, ["study", *args])


def _edit(spec, old, new):
    text = spec.read_text()
    assert old in text
    spec.write_text(text.replace(old, new, 1))


@pytest.mark.parametrize("old, new, message", [
    ('out = "out"', 'out = "out"\nworkers = 3', "Unknown key 'workers' in the top level of study.toml; allowed: base, seeds"),
    ("epochs = 1", "epochs = 1\nepoch = 2", "Unknown key 'epoch' in [lab]; allowed: epochs, batch_size, lr"),
    ('name = "b"', 'name = "b"\nlabel = "x"', "Unknown key 'label' in [[task]] #2 ('b'); allowed: name, type, data"),
    ("max_examples = 10", "max_examples = 10\nanalysis = 'x'", "Unknown key 'analysis' in [compare]; allowed: data,"),
    ('data = "b_train.tsv"', 'data = "nowhere.tsv"', "[[task]] #2 ('b'): data 'nowhere.tsv' does not exist"),
    ('data = "shared.tsv"', 'data = "gone.txt"', "[compare]: data 'gone.txt' does not exist"),
    ('name = "b"', 'name = "a"', "Two tasks are called 'a'; task names must be unique"),
    ("seeds = [0, 1]", "seeds = [0, 1, 0]", "seeds [0, 1, 0] repeat a seed"),
    ('type = "classification"', 'type = "summarisation"', "type must be one of auto, classification"),
    ('"representation_similarity"]', '"representation_similarity", "nope"]', "Unknown analysis nope"),
])
def test_a_bad_spec_is_one_clear_error_before_any_work(tmp_path, old, new, message):
    spec = tiny_study(tmp_path)
    _edit(spec, old, new)
    result = invoke([str(spec)])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())
    assert not (tmp_path / "out").exists()  # nothing was started


def _given_models(tmp_path, spec, model):
    """Task b as existing fine-tunes: seed 0 = ``model``."""
    _edit(spec, 'data = "b_train.tsv"\neval_data = "b_dev.tsv"', f'models = {{ 0 = "{model}" }}')


def test_a_given_model_with_other_layers_or_tokenizer_is_refused_before_any_work(tmp_path):
    spec = tiny_study(tmp_path)
    _given_models(tmp_path, spec, save_tiny_bert(tmp_path / "deep", num_hidden_layers=3))
    with pytest.raises(BertologyError, match=r"task 'b', seed 0: .*different shapes \(num_hidden_layers: 2 vs 3\)"):
        run_study(spec)
    assert not (tmp_path / "out").exists()

    from transformers import BertTokenizer

    other = save_tiny_bert(tmp_path / "othertok")
    vocab = tiny_vocab()
    swapped = {tok: vocab["bad" if tok == "good" else "good" if tok == "bad" else tok] for tok in vocab}  # same size, other ids
    BertTokenizer(vocab=swapped, do_lower_case=True).save_pretrained(other)
    spec = tiny_study(tmp_path / "t2")
    _given_models(tmp_path, spec, other)
    result = invoke([str(spec)])
    assert result.exit_code == 2
    assert "task 'b', seed 0: The tokenizers of" in result.output and "do not match" in result.output
    assert not (tmp_path / "t2" / "out").exists()


def test_tiny_study_end_to_end_then_a_rerun_trains_nothing(tmp_path):
    from bertology.config import CompareConfig, DataConfig
    from bertology.pipeline import compare

    spec = tiny_study(tmp_path, extra=NO_REPORT)
    result = invoke([str(spec)])
    assert result.exit_code == 0, result.output
    out = tmp_path / "out"
    m = json.loads((out / "manifest.json").read_text())
    assert m["kind"] == "study" and m["status"] == "complete" and m["executor"] == "local"
    assert {j["id"]: j["status"] for j in m["jobs"]} == {
        "finetune:a/s0": "done", "finetune:a/s1": "done", "finetune:b/s0": "done", "finetune:b/s1": "done",
        "compare": "done", "seed_compare:a/s0": "done", "seed_compare:b/s0": "done"}
    assert m["tasks"][0] == {"name": "a", "task": "classification", "seeds": [0, 1],
                             "models": {"0": "finetune/a/s0/model", "1": "finetune/a/s1/model"}}
    assert [p["tuned"] for p in m["pairs"]] == ["a/s0", "a/s1", "b/s0", "b/s1"]
    assert m["seed_pairs"] == [{"task": "a", "seed_a": 0, "seed_b": 1, "dir": "seeds/a/s0"},
                               {"task": "b", "seed_a": 0, "seed_b": 1, "dir": "seeds/b/s0"}]
    assert (out / "study.toml").read_text() == spec.read_text()
    assert json.loads((out / "finetune/b/s1/manifest.json").read_text())["seed"] == 1

    # the combined table holds, for a/s1, exactly what a separate compare of base vs that model gives
    table = pd.read_parquet(out / "tables" / "attention_change.parquet")
    assert list(table.columns[:3]) == ["tuned", "task", "seed"]
    # the seed-noise tables and the study report come with every study; two seeds cannot reach alpha 0.05
    effects = pd.read_parquet(out / "tables" / "study_effects.parquet")
    assert set(effects["task"]) == {"a", "b"} and effects["beyond_noise"].isna().all()
    assert effects["reason"].str.contains("2 seeds").all()
    html = (out / "report.html").read_text()
    assert "Seed noise" in html and "2 seeds: the smallest possible p" in html
    assert set(table["tuned"]) == {"a/s0", "a/s1", "b/s0", "b/s1"}
    cfg = CompareConfig(base=str(tmp_path / "base"), tuned=str(out / "finetune/a/s1/model"),
                        data=DataConfig(str(tmp_path / "shared.tsv"), text_column="sentence", max_examples=10, max_length=16),
                        out=str(tmp_path / "alone"), analyses=("attention_change",))
    alone = compare(cfg, report=False).table("attention_change")
    mine = table[table["tuned"] == "a/s1"].drop(columns=["tuned", "task", "seed"]).reset_index(drop=True)
    pd.testing.assert_frame_equal(mine, alone.reset_index(drop=True), check_dtype=False)

    # seed vs seed: a/s1 against a/s0 as the base
    seeds = pd.read_parquet(out / "tables" / "seedpair_representation_similarity.parquet")
    assert list(seeds.columns[:3]) == ["task", "seed_a", "seed_b"]
    assert sorted(map(tuple, seeds[["task", "seed_a", "seed_b"]].drop_duplicates().values.tolist())) == [("a", 0, 1), ("b", 0, 1)]
    cfg = CompareConfig(base=str(out / "finetune/b/s0/model"), tuned=str(out / "finetune/b/s1/model"),
                        data=cfg.data, out=str(tmp_path / "alone2"), analyses=("representation_similarity",))
    alone = compare(cfg, report=False).table("representation_similarity")
    mine = seeds[seeds["task"] == "b"].drop(columns=["task", "seed_a", "seed_b"]).reset_index(drop=True)
    mine = mine.rename(columns={"representation_similarity_seed": "seed"})  # a pair table's own seed, kept apart from the keys
    pd.testing.assert_frame_equal(mine, alone.reset_index(drop=True), check_dtype=False)

    again = run_study(spec)
    assert set(again.statuses().values()) == {"cached"}
    pd.testing.assert_frame_equal(pd.read_parquet(out / "tables" / "attention_change.parquet"), table)

    shutil.rmtree(out / "finetune/b/s1/model")  # killed before its model was saved: only that fine-tune runs again
    again = run_study(spec)
    assert [k for k, v in again.statuses().items() if v != "cached"] == ["finetune:b/s1"]
    pd.testing.assert_frame_equal(pd.read_parquet(out / "tables" / "attention_change.parquet"), table)


def test_a_failing_task_is_reported_the_rest_completes_and_a_rerun_retries_it(tmp_path):
    spec = tiny_study(tmp_path, extra=NO_REPORT)
    good = (tmp_path / "b_train.tsv").read_text()
    (tmp_path / "b_train.tsv").write_text(good.replace("label", "polarity", 1))  # no label column any more
    result = invoke([str(spec)])
    assert result.exit_code == 1, result.output
    text = " ".join(result.output.split())
    assert "2 job(s) failed" in text and "label" in text
    m = json.loads((tmp_path / "out" / "manifest.json").read_text())
    status = {j["id"]: (j["status"], j["error"]) for j in m["jobs"]}
    assert status["finetune:b/s0"][0] == "failed" and "BertologyError" in status["finetune:b/s0"][1]
    assert status["seed_compare:b/s0"] == ("skipped", "needs the model of b/s0, b/s1, which did not finish")
    assert status["compare"][0] == status["seed_compare:a/s0"][0] == "done"
    assert m["status"] == "incomplete" and [p["tuned"] for p in m["pairs"]] == ["a/s0", "a/s1"]

    (tmp_path / "b_train.tsv").write_text(good)
    again = run_study(spec)
    assert again.statuses() == {
        "finetune:a/s0": "cached", "finetune:a/s1": "cached", "finetune:b/s0": "done", "finetune:b/s1": "done",
        "compare": "done", "seed_compare:a/s0": "cached", "seed_compare:b/s0": "done"}
    assert again.manifest["status"] == "complete"
    assert set(pd.read_parquet(again.out / "tables/attention_change.parquet")["tuned"]) == {"a/s0", "a/s1", "b/s0", "b/s1"}


def test_executor_ray_without_ray_names_the_extra(tmp_path, monkeypatch):
    spec = tiny_study(tmp_path)
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    result = invoke([str(spec), "--executor", "ray"])
    assert result.exit_code == 2
    assert "pip install 'bertology[ray]'" in result.output
    result = invoke([str(spec), "--executor", "dask"])
    assert "Unknown executor 'dask'; choose from: local, ray" in result.output
    shutil.rmtree(tmp_path / "out", ignore_errors=True)


def test_a_study_killed_before_its_end_resumes_and_a_foreign_folder_is_refused(tmp_path):
    from bertology.study import runner

    spec = tiny_study(tmp_path / "s", seeds=(0,), extra=NO_REPORT)
    calls = []

    class KilledAfterFinetunes(runner.LocalExecutor):
        def run(self, jobs):
            if jobs and jobs[0].kind != "finetune":
                raise KeyboardInterrupt  # killed once the fine-tunes are done
            calls.append([j.id for j in jobs])
            return super().run(jobs)

    with pytest.raises(KeyboardInterrupt):
        run_study(spec, executor=KilledAfterFinetunes())
    assert json.loads((tmp_path / "s/out/manifest.json").read_text())["status"] == "running"
    again = run_study(spec)
    assert again.statuses() == {"finetune:a/s0": "cached", "finetune:b/s0": "cached", "compare": "done"}

    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(BertologyError, match="is not empty and holds no study"):
        run_study(spec, tmp_path / "other")
    assert (tmp_path / "other" / "notes.txt").read_text() == "mine"


def test_existing_fine_tunes_are_compared_without_training(tmp_path):
    spec = tiny_study(tmp_path, extra=NO_REPORT)
    m0 = save_tiny_bert(tmp_path / "given0", seed=10, classifier=True)
    m1 = save_tiny_bert(tmp_path / "given1", seed=11, classifier=True)
    _edit(spec, 'data = "b_train.tsv"\neval_data = "b_dev.tsv"', 'models = { 0 = "given0", 1 = "given1" }')
    result = run_study(spec)
    assert result.statuses() == {"finetune:a/s0": "done", "finetune:a/s1": "done", "compare": "done",
                                 "seed_compare:a/s0": "done", "seed_compare:b/s0": "done"}
    assert result.manifest["tasks"][1]["models"] == {"0": str(m0), "1": str(m1)}
    assert not (tmp_path / "out" / "finetune" / "b").exists()
    table = pd.read_parquet(result.out / "tables" / "seedpair_attention_change.parquet")
    assert set(map(tuple, table[["task", "seed_a", "seed_b"]].drop_duplicates().values.tolist())) == {("a", 0, 1), ("b", 0, 1)}
