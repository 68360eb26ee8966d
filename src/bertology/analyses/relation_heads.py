"""Which heads attend to a word's syntactic head (or dependent)? Clark et al. 2019, §4.2.

For every attention head and every gold dependency ``d -> g`` (``g`` the head word of ``d``) the head
"predicts" a relation by an argmax over word-level attention (special tokens and the word itself left
out); accuracy is counted per relation (the full CoNLL-U DEPREL as in the file, e.g. ``nmod:poss``;
sub-types are not folded into their universal relation) and per direction:

``dep->head``
    the word most attended *from* ``d`` is ``g``: ``argmax_{w != d} att[d, w] == g``.
``head->dep``
    ``reverse="transpose"`` (default, Clark's ``head<-dep``: their code transposes the map and takes
    the row argmax): the word that attends most *to* ``d`` is ``g``: ``argmax_{w != d} att[w, d] == g``.
    ``reverse="row"``: the word most attended from ``g`` is ``d``: ``argmax_{w != g} att[g, w] == d``
    (a head with k dependents can get at most one of them right, so accuracy is capped).

The relation ``all`` aggregates every scored pair. Root words (head 0) are not pairs and are left
out of every relation including ``all``; Clark's ``all`` counts each root word as a miss, so their
figure is ours times ``n / (n + n_root)`` (``n_root`` is in the provenance).

Word-level attention follows Clark: attention *to* a word sums its pieces, *from* a word averages
them (:func:`bertology.data.align.word_attention`; ``pooling``: :class:`WordPooling`). With
``word_attention="clark2019"`` it follows their released code instead (the ``relation_word_attention``
convention): the maps are rounded to float16, a word's column is the float16 sum of its pieces'
columns, a word attends as its first piece's row, and the word's own entry is a candidate of value 0
rather than left out (:func:`bertology.metrics.word_argmax.clark_float16_columns`); ties go to the
first word, as ``np.argmax`` does. A word without
tokens, and for a truncated example the last word present (it may be cut), are not candidates and
their pairs are not scored (counted as ``n_pairs_unscored``). For a sentence pair, both sentences' trees are
used when its annotations cover both texts (``Example.n_first_words``), else the first sentence's.

Fixed-offset baseline: for each offset ``k`` (``offsets``, default -3..2 as in Clark, 0 skipped)
predict the head ``g = d + k`` (``dep->head``; with ``reverse="transpose"`` also ``head->dep``, which
predicts the same thing) or the dependent ``d = g + k`` (``head->dep`` with ``reverse="row"``);
positions outside the sentence are misses (Clark clamps them to the root / the last word). The table
reports the best offset per (relation, direction) and its accuracy. Clark's special case for
possessives followed by ``'s`` is not applied.

Table (``compute``): one row per (model, relation, direction, layer, head) with ``accuracy``,
``baseline_offset``, ``baseline_accuracy``, ``n`` (pairs of the relation) and ``rank`` (1 = best
within (model, relation, direction); ties share the lower rank). Relations with fewer than
``min_count`` pairs are left out of the table; their counts are in the provenance
(``dropped_relations``, ``n_pairs``).
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import ClassVar, Literal, NamedTuple

import numpy as np
import pandas as pd
import torch

from bertology import transfer
from bertology.extremes import decimals_to_tell, fixed, ties
from bertology.activations.batch import PairBatch
from bertology.analyses.base import Analysis
from bertology.analyses.registry import AnalysisSpec, BuildContext
from bertology.settings import Setting
from bertology.conventions import setting as convention
from bertology.config import CompareConfig
from bertology.data.align import Pooling, annotated_word_ids, word_attention
from bertology.data.corpus import Corpus
from bertology.metrics.word_argmax import WordAlignment, WordPairs, clark_float16_columns, word_argmax_hits
from bertology.results import Result, weights_rows

MODELS = ("base", "tuned")
DIRECTIONS = ("dep->head", "head->dep")
ALL = "all"
#: Word-level attention: ``mean`` (Clark et al. 2019's paper) or ``clark2019`` (their released code).
WORD_ATTENTION = ("mean", "clark2019")


class ArgmaxHeads(Analysis):
    """What the dependency and the span relation heads share: settings, hit counters, params and table.

    Both count, per relation, model, direction, layer and head, how often an attention argmax lands on
    a target, next to a fixed-offset baseline; only how pairs are found and scored differs.
    """

    #: The two directions a relation is scored in, first axis after the model of ``correct``.
    directions: ClassVar[tuple[str, str]] = DIRECTIONS
    #: Hit counts ``[R, model, direction, L, H]`` (int64) of the batches counted on a device, kept there:
    #: folded into the host counts when :attr:`correct` is read (``compute``, ``merge``), one copy per run.
    _device_correct: torch.Tensor | None = None

    @property
    def correct(self) -> np.ndarray:
        """Hit counts ``[R, model, direction, L, H]`` on the host, those kept on a device folded in."""
        self._fold_device_counts()
        return self._correct

    @correct.setter
    def correct(self, value: np.ndarray) -> None:
        self._correct = value

    def _fold_device_counts(self) -> None:
        """Add the hit counts kept on a device to the host counts (one copy) and drop them."""
        if self._device_correct is not None:
            counts = self._device_correct.cpu().numpy()
            self._correct[: len(counts)] += counts
            self._device_correct = None

    def _device_counts(self, device: torch.device) -> torch.Tensor:
        """The hit counts kept on ``device`` (``[R, model, direction, L, H]`` int64, a normal tensor to add to in
        place), grown to the relations known now; counts kept on another device are folded into the host's first."""
        R = len(self._correct)
        counts = self._device_correct
        with torch.inference_mode(False):
            if counts is None or counts.device != device:
                self._fold_device_counts()
                counts = torch.zeros((0,) + self._correct.shape[1:], dtype=torch.int64, device=device)
            if len(counts) < R:  # relations first seen since
                counts = torch.cat([counts, counts.new_zeros((R - len(counts),) + tuple(counts.shape[1:]))])
        self._device_correct = counts
        return counts

    def _setup(
        self, num_layers: int, num_heads: int, to_method: Pooling, from_method: Pooling, offsets: Iterable[int],
        min_count: int, n_relations: int,
    ) -> None:
        """Store the settings (offset 0 dropped, at least one left) and zero the counters of ``n_relations``."""
        self.num_layers, self.num_heads = int(num_layers), int(num_heads)
        self.to_method, self.from_method = to_method, from_method
        self.offsets = tuple(int(k) for k in offsets if int(k) != 0)
        if not self.offsets:
            raise ValueError("offsets must contain at least one non-zero offset")
        self.min_count = int(min_count)
        R, L, H, K = n_relations, self.num_layers, self.num_heads, len(self.offsets)
        self.correct = np.zeros((R, len(MODELS), len(self.directions), L, H), dtype=np.int64)
        self.baseline_correct = np.zeros((R, len(self.directions), K), dtype=np.int64)
        self.n = np.zeros(R, dtype=np.int64)

    def _shared_params(self) -> dict:
        """The settings :meth:`_setup` stored, as ``params`` reports them (the first keys, in this order)."""
        return {
            "num_layers": self.num_layers,
            "num_heads": self.num_heads,
            "to_method": self.to_method,
            "from_method": self.from_method,
            "offsets": list(self.offsets),
            "min_count": self.min_count,
        }

    def _table(self, keep: list[int], kind: str) -> pd.DataFrame:
        """:func:`relation_table` of the counters, for the relations ``keep``."""
        return relation_table(
            self.relations, keep, self.n, self.correct, self.baseline_correct, self.offsets, self.directions, kind=kind,
        )


