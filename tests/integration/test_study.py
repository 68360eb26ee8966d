"""``bertology study``: the spec's checks, a tiny study end to end, resumption, and a failing task."""
from __future__ import annotations

import json
import re
import shutil
import sys

import pandas as pd
import pytest
from typer.testing import CliRunner

from bertology.errors import BertologyError
from bertology.studies.runner import run_study
from bertology.studies.spec import load_spec
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
    ("epochs = 1", "epochs = 1\nepoch = 2", "Unknown key 'epoch' (did you mean epochs?) in [lab]; allowed: epochs, batch_size, lr"),
    ('name = "b"', 'name = "b"\nlabel = "x"', "Unknown key 'label' in [[task]] #2 ('b'); allowed: name, type, data"),
    ("max_examples = 10", "max_examples = 10\nanalysis = 'x'", "Unknown key 'analysis' (did you mean analyses?) in [compare]; allowed: data,"),
    ('data = "b_train.tsv"', 'data = "nowhere.tsv"', "[[task]] #2 ('b'): data 'nowhere.tsv' does not exist"),
    ('data = "shared.tsv"', 'data = "gone.txt"', "[compare]: data 'gone.txt' does not exist"),
    ('name = "b"', 'name = "a"', "Two tasks are called 'a'; task names must be unique"),
    ("seeds = [0, 1]", "seeds = [0, 1, 0]", "seeds [0, 1, 0] repeat a seed"),
    ('type = "classification"', 'type = "summarisation"', "type must be one of auto, classification"),
    ('"representation_similarity"]', '"representation_similarity", "nope"]', "Unknown analysis nope"),
    ("max_examples = 10", "max_examples = 10\nown_seed_noise = 'yes'", "[compare]: own_seed_noise must be true or false"),
    # a task name becomes folder names (finetune/<task>/s0): one that leaves its folder is refused (issue 43)
    ('name = "a"', 'name = ".."', "[[task]] #1 ('..'): The task name '..' names a folder itself, not a name inside it"),
    ('name = "a"', 'name = "."', "[[task]] #1 ('.'): The task name '.' names a folder itself"),
    ('name = "a"', 'name = "a/b"', "[[task]] #1 ('a/b'): The task name 'a/b' holds a path separator"),
    ('name = "a"', 'name = ".a"', "[[task]] #1 ('.a'): The task name '.a' starts with '.'"),
])
def test_a_bad_spec_is_one_clear_error_before_any_work(tmp_path, old, new, message):
    spec = tiny_study(tmp_path)
    _edit(spec, old, new)
    result = invoke([str(spec)])
    assert result.exit_code == 2, result.output
    assert message in " ".join(result.output.split())
    assert not (tmp_path / "out").exists()  # nothing was started


