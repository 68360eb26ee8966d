"""The head map (Clark et al. 2019, §6): every head of both models in one 2-D picture.

For a sample of examples, the distance between two heads is the Jensen-Shannon divergence (bits)
between their attention rows for the same query token, averaged over all real query tokens ([CLS] and
[SEP] included; real keys only). Heads of the base and of the tuned model go into one ``2 L H`` x
``2 L H`` matrix and one metric-MDS embedding, so a head that fine-tuning moved sits apart from its
base version; ``moved`` is that distance.

Cost: ``(2 L H)² / 2`` mixture entropies per query token (10,296 pairs for MiniLM), more than the
forward passes, so only a sample of ``max_examples`` examples is used: those with the smallest
hashed keys of ``(seed, example index)`` among all examples streamed (a bottom-k sample). The sample
depends only on which examples exist, never on batching or sharding.

- Without ``example_indices``, each candidate's sums are kept (``K (K - 1) / 2`` float64 per
  example: 16 MB for 200 MiniLM examples, 66 MB for BERT-base) until ``max_examples`` smaller keys
  have been seen, and ``merge`` takes the bottom-k of the union. Some candidates are computed and
  later dropped (about ``k ln(n / k)`` extra for a corpus of ``n``).
- With ``example_indices`` (the indices of the examples that will be streamed, through this
  instance or through all the shards that will be merged: pass the whole corpus's to every shard),
  the sample is known in advance: only its examples are computed and only the running sums are kept
  (memory ``O(K²)``). Same numbers (to float64 rounding), less work.

MDS runs on the JS *distance* (square root of the mean divergence, a metric) by default, starting
from classical scaling (deterministic) and then SMACOF with ``random_state=seed``; the map is
rotated to its principal axes and oriented so that ``x`` and ``y`` grow with the layer. A head whose
maps fine-tuning left unchanged gets its base version's distances bit for bit (they are computed once)
and, from the classical start, the same point on the map.

``distance="clark2019"`` (the ``head_map_distance`` convention) is Clark et al. (2019)'s own map
(their ``head_distances.py`` and General_Analysis notebook): every map is smoothed to
``0.999 p + 0.001 / n`` over its ``n`` tokens, the JS divergence is in nats and *summed* over all
sampled query tokens, and MDS embeds that sum from 5 random starts (1000 iterations, ``eps`` 1e-10;
seeded here, unseeded there). Their code does the arithmetic on float16 maps in float16; here it is
float32 per row and float64 over rows. Every divergence of such a run, ``moved`` and the
``head_distance`` table included, is of the smoothed maps.
"""
from __future__ import annotations

import inspect
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np
import pandas as pd
import torch

from bertology import transfer
from bertology.analyses.device_state import host
from bertology.activations.batch import PairBatch
from bertology.analyses.base import Analysis
from bertology.analyses.registry import AnalysisSpec, BuildContext
from bertology.settings import Setting
from bertology.conventions import setting as convention
from bertology.config import CompareConfig
from bertology.extremes import picks_text
from bertology.analyses.representation_similarity import token_keys
from bertology.metrics.head_distance import (
    BLOCK_ELEMENTS,
    classical_mds,
    expand_pairs,
    pair_indices,
    paired_js_sums,
    pairwise_js_sums,
    square,
    stress1,
)
from bertology.results import Result, weights_rows

MODELS = ("base", "tuned")
Distance = Literal["js_distance", "js_divergence", "clark2019"]
DISTANCES = ("js_distance", "js_divergence", "clark2019")
#: Clark et al. (2019)'s head distances smooth every map to ``(1 - s) p + s / n`` with this ``s``.
CLARK_JS_SMOOTHING = 1e-3
#: MDS settings per distance: bertology's deterministic classical start, or Clark et al.'s notebook
#: (``MDS(metric=True, n_init=5, eps=1e-10, max_iter=1000)``, random starts; seeded here).
MDS_SETTINGS: Mapping[str, dict] = {
    "js_distance": {"init": "classical", "n_init": 4, "max_iter": 300, "eps": 1e-6},
    "js_divergence": {"init": "classical", "n_init": 4, "max_iter": 300, "eps": 1e-6},
    "clark2019": {"init": "random", "n_init": 5, "max_iter": 1000, "eps": 1e-10},
}


@dataclass(frozen=True)
class MDSFit:
    """How the head map's MDS embedding is fitted: ``init`` (``classical`` or ``random``), ``n_init`` random
    restarts and ``max_iter`` iterations; a field left None takes the distance's :data:`MDS_SETTINGS`."""

    init: Literal["classical", "random"] | None = None
    n_init: int | None = None
    max_iter: int | None = None


