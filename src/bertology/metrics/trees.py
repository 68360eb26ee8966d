"""Tree metrics for structural probes (Hewitt & Manning 2019): pure functions, no model code.

Conventions
-----------
* ``heads`` are CoNLL-U heads: 1-based word indices, ``0`` for the root. One root per tree.
* Word indices in everything returned are 0-based.
* ``distances[i, j]`` is the number of edges on the path between words ``i`` and ``j``;
  ``depths[i]`` the number of edges from word ``i`` to the root (the root has depth 0).
* **Punctuation.** UUAS and root accuracy leave punctuation words out (``keep`` masks, normally
  ``upos != "PUNCT"``), as Hewitt & Manning's evaluation does: punctuation words are removed from the
  predicted distance matrix before the minimum spanning tree, and gold edges touching them are not
  counted. DSpr and NSpr use every word of the sentence (also as in their code), and "sentence
  length" for the 5-50 averaging is the number of words, punctuation included.
* **Corpus-level scores.** UUAS is micro-averaged (edges found / gold edges over the corpus); root
  accuracy is the share of sentences (with at least one kept word) whose least deep kept word is the
  gold root; DSpr/NSpr average per-word Spearman correlations within each sentence length, then
  average those means over the lengths 5..50 that occur.
"""
from __future__ import annotations

from dataclasses import dataclass

from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence

import numpy as np
from scipy.sparse import csr_matrix
from scipy.sparse.csgraph import minimum_spanning_tree, shortest_path
from scipy.stats import rankdata

__all__ = [
    "SpearmanByLength",
    "check_heads",
    "depth_spearman_per_word",
    "distance_spearman_per_word",
    "gold_edges",
    "mst_edges",
    "root_correct",
    "score_depths",
    "score_distances",
    "tree_depths",
    "tree_distances",
    "tree_problem",
    "uuas_counts",
]

#: Sentence lengths (in words) that DSpr and NSpr average over, as in Hewitt & Manning.
SPEARMAN_LENGTHS = (5, 50)


def check_heads(heads: Sequence[int]) -> np.ndarray:
    """Validate CoNLL-U heads (one root, indices in range, no cycle) and return them as an int array."""
    h = np.asarray(heads, dtype=np.int64)
    if h.ndim != 1 or h.size == 0:
        raise ValueError("heads must be a non-empty 1-D sequence")
    n = h.size
    if (h < 0).any() or (h > n).any():
        raise ValueError(f"heads must be in 0..{n}, got {h.tolist()}")
    if (h == np.arange(1, n + 1)).any():
        raise ValueError("a word cannot be its own head")
    n_roots = int((h == 0).sum())
    if n_roots != 1:
        raise ValueError(f"a tree needs exactly one root (head 0), found {n_roots}")
    # every word must reach the root: follow heads at most n steps
    cur = np.arange(1, n + 1)
    for _ in range(n):
        cur = np.where(cur > 0, h[np.maximum(cur, 1) - 1], 0)
    if (cur != 0).any():
        raise ValueError("heads contain a cycle")
    return h


def tree_problem(heads: Sequence[int], n_first_words: int | None = None) -> str | None:
    """Why ``heads`` are not one tree per sentence (a cycle, several roots...), or ``None`` when they are.

    With ``n_first_words`` the heads cover a sentence pair: the first ``n_first_words`` words are one
    tree and the rest (whose heads index the concatenation) another.
    """
    parts = [list(heads)]
    if n_first_words is not None:
        rest = [h - n_first_words if h > 0 else 0 for h in parts[0][n_first_words:]]
        parts = [parts[0][:n_first_words], rest]
    for part in parts:
        try:
            check_heads(part)
        except ValueError as err:
            return str(err)
    return None


def _adjacency(h: np.ndarray) -> csr_matrix:
    n = h.size
    child = np.nonzero(h > 0)[0]
    parent = h[child] - 1
    return csr_matrix((np.ones(child.size), (child, parent)), shape=(n, n))


def tree_distances(heads: Sequence[int]) -> np.ndarray:
    """Path lengths (edges) between every pair of words of a dependency tree, ``[n, n]`` float64."""
    h = check_heads(heads)
    return shortest_path(_adjacency(h), method="D", directed=False, unweighted=True)


def tree_depths(heads: Sequence[int]) -> np.ndarray:
    """Edges from every word to the root, ``[n]`` float64 (the root has depth 0)."""
    h = check_heads(heads)
    root = int(np.nonzero(h == 0)[0][0])
    return shortest_path(_adjacency(h), method="D", directed=False, unweighted=True, indices=root)