@pytest.mark.parametrize("name", ["..", ".", "a/b"])
def test_a_task_name_that_leaves_its_folder_leaves_an_earlier_study_untouched(tmp_path, name):
    spec = tiny_study(tmp_path)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "manifest.json").write_text('{"kind": "study", "status": "complete"}')
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and p != spec}
    _edit(spec, 'name = "a"', f'name = "{name}"')
    result = invoke([str(spec)])
    assert result.exit_code == 2, result.output
    assert f"The task name {name!r}" in " ".join(result.output.split())
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file() and p != spec} == before


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
    from bertology.commands.compare import compare
    from bertology.report.format import fmt_value

    spec = tiny_study(tmp_path, extra=NO_REPORT)
    result = invoke([str(spec)])
    assert result.exit_code == 0, result.output
    out = tmp_path / "out"
    m = json.loads((out / "manifest.json").read_text())
    assert m["kind"] == "study" and m["status"] == "complete" and m["executor"] == "local"
    assert {j["id"]: j["status"] for j in m["jobs"]} == {
        "finetune:a/s0": "done", "finetune:a/s1": "done", "finetune:b/s0": "done", "finetune:b/s1": "done",
        "compare": "done", "compare_own:a": "done", "compare_own:b": "done",
        "seed_compare:a/s0": "done", "seed_compare:b/s0": "done",
        "seed_compare_own:a/s0": "done", "seed_compare_own:b/s0": "done"}
    assert m["tasks"][0] == {"name": "a", "task": "classification", "type": "classification", "seeds": [0, 1],
                             "models": {"0": "finetune/a/s0/model", "1": "finetune/a/s1/model"}}
    # b's spec leaves the type out: the manifest says what its fine-tunes chose, as each run's own manifest does
    chosen = {json.loads((out / f"finetune/b/s{s}/manifest.json").read_text())["summary"]["task"] for s in (0, 1)}
    assert chosen == {"classification"} and (m["tasks"][1]["task"], m["tasks"][1]["type"]) == ("classification", "auto")
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
    # each fine-tune's own warnings (these tiny models do not beat chance on 8 examples) head the study
    want = [f"{t}/s{s}: {w}" for t in ("a", "b") for s in (0, 1)
            for w in json.loads((out / f"finetune/{t}/s{s}/manifest.json").read_text())["warnings"]]
    assert want and m["warnings"] == want
    assert want[0] in html
    assert all(f"warning: {w}" in result.output for w in want)  # and in the summary after the job table
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

    # seed vs seed on each task's own dev data: b/s1 against b/s0 as the base on b_dev.tsv, as a separate compare
    own_seeds = pd.read_parquet(out / "tables" / "own_seedpair_representation_similarity.parquet")
    assert list(own_seeds.columns[:3]) == ["task", "seed_a", "seed_b"]
    assert m["own_seed_pairs"] == [{"task": t, "seed_a": 0, "seed_b": 1, "dir": f"seeds_own/{t}/s0"} for t in "ab"]
    cfg = CompareConfig(base=str(out / "finetune/b/s0/model"), tuned=str(out / "finetune/b/s1/model"),
                        data=DataConfig(str(tmp_path / "b_dev.tsv"), text_column="sentence", max_examples=10, max_length=16),
                        out=str(tmp_path / "alone3"), analyses=("representation_similarity",))
    alone_own = compare(cfg, report=False).table("representation_similarity")
    mine = own_seeds[own_seeds["task"] == "b"].drop(columns=["task", "seed_a", "seed_b"]).reset_index(drop=True)
    mine = mine.rename(columns={"representation_similarity_seed": "seed"})
    pd.testing.assert_frame_equal(mine, alone_own.reset_index(drop=True), check_dtype=False)
    assert not mine.equals(seeds[seeds["task"] == "b"].drop(columns=["task", "seed_a", "seed_b"]).reset_index(drop=True))
    # its seed noise is 1 - the same-layer similarity of that compare, per layer and metric
    noise = pd.read_parquet(out / "tables" / "own_study_seed_noise.parquet")
    noise = noise[(noise["table"] == "representation_similarity") & (noise["task"] == "b")]
    diag = alone_own[alone_own["layer_base"] == alone_own["layer_tuned"]]
    want = (1 - diag.groupby(["metric", "layer_base"])["value"].mean()).abs()
    got = noise.set_index(["metric", noise["layer"].astype(int).rename("layer_base")])["mean"]
    assert len(got) == len(want) > 0 and (got.sort_index() - want.sort_index()).abs().max() < 1e-12
    own_effects = pd.read_parquet(out / "tables" / "own_study_effects.parquet")
    pairwise = own_effects[own_effects["table"].isin(["attention_change", "representation_similarity"])]
    assert len(pairwise) and (pairwise["n_seed_pairs"] == 1).all() and pairwise["reason"].str.contains("2 seeds").all()
    assert not (out / "tables" / "own_study_task_differences.parquet").exists()  # each task on other data

    again = invoke([str(spec)])  # nothing to do: every job keeps the time it took when it ran
    assert again.exit_code == 0, again.output
    m2 = json.loads((out / "manifest.json").read_text())
    assert {j["status"] for j in m2["jobs"]} == {"cached"}
    first = {j["id"]: (j["wall_time_s"], j["finished"]) for j in m["jobs"]}
    assert {j["id"]: (j["wall_time_s"], j["finished"]) for j in m2["jobs"]} == first
    assert all(w > 0 for w, _ in first.values())
    for job in m["jobs"]:  # jobs/<id>.json holds the same time
        marker = json.loads((out / "jobs" / (job["id"].replace(":", "__").replace("/", "~") + ".json")).read_text())
        assert (marker["wall_time_s"], marker["finished"]) == first[job["id"]]
    wall = first["compare"][0]
    assert f"{wall:.1f} s (earlier run)" in " ".join(again.output.split())
    jobs_html = (out / "report.html").read_text().split('id="jobs"')[1]
    assert f'data-value="{float(wall)!r}">{fmt_value(wall)} (cached)</td>' in jobs_html
    pd.testing.assert_frame_equal(pd.read_parquet(out / "tables" / "attention_change.parquet"), table)

    # own_seed_noise = false: the own-data seed jobs and tables go; own-data verdicts say why there are none
    spec.write_text(spec.read_text() + "own_seed_noise = false\n")
    off = run_study(spec)
    assert set(off.statuses().values()) == {"cached"} and not any("seed_compare_own" in k for k in off.statuses())
    assert not list((out / "tables").glob("own_seedpair_*")) and off.manifest["own_seed_pairs"] == []
    own_effects = pd.read_parquet(out / "tables" / "own_study_effects.parquet")
    pairwise = own_effects[own_effects["table"].isin(["attention_change", "representation_similarity"])]
    assert (pairwise["reason"] == "no seed-vs-seed comparison for this unit").all()
    spec.write_text(spec.read_text().replace("own_seed_noise = false\n", ""))

    shutil.rmtree(out / "finetune/b/s1/model")  # killed before its model was saved: only that fine-tune runs again
    again = run_study(spec)
    assert [k for k, v in again.statuses().items() if v != "cached"] == ["finetune:b/s1"]
    pd.testing.assert_frame_equal(pd.read_parquet(out / "tables" / "attention_change.parquet"), table)


