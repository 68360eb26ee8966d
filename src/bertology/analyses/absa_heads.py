"""Task heads of aspect-based sentiment, found by measurement rather than by eye.

For sentence pairs (review, auxiliary question) built by :mod:`bertology.data.absa`, the aspect named
in the question (a category such as "service", or a term) is the *from* span, and three relations
point into the review (scored like :mod:`bertology.analyses.span_relations`, Clark et al. 2019: the
review word the aspect attends to most, ``from->to``, or the word that attends most to the aspect,
``to->from``, must be a target):

``aspect``
    the review's aspect terms of that category (term level: the term itself);
``aspect_opinion``
    the opinion words of those terms (:func:`bertology.data.absa.opinion_spans`: adjectives and verbs
    within two dependency arcs of the term);
``other_aspect``
    the review's terms of the other categories (term level: the other terms).

Beside the fixed-offset baseline of the span relations (which counts over the concatenated words,
so it rarely reaches the review from the question), two baselines that do not look at attention:
``position_accuracy``, the best "k-th word of the review" (``k`` in :data:`REVIEW_POSITIONS`, from the
start or, negative, from the end), and ``chance``, the expected accuracy of a uniformly random
candidate word. ``best_baseline`` is the highest of the three.

No-op heads: for every item, the share of the aspect word's attention (mean over its pieces' rows)
that lands on ``[SEP]`` tokens, averaged separately over items whose aspect is absent from the review
(label ``none``) and present.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pandas as pd
import torch

from bertology import transfer
from bertology.activations.batch import PairBatch
from bertology.analyses.base import Analysis
from bertology.analyses.device_state import moved, zeros
from bertology.analyses.relation_heads import MODELS
from bertology.analyses.span_relations import SpanRelationHeads, instance_words
from bertology.data.absa import AbsaPair
from bertology.data.spans import SpanRelation, split_words
from bertology.results import Result

RELATIONS = ("aspect", "aspect_opinion", "other_aspect")
#: Review positions of the position baseline: the k-th word from the start (k >= 0) or the end (k < 0).
REVIEW_POSITIONS = (0, 1, 2, 3, 4, -1, -2, -3, -4, -5)
CONDITIONS = ("present", "absent")
#: The tables of :class:`AbsaHeads`, in the order of its ``results()``.
TABLES = ("absa_heads", "absa_head_change", "absa_sep_share")


@dataclass(frozen=True)
class AbsaInstance:
    """One pair's aspect span and targets, in words numbered over review then question."""

    example: int
    source: tuple[int, ...]
    n_first_words: int
    present: bool
    targets: Mapping[str, tuple[int, ...]]


def _words_overlapping(offsets: Sequence[tuple[int, int]], spans: Iterable[tuple[int, int]]) -> tuple[int, ...]:
    return tuple(sorted({i for a, b in spans for i, (s, e) in enumerate(offsets) if s < b and e > a}))


def absa_instances(pairs: Sequence[AbsaPair], opinions: Sequence[Sequence[tuple[int, int]]] | None = None
                   ) -> list[AbsaInstance]:
    """The instance of each pair (``example`` = its position); ``opinions[i]``: opinion-word char spans of pair i."""
    out = []
    for i, p in enumerate(pairs):
        _, review = split_words(p.text)
        _, question = split_words(p.question)
        n = len(review)
        source = tuple(n + w for w in _words_overlapping(question, [p.aspect_span]))
        aspect = _words_overlapping(review, [(t.start, t.end) for t in p.target_terms])
        targets = {
            "aspect": aspect,
            "aspect_opinion": tuple(w for w in _words_overlapping(review, opinions[i] if opinions else ()) if w not in aspect),
            "other_aspect": tuple(w for w in _words_overlapping(review, [(t.start, t.end) for t in p.other_terms])
                                  if w not in aspect),
        }
        out.append(AbsaInstance(i, source, n, p.present, {k: v for k, v in targets.items() if v}))
    return out


def span_relations(instances: Sequence[AbsaInstance]) -> list[SpanRelation]:
    """The span relations of the instances (one per instance and relation with targets)."""
    return [SpanRelation(x.example, rel, x.source, targets, x.n_first_words)
            for x in instances for rel, targets in x.targets.items()]