def _keep_mask(n: int, keep: Sequence[bool] | np.ndarray | None) -> np.ndarray:
    if keep is None:
        return np.ones(n, dtype=bool)
    k = np.asarray(keep, dtype=bool)
    if k.shape != (n,):
        raise ValueError(f"keep has shape {k.shape}, expected ({n},)")
    return k


def gold_edges(heads: Sequence[int], keep: Sequence[bool] | np.ndarray | None = None) -> set[tuple[int, int]]:
    """Undirected gold edges ``(min, max)`` (0-based) whose two words are both kept."""
    h = np.asarray(heads, dtype=np.int64)
    k = _keep_mask(h.size, keep)
    out = set()
    for i, head in enumerate(h):
        j = int(head) - 1
        if j >= 0 and k[i] and k[j]:
            out.add((min(i, j), max(i, j)))
    return out


def mst_edges(distances: np.ndarray, keep: Sequence[bool] | np.ndarray | None = None) -> set[tuple[int, int]]:
    """Edges ``(min, max)`` (0-based, original word indices) of the minimum spanning tree of the kept words.

    The matrix is symmetrised (mean of it and its transpose). Weights are shifted to be at least 1
    before calling :func:`scipy.sparse.csgraph.minimum_spanning_tree` (which reads 0 as "no edge");
    every spanning tree has the same number of edges, so the shift does not change which tree is
    minimal.
    """
    d = np.asarray(distances, dtype=np.float64)
    if d.ndim != 2 or d.shape[0] != d.shape[1]:
        raise ValueError(f"distances must be square, got shape {d.shape}")
    k = _keep_mask(d.shape[0], keep)
    idx = np.nonzero(k)[0]
    if idx.size < 2:
        return set()
    sub = d[np.ix_(idx, idx)]
    sub = (sub + sub.T) / 2
    if not np.isfinite(sub).all():
        raise ValueError("distances contain NaN or infinity")
    off = ~np.eye(idx.size, dtype=bool)
    w = sub - sub[off].min() + 1.0
    w[~off] = 0.0
    tree = minimum_spanning_tree(np.triu(w)).tocoo()  # upper triangle: each pair once
    return {(int(min(idx[a], idx[b])), int(max(idx[a], idx[b]))) for a, b in zip(tree.row, tree.col)}


def uuas_counts(distances: np.ndarray, heads: Sequence[int], keep: Sequence[bool] | np.ndarray | None = None) -> tuple[int, int]:
    """``(gold edges found by the MST of the predicted distances, gold edges)`` for one sentence."""
    gold = gold_edges(heads, keep)
    if not gold:
        return 0, 0
    return len(gold & mst_edges(distances, keep)), len(gold)


def root_correct(depths: np.ndarray, heads: Sequence[int], keep: Sequence[bool] | np.ndarray | None = None) -> bool | None:
    """Whether the least deep kept word is the gold root (None when no word is kept).

    A punctuation root (rare) can never be predicted when punctuation is left out; such a sentence
    counts as wrong, as in Hewitt & Manning's code.
    """
    d = np.asarray(depths, dtype=np.float64)
    k = _keep_mask(d.size, keep)
    if not k.any():
        return None
    root = int(np.nonzero(np.asarray(heads) == 0)[0][0])
    masked = np.where(k, d, np.inf)
    return int(np.argmin(masked)) == root


