"""Dependency parsing (a biaffine parser, :mod:`bertology.models.parser`): UAS, LAS and the per-word loss.

**Targets.** Each sentence's gold tree (CoNLL-U ``HEAD``/``DEPREL``) becomes, per word, ``(head, label,
scored)``: the head's 1-based word index (0 = root), the label id in the parser's label set (-1 for a
label the parser does not know: it cannot be predicted, so it is a labelled error) and whether the word
counts in UAS/LAS. In a batch (:meth:`Parsing.collate_targets`) each word's triple sits on its first
piece, with the head given as the head word's first-piece position (0 = ``[CLS]`` = root); every other
position holds -100. The candidate heads of a sentence are position 0 and its words' first pieces.

**Punctuation.** Words with UPOS ``PUNCT`` are left out of UAS and LAS (the UD convention of the
CoNLL 2017/2018 shared-task practice of reporting scores without punctuation; Hewitt & Manning's PTB
XPOS list, ``HEWITT_PUNCT_XPOS`` in :mod:`bertology.experiments.probe`, is the PTB-era convention and
is not offered here). They are trained on like every other word. A sentence without UPOS keeps
every word.

**Words without a piece of their own** (a word sharing its surface form's token, e.g. the second word of
``cannot`` = ``can`` + ``not``; words cut off by truncation) get no prediction: they are neither trained
on nor scored (:func:`coverage` counts them). As a head, such a word is found at the token it shares.

**Decoding** gives each sentence the highest-scoring tree with exactly one root (Chu-Liu-Edmonds over the
candidate heads, :func:`bertology.metrics.arborescence.max_spanning_tree`), as Dozat & Manning decode
well-formed trees; the label of each word is the argmax of the label scores on its arc in that tree.
``uas``/``las`` score the tree; ``uas_argmax``/``las_argmax`` score the per-word argmax over the
candidate heads (a word never heads itself), which need not be a tree, so both can be compared.

**Records** per sentence: correct arcs, correct labelled arcs (of the tree and of the argmax), scored
words, summed loss and words with a loss, so UAS = Σ correct / Σ scored under any bootstrap weights
over sentences.
"""
from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from bertology.data.align import first_pieces
from bertology.data.corpus import Corpus
from bertology.data.encode import EncodedCorpus, EncodedExample
from bertology.errors import BertologyError
from bertology.metrics.arborescence import max_spanning_tree
from bertology.metrics.chance import accuracy_interval
from bertology.models.parser import BiaffineParser
from bertology.tasks.base import Degeneracy, Task

IGNORE = -100
#: The UPOS tags UAS and LAS leave out.
PUNCT_UPOS = ("PUNCT",)
#: Fixed offsets (dependent -> head) of the chance baseline (Clark et al. 2019 use -3..+2 for heads).
BASELINE_OFFSETS = (-3, -2, -1, 1, 2, 3)


def check_trees(corpus: Corpus, what: str = "data") -> None:
    """One clear error unless every example is one annotated sentence (words, heads and relations)."""
    if len(corpus) == 0:
        raise BertologyError(f"The {what} ({corpus.source}) has no sentences.")
    pairs = [i for i, ex in enumerate(corpus) if ex.text_pair is not None]
    if pairs:
        raise BertologyError(f"The {what} ({corpus.source}) has sentence pairs (example {pairs[0] + 1}); "
                             "parsing reads one sentence per example (a CoNLL-U file).")
    missing = [i for i, ex in enumerate(corpus) if ex.words is None or ex.heads is None or ex.deprels is None]
    if missing:
        shown = ", ".join(str(i + 1) for i in missing[:5]) + (" ..." if len(missing) > 5 else "")
        raise BertologyError(
            f"Parsing needs gold trees, but {len(missing)} of {len(corpus)} sentences of the {what} ({corpus.source}) "
            f"have no HEAD or DEPREL (sentences {shown}); pass a CoNLL-U file with heads and relations."
        )