class AbsaHeads(Analysis):
    """Aspect, opinion and other-aspect heads with their baselines, and the [SEP] share of the aspect word."""

    name = "absa_heads"
    requires = frozenset({"attentions"})
    #: Where the [SEP] shares are summed: None (default) where the maps are (``--device cuda``: on the GPU, and kept
    #: there until read), else NumPy on the CPU; True or False forces one (the same numbers to rounding,
    #: tested).
    sum_on_device: ClassVar[bool | None] = None
    #: The [SEP] share sums ``[model, condition, L, H]`` of the examples summed on a device, kept there: folded into
    #: the host sums when :attr:`sep_sum` is read (``merge``, ``sep_table``), one copy per run.
    _device_sep_sum: torch.Tensor | None = None

    def __init__(self, instances: Sequence[AbsaInstance], num_layers: int, num_heads: int, sep_token_id: int,
                 offsets: Iterable[int] = range(-3, 3)):
        self.instances = {x.example: x for x in instances}
        relations = span_relations(instances)
        self.spans = SpanRelationHeads(relations, num_layers, num_heads, offsets=offsets) if relations else None
        self.relations = list(self.spans.relations) if self.spans else []
        self.num_layers, self.num_heads, self.sep_token_id = int(num_layers), int(num_heads), int(sep_token_id)
        L, H, R = self.num_layers, self.num_heads, len(self.relations)
        self.position_hits = np.zeros((R, len(REVIEW_POSITIONS)), dtype=np.int64)
        self.chance = np.zeros(R, dtype=np.float64)
        self.n_scored = np.zeros(R, dtype=np.int64)
        self.sep_sum = np.zeros((len(MODELS), len(CONDITIONS), L, H), dtype=np.float64)
        self.sep_n = np.zeros(len(CONDITIONS), dtype=np.int64)
        self.n_sep_unscored = 0

    def params(self) -> dict:
        return {
            "relations": self.relations,
            "review_positions": list(REVIEW_POSITIONS),
            "sep": "attention from the aspect word (mean over its pieces) summed over every [SEP] token",
            **({"span": self.spans.params()} if self.spans else {}),
        }

    @property
    def sep_sum(self) -> np.ndarray:
        """[SEP] share sums ``[model, condition, L, H]`` (float64) on the host, those kept on a device folded in."""
        self._fold_sep_sum()
        return self._sep_sum

    @sep_sum.setter
    def sep_sum(self, value: np.ndarray) -> None:
        self._sep_sum = value

    def _fold_sep_sum(self) -> None:
        """Add the [SEP] share sums kept on a device to the host sums (one copy) and drop them."""
        if self._device_sep_sum is not None:
            self._sep_sum += self._device_sep_sum.cpu().numpy().astype(np.float64)
            self._device_sep_sum = None

    def _add_sep_share(self, m: int, c: int, share: np.ndarray | torch.Tensor) -> None:
        """Add one example's ``[L, H]`` [SEP] shares of model ``m`` in condition ``c``: to the host sums (NumPy) or to
        those kept on the share's device (a tensor); shares of another device fold the kept ones in first."""
        if not isinstance(share, torch.Tensor):
            self._sep_sum[m, c] += share
            return
        kept = self._device_sep_sum
        if kept is None or kept.device != share.device:
            self._fold_sep_sum()  # shares summed on another device before
            kept = self._device_sep_sum = zeros(self._sep_sum.shape, torch.float64, share.device)
        with torch.inference_mode(False):
            kept[m, c] += moved(share, kept)

    def update(self, batch: PairBatch) -> None:
        if self.spans is not None:
            self.spans.update(batch)
        lengths = batch.lengths_host  # from the items: no copy of a GPU batch
        for b, item in enumerate(batch.items):
            x = self.instances.get(item.index)
            if x is None:
                continue
            T = int(lengths[b])
            n_words = max([max(x.source)] + [max(t) for t in x.targets.values()]) + 1
            wid, present = instance_words(item, T, x.n_first_words, n_words)
            if not all(present[w] for w in x.source):
                self.n_sep_unscored += 1
                continue
            self._baselines(x, wid, present)
            rows = np.flatnonzero(np.isin(wid, x.source))
            sep = np.asarray(item.input_ids)[:T] == self.sep_token_id
            c = CONDITIONS.index("present" if x.present else "absent")
            self.sep_n[c] += 1
            for m, cap in enumerate((batch.base, batch.tuned)):
                self._add_sep_share(m, c, self._sep_share(cap, b, T, rows, np.flatnonzero(sep)))

    def _sep_share(self, cap, row: int, T: int, rows: np.ndarray, sep: np.ndarray) -> np.ndarray | torch.Tensor:
        """``[L, H]`` float64: attention from the aspect word's pieces (``rows``) summed over the [SEP] tokens,
        averaged over the pieces, for one example of one model's capture.

        On a GPU (or with :attr:`sum_on_device`) the sums are taken where the maps are and returned there (a
        tensor: nothing is copied per example); on the CPU NumPy sums them (the numbers of earlier runs, bit for
        bit). The two agree to float64 rounding (tested).
        """
        L = self.num_layers
        att = [cap.attentions[layer][row, :, :T, :T] for layer in range(1, L + 1)]
        on_device = self.sum_on_device
        if on_device is None:
            on_device = att[0].device.type != "cpu"
        if on_device:
            dev = att[0].device
            picked = torch.stack(att).double()[:, :, transfer.send(rows, dev)]
            return picked[..., transfer.send(sep, dev)].sum(-1).mean(-1)
        full = np.stack([a.double().cpu().numpy() for a in att])
        return full[:, :, rows][..., sep].sum(-1).mean(-1)

    def _baselines(self, x: AbsaInstance, wid: np.ndarray, present: np.ndarray) -> None:
        """Position baseline and chance for the relations of one instance that the span analysis scores."""
        candidates = len(np.unique(wid[wid >= 0])) - len(x.source)  # every word but the aspect span
        for rel, targets in x.targets.items():
            kept = [w for w in targets if present[w]]
            if not kept:
                continue
            r = self.relations.index(rel)
            self.n_scored[r] += 1
            self.chance[r] += len(kept) / max(candidates, 1)
            for k, pos in enumerate(REVIEW_POSITIONS):
                w = pos if pos >= 0 else x.n_first_words + pos
                self.position_hits[r, k] += 0 <= w < x.n_first_words and w in kept

    def merge(self, other: "AbsaHeads") -> "AbsaHeads":
        self._check_mergeable(other)
        if self.spans is not None:
            self.spans.merge(other.spans)
        self.position_hits += other.position_hits
        self.chance += other.chance
        self.n_scored += other.n_scored
        self.sep_sum += other.sep_sum
        self.sep_n += other.sep_n
        self.n_sep_unscored += other.n_sep_unscored
        return self

    def compute(self) -> Result:
        """The ``absa_heads`` table: ``relation_heads`` columns plus the review-position and chance baselines."""
        if self.spans is None or self.n_scored.sum() == 0:
            raise ValueError("no ABSA relation instance could be scored (no aspect term found in the reviews?)")
        res = self.spans.compute()
        df = res.table.assign(kind="absa")
        pos_acc = self.position_hits / np.maximum(self.n_scored, 1)[:, None]
        best = pos_acc.argmax(1)
        extra = pd.DataFrame({
            "relation": self.relations,
            "position": np.asarray(REVIEW_POSITIONS)[best],
            "position_accuracy": pos_acc[np.arange(len(self.relations)), best],
            "chance": self.chance / np.maximum(self.n_scored, 1),
        })
        df = df.merge(extra, on="relation", how="left")
        df["best_baseline"] = df[["baseline_accuracy", "position_accuracy", "chance"]].max(axis=1)
        provenance = {**self.params(), "n_examples": self.spans.n_examples, "n_unscored": self.spans.n_unscored,
                      "n_pairs": {r: int(n) for r, n in zip(self.relations, self.n_scored)}}
        return Result(self.name, df, provenance)

    def extra_results(self) -> list[Result]:
        return [Result("absa_head_change", head_change(self.compute().table), self.params()),
                Result("absa_sep_share", self.sep_table(), {"n": dict(zip(CONDITIONS, self.sep_n.tolist())),
                                                            "n_unscored": self.n_sep_unscored})]

    def sep_table(self) -> pd.DataFrame:
        """Per model and head: mean [SEP] share of the aspect word when the aspect is absent / present."""
        rows = []
        mean = self.sep_sum / np.maximum(self.sep_n, 1)[None, :, None, None]
        for m, model in enumerate(MODELS):
            for layer in range(self.num_layers):
                for head in range(self.num_heads):
                    absent = mean[m, 1, layer, head] if self.sep_n[1] else np.nan
                    present = mean[m, 0, layer, head] if self.sep_n[0] else np.nan
                    rows.append({"model": model, "layer": layer + 1, "head": head, "sep_absent": absent,
                                 "sep_present": present, "difference": absent - present,
                                 "n_absent": int(self.sep_n[1]), "n_present": int(self.sep_n[0])})
        return pd.DataFrame(rows)


