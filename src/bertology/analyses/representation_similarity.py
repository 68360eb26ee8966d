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

from bertology.activations.batch import PairBatch
from bertology.analyses.base import Analysis
from bertology.analyses.registry import AnalysisSpec, BuildContext
from bertology.settings import Setting
from bertology.config import CompareConfig
from bertology.metrics.similarity import similarity_grids
from bertology.results import Result

METRICS = ("rsa_pearson", "rsa_spearman", "cka_linear", "cka_debiased")

_M1, _M2, _GOLD = np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB), np.uint64(0x9E3779B97F4A7C15)


def token_keys(seed: int, example: np.ndarray, position: np.ndarray) -> np.ndarray:
    """Deterministic pseudo-random uint64 key per (seed, example, position): SplitMix64 finaliser.

    Hand-written because NumPy's generators are sequential: a key must not depend on the order in
    which tokens arrive.
    """
    with np.errstate(over="ignore"):
        z = (np.uint64(seed) * _GOLD) ^ (example.astype(np.uint64) * _M1) ^ (position.astype(np.uint64) + np.uint64(1)) * _M2
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        return z ^ (z >> np.uint64(31))


class RepresentationSimilarity(Analysis):
    """RSA and CKA between every base layer and every tuned layer on one shared token sample."""

    name = "representation_similarity"
    requires = frozenset({"hidden_states"})

    def __init__(self, num_layers: int, n_tokens: int = 2000, seed: int = 0):
        if n_tokens < 4:
            raise ValueError("n_tokens must be at least 4")
        self.num_layers, self.n_tokens, self.seed = num_layers, n_tokens, seed
        self.keys = np.zeros(0, dtype=np.uint64)
        self.ids = np.zeros((0, 2), dtype=np.int64)  # (example index, position)
        self.base: list[np.ndarray] | None = None  # per layer [k, hidden] float32
        self.tuned: list[np.ndarray] | None = None
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
        self.base = [np.concatenate([p[2][l] for p in parts])[order] for l in range(n_layers)]
        self.tuned = [np.concatenate([p[3][l] for p in parts])[order] for l in range(n_layers)]
        self._pending, self._n_pending = [], 0

    def update(self, batch: PairBatch) -> None:
        rows, cols = batch.content.nonzero(as_tuple=True)
        if len(rows) == 0:
            return
        rows_np, cols_np = rows.cpu().numpy(), cols.cpu().numpy()
        example = batch.example_indices[rows_np]
        keys = token_keys(self.seed, example, cols_np)
        # Only tokens that could enter the current bottom-k are gathered (the threshold is the
        # largest kept key; queued candidates only make it conservative, never wrong).
        if len(self.keys) >= self.n_tokens:
            cand = np.nonzero(keys <= self.keys[-1])[0]
        else:
            cand = np.argsort(keys, kind="stable")[: self.n_tokens]
        self.n_seen += len(rows_np)
        if len(cand) == 0:
            return
        r, c = rows[cand], cols[cand]
        base = [batch.base.hidden_states[l][r, c].float().cpu().numpy() for l in range(self.num_layers + 1)]
        tuned = [batch.tuned.hidden_states[l][r, c].float().cpu().numpy() for l in range(self.num_layers + 1)]
        ids = np.stack([example[cand], cols_np[cand]], axis=1)
        self._keep(keys[cand], ids, base, tuned)

    def merge(self, other: "RepresentationSimilarity") -> "RepresentationSimilarity":
        self._check_mergeable(other)
        other._flush()
        if other.base is not None:
            self._keep(other.keys, other.ids, other.base, other.tuned)
        self._flush()
        self.n_seen += other.n_seen
        return self

    def token_sample(self) -> tuple[np.ndarray, list[np.ndarray], list[np.ndarray]]:
        """The sampled tokens so far: ``(ids [k, 2] = (example, position), base layers, tuned layers)``."""
        self._flush()
        if self.base is None:
            return self.ids, [], []
        return self.ids, self.base, self.tuned

    def compute(self) -> Result:
        self._flush()
        if self.base is None or len(self.keys) < 4:
            raise ValueError("representation_similarity needs at least 4 content tokens")
        n = len(self.keys)
        layers = self.num_layers + 1
        # One Gram matrix per model and layer serves RSA and CKA (similarity_grids); its products and sorts are
        # NumPy that releases the GIL: one layer per thread torch may use. The base layers' terms are kept, the
        # tuned ones ``workers`` at a time (memory: see similarity_grids).
        grids = similarity_grids(self.base, self.tuned, workers=max(1, torch.get_num_threads()))
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
                    settings=SETTINGS)