class WordPooling(NamedTuple):
    """How word pieces' attention becomes word-level attention: the columns of a word's pieces pooled by
    ``to_method``, then its rows by ``from_method`` (``sum``, ``mean``, ``first`` piece or ``max``)."""

    to_method: Pooling = "sum"
    from_method: Pooling = "mean"


class RelationHeads(ArgmaxHeads):
    """Per head and relation: how often the argmax of word-level attention hits the gold head/dependent."""

    name = "relation_heads"
    requires = frozenset({"attentions"})
    #: Where word attention is pooled and scored: None (default) on the maps' device when they are not on the CPU
    #: (``--device cuda``: the maps stay there, hits are counted there too), else the CPU's Numba kernel
    #: (:func:`word_argmax_hits`, which reads the maps as NumPy arrays). True or False forces one; the counts are the
    #: same either way (tested), except that ``word_attention="clark2019"`` always runs the kernel (its float16 maps).
    score_on_device: ClassVar[bool | None] = None

    def __init__(
        self,
        corpus: Corpus,
        num_layers: int,
        num_heads: int,
        pooling: WordPooling = WordPooling(),
        offsets: Iterable[int] = range(-3, 3),
        min_count: int = 20,
        reverse: Literal["transpose", "row"] = "transpose",
        word_attention: Literal["mean", "clark2019"] = "mean",
    ):
        to_method, from_method = pooling
        if reverse not in ("transpose", "row"):
            raise ValueError(f"reverse must be 'transpose' or 'row', not {reverse!r}")
        if word_attention not in WORD_ATTENTION:
            raise ValueError(f"word_attention must be one of {WORD_ATTENTION}, not {word_attention!r}")
        if word_attention == "clark2019":
            if (to_method, from_method) != ("sum", "mean"):
                raise ValueError("word_attention='clark2019' sets the pooling itself (to: sum, from: first piece)")
            from_method = "first"
        if min_count < 1:
            raise ValueError(f"min_count must be at least 1, not {min_count}")
        self.corpus = corpus
        self._setup(num_layers, num_heads, to_method, from_method, offsets, min_count, n_relations=0)
        self.reverse, self.word_attention = reverse, word_attention
        self.relations: list[str] = []  # relation names, index = first axis of the accumulators
        self._rel_index: dict[str, int] = {}
        self.n_examples = 0
        self.n_skipped_no_tree = 0
        self.n_root = 0
        self.n_pairs_unscored = 0
        self._relation(ALL)

    def params(self) -> dict:
        return {
            **self._shared_params(),
            "reverse": self.reverse,
            "word_attention": self.word_attention,
            "relation_label": "full deprel",
            "exclude": "special tokens, self" if self.word_attention == "mean" else "special tokens; self scored as 0",
            "maps": "as captured" if self.word_attention == "mean" else "rounded to float16, word columns summed in float16",
        }

    # ------------------------------------------------------------------------------ accumulation
    def _relation(self, name: str) -> int:
        idx = self._rel_index.get(name)
        if idx is None:
            idx = len(self.relations)
            self.relations.append(name)
            self._rel_index[name] = idx
            self._correct = np.concatenate([self._correct, np.zeros((1,) + self._correct.shape[1:], np.int64)])
            self.baseline_correct = np.concatenate(
                [self.baseline_correct, np.zeros((1,) + self.baseline_correct.shape[1:], np.int64)]
            )
            self.n = np.concatenate([self.n, np.zeros(1, np.int64)])
        return idx

    def _pairs(self, item, T: int):
        """Gold pairs of one example that can be scored, the candidate mask and the token word ids."""
        ex = self.corpus[item.index]
        if ex.heads is None or ex.deprels is None:
            return None
        W = len(ex.words) if ex.words is not None else len(ex.heads)
        wid = annotated_word_ids(np.asarray(item.word_ids)[:T], np.asarray(item.segment)[:T], ex.n_first_words)
        if wid.size and wid.max() >= W:
            raise ValueError(
                f"example {item.index}: token word id {int(wid.max())} but the corpus example has {W} words; "
                "pass the corpus that was encoded"
            )
        present = np.bincount(wid[wid >= 0], minlength=W) > 0
        if getattr(item, "truncated", False) and present.any():
            present[int(wid.max())] = False  # the last word present may have lost pieces
        heads = np.asarray(ex.heads, dtype=np.int64)
        dep = np.flatnonzero(heads > 0)
        self.n_root += int((heads == 0).sum())
        gov = heads[dep] - 1
        ok = present[dep] & present[gov]
        self.n_pairs_unscored += int((~ok).sum())
        dep, gov = dep[ok], gov[ok]
        rels = [ex.deprels[i] for i in dep]
        return wid, W, present, dep, gov, rels

    def _hits(self, att: torch.Tensor, wid: np.ndarray, W: int, present: np.ndarray, dep, gov) -> np.ndarray:
        """Reference for one example: ``att`` ``[L, H, T, T]`` -> bool ``[2 directions, L, H, P]`` (NumPy)."""
        return self._hits_where(att, wid, W, present, dep, gov).cpu().numpy()

    def _hits_where(self, att: torch.Tensor, wid: np.ndarray, W: int, present: np.ndarray, dep, gov) -> torch.Tensor:
        """:meth:`_hits` as a bool tensor on ``att``'s device (word attention pooled and scored there, float64)."""
        A = word_attention(att.double(), wid, self.to_method, self.from_method, n_words=W)  # [L, H, W, W]
        return self._score(A, present, dep, gov)

    def _score(self, A: torch.Tensor, present: np.ndarray, dep, gov) -> torch.Tensor:
        """Word attention ``[L, H, W, W]`` -> bool hits ``[2 directions, L, H, P]`` on ``A``'s device (argmax, self
        excluded). The gold pairs ``dep``/``gov`` (host integers) go to the device, the argmaxes stay there."""
        W = A.shape[-1]
        absent = transfer.send(~present, A.device)
        self_pair = torch.eye(W, dtype=torch.bool, device=A.device)
        A = A.masked_fill(absent[:, None] | absent[None, :] | self_pair, float("-inf"))
        dep = transfer.send(np.asarray(dep, dtype=np.int64), A.device)
        gov = transfer.send(np.asarray(gov, dtype=np.int64), A.device)
        from_d = A.argmax(-1)  # [L, H, W]: word most attended from each word
        dep_head = from_d[:, :, dep] == gov
        if self.reverse == "transpose":
            to_d = A.argmax(-2)  # [L, H, W]: word attending most to each word
            head_dep = to_d[:, :, dep] == gov
        else:
            head_dep = from_d[:, :, gov] == dep
        return torch.stack([dep_head, head_dep])

    def update(self, batch: PairBatch) -> None:
        found_all = []
        lengths = batch.lengths_host  # from the items: no copy of a GPU batch
        for b, item in enumerate(batch.items):
            found = self._pairs(item, int(lengths[b]))
            if found is None:
                self.n_skipped_no_tree += 1
            else:
                self.n_examples += 1
            found_all.append(found)
        scored = [b for b, f in enumerate(found_all) if f is not None and len(f[3])]
        if not scored:
            return
        # Every scored pair of the batch at once (grouped by example): dependent, governor, relation.
        dep = np.concatenate([found_all[b][3] for b in scored])
        gov = np.concatenate([found_all[b][4] for b in scored])
        rel_ids = np.array([self._relation(r) for b in scored for r in found_all[b][5]], dtype=np.int64)
        P, R = len(dep), len(self.relations)
        onehot = np.zeros((P, R), dtype=np.int64)
        onehot[np.arange(P), rel_ids] = 1
        onehot[:, self._rel_index[ALL]] = 1
        self.n += onehot.sum(0)
        # Hits per relation as segment sums over the pairs sorted by relation (an integer matmul with
        # the one-hot matrix is not a BLAS call and costs more than the scoring).
        by_rel = np.argsort(rel_ids, kind="stable")
        rel_sorted = rel_ids[by_rel]
        starts = np.flatnonzero(np.r_[True, rel_sorted[1:] != rel_sorted[:-1]])
        rel_present = rel_sorted[starts]
        all_idx = self._rel_index[ALL]
        ks = np.asarray(self.offsets)[:, None]  # [K, 1]
        base_dh = gov[None, :] == dep[None, :] + ks  # [K, P]
        base_hd = base_dh if self.reverse == "transpose" else dep[None, :] == gov[None, :] + ks
        self.baseline_correct += np.einsum("dkp,pr->rdk", np.stack([base_dh, base_hd]).astype(np.int64), onehot)
        # The kernel's view of the batch: each token's word (-1 for special tokens, padding and the
        # examples without pairs), each example's candidate words and the range of its pairs.
        B, T = batch.mask.shape
        W = max(found_all[b][1] for b in scored)
        word_ids = np.full((B, T), -1, dtype=np.int64)
        n_words = np.zeros(B, dtype=np.int64)
        allowed = np.zeros((B, W), dtype=bool)
        n_pairs = np.zeros(B, dtype=np.int64)
        for b in scored:
            wid, n_w, present = found_all[b][0], found_all[b][1], found_all[b][2]
            word_ids[b, : len(wid)] = wid
            n_words[b] = n_w
            allowed[b, : len(present)] = present
            n_pairs[b] = len(found_all[b][3])
        pair_start = np.r_[0, np.cumsum(n_pairs)]
        L, H = self.num_layers, self.num_heads
        clark = self.word_attention == "clark2019"
        on_device = self.score_on_device
        if on_device is None:
            on_device = batch.base.attentions[1].device.type != "cpu"
        if on_device and not clark:
            hits = self._hits_on_device(batch, scored, [found_all[b] for b in scored], [int(lengths[b]) for b in scored])
            self._count_on_device(hits, rel_ids, all_idx)
            return
        # Every layer of both models (base first): hits [2 L, 2 directions, H, P]
        maps = [cap.attentions[layer].detach().cpu().numpy() for cap in (batch.base, batch.tuned)
                for layer in range(1, L + 1)]
        to_method = self.to_method
        if clark:  # their code: float16 maps, each word's summed column in its first piece's column
            maps = [clark_float16_columns(a, word_ids) for a in maps]
            to_method = "first"
        hits = word_argmax_hits(maps, WordAlignment(word_ids, n_words, allowed), WordPairs(pair_start, dep, gov),
                                to_method=to_method, from_method=self.from_method, transpose=self.reverse == "transpose",
                                self_as_zero=clark)
        hits = hits.reshape(2, L, 2, H, P).transpose(0, 2, 1, 3, 4)  # [model, direction, L, H, P]
        for m in range(2):
            flat = hits[m].reshape(-1, P)
            per_rel = np.zeros((flat.shape[0], R), dtype=np.int64)  # [2*L*H, R]
            per_rel[:, rel_present] = np.add.reduceat(flat[:, by_rel], starts, axis=1, dtype=np.int64)
            per_rel[:, all_idx] = flat.sum(1)
            self.correct[:, m] += np.moveaxis(per_rel.reshape(2, L, H, R), -1, 0)

    def _hits_on_device(self, batch: PairBatch, rows: list[int], found: list, lengths: list[int]) -> torch.Tensor:
        """Hits ``[model, direction, L, H, P]``, a bool tensor where the maps are.

        Each scored example's word attention is pooled, its argmaxes taken and checked against the gold pairs on the
        maps' device (:meth:`_hits_where`, float64): nothing comes back to the CPU. ``rows``: the scored examples'
        rows in the batch, ``found`` their :meth:`_pairs`, ``lengths`` their real token counts; the pairs come in
        that order, as the kernel's do.
        """
        L = self.num_layers
        parts = []
        for row, (wid, W, present, dep, gov, _rels), T in zip(rows, found, lengths):
            per_model = [self._hits_where(torch.stack([cap.attentions[layer][row, :, :T, :T] for layer in range(1, L + 1)]),
                                          wid, W, present, dep, gov) for cap in (batch.base, batch.tuned)]
            parts.append(torch.stack(per_model))  # [model, direction, L, H, pairs of this example]
        return torch.cat(parts, dim=-1)

    def _count_on_device(self, hits: torch.Tensor, rel_ids: np.ndarray, all_idx: int) -> None:
        """Add hits ``[model, direction, L, H, P]`` (bool, on a device) to the device counts by relation.

        ``rel_ids`` (host, ``[P]``) is each pair's relation; every pair also counts for ``all``. The same counts as
        the host path's segment sums (integers: exactly).
        """
        R, dev = len(self.relations), hits.device
        h = hits.to(torch.int64)
        with torch.inference_mode(False):  # kept across batches: normal tensors
            per_rel = torch.zeros(h.shape[:-1] + (R,), dtype=torch.int64, device=dev)
            per_rel.index_add_(-1, transfer.send(rel_ids, dev), h)
            per_rel[..., all_idx] = h.sum(-1)
            counts = self._device_counts(dev)
            counts += per_rel.permute(4, 0, 1, 2, 3)

    def merge(self, other: "RelationHeads") -> "RelationHeads":
        self._check_mergeable(other)
        for j, rel in enumerate(other.relations):
            i = self._relation(rel)
            self.correct[i] += other.correct[j]
            self.baseline_correct[i] += other.baseline_correct[j]
            self.n[i] += other.n[j]
        self.n_examples += other.n_examples
        self.n_skipped_no_tree += other.n_skipped_no_tree
        self.n_root += other.n_root
        self.n_pairs_unscored += other.n_pairs_unscored
        return self

    # ------------------------------------------------------------------------------ result
    def counts(self) -> dict[str, int]:
        """Pairs per relation (``all`` included), in order of first appearance."""
        return {r: int(self.n[i]) for i, r in enumerate(self.relations)}

    def compute(self) -> Result:
        if self.n_examples == 0:
            raise ValueError(
                f"relation_heads saw no example with a dependency tree ({self.n_skipped_no_tree} without one)"
            )
        keep = [i for i, r in enumerate(self.relations) if self.n[i] >= self.min_count]
        dropped = {self.relations[i]: int(self.n[i]) for i in range(len(self.relations)) if i not in keep}
        df = self._table(keep, kind="dependency")
        provenance = {
            **self.params(),
            "n_examples": self.n_examples,
            "n_skipped_no_tree": self.n_skipped_no_tree,
            "n_root": self.n_root,
            "n_pairs_unscored": self.n_pairs_unscored,
            "n_pairs": self.counts(),
            "dropped_relations": dropped,
        }
        return Result(self.name, df, provenance)


