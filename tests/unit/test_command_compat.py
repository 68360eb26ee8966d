"""commands/compat.py leaves out of a fingerprint exactly what earlier versions left out.

The reference functions below are the inline code each command had before compat.py existed (ablate, probe and
finetune), copied verbatim: for every case the dict compat.py makes, and so the fingerprint, is the same.
"""
from __future__ import annotations

import pytest

from bertology.commands.compat import ADDED, ablate_metric, dtype_parts, finetune_rates, without_added
from bertology.runs import fingerprint

FINETUNE_BEFORE = {
    "objective": "supervised", "contrastive": "unsupervised", "temperature": 0.05, "pooling": "cls",
    "positive_label": "entailment", "negative_label": "contradiction", "sts_data": None, "anisotropy_sentences": 500,
    "anisotropy_pairs": 2000, "drop_layers": (), "freeze_layers": 0, "freeze_embeddings": False,
    "exclude_words": (), "slice_words": (), "grad_accum": 1, "eval_every": None, "early_stopping": None,
    "early_stopping_metric": None, "max_grad_norm": 1.0, "dtype": "float32", "tag_column": "upos",
    "doc_stride": 128, "max_answer_length": 30, "null_threshold": 0.0, "qa_split": "article",
    "arc_dim": None, "label_dim": None, "method": "full",
}


def _ablate_before(d, used, default, dtype):
    d.pop("metric")
    if used != default:
        d["main_metric"] = used
    if d.get("label_map", "") is None:
        d.pop("label_map")
    return d, ([dtype] if dtype != "float32" else [])


def _probe_before(d, dtype):
    if d["feature_dtype"] == "float32":
        d.pop("feature_dtype")
    return d, ([dtype] if dtype != "float32" else [])


def _finetune_before(d):
    if d.get("head_lr") == d.get("learning_rate"):
        d.pop("head_lr", None)
    for key, default in FINETUNE_BEFORE.items():
        if d.get(key) == default:
            d.pop(key)
    return d


def test_the_finetune_table_is_the_one_earlier_versions_had():
    assert dict(ADDED["finetune"]) == FINETUNE_BEFORE


@pytest.mark.parametrize("label_map", [None, {"pos": "1"}])
@pytest.mark.parametrize(("used", "dtype"), [("accuracy", "float32"), ("macro_f1", "bfloat16")])
def test_ablate_fingerprints_are_unchanged(label_map, used, dtype):
    d = {"mode": "mean", "seed": 0, "metric": "auto", "label_map": label_map}
    before, extra_before = _ablate_before(dict(d), used, "accuracy", dtype)
    now = without_added("ablate", ablate_metric(dict(d), used, "accuracy"))
    assert fingerprint(now, "corpus", "weights", *dtype_parts(dtype)) == fingerprint(before, "corpus", "weights",
                                                                                      *extra_before)
    assert ("label_map" in now) == (label_map is not None) and ("main_metric" in now) == (used != "accuracy")


@pytest.mark.parametrize(("feature_dtype", "dtype"), [("float32", "float32"), ("float16", "float16")])
def test_probe_fingerprints_are_unchanged(feature_dtype, dtype):
    d = {"rank": 8, "feature_dtype": feature_dtype}
    before, extra = _probe_before(dict(d), dtype)
    assert fingerprint(without_added("probe", dict(d)), *dtype_parts(dtype)) == fingerprint(before, *extra)
    assert ("feature_dtype" in without_added("probe", dict(d))) == (feature_dtype != "float32")


@pytest.mark.parametrize("changed", [{}, {"head_lr": 1e-3}, {"method": "lora", "drop_layers": [1]},
                                     {"dtype": "bfloat16", "objective": "contrastive", "sts_data": "x.tsv"}])
def test_finetune_fingerprints_are_unchanged(changed):
    d = {"learning_rate": 2e-5, "head_lr": 2e-5, "epochs": 3, **FINETUNE_BEFORE, **changed}
    now = without_added("finetune", finetune_rates(dict(d)))
    assert now == _finetune_before(dict(d))
    assert set(now) == {"learning_rate", "epochs", *changed}  # a list is not the tuple default: it stays, as before
