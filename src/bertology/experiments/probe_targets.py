"""What a token or edge probe is fitted to: each task's items (a word, or a head and its dependent), their label ids
and the control task's (Hewitt & Liang 2019), and the refusal of a task no classifier can be fitted to.

Part of :mod:`bertology.experiments.token_probe`, which reads these targets from its one feature pass.
"""
from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from bertology.errors import BertologyError
from bertology.experiments.edge_probe import EDGE_TASKS, edge_items, pair_features

# ``LabelledWords`` and ``TokenProbeSettings`` (annotations only) are :mod:`bertology.experiments.token_probe`'s, which
# imports this module: naming them here, even for type checkers, would close an import circle.


def control_labels(types: Sequence[str], train_labels: Sequence[str], seed: int) -> dict[str, str]:
    """Hewitt & Liang's control task: each word type -> one label drawn from the training label distribution.

    Each type's draw is seeded by ``seed`` and the type alone, so a type gets the same control label whichever
    split it is met in and in whatever order."""
    values, counts = np.unique(np.asarray(train_labels, dtype=object).astype(str), return_counts=True)
    p = counts / counts.sum()
    out = {}
    for t in dict.fromkeys(types):
        key = int.from_bytes(hashlib.sha256(f"{seed}\x00{t}".encode()).digest()[:8], "little")
        out[t] = str(values[np.random.default_rng(key).choice(len(values), p=p)])
    return out


@dataclass
class _Encoded:
    """One task's labels as ids over the training label set (test labels unseen in training: -1)."""

    train: np.ndarray
    test: np.ndarray
    names: list[str]


def _encode(train: np.ndarray, test: np.ndarray, names: Sequence[str] | None = None) -> _Encoded:
    """Label ids over ``names`` (default: the training labels, sorted)."""
    names = list(names) if names is not None else sorted(set(train.astype(str)))
    index = {n: i for i, n in enumerate(names)}
    return _Encoded(np.array([index[str(v)] for v in train], dtype=np.int64),
                    np.array([index.get(str(v), -1) for v in test], dtype=np.int64), names)


def _sample(n: int, limit: int | None, seed: int) -> np.ndarray:
    """Indices of the training words used: all, or a seeded sample of ``limit`` (kept in corpus order)."""
    if limit is None or limit >= n:
        return np.arange(n)
    return np.sort(np.random.default_rng(seed).choice(n, size=limit, replace=False))


def refuse_single_label(targets: Mapping[str, "ProbeTarget"]) -> None:
    """Refuse a task whose training items carry one label: a classifier cannot be fitted to one class, and an accuracy
    of 1 on it (every word gets the one label) would measure nothing."""
    for task, target in targets.items():
        names = [str(n) for n in target.labels.names]
        if len(names) < 2:
            unit = "word pairs" if task in EDGE_TASKS else "words"
            raise BertologyError(
                f"Probe task {task}: all {len(target.labels.train)} training {unit} carry the same label "
                f"('{names[0] if names else 'none'}'); a probe needs at least two labels to tell apart. Give training "
                f"sentences with more varied {task.removeprefix('edge_')} labels, or leave {task} out of --probe-task.")


@dataclass
class ProbeTarget:
    """One probe task on one pair of splits: which feature rows make each item (one word, or a head and a
    dependent), the label ids, the control task's, and the test sentence of each test item."""

    train_rows: np.ndarray  # [n_train, arity]
    test_rows: np.ndarray  # [n_test, arity]
    labels: _Encoded
    control: _Encoded | None
    test_sentence: np.ndarray

    @staticmethod
    def inputs(features: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """The probe's input per item: the word vector, or (edge tasks) head and dependent vectors concatenated."""
        x = np.asarray(features)
        x = x[rows[:, 0]] if rows.shape[1] == 1 else pair_features(x, rows)
        return x.astype(np.float32, copy=False)


def probe_target(train: LabelledWords, test: LabelledWords, task: str, settings: TokenProbeSettings,
                 seed: int) -> ProbeTarget:
    """A task's items, labels and control labels (token tasks: every word; edge tasks: word pairs); training items
    sampled down to ``max_train_words`` when set."""
    if task in EDGE_TASKS:
        tr, te = edge_items(train, task, seed), edge_items(test, task, seed)
        tr = tr.take(_sample(len(tr.labels), settings.max_train_words, seed))
        labels = _encode(tr.labels, te.labels)
        control = _control(tr.types.astype(str), te.types.astype(str), tr.labels.astype(str), labels.names, seed) \
            if settings.control else None
        return ProbeTarget(tr.index, te.index, labels, control, te.sentence)
    keep = _sample(train.n_words, settings.max_train_words, seed)
    labels, control = task_targets(train, test, task, keep, seed, control=settings.control)
    return ProbeTarget(keep[:, None], np.arange(test.n_words)[:, None], labels, control, test.sentence_of_word())


def _control(types_train: np.ndarray, types_test: np.ndarray, train_labels: np.ndarray, names: Sequence[str],
             seed: int) -> _Encoded:
    """The control task's label ids for items of these types (each type's label drawn once)."""
    mapping = control_labels(np.concatenate([types_train, types_test]), train_labels, seed)
    return _encode(np.array([mapping[t] for t in types_train], dtype=object),
                   np.array([mapping[t] for t in types_test], dtype=object), names)


def task_targets(train: LabelledWords, test: LabelledWords, task: str, keep: np.ndarray, seed: int, *,
                 control: bool) -> tuple[_Encoded, _Encoded | None]:
    """A task's label ids on the training words used and the test words, and its control task's (None without)."""
    labels = _encode(train.flat(task)[keep], test.flat(task))
    if not control:
        return labels, None
    types_train, types_test = train.flat_words()[keep].astype(str), test.flat_words().astype(str)
    return labels, _control(types_train, types_test, train.flat(task)[keep].astype(str), labels.names, seed)
