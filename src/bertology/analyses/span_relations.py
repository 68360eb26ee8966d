"""Which heads link user-given spans: an aspect to its opinion words, a pronoun to its antecedent, ...

The same question as :mod:`bertology.analyses.relation_heads`, for any token relation a user labels
in a JSONL file (:func:`bertology.data.spans.load_span_relations`). For each instance, the *from*
span is one unit (attention from it is the mean over its pieces, attention to it the sum) and every
other word is a unit; special tokens are left out. A head predicts:

``from->to``
    the unit most attended *from* the span lies in a *to* span: ``argmax_{u != from} att[from, u]``;
``to->from``
    the unit that attends most *to* the span lies in a *to* span: ``argmax_{u != from} att[u, from]``.

Fixed-offset baseline: for offset ``k < 0`` predict the word ``k`` positions before the span's first
word, for ``k > 0`` the word ``k`` after its last word; a hit when that word is in a *to* span (the
same prediction for both directions). Instances whose span or every target lost its tokens to
truncation are not scored (``n_unscored``).

Sentence pairs: a :class:`~bertology.data.spans.SpanRelation` with ``n_first_words`` set numbers the
words of both texts (the second's after the first's), so a span in one text can point into the other
(the aspect word of an auxiliary question and the review's terms, :mod:`bertology.analyses.absa_heads`);
without it only the first text's words count, as before.

The table has the columns of ``relation_heads`` (``kind = "span"``) so both can be shown together.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import ClassVar

import numpy as np
import torch

from bertology import transfer
from bertology.activations.batch import PairBatch
from bertology.analyses.relation_heads import ArgmaxHeads
from bertology.data.align import Pooling, annotated_word_ids, word_attention
from bertology.data.spans import SpanRelation
from bertology.results import Result

DIRECTIONS = ("from->to", "to->from")


def instance_words(item, T: int, n_first_words: int | None, n_words: int) -> tuple[np.ndarray, np.ndarray]:
    """Per token its word in the relation's numbering, and which words have all their pieces.

    Single texts number the first text's words only; a pair annotated over both texts
    (``n_first_words`` set) numbers the second text's words after the first's
    (:func:`~bertology.data.align.annotated_word_ids`). In a truncated example the last word present
    of each text may have lost pieces, so it is not counted as present.
    """
    seg = np.asarray(item.segment)[:T]
    wid = annotated_word_ids(np.asarray(item.word_ids)[:T], seg, n_first_words)
    n_words = max(n_words, int(wid.max()) + 1 if wid.size else 0)
    present = np.bincount(wid[wid >= 0], minlength=n_words) > 0
    if getattr(item, "truncated", False):
        for s in (0, 1):
            mine = wid[(seg == s) & (wid >= 0)]
            if mine.size:
                present[int(mine.max())] = False
    return wid, present


def span_units(word_ids: np.ndarray, source: Sequence[int], n_words: int) -> tuple[np.ndarray, int, np.ndarray]:
    """Unit id per token (the source words merged into one unit), the number of units and word -> unit."""
    src = np.zeros(n_words, dtype=bool)
    src[list(source)] = True
    first = int(np.flatnonzero(src)[0])
    word_unit = np.full(n_words, -1, dtype=np.int64)
    u = 0
    for w in range(n_words):
        if src[w] and w != first:
            continue
        word_unit[w] = u
        u += 1
    word_unit[src] = word_unit[first]
    units = np.where(word_ids >= 0, word_unit[np.clip(word_ids, 0, None)], -1)
    return units, u, word_unit


class SpanRelationHeads(ArgmaxHeads):
    """Per head and user relation: how often the argmax of span attention lands in a target span.

    Word attention is pooled and argmaxed where the maps are. Where the hits are counted: on the CPU the argmaxes
    index the host's target mask (NumPy, as before); with the maps elsewhere the hits are counted on
    their device and cross to the host once, when :attr:`correct` is read. The same integers either way (tested).
    """

    name = "relation_heads"
    requires = frozenset({"attentions"})
    directions = DIRECTIONS
    #: Where the hits are counted: None (default) on the maps' device when it is not the CPU, else on the host;
    #: True or False forces one (on the class or an instance).
    count_on_device: ClassVar[bool | None] = None

    def __init__(
        self,
        relations: Sequence[SpanRelation],
        num_layers: int,
        num_heads: int,
        to_method: Pooling = "sum",
        from_method: Pooling = "mean",
        offsets: Iterable[int] = range(-3, 3),
        min_count: int = 1,
    ):
        self.by_example: dict[int, list[SpanRelation]] = {}
        for r in relations:
            self.by_example.setdefault(r.example, []).append(r)
        self.relations: list[str] = sorted({r.relation for r in relations})
        self._rel_index = {r: i for i, r in enumerate(self.relations)}
        self._setup(num_layers, num_heads, to_method, from_method, offsets, min_count, n_relations=len(self.relations))
        self.n_unscored = 0
        self.n_examples = 0

    def params(self) -> dict:
        return {
            **self._shared_params(),
            "relations": self.relations,
            "exclude": "special tokens, the from span",
        }

    def _baseline(self, rel: SpanRelation, n_words: int) -> np.ndarray:
        """Hit per offset: the word k before the span's first word (k < 0) or after its last is a target."""
        first, last = min(rel.source), max(rel.source)
        targets = set(rel.targets)
        hits = []
        for k in self.offsets:
            w = first + k if k < 0 else last + k
            hits.append(0 <= w < n_words and w in targets)
        return np.asarray(hits, dtype=np.int64)

    def update(self, batch: PairBatch) -> None:
        lengths = batch.lengths_host  # from the items: no copy of a GPU batch
        on_device = self.count_on_device
        if on_device is None:
            on_device = batch.base.attentions[1].device.type != "cpu"
        for b, item in enumerate(batch.items):
            instances = self.by_example.get(item.index)
            if not instances:
                continue
            self.n_examples += 1
            T = int(lengths[b])
            n_words = int(max(max(max(r.source), max(r.targets)) for r in instances)) + 1
            wid, present = instance_words(item, T, instances[0].n_first_words, n_words)
            n_words = len(present)
            # kept where the model ran (a GPU's maps are pooled, argmaxed and counted there)
            maps = [
                torch.stack([cap.attentions[layer][b, :, :T, :T] for layer in range(1, self.num_layers + 1)]).double()
                for cap in (batch.base, batch.tuned)
            ]
            for rel in instances:
                targets = [w for w in rel.targets if present[w]]
                if not all(present[w] for w in rel.source) or not targets:
                    self.n_unscored += 1
                    continue
                units, U, word_unit = span_units(wid, rel.source, n_words)
                src_u = int(word_unit[rel.source[0]])
                target_u = np.zeros(U, dtype=bool)
                target_u[word_unit[targets]] = True
                candidate = np.zeros(U, dtype=bool)
                candidate[np.unique(units[units >= 0])] = True
                candidate[src_u] = False
                r = self._rel_index[rel.relation]
                self.n[r] += 1
                self.baseline_correct[r] += self._baseline(rel, n_words)[None, :]
                excluded = transfer.send(~candidate, maps[0].device)
                argmaxes = []  # [model][direction]: [L, H] unit indices
                for att in maps:
                    A = word_attention(att, units, self.to_method, self.from_method, n_words=U)  # [L, H, U, U]
                    out_row = A[:, :, src_u, :].masked_fill(excluded, float("-inf"))
                    in_col = A[:, :, :, src_u].masked_fill(excluded, float("-inf"))
                    argmaxes.append((out_row.argmax(-1), in_col.argmax(-1)))
                if on_device:
                    self._count_on_device(r, argmaxes, target_u)
                else:
                    for m, pair in enumerate(argmaxes):
                        for d, best in enumerate(pair):
                            self.correct[r, m, d] += target_u[best.cpu().numpy()]

    def _count_on_device(self, r: int, argmaxes: list[tuple[torch.Tensor, torch.Tensor]], target_u: np.ndarray) -> None:
        """Add one instance's hits to the counts kept on the argmaxes' device: ``argmaxes[model][direction]`` (``[L, H]``
        unit indices) looked up in the target-unit mask ``target_u`` (host bool ``[U]``, sent along)."""
        dev = argmaxes[0][0].device
        hit = transfer.send(target_u, dev)[torch.stack([torch.stack(pair) for pair in argmaxes])]
        counts = self._device_counts(dev)
        with torch.inference_mode(False):
            counts[r] += hit.to(torch.int64)  # [model, direction, L, H]

    def merge(self, other: "SpanRelationHeads") -> "SpanRelationHeads":
        self._check_mergeable(other)
        self.correct += other.correct
        self.baseline_correct += other.baseline_correct
        self.n += other.n
        self.n_unscored += other.n_unscored
        self.n_examples += other.n_examples
        return self

    def compute(self) -> Result:
        if self.n.sum() == 0:
            raise ValueError(f"no relation instance could be scored ({self.n_unscored} lost to truncation)")
        keep = [i for i in range(len(self.relations)) if self.n[i] >= self.min_count]
        table = self._table(keep, kind="span")
        provenance = {
            **self.params(),
            "n_examples": self.n_examples,
            "n_unscored": self.n_unscored,
            "n_pairs": {r: int(self.n[i]) for i, r in enumerate(self.relations)},
            "dropped_relations": {self.relations[i]: int(self.n[i]) for i in range(len(self.relations)) if i not in keep},
        }
        return Result(self.name, table, provenance)
