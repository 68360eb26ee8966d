"""The demo compares on a label-balanced sample of the held-out split (Corpus.stratified_sample), in corpus order."""
from collections import Counter

from bertology.data.corpus import Corpus
from bertology.demo import split_heldout


def test_stratified_sample_is_balanced_ordered_and_seeded():
    # like the polarity file: every positive sentence first, then every negative one
    corpus = Corpus.from_list([f"s{i}" for i in range(200)], labels=["1"] * 100 + ["-1"] * 100)
    _, held = split_heldout(corpus, 0.5, seed=0)
    assert Counter(ex.label for ex in list(held)[:40]) == {"1": 40}  # what head(40) would have compared
    sample = held.stratified_sample(40, seed=0)
    assert Counter(ex.label for ex in sample) == {"1": 20, "-1": 20}
    texts = [ex.text for ex in sample]
    order = {ex.text: i for i, ex in enumerate(held)}
    assert [order[t] for t in texts] == sorted(order[t] for t in texts)
    assert [ex.text for ex in held.stratified_sample(40, seed=0)] == texts
    assert len(held.stratified_sample(1000, seed=0)) == len(held)


def test_the_default_demo_is_quick_and_full_runs_the_whole_sweeps(tmp_path):
    """The config builders as pure functions: no fine-tune, no model loaded."""
    from pathlib import Path

    from bertology.demo import FULL, QUICK, demo_compare_config, demo_finetune_config, demo_plan

    data, out, model = tmp_path / "polarity.csv", tmp_path / "demo", tmp_path / "demo-model" / "model"
    assert demo_plan() is QUICK and demo_plan(full=True) is FULL
    quick = demo_compare_config(demo_plan(), data, out, model, compare_examples=500, seed=0)
    full = demo_compare_config(demo_plan(full=True), data, out, model, compare_examples=500, seed=0)
    for cfg in (quick, full):  # every kind of result: all analyses, the three ablation modes
        assert cfg.analyses == ("all",) and cfg.ablation_mode == ("uniform", "revert", "transplant")
        assert cfg.data.max_examples == 500 and Path(cfg.tuned) == model and cfg.out == str(out)
    assert full.ablation_examples == 500 and full.ablation_importance is True
    assert quick.ablation_examples < full.ablation_examples and quick.ablation_importance is False
    # never more sweep sentences than compared ones
    assert demo_compare_config(FULL, data, out, model, compare_examples=80, seed=0).ablation_examples == 80

    ft_quick = demo_finetune_config(QUICK, data, out, epochs=1.0, seed=3)
    ft_full = demo_finetune_config(FULL, data, out, epochs=1.0, seed=3)
    assert ft_full.data.max_examples is None and ft_full.data.max_length == 128  # the whole training split
    assert ft_quick.data.max_examples == QUICK.train_examples < 3200 and ft_quick.data.max_length < 128
    assert ft_full.learning_rate is None  # the recipe's, as before --full existed
    assert ft_quick.out == ft_full.out == str(tmp_path / "demo-model") and ft_quick.seed == 3


def test_the_demo_flag_is_the_function_keyword():
    """``bertology demo --full`` reaches ``run_demo(full=...)``, and every other flag a keyword too."""
    import inspect

    import click
    import typer.main

    from bertology.cli import app
    from bertology.demo import FULL, run_demo

    cmd = typer.main.get_command(app).commands["demo"]
    keywords = inspect.signature(run_demo).parameters
    flags = {p.name for p in cmd.get_params(click.Context(cmd)) if p.name != "help"}
    assert "full" in flags and flags <= set(keywords)
    assert keywords["full"].default is False
    full_help = next(p.help for p in cmd.get_params(click.Context(cmd)) if p.name == "full")
    assert f"{FULL.ablation_examples} held-out sentences" in full_help


def test_a_demo_run_leaves_its_split_where_demo_paths_say(tmp_path, monkeypatch):
    """The split files the README's quickstart names: written by run_demo at DemoPaths (the fine-tune and the
    comparison replaced by stand-ins: nothing is trained here), disjoint, together the whole data file."""
    import csv
    from pathlib import Path
    from types import SimpleNamespace

    import pandas as pd

    import bertology.demo as demo
    from bertology.data.loaders import load_corpus

    data = tmp_path / "polarity.csv"
    rows = [(f"sentence number {i} .", "1" if i < 20 else "-1") for i in range(40)]
    with data.open("w", newline="", encoding="utf-8") as fh:
        csv.writer(fh).writerows([("text", "label"), *rows])
    monkeypatch.setattr(demo, "fetch_polarity", lambda: data)
    seen = {}

    def finetune(config, train, heldout, **_):
        seen["finetune"] = config
        return SimpleNamespace(model_dir=Path(config.out) / "model", table=pd.DataFrame(), metrics={}, reused=False)

    monkeypatch.setattr(demo, "finetune_to_dir", finetune)
    monkeypatch.setattr(demo, "compare", lambda config, **_: seen.setdefault("compare", config))
    result = demo.run_demo(tmp_path / "runs" / "demo", heldout_fraction=0.25)
    paths = demo.DemoPaths.of(tmp_path / "runs" / "demo")
    assert result.paths == paths and Path(seen["finetune"].out) == paths.model_run and result.model_dir == paths.model
    train, held = load_corpus(str(paths.train)), load_corpus(str(paths.heldout))
    assert (len(train), len(held)) == (30, 10)
    assert {ex.text for ex in train}.isdisjoint(ex.text for ex in held)
    assert sorted((ex.text, ex.label) for ex in [*train, *held]) == sorted(rows)  # the labels as in the file
    assert Counter(ex.label for ex in held) == {"1": 5, "-1": 5}
