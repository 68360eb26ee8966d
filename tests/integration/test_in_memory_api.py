"""Every notebook call takes data in memory as it takes a file: ``bt.compare``, ``bt.finetune``, ``bt.ablate`` and
``bt.probe`` given a DataFrame (or a list) give the tables they give for the file it was written to, and apply the
same column settings and example cap."""
from __future__ import annotations

import random

import pandas as pd
import pytest

import bertology as bt
from bertology.errors import BertologyError
from bertology.testing import SENTENCES, TINY_WORDS, save_tiny_bert, tiny_bert_pair


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    return tiny_bert_pair(tmp_path_factory.mktemp("pair"), planted=(1, 2))


def _labelled(n: int = 40) -> pd.DataFrame:
    rng = random.Random(0)
    filler = [w for w in TINY_WORDS if w not in {"good", "bad"}]
    texts = [f"{rng.choice(filler)} {'good' if i % 2 else 'bad'} {rng.choice(filler)}" for i in range(n)]
    return pd.DataFrame({"review": texts, "stars": [i % 2 for i in range(n)]})


def _equal_tables(a: bt.Run, b: bt.Run) -> None:
    assert set(a.tables) == set(b.tables)
    for name in a.tables:
        pd.testing.assert_frame_equal(a.tables[name], b.tables[name])


def test_compare_a_dataframe_as_its_csv(pair, tmp_path):
    base, tuned = map(str, pair)
    frame = pd.DataFrame({"review": SENTENCES, "stars": [i % 2 for i in range(len(SENTENCES))]})
    frame.to_csv(tmp_path / "d.csv", index=False)
    kw = dict(analyses=["attention_change", "geometry"], text_column="review", label_column="stars", view_examples=0)
    from_frame = bt.compare(base, tuned, frame, **kw)
    _equal_tables(from_frame, bt.compare(base, tuned, tmp_path / "d.csv", **kw))
    data = from_frame.manifest["data"]
    assert data["source"] == "pandas DataFrame" and data["columns"]["text"] == "review"
    # the example cap applies to data in memory as to a file (it did not, for a list, before)
    capped = bt.compare(base, tuned, SENTENCES * 3, analyses=["attention_change"], max_examples=5, view_examples=0)
    assert capped.manifest["data"]["n_examples"] == 5 and capped.manifest["data"]["limited_to"] == 5


def test_finetune_and_ablate_from_a_dataframe_as_from_its_file(tmp_path):
    frame = _labelled()
    path = tmp_path / "train.csv"
    frame.to_csv(path, index=False)
    base = save_tiny_bert(tmp_path / "base")
    kw = dict(epochs=1, batch_size=8, seed=0, text_column="review", label_column="stars")
    held = frame.iloc[:10]
    from_frame = bt.finetune(base, frame, out=tmp_path / "ft_frame", eval_data=held, **kw)
    held.to_csv(tmp_path / "held.csv", index=False)
    from_file = bt.finetune(base, path, out=tmp_path / "ft_file", eval_data=tmp_path / "held.csv", **kw)
    curve = ["step", "epoch", "split", "metric", "value"]
    pd.testing.assert_frame_equal(from_frame.finetune[curve], from_file.finetune[curve])
    assert from_frame.manifest["data"]["train"]["source"] == "pandas DataFrame"
    kw = dict(text_column="review", label_column="stars", n_bootstrap=20, importance=False)
    _equal_tables(bt.ablate(from_frame.model_dir, frame, **kw), bt.ablate(from_frame.model_dir, path, **kw))
    with pytest.raises(BertologyError, match=r"python list has no labels; .*Give rows with their labels: a list of dicts"):
        bt.ablate(from_frame.model_dir, list(frame["review"]))
    with pytest.raises(BertologyError, match=r"pandas DataFrame has no labels; .*label_column= in Python"):
        bt.ablate(from_frame.model_dir, frame[["review"]], text_column="review")


def test_probe_a_list_of_sentences_as_its_text_file(pair, tmp_path):
    """Plain text is parsed by spaCy either way: a list and the .txt file of the same lines give one table."""
    pytest.importorskip("spacy")
    from bertology.assets import spacy_model_name

    if spacy_model_name(None) is None:
        pytest.skip("no English spaCy pipeline installed")
    base, _ = map(str, pair)
    (tmp_path / "s.txt").write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")
    kw = dict(rank=4, epochs=2, batch_size=6)
    from_list = bt.probe(base, SENTENCES, SENTENCES, **kw)
    from_file = bt.probe(base, tmp_path / "s.txt", tmp_path / "s.txt", **kw)
    _equal_tables(from_list, from_file)
    assert from_list.manifest["config"]["train"] == "python list"


def test_a_run_made_in_memory_is_saved_and_reopened(pair, tmp_path):
    base, tuned = map(str, pair)
    run = bt.compare(base, tuned, SENTENCES, analyses=["attention_change", "geometry"], view_examples=2)
    kept = run.save(tmp_path / "kept", report=True)
    assert kept.out == tmp_path / "kept" and kept.report == tmp_path / "kept" / "report.html"
    _equal_tables(kept, run)
    assert kept.manifest["config"]["out"] == str(tmp_path / "kept") and kept.manifest["saved_from_memory"] is True
    assert kept.manifest["views"] == [] and kept.manifest["fingerprint"] == run.manifest["fingerprint"]
    html = kept.report.read_text(encoding="utf-8")
    assert "could not be shown" not in html and "Attention change" in html
    assert run.save(tmp_path / "kept").out == tmp_path / "kept"  # the identical run is there: kept as it is
    other = bt.compare(base, tuned, SENTENCES[:5], analyses=["attention_change"], view_examples=0)
    with pytest.raises(BertologyError, match="overwrite"):
        other.save(tmp_path / "kept")
    assert set(other.save(tmp_path / "kept", overwrite=True).tables) == {"attention_change"}
    with pytest.raises(BertologyError, match="is kept in .* already"):
        kept.save(tmp_path / "elsewhere")