_SALT = 0x68656164  # "head": keeps these keys apart from representation_similarity's token keys


def example_keys(seed: int, example: np.ndarray) -> np.ndarray:
    """Deterministic uint64 sampling key per example index (order-free, so batching cannot change the sample)."""
    example = np.asarray(example, dtype=np.int64)
    return token_keys(seed, example, np.full(example.shape, _SALT, dtype=np.int64))


def unchanged_heads(base: torch.Tensor, tuned: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Which tuned heads equal their base version exactly on one example (``[H, T, T]`` each).

    Returns ``(representative [2 H], distinct [2 H] bool)`` for :func:`expand_pairs`: base heads
    represent themselves, an unchanged tuned head is represented by its base version, and only the
    ``distinct`` heads' pairs need computing.
    """
    h = base.shape[0]
    same = (base == tuned).flatten(1).all(1)
    distinct = torch.cat([torch.ones_like(same), ~same])
    rep = torch.cumsum(distinct, 0) - 1
    rep[h:] = torch.where(same, torch.arange(h, device=rep.device), rep[h:])
    return rep, distinct


def head_representatives(base: torch.Tensor, tuned: torch.Tensor) -> torch.Tensor:
    """``[2 H]`` int64: each head's index among all ``2 H`` (base then tuned), an unchanged tuned head its base version's.

    The device form of :func:`unchanged_heads`: every head's pairs are computed (``K' = 2 H`` for
    :func:`expand_pairs`) and the copies take their originals' values, so nothing about which heads changed
    (the size of the distinct set) has to be read back to the host.
    """
    h = base.shape[0]
    same = (base == tuned).flatten(1).all(1)
    own = torch.arange(2 * h, device=base.device)
    return torch.cat([own[:h], torch.where(same, own[:h], own[h:])])


def _take_rows(x: np.ndarray | torch.Tensor, rows: np.ndarray) -> np.ndarray | torch.Tensor:
    """Rows ``rows`` (NumPy integers) of ``x``, a NumPy array or a tensor on any device."""
    if isinstance(x, torch.Tensor):
        return x[transfer.send(rows, x.device, torch.long)]
    return x[rows]


def head_index(num_layers: int, num_heads: int) -> pd.DataFrame:
    """Row ``k`` of the distance matrix: ``model`` (base first), ``layer`` (1..L), ``head`` (0-based)."""
    model, layer, head = np.meshgrid(np.arange(2), np.arange(1, num_layers + 1), np.arange(num_heads), indexing="ij")
    return pd.DataFrame({"model": np.array(MODELS)[model.ravel()], "layer": layer.ravel(), "head": head.ravel()})


def mds_embedding(
    d: np.ndarray,
    *,
    seed: int = 0,
    init: Literal["classical", "random"] = "classical",
    n_init: int = 4,
    max_iter: int = 300,
    eps: float = 1e-6,
    layers: np.ndarray | None = None,
) -> tuple[np.ndarray, float]:
    """Metric MDS (sklearn SMACOF) of a precomputed distance matrix: ``(coordinates [K, 2], Stress-1)``.

    ``init="classical"`` starts from Torgerson scaling (one run, deterministic); ``"random"`` takes
    the best of ``n_init`` seeded random starts. The result is centred, rotated to its principal axes
    and each axis' sign fixed (growing with ``layers`` when given), so reruns draw the same picture;
    from the classical start, points with identical distance rows (heads fine-tuning left unchanged)
    coincide exactly.
    """
    from sklearn.manifold import MDS

    d = np.asarray(d, dtype=np.float64)
    k = d.shape[0]
    if k < 3 or not np.any(d > 0):
        return np.zeros((k, 2)), 0.0
    kw: dict = dict(n_components=2, max_iter=max_iter, eps=eps, random_state=seed, normalized_stress=False)
    if "metric_mds" in inspect.signature(MDS).parameters:  # sklearn >= 1.8
        kw.update(metric_mds=True, metric="precomputed", init="random")
    else:
        kw.update(metric=True, dissimilarity="precomputed")
    start = None
    if init == "classical":
        kw["n_init"], start = 1, classical_mds(d)
    elif init == "random":
        kw["n_init"] = n_init
    else:
        raise ValueError(f"init must be 'classical' or 'random', not {init!r}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # parameter renames across sklearn versions
        x = MDS(**kw).fit_transform(d, init=start)
    x = _orient(x, layers)
    if init == "classical":
        x = _coincide(x, d)
    return x, stress1(d, x)


def _coincide(x: np.ndarray, d: np.ndarray) -> np.ndarray:
    """Put points with identical rows of ``d`` (distance 0 to each other, the same to every other
    point) at their mean, so they coincide exactly.

    SMACOF in exact arithmetic keeps such points together from the classical start (their Guttman
    updates are equal); in floating point each row of its matrix product sums in another order, so
    they end about one ulp apart (2e-18 on a 4e-3 map). Averaging removes that and changes nothing
    else. Only for the classical start: from random starts (``clark2019``, Clark et al.'s own map)
    such points need not meet, and their map is kept as SMACOF leaves it.
    """
    _, group = np.unique(d, axis=0, return_inverse=True)
    group = group.ravel()
    if group.max() + 1 == len(group):
        return x
    means = np.zeros((group.max() + 1, x.shape[1]))
    np.add.at(means, group, x)
    means /= np.bincount(group)[:, None]
    return means[group]


def _orient(x: np.ndarray, layers: np.ndarray | None) -> np.ndarray:
    """Centre, rotate to principal axes, and fix each axis' sign (distances unchanged)."""
    x = x - x.mean(0)
    _, _, vt = np.linalg.svd(x, full_matrices=False)
    x = x @ vt.T
    for c in range(x.shape[1]):
        s = 0.0
        if layers is not None and np.std(layers) > 0 and np.std(x[:, c]) > 0:
            s = float(np.corrcoef(x[:, c], layers)[0, 1])
        if s == 0.0:
            s = float(x[np.abs(x[:, c]).argmax(), c])
        if s < 0:
            x[:, c] = -x[:, c]
    return x


class HeadMap(Analysis):
    """JS distances between all heads of both models on a hashed example sample, and their MDS map.

    Where the sums live: on the CPU as NumPy arrays (the fused Numba kernel of
    :func:`pairwise_js_sums` makes them there); with the maps on a GPU as float64 tensors on that device, so no
    example's ``K (K - 1) / 2`` sums are copied back per batch, only the total once in ``compute``. The sample
    (keys, indices, token counts) is chosen on the host from the items either way.
    """

    name = "head_map"
    distance_name = "head_distance"
    requires = frozenset({"attentions"})
    #: Where the per-example sums are kept: None (default) as tensors on the maps' device when it is not the CPU,
    #: else as NumPy arrays; True or False forces one. The sums are the same either way; only the order in which
    #: their total is added may differ (tested). Set on the class or an instance.
    on_device: bool | None = None

    def __init__(
        self,
        num_layers: int,
        num_heads: int,
        *,
        max_examples: int = 100,
        seed: int = 0,
        distance: Distance = "js_distance",
        mds: MDSFit = MDSFit(),
        example_indices: Iterable[int] | None = None,
        block_elements: int = BLOCK_ELEMENTS,
    ):
        """``mds`` (:class:`MDSFit`): how the embedding is fitted; what it leaves None, the distance's
        :data:`MDS_SETTINGS`."""
        mds_init, n_init, max_iter = mds.init, mds.n_init, mds.max_iter
        if max_examples < 1:
            raise ValueError("max_examples must be at least 1")
        if distance not in DISTANCES:
            raise ValueError(f"distance must be one of {DISTANCES}, not {distance!r}")
        preset = MDS_SETTINGS[distance]
        mds_init = preset["init"] if mds_init is None else mds_init
        if mds_init not in ("classical", "random"):
            raise ValueError(f"mds_init must be 'classical' or 'random', not {mds_init!r}")
        self.num_layers, self.num_heads = num_layers, num_heads
        self.max_examples, self.seed, self.distance = max_examples, seed, distance
        self.mds_init = mds_init
        self.n_init = preset["n_init"] if n_init is None else n_init
        self.max_iter = preset["max_iter"] if max_iter is None else max_iter
        self.eps = preset["eps"]
        self.block_elements = block_elements
        self.n_heads_total = 2 * num_layers * num_heads
        self.n_pairs = self.n_heads_total * (self.n_heads_total - 1) // 2
        ia, ib = pair_indices(self.n_heads_total)
        half = num_layers * num_heads
        # Position of pair (k, k + L H), i.e. a head against its tuned version, in pair order.
        self._moved_pairs = torch.from_numpy(np.nonzero(ib - ia == half)[0])
        # The bottom-k sample, sorted by (key, index), with row counts; the JS sums per example
        # (``sums``, when examples may still be evicted) or their running total (``total``).
        self.keys = np.zeros(0, dtype=np.uint64)
        self.indices = np.zeros(0, dtype=np.int64)
        self.rows = np.zeros(0, dtype=np.int64)
        self.sums: np.ndarray | None = np.zeros((0, self.n_pairs))
        self.total = np.zeros(self.n_pairs)
        self.n_seen = 0
        self._allowed: set[int] | None = None
        self._limit: np.uint64 | None = None
        if example_indices is not None:
            idx = np.unique(np.fromiter(example_indices, dtype=np.int64))
            self._allowed = set(idx.tolist())
            self.sums = None  # the sample is known: nothing will be evicted
            if len(idx) > max_examples:
                self._limit = np.sort(example_keys(seed, idx))[max_examples - 1]

    def params(self) -> dict:
        return {
            "max_examples": self.max_examples, "seed": self.seed, "distance": self.distance,
            "divergence": (
                "Jensen-Shannon, base 2, mean over real query tokens (incl. [CLS]/[SEP]), real keys"
                if self.distance != "clark2019" else
                f"Jensen-Shannon, nats, of maps smoothed as {1 - CLARK_JS_SMOOTHING:g} p + {CLARK_JS_SMOOTHING:g} / n, "
                "summed over real query tokens (incl. [CLS]/[SEP]), real keys (Clark et al. 2019)"),
            "sample": "bottom-k of hash(seed, example index)",
            "mds": {"metric": True, "init": self.mds_init, "n_init": self.n_init if self.mds_init == "random" else 1,
                    "max_iter": self.max_iter, "eps": self.eps, "random_state": self.seed},
            "num_layers": self.num_layers, "num_heads": self.num_heads,
        }

    # ------------------------------------------------------------------------------ accumulation
    def _stack(self, batch: PairBatch, row: int, length: int) -> torch.Tensor:
        """All ``2 L H`` heads' attention of one example, cropped to its real tokens: ``[K, T, T]``."""
        return torch.cat(
            [cap.attentions[layer][row, :, :length, :length]
             for cap in (batch.base, batch.tuned) for layer in range(1, self.num_layers + 1)]
        )

    def _example_sums(self, batch: PairBatch, row: int, length: int) -> torch.Tensor:
        """One example's float64 JS sums over its tokens for every pair of heads (:func:`pair_indices` order), on the maps' device.

        The base-vs-tuned pairs of the same head are recomputed in the precise float64 form, so an
        unchanged head has ``moved == 0`` exactly and small moves are not float32 noise. A tuned head
        whose map equals its base version's (a frozen layer, an identical model) is not computed again
        but takes its base version's sums: float32 sums reduced in another block would differ by
        rounding (3e-7 in JS distance on a tiny random model, 1e-4 of its map), and the two copies
        would then sit apart on the map.
        """
        p = self._stack(batch, row, length)
        if self.distance == "clark2019":  # their smoothing, over the example's own tokens
            p = p * (1.0 - CLARK_JS_SMOOTHING) + CLARK_JS_SMOOTHING / length
        half = self.num_layers * self.num_heads
        if isinstance(self.total, torch.Tensor):
            # Device form: which heads are unchanged stays on the device (its count would size p[distinct], a
            # sync per example), so every head's pairs are computed and the copies take their originals'. The
            # same values in the CPU kernel (a pair's sum depends only on its two heads' maps: tested), to
            # float32 rounding in the torch form (other blocks); more work only where tuned heads equal their
            # base versions: (2 L / (2 L - f))^2 for f unchanged layers of L, 4x for identical models.
            rep = head_representatives(p[:half], p[half:])
            sums = expand_pairs(pairwise_js_sums(p, block_elements=self.block_elements), rep, n_distinct=len(rep))
        else:
            rep, distinct = unchanged_heads(p[:half], p[half:])
            sums = expand_pairs(pairwise_js_sums(p[distinct], block_elements=self.block_elements), rep)
        sums[transfer.send(self._moved_pairs, sums.device)] = paired_js_sums(p[:half], p[half:]).to(sums.device)
        return sums

    def _state(self, x: np.ndarray | torch.Tensor | None) -> np.ndarray | torch.Tensor | None:
        """Sums ``x`` in this instance's form: NumPy, or float64 tensors on the device of :attr:`total`."""
        if x is None:
            return None
        if isinstance(self.total, torch.Tensor):
            return torch.as_tensor(x).to(self.total.device, torch.float64)
        return host(x)

    def _to(self, device: torch.device | None) -> None:
        """Keep the sums as float64 tensors on ``device``, or as NumPy arrays for None (moving what is kept)."""
        if device is None:
            self.total = host(self.total)
        elif not isinstance(self.total, torch.Tensor) or self.total.device != device:
            with torch.inference_mode(False):
                self.total = transfer.send(self.total, device, torch.float64)
        self.sums = self._state(self.sums)

    def update(self, batch: PairBatch) -> None:
        idx = batch.example_indices
        if self._allowed is not None:
            unknown = [int(i) for i in idx if int(i) not in self._allowed]
            if unknown:
                raise ValueError(f"head_map: examples {unknown[:5]} are not in example_indices")
        self.n_seen += len(idx)
        keys = example_keys(self.seed, idx)
        cand = np.ones(len(idx), dtype=bool)
        if self._limit is not None:
            cand &= keys <= self._limit
        if len(self.keys) >= self.max_examples:
            cand &= keys <= self.keys[-1]
        cand = np.nonzero(cand)[0]
        cand = cand[np.lexsort((idx[cand], keys[cand]))][: self.max_examples]
        if len(cand) == 0:
            return
        lengths = batch.lengths_host  # from the items: no copy of a GPU batch
        dev = batch.base.attentions[1].device
        on_device = self.on_device if self.on_device is not None else dev.type != "cpu"
        self._to(dev if on_device else None)
        sums = torch.stack([self._example_sums(batch, int(r), int(lengths[r])) for r in cand])
        self._keep(keys[cand], idx[cand], sums, lengths[cand])

    def _keep(self, keys: np.ndarray, indices: np.ndarray, sums: np.ndarray | torch.Tensor | None, rows: np.ndarray,
              total: np.ndarray | torch.Tensor | None = None) -> None:
        """Add candidates and keep the bottom ``max_examples`` by (key, index).

        ``sums`` are per example; without them (a shard that kept only its ``total``) those examples
        cannot be evicted, which is exact when they were chosen from the whole corpus's indices. They
        may be NumPy arrays or tensors on any device: they are taken into this instance's form first.
        """
        sums, total = self._state(sums), self._state(total)
        mine = self.sums is not None
        theirs = sums is not None
        all_keys = np.concatenate([self.keys, keys])
        all_indices = np.concatenate([self.indices, indices])
        all_rows = np.concatenate([self.rows, rows])
        order = np.lexsort((all_indices, all_keys))
        kept, dropped = order[: self.max_examples], order[self.max_examples :]
        if mine and theirs:
            joined = torch.cat([self.sums, sums]) if isinstance(sums, torch.Tensor) else np.concatenate([self.sums, sums])
            self.sums = _take_rows(joined, kept)
        else:
            fixed = np.concatenate([np.full(len(self.keys), not mine), np.full(len(keys), not theirs)])
            if fixed[dropped].any():
                raise ValueError("head_map: cannot merge shards built with example_indices of their own; give "
                                 "every shard the indices of the whole corpus (or none)")
            n_self = len(self.keys)
            total = (self.total if not mine else 0) + (total if not theirs else 0)
            if mine:
                total = total + _take_rows(self.sums, kept[kept < n_self]).sum(0)
            if theirs:
                total = total + _take_rows(sums, kept[kept >= n_self] - n_self).sum(0)
            self.total, self.sums = total, None
        self.keys, self.indices, self.rows = all_keys[kept], all_indices[kept], all_rows[kept]

    def _total(self) -> np.ndarray:
        """The JS sums over the sample (float64 NumPy: the one copy to the host of a device run)."""
        # Per-example sums are added in key order, so the total does not depend on batching or sharding.
        total = self.sums.sum(0) if self.sums is not None else self.total
        return total.cpu().numpy() if isinstance(total, torch.Tensor) else total

    def merge(self, other: "HeadMap") -> "HeadMap":
        self._check_mergeable(other)
        if np.intersect1d(self.indices, other.indices).size:
            raise ValueError("head_map: the shards share examples")
        if not len(self.keys) and len(other.keys):  # an empty instance takes the shard's form and device
            self._to(other.total.device if isinstance(other.total, torch.Tensor) else None)
        self._keep(other.keys, other.indices, other.sums, other.rows, other.total)
        self.n_seen += other.n_seen
        return self

    # ------------------------------------------------------------------------------ results
    @property
    def sample(self) -> np.ndarray:
        """Indices of the examples in the sample, in key order."""
        return self.indices.copy()

    def divergence_matrix(self) -> np.ndarray:
        """Mean JS divergence (bits) over the sampled query tokens, ``[K, K]`` in :func:`head_index` order."""
        if len(self.indices) == 0:
            raise ValueError("head_map saw no examples")
        return square(self._total() / self.rows.sum(), self.n_heads_total)

    def distance_matrix(self, which: Distance | None = None) -> np.ndarray:
        """The matrix MDS uses (``which`` defaults to ``distance``).

        ``js_distance``: the square root of :meth:`divergence_matrix`; ``js_divergence``: that matrix;
        ``clark2019``: the divergence in nats summed over the sampled tokens (Clark et al.'s matrix).
        """
        which = which or self.distance
        if which == "clark2019" and self.distance != "clark2019":
            raise ValueError("the clark2019 distance needs the smoothed maps: build the head map with distance='clark2019'")
        div = self.divergence_matrix()
        if which == "clark2019":
            return div * (self.rows.sum() * np.log(2.0))  # mean bits -> summed nats
        return np.sqrt(div) if which == "js_distance" else div

    def compute(self) -> Result:
        """``head_map`` table: one row per head of each model with its map position and ``moved``."""
        div = self.divergence_matrix()
        heads = head_index(self.num_layers, self.num_heads)
        d = self.distance_matrix()
        xy, stress = mds_embedding(d, seed=self.seed, init=self.mds_init, n_init=self.n_init,
                                   max_iter=self.max_iter, eps=self.eps, layers=heads["layer"].to_numpy())
        half = self.num_layers * self.num_heads
        moved_div = np.tile(np.diag(div[:half, half:]), 2)
        df = heads.assign(
            x=xy[:, 0], y=xy[:, 1],
            moved=np.sqrt(moved_div), moved_js_divergence=moved_div,
            n_examples=len(self.indices), n_tokens=int(self.rows.sum()), n_examples_seen=self.n_seen,
            distance=self.distance, stress=stress,
        )
        return Result(self.name, df, self.params())

    def extra_results(self) -> list[Result]:
        return [self.distances()]

    def distances(self) -> Result:
        """``head_distance`` table: every unordered pair of heads once (base heads first, then tuned)."""
        div = self.divergence_matrix()
        heads = head_index(self.num_layers, self.num_heads)
        ia, ib = pair_indices(self.n_heads_total)
        a, b = heads.iloc[ia].reset_index(drop=True), heads.iloc[ib].reset_index(drop=True)
        df = pd.concat([a.add_suffix("_a"), b.add_suffix("_b")], axis=1).assign(
            js_divergence=div[ia, ib], js_distance=np.sqrt(div[ia, ib]),
            n_examples=len(self.indices), n_tokens=int(self.rows.sum()),
        )
        return Result(self.distance_name, df, self.params())


def most_moved(table: pd.DataFrame, top: int | None = 10) -> pd.DataFrame:
    """The ``top`` heads that moved most (one row per head: ``layer, head, label, moved``), largest first; every head
    with ``top=None``."""
    heads = table[table["model"] == "base"] if "model" in table else table
    out = heads.sort_values(["moved", "layer", "head"], ascending=[False, True, True])
    out = out if top is None else out.head(top)
    out = out[["layer", "head", "moved"] + (["moved_js_divergence"] if "moved_js_divergence" in out else [])].copy()
    out.insert(2, "label", [f"L{l}H{h}" for l, h in zip(out["layer"], out["head"])])
    return out.reset_index(drop=True)


def summary(tables: Mapping[str, pd.DataFrame]) -> str:
    """The heads that moved most on the map."""
    ranked = most_moved(weights_rows(tables["head_map"]), top=None)
    return "head map: heads that moved most (JS distance) " + picks_text(ranked["label"].tolist(),
                                                                          ranked["moved"].tolist(), 3, lowest=False)


def _build(config: CompareConfig, ctx: BuildContext) -> HeadMap:
    return HeadMap(ctx.num_layers, ctx.num_heads, max_examples=config.head_map_examples, seed=config.seed,
                   distance=config.head_map_distance, example_indices=[it.index for it in ctx.encoded.items])


SETTINGS = (
    Setting("head_map_examples", 100, "Examples sampled for the all-pairs head distances.", minimum=1,
            paper="Clark et al. 2019"),
    convention("head_map_distance", paper="Clark et al. 2019"),
)

SPEC = AnalysisSpec("head_map", _build, ("head_map", "head_distance"), summary=summary, settings=SETTINGS,
                    per_measure=True)
