"""Every command a notebook function: ``bt.view`` (inline in Jupyter), ``bt.track`` and ``bt.render_report`` do what
``bertology view``, ``track`` and ``report`` do, with data in memory where a command takes data."""
from __future__ import annotations

import pandas as pd
import pytest

import bertology as bt
from bertology.errors import BertologyError
from bertology.testing import SENTENCES, save_tiny_bert, tiny_bert_pair


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return tiny_bert_pair(tmp_path_factory.mktemp("pair"), planted=(1, 2))


def test_view_is_the_commands_view_and_shows_inline(pair, tmp_path):
    from bertology.commands.view import view

    base, tuned = map(str, pair)
    shown = bt.view("the cat sat .", model=base, compare=tuned, out=tmp_path / "py.json")
    command = view("the cat sat .", model=base, compare=tuned, out=tmp_path / "cmd.json")
    assert (tmp_path / "py.json").read_text(encoding="utf-8") == command.out.read_text(encoding="utf-8")
    assert "cat" in shown.tokens and shown.diff().shape == shown.attention().shape
    html = shown._repr_html_()
    assert "<script" in html and "bertology-view-" in html  # the viewer fragment a notebook renders
    with pytest.raises(BertologyError, match="max_length"):
        bt.view("the cat sat .", model=base, max_length=1)


def test_track_a_run_trained_from_a_dataframe_on_a_dataframe(tmp_path):
    base = save_tiny_bert(tmp_path / "base")
    frame = pd.DataFrame({"sentence": SENTENCES * 2, "label": ["pos", "neg"] * len(SENTENCES)})
    ft = bt.finetune(base, frame, out=tmp_path / "ft", epochs=1, batch_size=8, save_every=2)
    with pytest.raises(BertologyError, match="No data to compare on"):
        bt.track(ft.out, max_examples=8)  # trained from memory: no file to fall back on
    tracked = bt.track(ft.out, frame, max_examples=8)
    assert sorted(tracked.tables) == ["track_attention_change", "track_representation_similarity"]
    again = bt.load_run(ft.out)
    pd.testing.assert_frame_equal(again.track_attention_change, tracked.track_attention_change, check_dtype=False)
    steps = sorted(set(tracked.track_attention_change["step"]))
    assert steps[0] == 2  # the first checkpoint (one every 2 steps)
    with pytest.raises(BertologyError, match=r"max_example \(did you mean max_examples\?\)"):
        bt.track(ft.out, frame, max_example=8)


def test_report_renders_a_kept_run_again(pair, tmp_path):
    base, tuned = map(str, pair)
    bt.compare(base, tuned, SENTENCES, analyses=["attention_change"], view_examples=0, out=tmp_path / "run")
    (tmp_path / "run" / "report.html").unlink(missing_ok=True)
    assert bt.render_report(tmp_path / "run") == tmp_path / "run" / "report.html"
    assert "Attention change" in (tmp_path / "run" / "report.html").read_text(encoding="utf-8")
    (tmp_path / "run" / "tables" / "attention_change.parquet").write_bytes(b"not parquet")
    with pytest.raises(BertologyError, match=r"attention_change of .* could not be read.*report\.html"):
        bt.render_report(tmp_path / "run")
    with pytest.raises(BertologyError, match="no manifest.json"):
        bt.render_report(tmp_path / "nowhere")


