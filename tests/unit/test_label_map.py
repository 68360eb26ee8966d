"""``--label-map``: parsed and checked as a declared setting (one line each), applied to a corpus once, and a label
mismatch read from a model's config alone (no weights)."""
from __future__ import annotations

import pytest

from bertology.data.corpus import Corpus
from bertology.data.labels import label_map_pairs, map_labels, parse_label_map
from bertology.errors import BertologyError


@pytest.mark.parametrize(("given", "canonical"), [
    ("0=-1,1=1", "0=-1,1=1"),
    (" 0 = -1 , 1=1, ", "0=-1,1=1"),
    ({0: -1, 1: 1}, "0=-1,1=1"),
    ({"neg": "0", "pos": "1"}, "neg=0,pos=1"),
    ("neutral=0,contradiction=0,entailment=1", "neutral=0,contradiction=0,entailment=1"),  # classes merged
])
def test_a_label_map_is_written_one_way_and_parses_back_to_itself(given, canonical):
    assert parse_label_map(given) == canonical
    assert parse_label_map(canonical) == canonical


@pytest.mark.parametrize(("given", "says"), [
    ("", "is empty"),
    (" , ", "is empty"),
    ("0", "'0' has no '='"),
    ("0:-1,1:1", "'0:-1' has no '='"),
    ("0=-1,0=1", "maps the data's label '0' twice (to '-1' and to '1')"),
    ("=1", "empty data label"),
    ("0=", "empty model label"),
    ("0=1=2", "one '=' per DATA=MODEL pair"),
    ({"a,b": 1}, "',' or '='"),
])
def test_bad_syntax_and_duplicate_keys_are_one_line_from_python_and_the_cli(given, says):
    from bertology.experiments.ablation import AblationSettings
    from bertology.commands.selection import complete_config, make_config

    with pytest.raises(ValueError, match=_escape(says)):
        parse_label_map(given)
    for make in (lambda: AblationSettings(label_map=given),
                 lambda: complete_config(make_config("absent.txt", tuned="absent", label_map=given))):
        with pytest.raises(BertologyError) as err:
            make()
        line = str(err.value)
        assert line.startswith("--label-map (label_map) ") and says in line and "\n" not in line


def _escape(text: str) -> str:
    import re

    return re.escape(text)


def test_map_labels_maps_every_label_once_and_refuses_one_left_out():
    corpus = Corpus.from_list(["a", "b", "c"], labels=[0, 1, 0], name="toy")
    mapped = map_labels(corpus, "0=-1,1=1")
    assert [ex.label for ex in mapped] == ["-1", "1", "-1"] and [ex.text for ex in mapped] == ["a", "b", "c"]
    assert mapped.stats["label_map"] == "0=-1,1=1" and corpus.stats.get("label_map") is None  # the input untouched
    assert map_labels(mapped, {0: -1, 1: 1}) is mapped  # the same map again: not mapped twice
    assert map_labels(corpus, None) is corpus
    assert label_map_pairs("neg=0,pos=1") == {"neg": "0", "pos": "1"} and label_map_pairs(None) == {}
    with pytest.raises(BertologyError, match=r"--label-map \(label_map\) 0=-1 does not map the label\(s\) '1'"):
        map_labels(corpus, "0=-1")
    unlabelled = Corpus.from_list(["a", "b"])
    assert [ex.label for ex in map_labels(unlabelled, "0=-1")] == [None, None]


def test_a_label_mismatch_is_read_from_the_config_alone_with_a_label_map_suggested():
    from transformers import BertConfig

    from bertology.tasks.match import config_label_problem, is_sentence_classifier

    config = BertConfig(architectures=["BertForSequenceClassification"], id2label={0: "-1", 1: "1"},
                        label2id={"-1": 0, "1": 1})
    data = Corpus.from_list(["a", "b"], labels=[0, 1])
    problem = config_label_problem(config, data)
    assert "label(s) '0'" in problem and "its labels are '-1', '1'" in problem
    assert "--label-map 0=-1,1=1" in problem
    assert config_label_problem(config, map_labels(data, "0=-1,1=1")) is None
    wrong = config_label_problem(config, map_labels(data, "0=neg,1=1"))
    assert "label(s) 'neg' after --label-map 0=neg,1=1" in wrong
    # a generic LABEL_k config takes 0..k-1; a regressor or an encoder says nothing here
    generic = BertConfig(architectures=["BertForSequenceClassification"], num_labels=2)
    assert config_label_problem(generic, data) is None
    assert not is_sentence_classifier(BertConfig(architectures=["BertModel"]))
    assert not is_sentence_classifier(BertConfig(architectures=["BertForSequenceClassification"], num_labels=1))
    assert config_label_problem(None, data) is None
