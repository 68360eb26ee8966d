"""The highest-scoring dependency tree with exactly one root: Chu-Liu-Edmonds decoding (pure functions).

A parser scores every (dependent, head) pair; the per-word argmax of those scores need not be a tree
(cycles, several roots). Dozat & Manning (2017) decode well-formed trees; this module gives the
maximum spanning arborescence rooted at node 0 whose root has exactly one child, as the UD
treebanks require.

Written here rather than taken from a library: ``ufal.chu_liu_edmonds`` (TurboParser's decoder) is
GPL-3.0, which an Apache-2.0 package cannot depend on, and does not enforce a single root;
networkx's ``maximum_spanning_arborescence`` is pure Python, has no single-root constraint and
would need one call per candidate root child; scipy has no directed spanning tree.

**Single root.** Every root edge's score is lowered by ``M = n * spread + 1`` (``spread``: the range
of the finite scores), larger than the difference between the scores of any two trees. Among all
spanning arborescences the best one then has as few root edges as possible (exactly one is always
possible) and, among those, the highest original score: one Chu-Liu-Edmonds call, exact, where the
common alternative (re-decoding once per root child) is ``n`` calls.
"""
from __future__ import annotations

import numpy as np

__all__ = ["max_spanning_tree", "tree_score"]


def _cycle(heads: np.ndarray) -> list[int] | None:
    """The nodes of one cycle of the head graph (node 0 is the root, ``heads[0]`` unused), or None."""
    state = np.zeros(len(heads), dtype=np.int8)  # 0 unvisited, 1 on the current path, 2 done
    state[0] = 2
    for start in range(1, len(heads)):
        path, v = [], start
        while state[v] == 0:
            state[v] = 1
            path.append(v)
            v = int(heads[v])
        if state[v] == 1:
            return path[path.index(v):]
        state[path] = 2
    return None


def _chu_liu_edmonds(scores: np.ndarray) -> np.ndarray:
    """The maximum spanning arborescence rooted at node 0 of ``scores[dependent, head]`` (-inf: no such edge):
    every node takes its best head; a cycle is contracted into one node (an edge into it scores the edge minus
    the cycle edge it replaces), the smaller graph is solved, and the cycle is broken where its head enters."""
    m = scores.shape[0]
    heads = scores.argmax(1)
    heads[0] = 0
    cycle = _cycle(heads)
    if cycle is None:
        return heads
    cyc = np.asarray(cycle)
    outside = np.flatnonzero(~np.isin(np.arange(m), cyc))  # node 0 first: the root is never in a cycle
    k = len(outside)
    into = scores[np.ix_(cyc, outside)] - scores[cyc, heads[cyc]][:, None]  # [cycle node, outside head]
    out_of = scores[np.ix_(outside, cyc)]  # [outside dependent, cycle node as head]
    small = np.full((k + 1, k + 1), -np.inf)
    small[:k, :k] = scores[np.ix_(outside, outside)]
    small[k, :k] = into.max(0)
    small[:k, k] = out_of.max(1)
    small[0] = -np.inf
    sub = _chu_liu_edmonds(small)
    for i in range(1, k):
        heads[outside[i]] = cyc[out_of[i].argmax()] if sub[i] == k else outside[sub[i]]
    entry = int(sub[k])
    heads[cyc[into[:, entry].argmax()]] = outside[entry]
    return heads


def max_spanning_tree(scores: np.ndarray) -> np.ndarray:
    """CoNLL-U heads (1-based, 0 = root) of the best tree for ``scores`` ``[n + 1, n + 1]``, where
    ``scores[i, j]`` scores word ``i`` taking head ``j`` (row and column 0: the root; row 0 is ignored; -inf or
    NaN: not allowed). Exactly one word takes the root (see the module docs). Returns ``n`` heads."""
    s = np.array(scores, dtype=np.float64)
    n = s.shape[0] - 1
    if s.shape != (n + 1, n + 1) or n < 1:
        raise ValueError(f"scores must be square with at least 2 rows (root + words), not {s.shape}")
    s[~np.isfinite(s)] = -np.inf
    np.fill_diagonal(s, -np.inf)
    s[0] = -np.inf
    heads = s.argmax(1)
    if int((heads[1:] == 0).sum()) == 1 and _cycle(heads) is None:  # the argmax is already a one-root tree
        return heads[1:].astype(np.int64)
    finite = s[np.isfinite(s)]
    s[1:, 0] -= n * float(finite.max() - finite.min()) + 1.0
    return _chu_liu_edmonds(s)[1:].astype(np.int64)


def tree_score(scores: np.ndarray, heads: np.ndarray) -> float:
    """The summed score of the edges ``heads`` (1-based, 0 = root) picks from ``scores[dependent, head]``."""
    heads = np.asarray(heads, dtype=np.int64)
    return float(np.asarray(scores, dtype=np.float64)[np.arange(1, len(heads) + 1), heads].sum())