def relation_table(
    relations: list[str],
    keep: list[int],
    n: np.ndarray,
    correct: np.ndarray,
    baseline_correct: np.ndarray,
    offsets: tuple[int, ...],
    directions: tuple[str, str],
    kind: str,
) -> pd.DataFrame:
    """The tidy ``relation_heads`` table from hit counts ``correct`` ``[R, model, direction, L, H]`` (the layers and
    heads are its last two axes) and pair counts.

    One row per (model, relation, direction, layer, head), with the best fixed offset of the relation
    and direction, and ``rank`` (1 = best head within (model, relation, direction); ties share it).
    """
    L, H = np.shape(correct)[-2:]
    columns = ["model", "relation", "direction", "layer", "head", "accuracy", "baseline_offset", "baseline_accuracy",
               "n", "kind"]
    if not keep:
        df = pd.DataFrame(columns=columns)
        df["rank"] = pd.Series(dtype=int)
        return df
    # One block of L*H rows per (relation, model, direction), in that order, built as whole columns.
    keep_idx = np.asarray(keep)
    count = np.asarray(n)[keep_idx].astype(np.int64)  # [R]
    base_acc = np.asarray(baseline_correct)[keep_idx] / count[:, None, None]  # [R, 2, K]
    best_k = base_acc.argmax(-1)  # [R, 2]: first best offset in ``offsets`` order
    best_acc = np.take_along_axis(base_acc, best_k[..., None], -1)[..., 0]  # [R, 2]
    acc = np.asarray(correct)[keep_idx] / count[:, None, None, None, None]  # [R, model, direction, L, H]
    R, M, D, block = len(keep_idx), len(MODELS), len(directions), L * H  # a block: one (relation, model, direction)
    r_i, m_i, d_i = (a.ravel() for a in np.meshgrid(np.arange(R), np.arange(M), np.arange(D), indexing="ij"))
    df = pd.DataFrame({
        "model": np.repeat(np.asarray(MODELS, dtype=object)[m_i], block),
        "relation": np.repeat(np.asarray(relations, dtype=object)[keep_idx][r_i], block),
        "direction": np.repeat(np.asarray(directions, dtype=object)[d_i], block),
        "layer": np.tile(np.repeat(np.arange(1, L + 1), H), R * M * D),
        "head": np.tile(np.tile(np.arange(H), L), R * M * D),
        "accuracy": acc.reshape(-1),
        "baseline_offset": np.repeat(np.asarray(offsets)[best_k[r_i, d_i]], block),
        "baseline_accuracy": np.repeat(best_acc[r_i, d_i], block),
        "n": np.repeat(count[r_i], block),
        "kind": kind,
    })
    # rank within each block of L*H heads (1 = best; ties share the lower rank), as groupby().rank("min")
    blocks = df["accuracy"].to_numpy().reshape(-1, block)
    df["rank"] = ((blocks[:, None, :] > blocks[:, :, None]).sum(-1) + 1).reshape(-1)
    return df


