"""Per-task recipes (bertology.training.recipes): what the user gave wins, the rest comes from the task's recipe
and the manifest says so; the head trains at its own rate; an under-trained run is flagged."""
from __future__ import annotations

import dataclasses

import pandas as pd
import pytest
from transformers import AutoModel

from bertology.cli.finetune import make_config
from bertology.config import DataConfig, FinetuneConfig
from bertology.models.parser import BiaffineParser, ParserConfig
from bertology.training.loop import LoopConfig, _optimizer, head_parameter_names
from bertology.training.recipes import (
    FAR_BELOW, RECIPES, STEEP_DROP, apply_recipe, last_epoch_drop, recipe_record, undertraining_warnings,
)
from bertology.training.run import settings_record
from bertology.testing import save_tiny_bert


def _config(**values) -> FinetuneConfig:
    return FinetuneConfig(model="m", data=DataConfig(path="d", max_examples=None, overlong="truncate"), **values)


def test_a_value_given_wins_even_when_it_equals_the_generic_default():
    recipe = RECIPES["parsing"]
    given = apply_recipe(_config(learning_rate=5e-5, batch_size=32), "parsing")
    assert (given.learning_rate, given.batch_size) == (5e-5, 32)  # the old generic defaults, given: kept
    assert (given.head_lr, given.epochs, given.parsing.arc_dim) == (recipe.head_lr, recipe.epochs, recipe.arc_dim)
    assert given.recipe == {"task": "parsing", "from_recipe": ["arc_dim", "epochs", "head_lr", "label_dim", "warmup_ratio"]}
    left = apply_recipe(_config(), "parsing")
    assert (left.learning_rate, left.batch_size) == (recipe.learning_rate, recipe.batch_size)
    assert apply_recipe(left, "parsing") is left  # nothing left to fill: the record stays


def test_the_command_line_passes_only_the_flags_given():
    config = make_config("d.conllu", "minilm", "out", None, {"learning_rate": 5e-5, "task": "parsing"})
    assert config.learning_rate == 5e-5 and config.batch_size is None and config.head_lr is None
    resolved = apply_recipe(config, "parsing")
    assert resolved.learning_rate == 5e-5 and resolved.batch_size == RECIPES["parsing"].batch_size


def test_one_rate_recipes_give_the_head_the_encoders_rate_and_tasks_without_a_biaffine_no_sizes():
    config = apply_recipe(_config(learning_rate=3e-5), "classification")
    assert config.head_lr == 3e-5 and config.parsing.arc_dim is None and config.parsing.label_dim is None
    assert apply_recipe(_config(), "bio_tagging").head_lr == RECIPES["tagging"].head_lr


def test_the_manifest_records_the_values_used_and_which_came_from_the_recipe():
    config = apply_recipe(_config(learning_rate=5e-5), "tagging")
    settings = settings_record(config)["finetune"]
    assert settings["learning_rate"] == {**settings["learning_rate"], "value": 5e-5} and "source" not in settings["learning_rate"]
    assert settings["head_lr"]["value"] == RECIPES["tagging"].head_lr
    assert settings["head_lr"]["source"] == "the tagging recipe"
    record = recipe_record(config)
    assert record["task"] == "tagging" and record["from_recipe"]["batch_size"]["value"] == RECIPES["tagging"].batch_size
    assert record["from_recipe"]["batch_size"]["source"] == RECIPES["tagging"].sources["batch_size"]
    assert recipe_record(_config()) is None


def test_every_recipe_names_a_source_for_each_value_it_sets():
    for name, recipe in RECIPES.items():
        set_here = [f.name for f in dataclasses.fields(recipe) if f.name in
                    ("learning_rate", "epochs", "batch_size", "warmup_ratio", "head_lr", "arc_dim", "label_dim")
                    and getattr(recipe, f.name) is not None]
        assert set(set_here) <= set(recipe.sources), name


def test_the_head_trains_at_its_own_rate_and_the_encoder_at_the_run_rate(tmp_path):
    enc = AutoModel.from_pretrained(save_tiny_bert(tmp_path), attn_implementation="eager")
    model = BiaffineParser(enc, ParserConfig(labels=("a", "b"), hidden_size=32, arc_dim=8, label_dim=4))
    head = head_parameter_names(model)
    assert head == {f"head.{n}" for n, _ in model.head.named_parameters()}
    opt = _optimizer(model, LoopConfig(total_steps=1, steps_per_epoch=1, warmup_steps=0, batch_size=2,
                                       learning_rate=1e-4, head_lr=2e-3))
    rate = {id(p): g["lr"] for g in opt.param_groups for p in g["params"]}
    named = dict(model.named_parameters())
    assert {rate[id(named[n])] for n in head} == {2e-3}
    assert {rate[id(p)] for n, p in named.items() if n not in head} == {1e-4}
    assert head_parameter_names(enc) == set()  # a bare encoder has no head