def test_compare_several_tuned_models_as_the_command_does(tmp_path):
    """``bt.compare(base, {name: model})`` is ``bertology compare --tuned NAME=PATH ...``: one run, combined tables with
    tuned/task/seed first, each pair's own run; the same with a list of NAME=PATH strings and from load_run."""
    base = save_tiny_bert(tmp_path / "base")
    a = tiny_bert_pair(tmp_path / "a", planted=(1, 2))[1]
    b = tiny_bert_pair(tmp_path / "b", planted=(2, 1))[1]
    models = {"sst2/s0": str(a), "sst2/s1": str(b)}
    kw = dict(analyses=["attention_change"], view_examples=0)
    run = bt.compare(base, models, SENTENCES, **kw)
    assert run.kind == "compare_many" and run.out is None and set(run.pairs) == set(models)
    table = run.attention_change
    assert list(table.columns[:3]) == ["tuned", "task", "seed"] and set(table["seed"]) == {0, 1}
    for name, pair in run.pairs.items():
        mine = table[table["tuned"] == name].drop(columns=["tuned", "task", "seed"]).reset_index(drop=True)
        pd.testing.assert_frame_equal(mine, pair.attention_change.reset_index(drop=True), check_dtype=False)
    assert run.summary().startswith("sst2/s0: attention change")
    card = run._repr_html_()
    assert "→ sst2/s0, sst2/s1" in card and "run.pairs[name]" in card and "10 examples" in card
    kept = bt.compare(base, [f"{n}={p}" for n, p in models.items()], SENTENCES, out=tmp_path / "many", **kw)
    again = bt.load_run(tmp_path / "many")
    assert set(again.pairs) == set(models) and again.pairs["sst2/s1"].out == tmp_path / "many/pairs/sst2~s1"
    pd.testing.assert_frame_equal(again.attention_change, kept.attention_change, check_dtype=False)
    pd.testing.assert_frame_equal(kept.attention_change, run.attention_change, check_dtype=False)
    with pytest.raises(BertologyError, match="tuned must be a model"):
        bt.compare(base, 3, SENTENCES)


def test_what_the_commands_take_the_functions_take(tmp_path):
    """``bertology ablate --base`` (revert), ``finetune``'s report and ``study --ray-address`` were CLI-only."""
    from bertology.commands.ablate import ablate

    base = save_tiny_bert(tmp_path / "base")
    frame = pd.DataFrame({"sentence": SENTENCES * 2, "label": ["pos", "neg"] * len(SENTENCES)})
    ft = bt.finetune(base, frame, out=tmp_path / "ft", epochs=1, batch_size=8, report=True)
    assert ft.report == tmp_path / "ft" / "report.html" and ft.report.exists()
    kw = dict(n_bootstrap=10, importance=False)
    reverted = bt.ablate(ft.model_dir, frame, base=base, mode="revert", **kw)
    frame.to_csv(tmp_path / "d.csv", index=False)
    command = ablate(str(ft.model_dir), str(tmp_path / "d.csv"), {"mode": "revert", **kw}, base=str(base), report=False)
    pd.testing.assert_frame_equal(reverted.ablation, command.tables["ablation"], check_dtype=False)
    with pytest.raises(BertologyError, match="needs --base"):
        bt.ablate(ft.model_dir, frame, mode="revert", **kw)
    import inspect

    from bertology.api import study

    assert "ray_address" in inspect.signature(study).parameters  # passed on to run_study (tests/integration/test_study_ray)


def test_a_many_model_run_made_in_memory_is_saved_with_its_pairs(tmp_path):
    base = save_tiny_bert(tmp_path / "base")
    models = {"a": str(tiny_bert_pair(tmp_path / "a", planted=(1, 2))[1]),
              "b": str(tiny_bert_pair(tmp_path / "b", planted=(2, 1))[1])}
    run = bt.compare(base, models, SENTENCES, analyses=["attention_change"], view_examples=0)
    kept = run.save(tmp_path / "kept", report=True)
    assert set(kept.pairs) == {"a", "b"} and kept.report.exists()
    for name, pair in kept.pairs.items():
        assert pair.out == tmp_path / "kept" / "pairs" / name and pair.report.exists()
        pd.testing.assert_frame_equal(pair.attention_change, run.pairs[name].attention_change, check_dtype=False)
    assert [p["report"] for p in kept.manifest["pairs"]] == ["pairs/a/report.html", "pairs/b/report.html"]
    assert 'href="pairs/a/report.html"' in kept.report.read_text(encoding="utf-8")