def head_label(layer: int, head: int) -> str:
    return f"L{int(layer)}H{int(head)}"


def best_heads(table: pd.DataFrame, by_direction: bool = True) -> pd.DataFrame:
    """The best head per (model, relation, direction), or per (model, relation) over both directions.

    Ties go to the lower layer, then the lower head (then ``dep->head``). Columns: ``model, relation,
    direction, head_label, layer, head, accuracy, baseline_offset, baseline_accuracy, n``; the
    baseline is that of the chosen row's direction.
    """
    keys = ["model", "relation", "direction"] if by_direction else ["model", "relation"]
    order = table.sort_values(
        ["model", "relation", "accuracy", "layer", "head", "direction"], ascending=[True, True, False, True, True, True]
    )
    best = order.groupby(keys, sort=True, as_index=False).head(1).copy()
    best.insert(3, "head_label", [head_label(layer, head) for layer, head in zip(best.layer, best["head"])])
    cols = keys + ["head_label", "layer", "head", "accuracy", "baseline_offset", "baseline_accuracy", "n"]
    if not by_direction:
        cols.insert(2, "direction")
    return best[cols].sort_values(keys).reset_index(drop=True)


def summary(tables: Mapping[str, pd.DataFrame]) -> str | None:
    """The best head over all relations per model, beside the best fixed-offset baseline."""
    t = weights_rows(tables["relation_heads"])
    best = best_heads(t, by_direction=False)
    overall = best[best["relation"] == "all"].set_index("model")
    if not len(overall):
        return None
    parts = []
    for m, r in overall.iterrows():  # each model's best head in the decimals that tell it from its runner-up
        heads = (t[(t["relation"] == "all") & (t["model"] == m)].groupby(["layer", "head"])["accuracy"].max()
                 .sort_values(ascending=False).tolist())
        d, tied = decimals_to_tell(heads, 1), ties(heads)
        parts.append(f"{m} {fixed(r.accuracy, d)} ({r.head_label}{f', tied with {tied} more' if tied else ''}; "
                     f"best offset {fixed(r.baseline_accuracy, d)})")
    return "relation heads, all relations: " + ", ".join(parts)


def _build(config: CompareConfig, ctx: BuildContext) -> RelationHeads:
    return RelationHeads(ctx.corpus, ctx.num_layers, ctx.num_heads, min_count=config.relation_min_count,
                         word_attention=config.relation_word_attention)


SETTINGS = (
    Setting("relation_min_count", 20, "Leave out relations with fewer pairs.", minimum=1),
    convention("relation_word_attention", paper="Clark et al. 2019"),
    Setting("relations", None, "JSONL of user token relations (text, from span, to spans, relation) scored like "
            "relation heads.", kind=str),
)

SPEC = AnalysisSpec("relation_heads", _build, ("relation_heads",), needs=frozenset({"trees"}), summary=summary,
                    settings=SETTINGS, per_measure=True)