def _table(losses: list[float], epochs: float = 2.0) -> pd.DataFrame:
    """A finetune table with one logged training loss per window, spread evenly over ``epochs``."""
    n = len(losses)
    rows = [{"step": i + 1, "epoch": epochs * (i + 1) / n, "split": "train", "metric": "loss", "value": v, "slice": "all"}
            for i, v in enumerate(losses)]
    return pd.DataFrame(rows)


def test_a_loss_still_falling_steeply_in_the_last_epoch_is_flagged():
    falling = _table([4.0, 3.5, 3.0, 2.6, 2.2, 1.8, 1.5, 1.2])  # last epoch: 2.2 1.8 | 1.5 1.2
    assert last_epoch_drop(falling) == pytest.approx(1 - 1.2 / 2.2)
    warnings = undertraining_warnings(falling, {}, "classification")
    assert len(warnings) == 1 and "still falling steeply" in warnings[0]
    flat = _table([4.0, 2.0, 1.0, 0.8, 0.52, 0.5, 0.5, 0.49])
    assert last_epoch_drop(flat) < STEEP_DROP and undertraining_warnings(flat, {}, "classification") == []
    assert last_epoch_drop(_table([1.0, 0.5])) is None  # too few windows to tell


def test_a_run_of_under_two_epochs_is_judged_on_its_last_half():
    assert last_epoch_drop(_table([3.0, 2.0, 1.0, 0.9, 0.8, 0.4], epochs=1.0)) == pytest.approx(1 - 0.4 / 0.9)


def test_a_score_far_below_the_recipes_figure_is_flagged_and_one_near_it_is_not():
    ref = RECIPES["parsing"].reference
    flat = _table([1.0] * 6)
    low = undertraining_warnings(flat, {"uas": 0.317, "las": 0.191}, "parsing")
    assert len(low) == 1 and "far below" in low[0] and f"{ref.value:.3f}" in low[0]
    assert undertraining_warnings(flat, {"uas": ref.value * (FAR_BELOW + 0.01)}, "parsing") == []
    assert undertraining_warnings(flat, {"uas": float("nan")}, "parsing") == []
    assert undertraining_warnings(flat, {"accuracy": 0.1}, "bio_tagging") == []  # O tags: no reference applies
    both = undertraining_warnings(_table([4.0, 3.5, 3.0, 2.6, 2.2, 1.8, 1.5, 1.2]), {"uas": 0.1}, "parsing")
    assert len(both) == 2


def test_unknown_recipe_names_are_refused():
    with pytest.raises(KeyError):
        apply_recipe(_config(), "no-such-task")


def test_a_value_is_one_run_whether_the_user_or_the_recipe_gave_it(tmp_path):
    from bertology.data.corpus import Corpus
    from bertology.training.run import run_fingerprint

    base = str(save_tiny_bert(tmp_path / "m"))
    corpus = Corpus.from_list(["a b", "c d", "e f", "g h"], labels=["0", "1", "0", "1"])

    def fp(**values) -> str:
        return run_fingerprint(dataclasses.replace(_config(**values), model=base), corpus)

    generic = dict(learning_rate=5e-5, batch_size=32, epochs=2.0, warmup_ratio=0.1)
    assert fp() == fp(**generic) == fp(**generic, head_lr=5e-5)  # classification: one rate, as before recipes
    assert fp() != fp(learning_rate=1e-4)
    parsing = RECIPES["parsing"]
    given = dict(learning_rate=parsing.learning_rate, head_lr=parsing.head_lr, batch_size=parsing.batch_size,
                 epochs=parsing.epochs, warmup_ratio=parsing.warmup_ratio, arc_dim=parsing.arc_dim, label_dim=parsing.label_dim)
    assert fp(task="parsing") == fp(task="parsing", **given) != fp(task="parsing", **{**given, "head_lr": 1e-3})


def test_the_report_says_a_setting_came_from_the_recipe_not_that_it_differs_from_not_given():
    from bertology.report.sections.overview import _declared_row

    record = settings_record(apply_recipe(_config(learning_rate=5e-5), "parsing"))["finetune"]
    assert _declared_row(record["head_lr"])["text"].startswith("0.002 (the parsing recipe)")
    assert _declared_row(record["learning_rate"])["text"].startswith("5e-05 (default not given)")


def test_a_weak_run_of_few_steps_is_told_the_epochs_or_examples_that_reach_the_minimum():
    from bertology.training.recipes import MIN_STEPS, few_steps_note

    record = {"steps": 14, "steps_per_epoch": 7, "epochs": 2.0, "effective_batch_size": 32, "n_train": 200}
    note = few_steps_note(record, min_steps=100)
    # 100 steps at 7 a epoch take ceil(100 / 7) = 15 epochs; at 2 epochs of batch 32, 100 steps take 1,600 examples
    assert "made 14 optimizer steps (200 training examples, batch 32, 2 epochs)" in note
    assert "--epochs 15 on this data" in note and "at least 1,600 training examples" in note
    assert few_steps_note({**record, "steps": 100}, min_steps=100) is None  # enough steps: nothing to add
    assert few_steps_note({**record, "steps": None}) is None and few_steps_note({}) is None  # an older record
    assert few_steps_note(record) == few_steps_note(record, min_steps=MIN_STEPS)