def test_a_task_whose_data_lacks_a_column_is_one_error_before_any_job(tmp_path):
    spec = tiny_study(tmp_path, extra=NO_REPORT)
    good = (tmp_path / "b_train.tsv").read_text()
    (tmp_path / "b_train.tsv").write_text(good.replace("label", "polarity", 1))  # no label column any more
    result = invoke([str(spec)])
    assert result.exit_code == 2, result.output
    assert "task 'b': " in result.output and "no label column 'label'" in " ".join(result.output.split())
    assert not (tmp_path / "out").exists()  # nothing was started
    (tmp_path / "b_train.tsv").write_text(good)
    _edit(spec, 'data = "shared.tsv"\ntext_column = "sentence"', 'data = "shared.tsv"\ntext_column = "text"')
    result = invoke([str(spec)])
    assert result.exit_code == 2 and "[compare] data: " in result.output, result.output
    assert not (tmp_path / "out").exists()


def test_a_failing_task_is_reported_the_rest_completes_and_a_rerun_retries_it(tmp_path, monkeypatch):
    from bertology.studies.jobs import FinetuneJob

    spec = tiny_study(tmp_path, extra=NO_REPORT)
    real_run = FinetuneJob.run

    def broken_b(self, progress=False):  # task b fails at run time (e.g. out of memory), a does not
        if self.task.name == "b":
            raise RuntimeError("CUDA out of memory (injected)")
        return real_run(self, progress)

    monkeypatch.setattr(FinetuneJob, "run", broken_b)
    result = invoke([str(spec)])
    assert result.exit_code == 1, result.output
    lines = result.output.splitlines()  # one line per failed job
    assert "2 of 11 job(s) failed; run the same command again to retry them:" in lines
    assert "failed: finetune:b/s0: RuntimeError: CUDA out of memory (injected)" in lines
    assert "failed: finetune:b/s1: RuntimeError: CUDA out of memory (injected)" in lines
    m = json.loads((tmp_path / "out" / "manifest.json").read_text())
    status = {j["id"]: (j["status"], j["error"]) for j in m["jobs"]}
    assert status["finetune:b/s0"] == ("failed", "RuntimeError: CUDA out of memory (injected)")
    assert status["seed_compare:b/s0"] == ("skipped", "needs the model of b/s0, b/s1, which did not finish")
    assert status["compare"][0] == status["seed_compare:a/s0"][0] == status["compare_own:a"][0] == "done"
    assert status["compare_own:b"] == ("skipped", "no fine-tuned model of b finished")
    assert status["seed_compare_own:b/s0"] == ("skipped", "needs the model of b/s0, b/s1, which did not finish")
    assert status["seed_compare_own:a/s0"][0] == "done"
    assert m["status"] == "incomplete" and [p["tuned"] for p in m["pairs"]] == ["a/s0", "a/s1"]
    # the seed-noise tables come from the seeds that exist: task a's verdicts, none for b
    effects = pd.read_parquet(tmp_path / "out/tables/study_effects.parquet")
    assert set(effects["task"]) == {"a"}
    assert (tmp_path / "out/report.html").exists()

    monkeypatch.setattr(FinetuneJob, "run", real_run)
    again = run_study(spec)
    assert again.statuses() == {
        "finetune:a/s0": "cached", "finetune:a/s1": "cached", "finetune:b/s0": "done", "finetune:b/s1": "done",
        "compare": "done", "compare_own:a": "cached", "compare_own:b": "done",
        "seed_compare:a/s0": "cached", "seed_compare:b/s0": "done",
        "seed_compare_own:a/s0": "cached", "seed_compare_own:b/s0": "done"}
    assert again.manifest["status"] == "complete"
    assert set(pd.read_parquet(again.out / "tables/attention_change.parquet")["tuned"]) == {"a/s0", "a/s1", "b/s0", "b/s1"}