def word_targets(corpus: Corpus, labels: Sequence[str], what: str = "data") -> np.ndarray:
    """Per sentence an int64 array ``[n_words, 3]`` of (head, label id, scored); an object array in corpus order."""
    check_trees(corpus, what)
    label_id = {lab: i for i, lab in enumerate(labels)}
    out = np.empty(len(corpus), dtype=object)
    for i, ex in enumerate(corpus):
        n = len(ex.words)
        heads = np.asarray(ex.heads, dtype=np.int64)
        if heads.size != n or (heads < 0).any() or (heads > n).any():  # the reader refuses these; a Python corpus may not
            raise BertologyError(f"Sentence {i + 1} of the {what} ({corpus.source}) has heads {list(ex.heads)} "
                                 f"for {n} words; each head must be 0 (root) .. {n}.")
        lab = np.array([label_id.get(d, -1) for d in ex.deprels], dtype=np.int64)
        scored = np.ones(n, dtype=np.int64) if ex.upos is None else np.array(
            [u not in PUNCT_UPOS for u in ex.upos], dtype=np.int64)
        out[i] = np.stack([heads, lab, scored], axis=1)
    return out


def deprel_set(corpus: Corpus) -> list[str]:
    """The sorted dependency relations of a treebank (full UD labels, subtypes kept: ``nmod:poss``)."""
    return sorted({d for ex in corpus if ex.deprels is not None for d in ex.deprels})


def coverage(encoded: EncodedCorpus, targets: np.ndarray) -> dict:
    """Words and scored words with and without a piece of their own, and labels the parser does not know."""
    words = scored = lost = lost_scored = unknown = 0
    for it in encoded.items:
        t = targets[it.index]
        own = first_pieces(it.word_ids, len(t)) >= 0
        words += len(t)
        scored += int(t[:, 2].sum())
        lost += int((~own).sum())
        lost_scored += int(t[~own, 2].sum())
        unknown += int((t[:, 1] < 0).sum())
    return {"n_words": words, "n_scored_words": scored, "n_words_without_piece": lost,
            "n_scored_words_without_piece": lost_scored, "n_unknown_labels": unknown}