def _row_spearman(pred: np.ndarray, gold: np.ndarray) -> np.ndarray:
    """Spearman correlation of each row of ``pred`` with the same row of ``gold`` (NaN for constant rows)."""
    rp = rankdata(pred, axis=-1)
    rg = rankdata(gold, axis=-1)
    rp = rp - rp.mean(axis=-1, keepdims=True)
    rg = rg - rg.mean(axis=-1, keepdims=True)
    num = (rp * rg).sum(axis=-1)
    den = np.sqrt((rp**2).sum(axis=-1) * (rg**2).sum(axis=-1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)


def distance_spearman_per_word(pred: np.ndarray, gold: np.ndarray) -> np.ndarray:
    """Per word ``i``: Spearman between row ``i`` of the predicted and of the gold distance matrix."""
    p, g = np.asarray(pred, dtype=np.float64), np.asarray(gold, dtype=np.float64)
    if p.shape != g.shape or p.ndim != 2:
        raise ValueError(f"pred {p.shape} and gold {g.shape} must be the same square shape")
    return _row_spearman(p, g)


def depth_spearman_per_word(pred: np.ndarray, gold: np.ndarray) -> float:
    """Spearman between predicted and gold depths of one sentence's words."""
    p, g = np.asarray(pred, dtype=np.float64), np.asarray(gold, dtype=np.float64)
    if p.shape != g.shape or p.ndim != 1:
        raise ValueError(f"pred {p.shape} and gold {g.shape} must be the same 1-D shape")
    return float(_row_spearman(p[None], g[None])[0])


class SpearmanByLength:
    """Collects Spearman correlations by sentence length; :meth:`score` is Hewitt & Manning's average.

    ``add(length, values)`` pools values (NaNs dropped) under the sentence length; ``score()`` means
    them per length, then means those over the lengths in ``lengths`` (5..50) that occur (NaN if none).
    """

    def __init__(self, lengths: tuple[int, int] = SPEARMAN_LENGTHS):
        self.lengths = lengths
        self._sums: dict[int, float] = defaultdict(float)
        self._counts: dict[int, int] = defaultdict(int)

    def add(self, length: int, values: float | Iterable[float]) -> None:
        v = np.atleast_1d(np.asarray(values, dtype=np.float64))
        v = v[np.isfinite(v)]
        if v.size:
            self._sums[int(length)] += float(v.sum())
            self._counts[int(length)] += int(v.size)

    def per_length(self) -> dict[int, float]:
        return {n: self._sums[n] / self._counts[n] for n in sorted(self._counts)}

    def score(self) -> float:
        lo, hi = self.lengths
        means = [m for n, m in self.per_length().items() if lo <= n <= hi]
        return float(np.mean(means)) if means else float("nan")


@dataclass(frozen=True)
class SentenceScores:
    """Per sentence: ``hits`` out of ``counted`` (UUAS edges or the root), its ``length`` in words, and the sum and
    count of its finite Spearman values: what a corpus score adds up, kept per sentence so it can be resampled."""

    hits: np.ndarray
    counted: np.ndarray
    lengths: np.ndarray
    spr_sum: np.ndarray
    spr_count: np.ndarray

    def scores(self, weights: np.ndarray, lengths: tuple[int, int] = SPEARMAN_LENGTHS) -> tuple[np.ndarray, np.ndarray]:
        """The corpus ratio (hits / counted) and Hewitt & Manning's Spearman (mean over sentence lengths ``lengths``
        of the mean per length) for each row of ``weights`` ``[R, n]`` (how often each sentence is drawn)."""
        w = np.asarray(weights, dtype=np.float64)
        counted = w @ self.counted
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio = np.where(counted > 0, (w @ self.hits) / np.where(counted > 0, counted, 1), np.nan)
        lo, hi = lengths
        keep = (self.lengths >= lo) & (self.lengths <= hi)
        sizes = np.unique(self.lengths[keep])
        if sizes.size == 0:
            return ratio, np.full(w.shape[0], np.nan)
        onehot = (self.lengths[:, None] == sizes[None, :]) & keep[:, None]  # [n, L]
        total, count = w @ (self.spr_sum[:, None] * onehot), w @ (self.spr_count[:, None] * onehot)  # [R, L]
        present = count > 0
        per_length = np.where(present, total / np.where(present, count, 1), 0.0)
        n_present = present.sum(1)
        with np.errstate(invalid="ignore", divide="ignore"):
            spr = np.where(n_present > 0, per_length.sum(1) / np.maximum(n_present, 1), np.nan)
        return ratio, spr


def score_distances(
    predictions: Sequence[np.ndarray],
    heads: Sequence[Sequence[int]],
    keeps: Sequence[np.ndarray | None],
    lengths: tuple[int, int] = SPEARMAN_LENGTHS,
    golds: Sequence[np.ndarray] | None = None,
    *,
    n_bootstrap: int = 0,
    seed: int = 0,
) -> dict:
    """Corpus UUAS (punctuation left out through ``keeps``) and DSpr of predicted distance matrices; with
    ``n_bootstrap`` their 95% percentile intervals over sentences (``uuas_ci``, ``dspr_ci``).

    ``golds`` (the gold distance matrices) may be passed to skip recomputing them from ``heads``.
    """
    per = _sentence_scores(predictions, heads, keeps, golds, tree_distances, uuas_counts, distance_spearman_per_word)
    uuas, dspr = per.scores(np.ones((1, len(per.hits))), lengths)
    out = {"uuas": float(uuas[0]), "dspr": float(dspr[0]), "n_sentences": len(per.hits), "n_edges": int(per.counted.sum())}
    if n_bootstrap:
        out["uuas_ci"], out["dspr_ci"] = _intervals(per, n_bootstrap, seed, lengths)
    return out


def score_depths(
    predictions: Sequence[np.ndarray],
    heads: Sequence[Sequence[int]],
    keeps: Sequence[np.ndarray | None],
    lengths: tuple[int, int] = SPEARMAN_LENGTHS,
    golds: Sequence[np.ndarray] | None = None,
    *,
    n_bootstrap: int = 0,
    seed: int = 0,
) -> dict:
    """Corpus root accuracy (punctuation left out through ``keeps``) and NSpr of predicted depths; with
    ``n_bootstrap`` their 95% percentile intervals over sentences (``root_acc_ci``, ``nspr_ci``).

    ``golds`` (the gold depths) may be passed to skip recomputing them from ``heads``.
    """
    per = _sentence_scores(predictions, heads, keeps, golds, tree_depths, _root_counts, depth_spearman_per_word)
    root, nspr = per.scores(np.ones((1, len(per.hits))), lengths)
    out = {"root_acc": float(root[0]), "nspr": float(nspr[0]), "n_sentences": len(per.hits)}
    if n_bootstrap:
        out["root_acc_ci"], out["nspr_ci"] = _intervals(per, n_bootstrap, seed, lengths)
    return out


def _intervals(per: SentenceScores, n_bootstrap: int, seed: int, lengths: tuple[int, int]
               ) -> tuple[tuple[float, float], tuple[float, float]]:
    """95% percentile intervals of both scores over ``n_bootstrap`` resamples of the sentences."""
    from bertology.metrics.bootstrap import bootstrap_counts, percentile_interval

    ratio, spr = per.scores(bootstrap_counts(len(per.hits), n_bootstrap, seed), lengths)
    return percentile_interval(ratio), percentile_interval(spr)


def linear_chain_scores(heads: Sequence[Sequence[int]], keeps: Sequence[np.ndarray | None], *,
                        n_bootstrap: int = 0, seed: int = 0) -> dict:
    """The right-branching chain baseline: every word attached to the next and the first word the root (distance
    ``|i - j|``, depth ``i``), scored as a probe's predictions are; the floor a structural probe must clear."""
    distances = [np.abs(np.subtract.outer(np.arange(len(h)), np.arange(len(h)))).astype(np.float64) for h in heads]
    depths = [np.arange(len(h), dtype=np.float64) for h in heads]
    return {**score_distances(distances, heads, keeps, n_bootstrap=n_bootstrap, seed=seed),
            **score_depths(depths, heads, keeps, n_bootstrap=n_bootstrap, seed=seed)}


def _root_counts(depths: np.ndarray, heads: Sequence[int], keep: Sequence[bool] | np.ndarray | None) -> tuple[int, int]:
    """``(1 if the root is right, 1)`` for one sentence, ``(0, 0)`` when it has no kept word (not counted)."""
    ok = root_correct(depths, heads, keep)
    return (0, 0) if ok is None else (int(ok), 1)


def _sentence_scores(
    predictions: Sequence[np.ndarray],
    heads: Sequence[Sequence[int]],
    keeps: Sequence[np.ndarray | None],
    golds: Sequence[np.ndarray] | None,
    gold_of: Callable[[Sequence[int]], np.ndarray],
    counts: Callable[[np.ndarray, Sequence[int], np.ndarray | None], tuple[int, int]],
    spearman: Callable[[np.ndarray, np.ndarray], float | np.ndarray],
) -> SentenceScores:
    """The corpus loop both probes share, per sentence: ``counts`` (hits, out of), its length, its Spearman values.

    Each prediction is read as float64; its gold is ``golds[k]`` when given, else ``gold_of(heads)``.
    """
    n = len(predictions)
    hits, counted, sizes = np.zeros(n), np.zeros(n), np.zeros(n, dtype=np.int64)
    spr_sum, spr_count = np.zeros(n), np.zeros(n)
    for k, (pred, h, keep) in enumerate(zip(predictions, heads, keeps)):
        pred = np.asarray(pred, dtype=np.float64)
        gold = gold_of(h) if golds is None else golds[k]
        hits[k], counted[k] = counts(pred, h, keep)
        sizes[k] = len(gold)
        v = np.atleast_1d(np.asarray(spearman(pred, gold), dtype=np.float64))
        v = v[np.isfinite(v)]
        spr_sum[k], spr_count[k] = float(v.sum()), v.size
    return SentenceScores(hits, counted, sizes, spr_sum, spr_count)