def test_executor_ray_without_ray_names_the_extra(tmp_path, monkeypatch):
    spec = tiny_study(tmp_path)
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    result = invoke([str(spec), "--executor", "ray"])
    assert result.exit_code == 2
    assert "pip install 'bertology[ray]'" in result.output
    result = invoke([str(spec), "--executor", "dask"])
    assert "--executor (executor) must be one of local, ray, not 'dask'" in " ".join(result.output.split())
    shutil.rmtree(tmp_path / "out", ignore_errors=True)


def test_a_study_killed_before_its_end_resumes_and_a_foreign_folder_is_refused(tmp_path):
    from bertology.studies import runner

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
    assert again.statuses() == {"finetune:a/s0": "cached", "finetune:b/s0": "cached", "compare": "done",
                                "compare_own:a": "done", "compare_own:b": "done"}

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
                                 "compare_own:a": "done", "seed_compare:a/s0": "done", "seed_compare:b/s0": "done",
                                 "seed_compare_own:a/s0": "done"}  # b has no eval data: no own-data jobs
    assert result.manifest["tasks"][1]["models"] == {"0": str(m0), "1": str(m1)}
    assert result.manifest["tasks"][1]["task"] is None  # type auto and nothing fine-tuned: no kind to state
    assert not (tmp_path / "out" / "finetune" / "b").exists()
    table = pd.read_parquet(result.out / "tables" / "seedpair_attention_change.parquet")
    assert set(map(tuple, table[["task", "seed_a", "seed_b"]].drop_duplicates().values.tolist())) == {("a", 0, 1), ("b", 0, 1)}


def test_each_task_is_also_compared_on_its_own_dev_data(tmp_path):
    """[compare] own_data (the default): base vs each task's models on that task's eval_data (Merchant et al. 2020)."""
    from bertology.config import CompareConfig, DataConfig
    from bertology.commands.compare import compare

    spec = tiny_study(tmp_path, seeds=(0,))
    result = run_study(spec)
    out = result.out
    assert result.statuses()["compare_own:a"] == result.statuses()["compare_own:b"] == "done"
    assert result.manifest["own_pairs"] == [
        {"tuned": f"{t}/s0", "task": t, "seed": 0, "report": f"compare_own/{t}/pairs/{t}~s0/report.html"} for t in "ab"]
    assert all((out / p["report"]).is_file() for p in result.manifest["own_pairs"])
    for name in ("attention_change", "representation_similarity"):
        table = pd.read_parquet(out / "tables" / f"own_{name}.parquet")
        assert list(table.columns[:3]) == ["tuned", "task", "seed"] and set(table["tuned"]) == {"a/s0", "b/s0"}
        # b/s0's rows are exactly a separate compare of base vs that model on b's dev file
        cfg = CompareConfig(base=str(tmp_path / "base"), tuned=str(out / "finetune/b/s0/model"),
                            data=DataConfig(str(tmp_path / "b_dev.tsv"), text_column="sentence", max_examples=10,
                                            max_length=16),
                            out=str(tmp_path / f"alone_{name}"), analyses=(name,))
        alone = compare(cfg, report=False).table(name)
        mine = table[table["tuned"] == "b/s0"].drop(columns=["tuned", "task", "seed"]).reset_index(drop=True)
        mine = mine.rename(columns={f"{name}_seed": "seed"})  # a pair table's own seed, kept apart from the keys
        pd.testing.assert_frame_equal(mine, alone.reset_index(drop=True), check_dtype=False)
        shared = pd.read_parquet(out / "tables" / f"{name}.parquet")
        assert not shared[shared["tuned"] == "b/s0"].drop(columns=["tuned", "task", "seed"]).reset_index(drop=True).equals(mine)
    html = (out / "report.html").read_text()
    assert "own dev data" in html and "each task is measured on its own dev data" in html
    assert (out / "figures" / "study_similarity_own_cka_linear.svg").is_file()
    # the overview links each task's own-data pair reports beside its shared-corpus ones
    own_links = re.findall(r'<a class="own-pair-report" href="([^"]+)">([^<]+)</a>', html)
    assert own_links == [(p["report"], p["tuned"]) for p in result.manifest["own_pairs"]]
    # the figure draws own_study_summary: 1 - the same-layer similarity of the own-data table, per task and layer
    own = pd.read_parquet(out / "tables" / "own_representation_similarity.parquet")
    diag = own[(own["layer_base"] == own["layer_tuned"]) & (own["metric"] == "cka_linear")]
    want = 1 - diag.groupby(["task", "layer_base"])["value"].mean()
    summary = pd.read_parquet(out / "tables" / "own_study_summary.parquet")
    drawn = summary.query("table == 'representation_similarity' and metric == 'cka_linear' and quantity == 'change'")
    got = drawn.set_index(["task", drawn["layer"].astype(int).rename("layer_base")])["mean"]
    assert len(got) == len(want) == 2 * 3  # two tasks, embeddings + two layers
    assert (got.sort_index() - want.sort_index()).abs().max() < 1e-12 and (drawn["min"] == drawn["max"]).all()
    assert "No seed-vs-seed comparison on this corpus" in html  # one seed: no dashed line to draw
    assert "out-of-domain corpus" not in html  # no ood_data in this spec

    spec.write_text(spec.read_text() + "own_data = false\n")  # turned off: the shared comparison stays cached
    off = run_study(spec)
    assert set(off.statuses().values()) == {"cached"} and "compare_own:a" not in off.statuses()
    assert not list((out / "tables").glob("own_*")) and "own dev data" not in (out / "report.html").read_text()

    spec2 = tiny_study(tmp_path / "off", seeds=(0,), extra=NO_REPORT + "own_data = false\n")
    off = run_study(spec2)
    assert not any(k.startswith("compare_own") for k in off.statuses())
    assert off.manifest["own_pairs"] == [] and not (off.out / "compare_own").exists()
    assert not list((off.out / "tables").glob("own_*"))
    _edit(spec2, "own_data = false", "own_data = 1")
    with pytest.raises(BertologyError, match=r"\[compare\]: own_data must be true or false, not 1"):
        load_spec(spec2)