def _masked_arcs(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Arc scores ``[B, T, T]`` with non-candidate heads (not root, not a word's first piece) and self-loops masked."""
    arc = outputs[..., 0].float()
    cand = targets[..., 0] != IGNORE
    cand[:, 0] = True
    T = arc.shape[-1]
    bad = ~cand[:, None, :] | torch.eye(T, dtype=torch.bool, device=arc.device)[None]
    return arc.masked_fill(bad, torch.finfo(arc.dtype).min)


def _word_losses(outputs: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per token ``[B, T]``: arc + label cross-entropy of the words with a usable target (0 elsewhere), and that mask."""
    arc = _masked_arcs(outputs, targets)
    gold = targets[..., 0]
    valid = gold >= 0
    g = gold.clamp_min(0)
    arc_loss = F.cross_entropy(arc.transpose(1, 2), g, reduction="none")  # [B, T]
    lab_logits = torch.gather(outputs[..., 1:].float(), 2,
                              g[:, :, None, None].expand(-1, -1, 1, outputs.shape[-1] - 1))[:, :, 0]  # [B, T, L]
    lab = targets[..., 1]
    lab_loss = F.cross_entropy(lab_logits.transpose(1, 2), lab.clamp_min(0), reduction="none") * (lab >= 0)
    return torch.where(valid, arc_loss + lab_loss, torch.zeros_like(arc_loss)), valid


def tree_heads(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``[B, T]``: each word's head position in its sentence's best one-root tree (Chu-Liu-Edmonds over the root
    and the words' first pieces, :func:`~bertology.metrics.arborescence.max_spanning_tree`); other positions
    keep their argmax (never scored)."""
    arc = _masked_arcs(outputs, targets)
    floor = torch.finfo(arc.dtype).min
    pred = arc.argmax(-1).cpu().numpy()
    scores = arc.double().cpu().numpy()
    is_word = (targets[..., 0] != IGNORE).cpu().numpy()
    for b in range(len(pred)):
        words = np.flatnonzero(is_word[b])
        if words.size:
            nodes = np.concatenate([[0], words])
            sub = scores[b][np.ix_(nodes, nodes)]
            sub[sub <= floor] = -np.inf  # masked candidates: not allowed
            pred[b, words] = nodes[max_spanning_tree(sub)]
    return torch.as_tensor(pred, device=outputs.device)


def _labels_on(outputs: torch.Tensor, heads: torch.Tensor) -> torch.Tensor:
    """``[B, T]``: the argmax label of each position's arc to its head position ``heads``."""
    return torch.gather(outputs[..., 1:], 2, heads[:, :, None, None].expand(-1, -1, 1, outputs.shape[-1] - 1))[:, :, 0].argmax(-1)


def _hits(outputs: torch.Tensor, targets: torch.Tensor, heads: torch.Tensor, scored: torch.Tensor,
          suffix: str) -> dict[str, np.ndarray]:
    """Per sentence, the scored words whose head (``correct``) and also label (``correct_labelled``) are right when
    each word takes head position ``heads`` and the best label on that arc; ``suffix`` names the decoding."""
    arc_ok = scored & (heads == targets[..., 0])
    las_ok = arc_ok & (_labels_on(outputs, heads) == targets[..., 1])
    return {"correct" + suffix: arc_ok.sum(1).cpu().numpy().astype(np.float64),
            "correct_labelled" + suffix: las_ok.sum(1).cpu().numpy().astype(np.float64)}


def predicted_trees(outputs: torch.Tensor, targets: torch.Tensor, items: Sequence[EncodedExample],
                    n_words: Sequence[int], *, tree: bool = True) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per sentence of a batch (``items``, with ``n_words`` words each), the predicted head (1-based word
    index, 0 = root) and label id of every word, decoded as :meth:`Parsing.record` scores them (the best
    one-root tree, or with ``tree=False`` the per-word argmax); -1 for a word without a piece of its own."""
    heads_at = tree_heads(outputs, targets) if tree else _masked_arcs(outputs, targets).argmax(-1)
    pred = heads_at.cpu().numpy()
    lab = _labels_on(outputs, heads_at).cpu().numpy()
    out = []
    for b, (it, n) in enumerate(zip(items, n_words)):
        own = first_pieces(it.word_ids, n)
        word_at = np.zeros(pred.shape[1], dtype=np.int64)  # first-piece position -> word index + 1
        word_at[own[own >= 0]] = np.flatnonzero(own >= 0) + 1
        heads, labels = np.full(n, -1, dtype=np.int64), np.full(n, -1, dtype=np.int64)
        heads[own >= 0] = word_at[pred[b, own[own >= 0]]]
        labels[own >= 0] = lab[b, own[own >= 0]]
        out.append((heads, labels))
    return out


def _tree_code(rel: np.ndarray) -> int:
    """A stable integer naming one predicted tree by its relative head offsets (distinct trees: distinct codes)."""
    return zlib.crc32(np.ascontiguousarray(rel, dtype=np.int64).tobytes())


class Parsing(Task):
    name = "parsing"
    example_unit = "sentences"
    metrics = ("uas", "las", "loss", "uas_argmax", "las_argmax")
    higher_is_better = {"uas": True, "las": True, "loss": False, "uas_argmax": True, "las_argmax": True}
    loss_metric = "loss"
    loss_name = "arc + label cross-entropy per word"
    problem_type = "dependency_parsing"
    target_dtype = torch.long
    token_level = True

    def check_model(self, model: torch.nn.Module, name: str = "the model") -> None:
        if not isinstance(model, BiaffineParser):
            raise BertologyError(f"{name} has no dependency parser head; pass a parser fine-tuned with "
                                 "`bertology finetune --task parsing`.")

    def targets(self, corpus: Corpus, model: torch.nn.Module, what: str = "data") -> np.ndarray:
        self.check_model(model)
        return word_targets(corpus, model.labels, what)

    def collate_targets(self, items: Sequence[EncodedExample], targets: Sequence[np.ndarray]) -> torch.Tensor:
        """``[B, T, 3]``: on each word's first piece (head's first-piece position, label, scored), -100 elsewhere.

        A head with no piece of its own is found at the token it shares; a word whose head has no token
        at all (truncated), or shares the word's own token, keeps -1 as its head (no loss, not scored).
        """
        T = max(len(it) for it in items)
        out = np.full((len(items), T, 3), IGNORE, dtype=np.int64)
        for b, (it, t) in enumerate(zip(items, targets)):
            n = len(t)
            own = first_pieces(it.word_ids, n)
            at = first_pieces(it.word_ids, n, it.shared_words)
            for w in np.flatnonzero(own >= 0):
                h = int(t[w, 0])
                piece = 0 if h == 0 else int(at[h - 1])
                if piece == own[w]:
                    piece = -1
                out[b, own[w]] = (piece, t[w, 1], t[w, 2] if piece >= 0 else 0)
        return torch.as_tensor(out)

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor, reduction: str = "mean") -> torch.Tensor:
        """Arc + label cross-entropy per word (Dozat & Manning): ``mean`` over the batch's words, ``sum``, or
        ``none`` = per sentence, summed over its words."""
        per_token, valid = _word_losses(outputs, targets)
        if reduction == "none":
            return per_token.sum(1)
        total = per_token.sum()
        return total if reduction == "sum" else total / valid.sum().clamp_min(1)

    def record(self, outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, np.ndarray]:
        with torch.no_grad():
            outputs, targets = outputs.detach(), targets.detach()
            per_token, valid = _word_losses(outputs, targets)
            scored = valid & (targets[..., 2] == 1)
            pred = tree_heads(outputs, targets)  # [B, T] head position in the decoded tree
            hits = {**_hits(outputs, targets, pred, scored, ""),
                    **_hits(outputs, targets, _masked_arcs(outputs, targets).argmax(-1), scored, "_argmax")}
            is_word = targets[..., 0] != IGNORE
            rank = torch.cumsum(is_word.long(), 1) * is_word  # word number (1-based) of each first piece
            rank_of_head = torch.gather(rank, 1, pred)  # 0 for the root
            rel = torch.where(rank_of_head > 0, rank_of_head - rank, torch.zeros_like(rank))
        codes = [_tree_code(r[w]) for r, w in zip(rel.cpu().numpy(), is_word.cpu().numpy())]
        n_loss = valid.sum(1).double()
        loss_sum = per_token.double().sum(1)
        return {
            "pred": np.asarray(codes, dtype=np.int64),
            "loss": (loss_sum / n_loss.clamp_min(1)).cpu().numpy(),
            "loss_sum": loss_sum.cpu().numpy(),
            "n_loss": n_loss.cpu().numpy(),
            **hits,
            "n_scored": scored.sum(1).cpu().numpy().astype(np.float64),
        }

    def scores(self, weights: np.ndarray, records: Mapping[str, np.ndarray], y: np.ndarray) -> dict[str, np.ndarray]:
        """Word-level ratios under sentence weights: UAS = Σ_s w_s correct_s / Σ_s w_s scored_s (``[R, U]``)."""
        w = np.asarray(weights, dtype=np.float64)

        def ratio(num: str, den: str) -> np.ndarray:
            top = w @ np.asarray(records[num], dtype=np.float64).T
            bottom = w @ np.asarray(records[den], dtype=np.float64).T
            with np.errstate(invalid="ignore", divide="ignore"):
                return np.where(bottom > 0, top / np.where(bottom > 0, bottom, 1), np.nan)

        return {"uas": ratio("correct", "n_scored"), "las": ratio("correct_labelled", "n_scored"),
                "loss": ratio("loss_sum", "n_loss"), "uas_argmax": ratio("correct_argmax", "n_scored"),
                "las_argmax": ratio("correct_labelled_argmax", "n_scored")}

    def n_predicted(self, pred: np.ndarray) -> int:
        """Distinct predicted trees (by their relative head offsets)."""
        return int(np.unique(pred).size)

    def chance(self, y: np.ndarray) -> float:
        """UAS of the best fixed-offset baseline (every word's head is the word k away, k in ±1..3)."""
        hits = np.zeros(len(BASELINE_OFFSETS))
        total = 0
        for t in y:
            t = np.asarray(t)
            if t.size == 0:
                continue
            pos = np.arange(1, len(t) + 1)
            scored = t[:, 2] == 1
            total += int(scored.sum())
            for k, off in enumerate(BASELINE_OFFSETS):
                hits[k] += int(((t[:, 0] == pos + off) & scored).sum())
        return float(hits.max() / total) if total else 0.0

    def prediction_summary(self, pred: np.ndarray, config) -> dict:
        return {"distinct_predicted_trees": int(np.unique(pred).size)}

    def degeneracy(self, value: float, n: int, n_predicted: int, chance: float) -> Degeneracy:
        """At chance when the Wilson 95% interval of UAS, taken over ``n`` sentences (wider than over words,
        whose errors are not independent within a sentence), reaches the best fixed-offset baseline."""
        lo, hi = accuracy_interval(round(value * n), n)
        return Degeneracy(
            metric="uas", value=float(value), n=int(n), ci=(lo, hi), ci_method="wilson 95% over sentences",
            chance=float(chance), chance_method="best fixed-offset head baseline (±1..3 words)",
            n_predicted=int(n_predicted), constant_predictions=int(n_predicted) <= 1 and n > 1,
            at_chance=bool(lo <= chance), what="parser",
        )


TASK = Parsing()
