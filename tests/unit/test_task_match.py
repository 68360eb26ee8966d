"""Whose task a corpus's labels are (``bertology.tasks.match``): the rules that keep a regressor from being
ablated on a classification task's 0/1 labels, and a classifier on a regression task's scores."""
import json

import pytest
from transformers import BertForSequenceClassification, BertForTokenClassification

from bertology.data.corpus import Corpus, Example
from bertology.tasks.match import label_kind, mismatch, training_labels
from bertology.testing import tiny_config


def _corpus(labels, source="d.tsv") -> Corpus:
    return Corpus([Example(f"text {i}", label=lab) for i, lab in enumerate(labels)], source=source)


@pytest.fixture(scope="module")
def heads():
    """A binary classifier (labels '0'/'1'), a three-class one with named labels, a regressor and a tagger."""
    binary = BertForSequenceClassification(tiny_config(num_labels=2, id2label={0: "0", 1: "1"}, label2id={"0": 0, "1": 1}))
    named = BertForSequenceClassification(tiny_config(num_labels=3, id2label={0: "neg", 1: "neu", 2: "pos"},
                                                      label2id={"neg": 0, "neu": 1, "pos": 2}))
    regressor = BertForSequenceClassification(tiny_config(num_labels=1, problem_type="regression"))
    tagger = BertForTokenClassification(tiny_config(num_labels=2))
    return {"binary": binary, "named": named, "regressor": regressor, "tagger": tagger}


@pytest.mark.parametrize("labels, kind", [
    (["0", "1", "1"], "numbers"),
    (["1", "2", "3", "4", "5"], "numbers"),  # a rating: class ids or integer scores
    (["0.000", "3.800", "2.5"], "scores"),
    ([str(i) for i in range(30)], "scores"),  # more whole numbers than a classifier would have
    (["pos", "neg"], "classes"),
    ([None, None], "none"),
])
def test_label_kind_follows_finetune_autos_rule(labels, kind):
    assert label_kind(_corpus(labels)).kind == kind


def test_a_regressor_on_another_classifiers_zero_one_labels_is_a_mismatch(heads):
    data = _corpus(["0", "1"] * 5)
    reason = mismatch(heads["regressor"], data, peers=[("sst2/s0", heads["binary"])])
    assert reason is not None and "the classes of sst2/s0" in reason and "a regressor (one output)" in reason
    assert "'0', '1'" in reason and "d.tsv" in reason
    # alone, nothing says 0/1 are not the regressor's own scores: it is scored on them
    assert mismatch(heads["regressor"], data) is None
    # a peer that does not read the labels (named classes) claims nothing
    assert mismatch(heads["regressor"], data, peers=[("mnli", heads["named"])]) is None


def test_a_regressor_is_never_scored_on_labels_that_are_not_numbers(heads):
    reason = mismatch(heads["regressor"], _corpus(["pos", "neg"]))
    assert reason is not None and "a classification task's classes" in reason


def test_a_classifier_on_scores_it_has_no_label_for_is_a_mismatch(heads):
    reason = mismatch(heads["binary"], _corpus(["0.000", "3.800", "2.500"]))
    assert reason is not None and "a regression task's scores" in reason and "a classifier over 2 labels ('0', '1')" in reason
    assert mismatch(heads["regressor"], _corpus(["0.000", "3.800", "2.500"])) is None  # its own kind of labels
    assert mismatch(heads["binary"], _corpus(["0", "1"])) is None


def test_token_level_heads_and_unlabelled_data_are_left_to_the_ablations_own_checks(heads):
    assert mismatch(heads["tagger"], _corpus(["0", "1"])) is None
    assert mismatch(heads["regressor"], _corpus([None, None]), peers=[("a", heads["binary"])]) is None


def _finetune_run(tmp_path, labels):
    model = tmp_path / "run" / "model"
    model.mkdir(parents=True)
    manifest = {"kind": "finetune", "data": {"train": {"labels": labels}}}
    (tmp_path / "run" / "manifest.json").write_text(json.dumps(manifest))
    return model


def test_a_regressor_fine_tuned_on_scores_is_not_scored_on_whole_number_classes(heads, tmp_path):
    """The finetune manifest beside the model lists its training labels: scores (STS-B) make 0/1 another task's."""
    sts = training_labels(_finetune_run(tmp_path / "a", "120 distinct numbers from 0 to 5"))
    assert sts is not None and sts.kind == "scores"
    reason = mismatch(heads["regressor"], _corpus(["0", "1"]), trained_on=sts)
    assert reason is not None and "fine-tuned on scores (120 distinct numbers from 0 to 5)" in reason
    # fine-tuned on whole-number ratings, it is scored on whole-number ratings
    stars = training_labels(_finetune_run(tmp_path / "b", ["1", "2", "3", "4", "5"]))
    assert stars is not None and stars.kind == "numbers"
    assert mismatch(heads["regressor"], _corpus(["1", "5", "3"]), trained_on=stars) is None
    # a folder that is not a finetune run's model says nothing
    assert training_labels(tmp_path / "a" / "run") is None and training_labels(tmp_path / "nowhere") is None
