"""Layer-wise similarity of base and tuned representations (Merchant et al. 2020): RSA and CKA.

One shared sample of content tokens (no [CLS]/[SEP]/padding) is drawn from the whole corpus; for
every base layer x tuned layer it reports RSA (Pearson and Spearman correlation of the upper
triangles of the cosine-similarity matrices) and linear and debiased CKA.

The token sample is a bottom-k sample on a hashed key of ``(seed, example index, token position)``:
the same tokens are chosen whatever the batch order or sharding, memory stays at ``n_tokens`` vectors
per layer, and ``merge`` of two shards gives exactly the sample of the whole corpus.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pandas as pd
import torch

from bertology import transfer
from bertology.activations.batch import PairBatch
from bertology.analyses.base import Analysis
from bertology.analyses.registry import AnalysisSpec, BuildContext
from bertology.settings import Setting
from bertology.config import CompareConfig
from bertology.metrics.similarity import similarity_grids
from bertology.metrics.similarity_torch import similarity_grids_torch
from bertology.reach import ManyView, SeedNoise, Track, changes, views
from bertology.results import Result

METRICS = ("rsa_pearson", "rsa_spearman", "cka_linear", "cka_debiased")

_M1, _M2, _GOLD = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB), np.uint64(0x9E3779B97F4A7C15)


def token_keys(seed: int, example: np.ndarray, position: np.ndarray) -> np.ndarray:
    """Deterministic pseudo-random uint64 key per (seed, example, position): SplitMix64 finaliser.

    Hand-written because NumPy's generators are sequential: a key must not depend on the order in
    which tokens arrive. The analysis computes them here, on the host, from the items (example indices and
    content positions are known there), on every device: no key is computed or read back on a GPU.
    """
    with np.errstate(over="ignore"):
        z = (np.uint64(seed) * _GOLD) ^ (example.astype(np.uint64) * _M1) ^ (position.astype(np.uint64) + np.uint64(1)) * _M2
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        return z ^ (z >> np.uint64(31))


def _rows(h: torch.Tensor, r: torch.Tensor, c: torch.Tensor, host: bool) -> torch.Tensor:
    """``h[r, c].float()``: the rows of a ``[batch, seq, hidden]`` tensor at ``(r, c)``, in float32, on ``h``'s device.

    With ``host`` (CPU float32 tensors only) NumPy makes the copy: the same bits, 10x faster here, because
    torch's CPU allocator faults in the pages of every new large tensor (26 gathers of 2,000 x 768 took
    0.29 s in torch against 0.02 s in NumPy on our 2 shared cores).
    """
    if host and h.device.type == "cpu" and h.dtype == torch.float32:
        return torch.from_numpy(h.numpy()[r.numpy(), c.numpy()])
    return h[r, c].float()


def _cat_rows(parts: list[torch.Tensor], order: np.ndarray, host: bool) -> torch.Tensor:
    """``torch.cat(parts)[order]`` (on the parts' device); with ``host`` on the CPU by NumPy, as :func:`_rows`."""
    if host and parts[0].device.type == "cpu":
        return torch.from_numpy(np.concatenate([p.numpy() for p in parts])[order])
    return torch.cat(parts)[transfer.send(order, parts[0].device)]


class RepresentationSimilarity(Analysis):
    """RSA and CKA between every base layer and every tuned layer on one shared token sample.

    The sampled vectors live where the hidden states are: torch tensors on the captured tensors'
    device, so on a GPU nothing is read back from the device per batch (no copy, no index list to size). Which tokens
    are candidates and which are kept is decided on the host: their keys (:func:`token_keys`), example indices and
    positions come from the items (:meth:`PairBatch.host_tokens`), and only the gather positions go to the
    device. The vectors are kept in float32 (the
    captured states' values, exactly as before; the statistics are float64 in ``compute``). ``compute``
    runs where the sample is: on the CPU the NumPy/Numba :func:`similarity_grids` (faster there), on other
    devices :func:`similarity_grids_torch` in float64; on MPS, which has no float64, the sample is copied to
    the host once and the NumPy path computes it.
    """

    name = "representation_similarity"
    requires = frozenset({"hidden_states"})
    #: Where ``compute`` runs: None follows the sample (CPU and MPS: NumPy on the host; others: torch on the
    #: device); True forces the torch path (tests run it on the CPU), False the NumPy one.
    compute_on_device: bool | None = None
    #: On the CPU, copy sampled rows with NumPy (:func:`_rows`; the same bits). False: torch, as on a GPU.
    host_rows: bool = True

    def __init__(self, num_layers: int, n_tokens: int = 2000, seed: int = 0):
        if n_tokens < 4:
            raise ValueError("n_tokens must be at least 4")
        self.num_layers, self.n_tokens, self.seed = num_layers, n_tokens, seed
        self.device = torch.device("cpu")
        self.keys = np.zeros(0, dtype=np.uint64)  # the sample's keys (token_keys), sorted; on the host
        self.ids = np.zeros((0, 2), dtype=np.int64)  # (example index, position), in the same order
        self.base: list[torch.Tensor] | None = None  # per layer [k, hidden] float32, on self.device
        self.tuned: list[torch.Tensor] | None = None
        self.n_seen = 0
        self._pending: list[tuple] = []
        self._n_pending = 0

    def params(self) -> dict:
        return {"n_tokens": self.n_tokens, "seed": self.seed, "tokens": "content (no special, no padding)",
                "num_layers": self.num_layers}

    def _keep(self, keys, ids, base, tuned) -> None:
        """Queue candidate tokens; they are merged into the bottom-k sample in :meth:`_flush`."""
        self._pending.append((keys, ids, base, tuned))
        self._n_pending += len(keys)
        if self._n_pending >= self.n_tokens:
            self._flush()

    def _flush(self) -> None:
        """Merge queued candidates into the sample (one concatenation per ``n_tokens`` candidates)."""
        if not self._pending:
            return
        parts = ([(self.keys, self.ids, self.base, self.tuned)] if self.base is not None else []) + self._pending
        keys = np.concatenate([p[0] for p in parts])
        ids = np.concatenate([p[1] for p in parts])
        # Tie-break on (example, position) so the sample is a pure function of the keys.
        order = np.lexsort((ids[:, 1], ids[:, 0], keys))[: self.n_tokens]
        self.keys, self.ids = keys[order], ids[order]
        n_layers = len(parts[0][2])
        self.base = [_cat_rows([p[2][l] for p in parts], order, self.host_rows) for l in range(n_layers)]
        self.tuned = [_cat_rows([p[3][l] for p in parts], order, self.host_rows) for l in range(n_layers)]
        self._pending, self._n_pending = [], 0

    def update(self, batch: PairBatch) -> None:
        dev = batch.base.hidden_states[0].device
        rows, cols = np.nonzero(batch.host_tokens()[2])  # content tokens, from the items: nothing read back
        if len(rows) == 0:
            return
        if self.base is None and not self._pending:
            self.device = dev
        example = batch.example_indices[rows]
        keys = token_keys(self.seed, example, cols)
        # Only tokens that could enter the current bottom-k are gathered (the threshold is the
        # largest kept key; queued candidates only make it conservative, never wrong).
        if len(self.keys) >= self.n_tokens:
            cand = np.flatnonzero(keys <= self.keys[-1])
        else:
            cand = np.argsort(keys, kind="stable")[: self.n_tokens]
        self.n_seen += len(rows)
        if len(cand) == 0:
            return
        r, c = (transfer.send(x[cand], dev) for x in (rows, cols))
        base = [_rows(batch.base.hidden_states[l], r, c, self.host_rows) for l in range(self.num_layers + 1)]
        tuned = [_rows(batch.tuned.hidden_states[l], r, c, self.host_rows) for l in range(self.num_layers + 1)]
        self._keep(keys[cand], np.stack([example[cand], cols[cand]], axis=1), base, tuned)

    def merge(self, other: "RepresentationSimilarity") -> "RepresentationSimilarity":
        self._check_mergeable(other)
        other._flush()
        if other.base is not None:
            if self.base is None and not self._pending:
                self.device = other.device
            to = self.device
            self._keep(other.keys, other.ids, [t.to(to) for t in other.base], [t.to(to) for t in other.tuned])
        self._flush()
        self.n_seen += other.n_seen
        return self

    def token_sample(self) -> tuple[np.ndarray, list[np.ndarray], list[np.ndarray]]:
        """The sampled tokens so far, copied to the host: ``(ids [k, 2] = (example, position), base layers, tuned layers)``."""
        self._flush()
        ids = self.ids.copy()
        if self.base is None:
            return ids, [], []
        return ids, [t.cpu().numpy() for t in self.base], [t.cpu().numpy() for t in self.tuned]

    def _grids(self) -> dict[str, np.ndarray]:
        """RSA and CKA grids of the sample, computed where :attr:`compute_on_device` says."""
        on_device = self.compute_on_device
        if on_device is None:
            on_device = self.device.type not in ("cpu", "mps")  # MPS has no float64
        if on_device:
            return similarity_grids_torch(self.base, self.tuned)
        # One Gram matrix per model and layer serves RSA and CKA (similarity_grids); its products and sorts are
        # NumPy that releases the GIL: one layer per thread torch may use. The base layers' terms are kept, the
        # tuned ones ``workers`` at a time (memory: see similarity_grids). On the CPU ``.numpy()`` is a view.
        return similarity_grids([t.cpu().numpy() for t in self.base], [t.cpu().numpy() for t in self.tuned],
                                workers=max(1, torch.get_num_threads()))

    def compute(self) -> Result:
        self._flush()
        if self.base is None or len(self.keys) < 4:
            raise ValueError("representation_similarity needs at least 4 content tokens")
        n = len(self.keys)
        layers = self.num_layers + 1
        grids = self._grids()
        records = []
        for lb in range(layers):
            for lt in range(layers):
                for metric in METRICS:
                    records.append((lb, lt, metric, float(grids[metric][lb, lt]), n, self.seed))
        df = pd.DataFrame.from_records(records, columns=["layer_base", "layer_tuned", "metric", "value", "n_tokens", "seed"])
        df["n_tokens_seen"] = self.n_seen
        return Result(self.name, df, self.params())


def same_layer(table: pd.DataFrame) -> pd.DataFrame:
    """The diagonal of the layer x layer grid: one row per layer and metric."""
    diag = table[table["layer_base"] == table["layer_tuned"]]
    return diag.rename(columns={"layer_base": "layer"}).drop(columns=["layer_tuned"])


#: Representation similarity on the second (out-of-domain) corpus, written by the pipeline with ``--ood-data``.
OOD_TABLE = "representation_similarity_ood"


def summary(tables: Mapping[str, pd.DataFrame]) -> str:
    """Linear CKA of base and tuned at the same layer, in domain and (when run) out of domain."""
    lines = []
    for name, where in (("representation_similarity", ""), (OOD_TABLE, ", out-of-domain corpus")):
        if name in tables:
            d = same_layer(tables[name])
            cka = d[d.metric == "cka_linear"].sort_values("layer")["value"]
            lines.append(f"linear CKA, same layer 0..N{where}: " + " ".join(f"{v:.3f}" for v in cka))
    return "\n".join(lines)


def _build(config: CompareConfig, ctx: BuildContext) -> RepresentationSimilarity:
    return RepresentationSimilarity(ctx.num_layers, config.rsa_tokens, config.seed)


SETTINGS = (
    Setting("rsa_tokens", 2000, "Size of the shared token sample for RSA/CKA.", minimum=4,
            paper="Merchant et al. 2020"),
    Setting("ood_data", None, "A second, out-of-domain corpus: RSA/CKA of base vs tuned on it too.", kind=str,
            paper="Merchant et al. 2020"),
    Setting("ood_text_column", None, "Text column of --ood-data (CSV/TSV/JSONL).", kind=str),
)

SPEC = AnalysisSpec("representation_similarity", _build, ("representation_similarity",), summary=summary,
                    settings=SETTINGS, seed_noise=SeedNoise(pairwise=True, extract=changes.representation_similarity),
                    many_view=ManyView("Representation similarity: linear CKA of base and tuned at the same layer",
                                       views.representation_similarity_view),
                    track=Track(views.representation_similarity_scalars))
