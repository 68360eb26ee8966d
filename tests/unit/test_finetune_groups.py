"""FinetuneConfig's settings groups: read nested (``config.lora.rank``), met flat everywhere a user or a run folder
meets them (keywords, flags, manifest, fingerprint), so run folders written before the groups still resume.

``finetune_config_before_groups.json`` was written by the flat FinetuneConfig (main before the groups): each case's
keywords and the ``to_dict()`` it gave (the manifest's ``config``; the fingerprints hash it), and the order of
``field_settings(FinetuneConfig)``.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from bertology.config import DataConfig, FinetuneConfig, LoraSettings, QaSettings
from bertology.errors import BertologyError
from bertology.settings import declared_fields, field_settings

BEFORE = json.loads((Path(__file__).parent / "finetune_config_before_groups.json").read_text(encoding="utf-8"))


def _config(**given) -> FinetuneConfig:
    given = {("learning_rate" if k == "lr" else k): v for k, v in given.items()}
    return FinetuneConfig(model="minilm", out="o", data=DataConfig(path="d.csv", max_examples=None, overlong="truncate"),
                          **given)


@pytest.mark.parametrize("case", sorted(BEFORE["cases"]))
def test_the_record_is_the_flat_one_the_config_gave_before_its_groups(case):
    given, before = BEFORE["cases"][case]["given"], BEFORE["cases"][case]["to_dict"]
    now = json.loads(json.dumps(_config(**given).to_dict(), default=str))
    assert now == before  # same names, same values: the same manifest config and fingerprints


def test_the_declared_settings_are_the_same_names_with_qa_split_beside_the_other_qa_settings():
    now = [s.name for s in field_settings(FinetuneConfig)]
    assert sorted(now) == sorted(BEFORE["order"])
    moved = [n for n in BEFORE["order"] if n != "qa_split"]
    assert [n for n in now if n != "qa_split"] == moved
    assert now.index("qa_split") == now.index("null_threshold") + 1


def test_a_flat_keyword_reaches_its_group_and_reads_back_by_its_name():
    config = _config(lora_rank=4, lora_targets="query,key", qa_split="question", contrastive="supervised",
                     slice_words="fun", track_every=3, drop_layers="2", arc_dim=50)
    assert config.lora == LoraSettings(rank=4, targets=("query", "key"))
    assert (config.qa.split, config.simcse.mode, config.words.slices) == ("question", "supervised", ("fun",))
    assert (config.tracking.every, config.surgery.drop_layers, config.parsing.arc_dim) == (3, (2,), 50)
    for name in ("lora_rank", "qa_split", "contrastive", "slice_words", "track_every", "drop_layers", "arc_dim"):
        assert config.value(name) == config.to_dict()[name]
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.lora.rank = 2  # type: ignore[misc]


def test_replace_by_a_flat_name_keeps_the_rest_of_the_group():
    config = _config(lora_rank=4, lora_alpha=8.0)
    again = dataclasses.replace(config, lora_dropout=0.0)
    assert again.lora == LoraSettings(rank=4, alpha=8.0, dropout=0.0)
    assert dataclasses.replace(config, qa=QaSettings(doc_stride=64), qa_split="question").qa == QaSettings(
        doc_stride=64, split="question")  # a flat name wins over the whole group given beside it


def test_a_group_setting_is_refused_by_its_flag_as_before():
    with pytest.raises(BertologyError, match=r"^--lora-rank \(lora_rank\) must be at least 1, not 0\.$"):
        _config(lora_rank=0)
    with pytest.raises(BertologyError, match=r"^--contrastive \(contrastive\) must be one of auto, unsupervised"):
        _config(contrastive="bogus")
    with pytest.raises(TypeError, match="unexpected keyword argument 'lora_rnak'"):
        _config(lora_rnak=4)


def test_every_group_is_frozen_and_every_setting_is_declared_once():
    groups = {g for g, _, _ in declared_fields(FinetuneConfig) if g is not None}
    assert groups == {"simcse", "surgery", "words", "qa", "parsing", "lora", "tracking"}
    for f in dataclasses.fields(FinetuneConfig):
        if f.name in groups:
            assert f.metadata["group"].__dataclass_params__.frozen, f.name
    names = [s.name for s in field_settings(FinetuneConfig)]
    assert len(names) == len(set(names))


def test_a_config_with_groups_survives_pickling_as_a_study_s_workers_receive_it():
    import pickle

    config = _config(lora_rank=4, qa_split="question", track_every=2)
    again = pickle.loads(pickle.dumps(config))
    assert again == config and again.to_dict() == config.to_dict() and again.lora.rank == 4
