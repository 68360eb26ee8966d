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
    from bertology.study.view import view

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
    assert sorted(tracked.tables) == ["attention_change", "representation_similarity"]
    steps = sorted(set(tracked.attention_change["step"]))
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
