"""Edge probes (Tenney et al. 2019): a pair of words -> a label, read from the two word vectors of one layer.

Tenney et al. pool each span into a vector and classify the pair; our spans are single words, so a span's vector is
the word vector the token probes read (the mean of its sub-word pieces), and the pair's input is
``[head ; dependent]``, the two vectors concatenated. Two tasks, on the gold trees of a CoNLL-U file (or spaCy's):

* ``edge_deprel``: every arc (head, dependent) of the tree, the root's left out -> the dependent's universal
  relation (the part before ``:``);
* ``edge_arc``: is there an arc? Every arc (head, dependent) is a positive ("arc"); as many ordered pairs of the
  same sentence with no arc between them either way are drawn as negatives ("none"), seeded by the seed and the
  sentence, so the majority rate is about one half.

The control task is Hewitt & Liang's, keyed on the second word's (the dependent's) type: each type gets one label
drawn from the training label distribution, fixed in every split. Keying it on the pair of types instead gives a
control no probe can learn (most pairs of EWT test are unseen in training: .08 accuracy for edge_deprel, under the
majority rate), which would make even the random-init model look selective. Everything else (probe, intervals over test sentences,
MDL) is the token probes' (:mod:`bertology.experiments.token_probe`), read from the same feature pass.
"""
from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

#: Edge probe tasks and what they label.
EDGE_TASKS = {"edge_deprel": "the dependent's relation, per arc", "edge_arc": "arc or none, per word pair"}
#: What an edge task needs from each word (the entries :func:`bertology.experiments.token_probe.labelled_words` keeps).
EDGE_FIELDS = ("heads", "deprel")
ARC, NONE = "arc", "none"


@dataclass
class EdgeItems:
    """One split's word pairs: rows of the split's word features (``[n, 2]``: head, dependent), their labels,
    the dependent's word type (what the control task keys on) and the sentence each pair is in."""

    index: np.ndarray
    labels: np.ndarray
    types: np.ndarray
    sentence: np.ndarray

    def take(self, rows: np.ndarray) -> EdgeItems:
        return EdgeItems(self.index[rows], self.labels[rows], self.types[rows], self.sentence[rows])


def sentence_arcs(heads: Sequence[int]) -> list[tuple[int, int]]:
    """``(head, dependent)`` word positions (0-based) of a sentence's tree; CoNLL-U heads are 1-based, 0 = root."""
    return [(h - 1, d) for d, h in enumerate(heads) if h > 0]


def non_arcs(n: int, arcs: Sequence[tuple[int, int]], count: int, seed: int, sentence: int) -> list[tuple[int, int]]:
    """Up to ``count`` ordered pairs of distinct words of an ``n``-word sentence with no arc between them either
    way, drawn without replacement (seeded by ``seed`` and the sentence's position)."""
    linked = {(h, d) for h, d in arcs} | {(d, h) for h, d in arcs}
    pool = [(i, j) for i in range(n) for j in range(n) if i != j and (i, j) not in linked]
    if not pool:
        return []
    key = int.from_bytes(hashlib.sha256(f"{seed}\x00edge\x00{sentence}".encode()).digest()[:8], "little")
    pick = np.random.default_rng(key).choice(len(pool), size=min(count, len(pool)), replace=False)
    return [pool[k] for k in sorted(pick)]


def edge_items(words, task: str, seed: int) -> EdgeItems:
    """The word pairs of ``task`` in a :class:`~bertology.experiments.token_probe.LabelledWords` split kept with
    :data:`EDGE_FIELDS`."""
    offsets = words.offsets
    index, labels, types, sentence = [], [], [], []
    for s, (ws, heads, rels) in enumerate(zip(words.words, words.labels["heads"], words.labels["deprel"])):
        arcs = sentence_arcs([int(h) for h in heads])
        pairs = [(h, d, rels[d]) for h, d in arcs] if task == "edge_deprel" else \
            [(h, d, ARC) for h, d in arcs] + [(i, j, NONE) for i, j in non_arcs(len(ws), arcs, len(arcs), seed, s)]
        for h, d, label in pairs:
            index.append((offsets[s] + h, offsets[s] + d))
            labels.append(label)
            types.append(ws[d])
            sentence.append(s)
    return EdgeItems(np.array(index, dtype=np.int64).reshape(-1, 2), np.array(labels, dtype=object),
                     np.array(types, dtype=object), np.array(sentence, dtype=np.int64))


def pair_features(features: np.ndarray, index: np.ndarray) -> np.ndarray:
    """``[n, 2 * hidden]``: each pair's head vector and dependent vector, concatenated."""
    return np.concatenate([features[index[:, 0]], features[index[:, 1]]], axis=1)
