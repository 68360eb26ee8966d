"""Fingerprint compatibility: what keeps run folders written by earlier versions resuming (or refused with the
reason, as any other run), kept in one place.

A setting added to a command after runs were written enters the fingerprint only when it holds another value
than the one every earlier run had: :data:`ADDED` lists them per command and :func:`without_added` leaves them
out. A model dtype other than float32 is one more fingerprint part (:func:`dtype_parts`), so float32 runs keep
the fingerprints they had before ``--dtype``. compare's own settings follow the same rule inside
:meth:`bertology.config.CompareConfig.fingerprint`, which sits below this room (the config's ``dtype``,
``ablation_metric``, ``label_map`` and one-element ``ablation_mode``).

Nothing here may change a value: ``tests/unit/test_command_compat.py`` checks each function against the inline
code the commands had before, copied verbatim.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: Per command: the settings added after runs were first written, and the value every earlier run had.
ADDED: Mapping[str, Mapping[str, Any]] = {
    "ablate": {"label_map": None},  # before --label-map
    "probe": {"feature_dtype": "float32"},  # before --feature-dtype the word features were float32
    "finetune": {  # the fine-tuning lab's settings and those added since
        "objective": "supervised", "contrastive": "unsupervised", "temperature": 0.05, "pooling": "cls",
        "positive_label": "entailment", "negative_label": "contradiction", "sts_data": None,
        "anisotropy_sentences": 500, "anisotropy_pairs": 2000, "drop_layers": (), "freeze_layers": 0,
        "freeze_embeddings": False, "exclude_words": (), "slice_words": (), "grad_accum": 1, "eval_every": None,
        "early_stopping": None, "early_stopping_metric": None, "max_grad_norm": 1.0, "dtype": "float32",
        "tag_column": "upos", "doc_stride": 128, "max_answer_length": 30, "null_threshold": 0.0,
        "qa_split": "article", "arc_dim": None, "label_dim": None, "method": "full",
    },
}


def without_added(kind: str, settings: dict) -> dict:
    """``settings`` (changed in place and returned) without the added settings of ``kind`` that hold the value
    earlier runs had (compared with ``==``, as the values are read back from their dataclass)."""
    for key, earlier in ADDED[kind].items():
        if key in settings and settings[key] == earlier:
            settings.pop(key)
    return settings


def dtype_parts(dtype: str) -> list[str]:
    """The fingerprint's part for the model dtype: none for float32 (runs from before ``--dtype``), else its name."""
    return [dtype] if dtype != "float32" else []


def ablate_metric(settings: dict, used: str, task_default: str) -> dict:
    """ablate's metric as earlier runs named it: the requested ``metric`` left out, the metric ``used`` recorded
    (``main_metric``) only where it is not the task's own, so runs judged by the task's metric keep theirs."""
    settings.pop("metric")
    if used != task_default:
        settings["main_metric"] = used
    return settings


def finetune_rates(settings: dict) -> dict:
    """One learning rate for encoder and head (``head_lr`` equal to ``learning_rate``) as before ``head_lr``."""
    if settings.get("head_lr") == settings.get("learning_rate"):
        settings.pop("head_lr", None)
    return settings