def test_one_writer_per_study_folder_and_an_unwritable_out_is_one_clear_error(tmp_path):
    """A second study into a folder a study is writing is refused before any job (the single runs' lock, held on
    the study folder for the whole study); an --out that cannot be a folder is one clear line, not a traceback."""
    from bertology.runs import lock_folder

    spec = tiny_study(tmp_path / "s", seeds=(0,))
    out = tmp_path / "s" / "out"
    held = lock_folder(out)  # another study's lock, as a concurrent process would hold it
    try:
        with pytest.raises(BertologyError, match="Another bertology run is writing into --out"):
            run_study(spec, out)
    finally:
        held.release()
    assert not (out / "manifest.json").exists() and not (out / "finetune").exists()  # nothing was written
    (tmp_path / "file").write_text("x", encoding="utf-8")
    result = invoke([str(spec), "--out", str(tmp_path / "file" / "out")])
    assert result.exit_code == 2 and "Cannot write into --out" in result.output and "internal error" not in result.output
    done = run_study(spec, out)  # the lock was the only thing in the folder: the study runs and resumes there
    assert all(j.status == "done" for j in done.jobs)


def test_a_changed_task_recipe_makes_the_fine_tunes_other_runs(tmp_path, monkeypatch):
    """Seeds trained before and after a recipe change are not mixed: the recipe's values are in the fingerprint,
    except those [lab] sets itself."""
    from dataclasses import replace

    from bertology.studies import jobs
    from bertology.training import recipes

    spec = load_spec(tiny_study(tmp_path))
    before = [j.fingerprint for j in jobs.finetune_jobs(spec, tmp_path / "out")]
    old = recipes.RECIPES["classification"]
    monkeypatch.setitem(recipes.RECIPES, "classification", replace(old, warmup_ratio=0.2))
    after = [j.fingerprint for j in jobs.finetune_jobs(spec, tmp_path / "out")]
    assert all(a != b for a, b in zip(before, after))  # task a is classification, b is auto (may be one)
    monkeypatch.setitem(recipes.RECIPES, "classification", replace(old, epochs=9.0))  # [lab] sets epochs
    assert [j.fingerprint for j in jobs.finetune_jobs(spec, tmp_path / "out")] == before
