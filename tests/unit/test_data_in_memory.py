"""Data in memory (bertology.data.frames through load_corpus): a DataFrame, a datasets.Dataset, a list of dicts and
a list of sentences are read exactly as the file they could have been written to: the same examples, columns,
drops and fingerprint; what cannot be read is one clear error."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from bertology.data.corpus import Corpus
from bertology.data.loaders import load_corpus
from bertology.errors import BertologyError


@pytest.fixture
def frame() -> pd.DataFrame:
    """GLUE-like rows with a NaN label (pandas widens the int column to float) and an empty text."""
    return pd.DataFrame({
        "premise": ["a man sleeps", "  two dogs run ", "", "the cat sat", "it rains"],
        "hypothesis": ["a person rests", "animals move", "x", "a cat", "it is wet"],
        "label": [1, 0, 1, np.nan, 2],
    })


def _same(a: Corpus, b: Corpus) -> None:
    assert a.examples == b.examples
    assert a.fingerprint() == b.fingerprint()
    assert a.stats["columns"] == b.stats["columns"]
    assert (a.stats["n_empty_text"], a.stats["n_no_gold_label"]) == (b.stats["n_empty_text"], b.stats["n_no_gold_label"])


def test_a_dataframe_reads_as_the_csv_written_from_it(frame, tmp_path):
    path = tmp_path / "d.csv"
    frame.to_csv(path, index=False)  # the NaN label is written as an empty cell, 1.0 as 1.0
    from_file = load_corpus(path)
    in_memory = load_corpus(frame)
    assert in_memory.source == "pandas DataFrame" and in_memory.stats["format"] == "dataframe"
    assert [ex.label for ex in in_memory] == ["1", "0", None, "2"]  # 1, not "1.0": the int column pandas widened
    assert in_memory.stats["n_empty_text"] == 1 and in_memory[1].text == "two dogs run"
    assert in_memory.stats["columns"] == {"text": "premise", "pair": "hypothesis", "label": "label"}
    frame_as_ints = frame.assign(label=frame["label"].astype("Int64"))  # the file the labels came from
    frame_as_ints.to_csv(path, index=False)
    _same(load_corpus(path), in_memory)
    assert from_file.examples != in_memory.examples  # to_csv wrote the widened column as 1.0


def test_a_float_column_without_missing_cells_keeps_its_floats(tmp_path):
    """A regression target of whole scores (1.0, 2.0) stays 1.0 as in its CSV: task detection reads the decimal point."""
    frame = pd.DataFrame({"text": ["a", "b", "c"], "score": [1.0, 2.0, 2.5]})
    frame.to_csv(tmp_path / "s.csv", index=False)
    assert [ex.label for ex in load_corpus(frame)] == ["1.0", "2.0", "2.5"]
    _same(load_corpus(frame), load_corpus(tmp_path / "s.csv"))


def test_column_flags_and_limit_act_as_on_a_file(frame, tmp_path):
    path = tmp_path / "d.csv"
    frame.assign(label=frame["label"].astype("Int64")).to_csv(path, index=False)
    flags = dict(text_column="hypothesis", label_column="label", limit=2)
    _same(load_corpus(frame, **flags), load_corpus(path, **flags))
    assert load_corpus(frame, **flags).stats["limited_to"] == 2
    assert load_corpus(frame, text_column="2").stats["columns"]["text"] == "label"  # a 0-based position, as in a file
    with pytest.raises(BertologyError, match=r"pandas DataFrame: no text column 'txt'; available columns: "
                                             r"\['premise', 'hypothesis', 'label'\]"):
        load_corpus(frame, text_column="txt")


def test_a_list_of_dicts_and_a_dataset_read_as_the_frame(frame):
    expected = load_corpus(frame)
    records = load_corpus(frame.to_dict("records"))
    assert records.source == "list of dicts"
    _same(records, expected)
    datasets = pytest.importorskip("datasets")
    whole = frame.assign(label=frame["label"].astype("Int64"))
    ds = datasets.Dataset.from_pandas(whole)
    assert load_corpus(ds).examples == expected.examples
    with pytest.raises(BertologyError, match=r"a datasets.DatasetDict with splits \['train'\]; pass one split"):
        load_corpus(datasets.DatasetDict({"train": ds}))
    with pytest.raises(BertologyError, match=r"a streaming datasets.IterableDataset; take the examples first"):
        load_corpus(ds.to_iterable_dataset())


def test_a_dataset_class_label_names_and_no_gold_label():
    """As the hf: reader always did: a ClassLabel column's names are recorded, and -1 (SNLI's "no gold label") dropped."""
    datasets = pytest.importorskip("datasets")
    features = datasets.Features({"sentence": datasets.Value("string"),
                                  "label": datasets.ClassLabel(names=["negative", "positive"])})
    ds = datasets.Dataset.from_dict({"sentence": ["good", "bad", "meh"], "label": [1, 0, -1]}, features=features)
    corpus = load_corpus(ds)
    assert [ex.label for ex in corpus] == ["1", "0"] and corpus.stats["n_no_gold_label"] == 1
    assert corpus.stats["label_names"] == ["negative", "positive"]


def test_a_list_of_sentences_is_cleaned_as_a_text_file(tmp_path):
    sentences = ["  a fine film .", "", "a dull film .", "   "]
    path = tmp_path / "s.txt"
    path.write_text("\n".join(sentences) + "\n", encoding="utf-8")
    corpus = load_corpus(sentences)
    assert [ex.text for ex in corpus] == ["a fine film .", "a dull film ."] and corpus.stats["n_empty_text"] == 2
    assert [ex.text for ex in corpus] == [ex.text for ex in load_corpus(path)]
    assert load_corpus(pd.Series(sentences)).examples == corpus.examples  # one column of a frame
    with pytest.raises(BertologyError, match=r"a list of sentences has no columns: column flags \(label\)"):
        load_corpus(sentences, label_column="label")


def test_a_corpus_passes_through_with_its_limit():
    corpus = Corpus.from_list(["a", "b", "c"], labels=[0, 1, 0], name="mine")
    again = load_corpus(corpus, limit=2)
    assert again.examples == corpus.examples[:2] and again.name == "mine" and again.stats["limited_to"] == 2
    with pytest.raises(BertologyError, match="column flags \\(text\\) do not apply to a Corpus"):
        load_corpus(corpus, text_column="text")


@pytest.mark.parametrize("data, message", [
    (["a film", 3], r"data is a list of int, str; a list must hold only sentences \(str\) or only rows"),
    ([], r"data is an empty list; give a file path"),
    (3.5, r"data is a float; give a file path, hf:NAME\[:CONFIG\]:SPLIT, or a pandas DataFrame"),
    (pd.DataFrame({"text": ["", " "]}), r"pandas DataFrame has no examples \(2 row\(s\) read; 2 dropped with an empty"),
])
def test_what_cannot_be_read_is_one_clear_error(data, message):
    with pytest.raises(BertologyError, match=message):
        load_corpus(data)


def test_a_trainers_eval_set_is_a_probe_set():
    """BertologyCallback's probe may be the Trainer's own eval table: its text column is found, other columns left."""
    from bertology.integrations.trainer import probe_corpus

    table = pd.DataFrame({"sentence": ["a good film", "a bad film"], "label": [1, 0], "input_ids": [[1, 2], [1, 3]]})
    assert [ex.text for ex in probe_corpus(table)] == ["a good film", "a bad film"]
    datasets = pytest.importorskip("datasets")
    assert probe_corpus(datasets.Dataset.from_pandas(table)).examples == probe_corpus(table).examples
    assert [ex.text for ex in probe_corpus(table, text_column="label")] == ["1", "0"]