def head_change(table: pd.DataFrame) -> pd.DataFrame:
    """One row per (relation, direction, head): the base accuracy beside the tuned one, and the baselines.

    ``delta`` = tuned - base; ``created`` marks heads that are at or below the best baseline in the
    base model and above it after fine-tuning.
    """
    keys = ["relation", "direction", "layer", "head"]
    base = table[table.model == "base"].set_index(keys)
    tuned = table[table.model == "tuned"].set_index(keys)
    out = pd.DataFrame({"base": base["accuracy"], "tuned": tuned["accuracy"]}).reset_index()
    extra = base[["n", "best_baseline", "baseline_accuracy", "position_accuracy", "chance"]].reset_index()
    out = out.merge(extra, on=keys)
    out["delta"] = out["tuned"] - out["base"]
    out["created"] = (out["base"] <= out["best_baseline"]) & (out["tuned"] > out["best_baseline"])
    return out.sort_values(["relation", "direction", "tuned"], ascending=[True, True, False]).reset_index(drop=True)


def top_heads(table: pd.DataFrame, k: int = 3) -> pd.DataFrame:
    """The ``k`` best heads per (model, relation) over both directions, from an ``absa_heads`` table."""
    order = table.sort_values(["model", "relation", "accuracy", "layer", "head"], ascending=[True, True, False, True, True])
    order = order.drop_duplicates(["model", "relation", "layer", "head"])  # a head's better direction
    return order.groupby(["model", "relation"], sort=True).head(k).reset_index(drop=True)
