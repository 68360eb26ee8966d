"""2-D PCA views of token representations per layer, base and tuned side by side (van Aken et al. 2019).

For a few examples (chosen by index, or a seeded sample of the corpus) every token's representation
at every layer is kept; :meth:`PCAViews.compute` projects them to two dimensions (:func:`leading_pca`:
the two leading eigenvectors of the centred data's covariance, by Lanczos iteration or a subset
eigensolver, what scikit-learn's ``PCA(2, svd_solver="full")`` gives to rounding, with its ``svd_flip``
sign rule, at a fraction of the cost of a full SVD) in two ways:

- ``per_layer``: one PCA per model and layer (each panel in its own axes: the shape of each model's
  token cloud);
- ``shared``: one PCA per layer fitted on the base and the tuned tokens together, so the two panels
  share axes and the movement of tokens between models is visible.

Each token carries a ``category`` to colour by: ``special`` ([CLS], [SEP], ...), ``punct`` (punctuation
pieces, which needs ``tokenizer``, or UPOS PUNCT/SYM), a coarse part of speech when the corpus is annotated (``noun`` = NOUN/PROPN,
``verb`` = VERB/AUX, ``adj``, ``adv``, ``pron``, ``det``, ``adp``, ``conj`` = CCONJ/SCONJ, ``num``,
``part``, ``other``; every piece of a word takes the word's tag), else ``word``; and the example's
``label`` (when the corpus has labels). Tokens are ordered by (example, position) before fitting, so
the projection does not depend on batching.

``examples`` is a count or the example indices themselves (as ``--pca-examples``); a count ``n`` samples the
``n`` examples with the smallest hashed keys of ``(seed, example index)``, exact under batching and ``merge``; memory is those examples' tokens only
(``T x 2 x layers x hidden`` float32 each).

Device: with the hidden states on a GPU (:attr:`PCAViews.on_device`), the kept examples' token vectors
stay there as float32 tensors, gathered on the device at positions chosen on the host from the examples' own
arrays (``special``, their lengths), so no batch tensor is read back; ``compute`` centres them in float64 there,
takes the two leading eigenpairs with torch (:func:`leading_pca_torch`: the same sides, rank rule and ``svd_flip``
signs as :func:`leading_pca`), projects, and brings only the coordinates and variance ratios to the host, once.
On the CPU the NumPy path is kept (faster there: ``benchmarks/analysis_device.py --pca``);
``tests/unit/test_pca_views_device.py`` pins the two together.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
import torch

from bertology import transfer
from bertology.analyses.device_state import host
from bertology.activations.batch import PairBatch
from bertology.analyses.attention_targets import is_punct_token
from bertology.analyses.base import Analysis
from bertology.analyses.registry import AnalysisSpec, BuildContext
from bertology.settings import Setting, count_or_indices
from bertology.blas import one_blas_thread
from bertology.config import CompareConfig
from bertology.errors import BertologyError
from bertology.metrics.principal import top_eigenpairs, top_eigenpairs_torch
from bertology.analyses.head_map import example_keys
from bertology.data.align import annotated_word_ids
from bertology.data.corpus import Corpus
from bertology.results import Result

MODELS = ("base", "tuned")
FITS = ("per_layer", "shared")
COARSE_POS = {
    "NOUN": "noun", "PROPN": "noun", "VERB": "verb", "AUX": "verb", "ADJ": "adj", "ADV": "adv", "PRON": "pron",
    "DET": "det", "ADP": "adp", "CCONJ": "conj", "SCONJ": "conj", "NUM": "num", "PART": "part",
    "PUNCT": "punct", "SYM": "punct", "INTJ": "other", "X": "other",
}
_SALT = 0x706361  # "pca": keeps this sample apart from head_map's with the same seed
COLUMNS = ["model", "layer", "fit", "example", "token_index", "token", "category", "label", "x", "y",
           "explained_variance", "explained_variance_x", "explained_variance_y", "n_tokens"]


def leading_pca(x: np.ndarray, k: int = 2) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The ``k`` leading principal axes of ``x`` ``[n, dim]``: ``(mean [dim], components [k, dim], ratio [k])``.

    Equal, to rounding, to ``sklearn.decomposition.PCA(k, svd_solver="full")``'s ``mean_``,
    ``components_`` and ``explained_variance_ratio_`` (tested): the ``k`` top eigenpairs of the centred data's
    covariance (:func:`bertology.metrics.principal.top_eigenpairs`: Lanczos on ``Xc`` for large clouds, else
    LAPACK's subset ``eigh`` of the smaller of ``Xc Xc'`` and ``Xc' Xc``) instead of the full SVD, which costs
    ~10x more and computes ``min(n, dim)`` axes to show two; the total variance is ``||Xc||_F^2`` (the sum of
    all squared singular values). Signs follow sklearn's ``svd_flip(u_based_decision=False)``: each axis's
    largest-magnitude coordinate is positive. An axis with zero variance (rank below ``k``) is returned as
    zeros: it projects every point to 0, as any null-space axis does. Accuracy: eigenvalues to
    ``eps * sigma_1^2``, so an axis to about ``eps * sigma_1^2 / gap`` (its gap to the next eigenvalue); axes
    of near-equal variance are not determined by either method.
    """
    x = np.asarray(x, dtype=np.float64)
    n, dim = x.shape
    if not 1 <= k <= min(n, dim):
        raise ValueError(f"cannot fit {k} components to {n} points of dimension {dim}")
    mean = x.mean(axis=0)
    xc = x - mean
    w, vt = top_eigenpairs(xc, k)
    top = np.argmax(np.abs(vt), axis=1)
    vt = vt * np.where(vt[np.arange(k), top] < 0, -1.0, 1.0)[:, None]
    total = float(np.einsum("ij,ij->", xc, xc))
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = w / total
    return mean, np.ascontiguousarray(vt), ratio


def leading_pca_torch(x: torch.Tensor, k: int = 2) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`leading_pca` in torch on ``x``'s device, batched over leading axes: ``x`` ``[..., n, dim]`` (centred
    in float64) gives ``(mean [..., dim], components [..., k, dim], ratio [..., k])``, nothing copied to the host.

    The eigenpairs come from :func:`bertology.metrics.principal.top_eigenpairs_torch` (the same side and rank rule
    as the NumPy path, a full ``eigh`` instead of Lanczos); the signs follow the same ``svd_flip`` rule (each axis's
    largest-magnitude coordinate positive, the first such on ties). Pinned to :func:`leading_pca` by
    ``tests/unit/test_pca_views_device.py``: axes to ``~eps sigma_1^2 / gap``, ratios to rounding.
    """
    x = x.double()
    n, dim = x.shape[-2:]
    if not 1 <= k <= min(n, dim):
        raise ValueError(f"cannot fit {k} components to {n} points of dimension {dim}")
    mean = x.mean(-2)
    xc = x - mean[..., None, :]
    w, vt = top_eigenpairs_torch(xc, k)
    top = vt.abs().argmax(-1, keepdim=True)  # [..., k, 1]
    vt = vt * torch.where(vt.gather(-1, top) < 0, -1.0, 1.0)
    total = (xc * xc).sum((-2, -1))
    return mean, vt, w / total[..., None]


@dataclass
class _Example:
    key: np.uint64
    index: int
    tokens: list[str]
    categories: list[str]
    positions: np.ndarray  # int64 [n]
    vectors: np.ndarray | torch.Tensor  # float32 [n, 2, n_layers, hidden]; a tensor on the maps' device


class PCAViews(Analysis):
    """Token representations of a few examples, projected to 2-D per layer (per-model and shared PCA)."""

    name = "pca_views"
    requires = frozenset({"hidden_states"})
    #: Where the kept token vectors live. None: with the hidden states, unless they are on the CPU, where
    #: the NumPy path is kept (faster there); True forces the device path (tests, benchmarks), False the host one.
    on_device: bool | None = None

    def __init__(
        self,
        num_layers: int,
        *,
        tokenizer=None,
        corpus: Corpus | None = None,
        examples: int | Iterable[int] = 20,
        layers: Sequence[int] | None = None,
        fits: Sequence[str] = FITS,
        include_special: bool = True,
        seed: int = 0,
    ):
        if isinstance(examples, int) and examples < 1:
            raise ValueError("examples must be a count of at least 1 or the example indices")
        fits = tuple(fits)
        if not fits or any(f not in FITS for f in fits):
            raise ValueError(f"fits must be a non-empty subset of {FITS}, not {fits!r}")
        self.layers = tuple(range(num_layers + 1)) if layers is None else tuple(int(l) for l in layers)
        if not self.layers or any(not 0 <= l <= num_layers for l in self.layers):
            raise ValueError(f"layers must lie in 0..{num_layers}, got {self.layers}")
        self.num_layers, self.tokenizer, self.corpus = num_layers, tokenizer, corpus
        self.examples = None if isinstance(examples, int) else tuple(sorted({int(i) for i in examples}))
        self.n_examples = len(self.examples) if self.examples is not None else examples
        self.fits, self.include_special, self.seed = fits, bool(include_special), seed
        self.kept: list[_Example] = []  # sorted by (key, index)
        self.n_seen = 0

    def params(self) -> dict:
        return {
            "examples": list(self.examples) if self.examples is not None else None,
            "n_examples": self.n_examples, "seed": self.seed, "layers": list(self.layers), "fits": list(self.fits),
            "include_special": self.include_special,
            "sample": "the given examples" if self.examples is not None else "bottom-k of hash(seed, example index)",
            "pca": "2 leading axes (= sklearn PCA(n_components=2, svd_solver='full') to rounding), tokens in (example, position) order",
            "num_layers": self.num_layers,
        }

    # ------------------------------------------------------------------------------ token labels
    def _token_strings(self, ids: np.ndarray) -> list[str]:
        if self.tokenizer is None:
            return [str(int(i)) for i in ids]
        return list(self.tokenizer.convert_ids_to_tokens([int(i) for i in ids]))

    def _categories(self, item, tokens: list[str]) -> list[str]:
        ex = self.corpus[item.index] if self.corpus is not None else None
        word_tag: np.ndarray | None = None
        if ex is not None and ex.upos is not None and ex.words is not None:
            aw = annotated_word_ids(item.word_ids, item.segment, ex.n_first_words)
            word_tag = aw
        out = []
        for t, (tok, special) in enumerate(zip(tokens, item.special)):
            if special:
                out.append("special")
                continue
            if word_tag is not None and 0 <= word_tag[t] < len(ex.upos):
                out.append(COARSE_POS.get(str(ex.upos[word_tag[t]]).upper(), "other"))
            elif self.tokenizer is not None and is_punct_token(tok):
                out.append("punct")
            else:
                out.append("word")
        return out

    def label_of(self, index: int) -> str | None:
        """The example's label (None without a labelled corpus)."""
        if self.corpus is None:
            return None
        return self.corpus[index].label

    # ------------------------------------------------------------------------------ streaming
    def _keep(self, new: list[_Example]) -> None:
        allx = self.kept + new
        allx.sort(key=lambda e: (int(e.key), e.index))
        self.kept = allx[: self.n_examples]

    def _positions(self, item) -> np.ndarray:
        """The example's kept token positions: all of them, or (``include_special=False``) its non-special ones. The
        same positions as ``batch.mask`` / ``batch.content`` (``collate`` builds them from these arrays), from the host."""
        special = np.asarray(item.special, dtype=bool)
        return np.arange(len(special), dtype=np.int64) if self.include_special else np.flatnonzero(~special)

    def update(self, batch: PairBatch) -> None:
        """Keep the sampled examples' tokens: NumPy copies on the CPU, float32 tensors gathered where the hidden states
        are otherwise (no host copy: rows and positions are chosen from the examples' host arrays)."""
        idx = batch.example_indices
        self.n_seen += len(idx)
        keys = example_keys(self.seed ^ _SALT, idx)
        if self.examples is not None:
            wanted = set(self.examples)
            rows = [r for r, i in enumerate(idx) if int(i) in wanted]
        else:
            limit = (int(self.kept[-1].key), self.kept[-1].index) if len(self.kept) >= self.n_examples else None
            rows = [r for r in range(len(idx)) if limit is None or (int(keys[r]), int(idx[r])) < limit]
        if not rows:
            return
        on_device = self.on_device
        if on_device is None:
            on_device = batch.base.hidden_states[0].device.type != "cpu"
        caps = (batch.base, batch.tuned)
        new = []
        for r in rows:
            item = batch.items[r]
            pos = self._positions(item)
            if on_device:
                at = transfer.send(pos, caps[0].hidden_states[0].device)
                vec = torch.stack([torch.stack([cap.hidden_states[l][r, at] for l in self.layers], dim=1)
                                   for cap in caps], dim=1).float()  # [n, 2, n_layers, D] on the device
            else:
                vec = np.stack(
                    [np.stack([cap.hidden_states[l][r, pos].float().cpu().numpy() for l in self.layers], axis=1)
                     for cap in caps], axis=1).astype(np.float32)  # [n, 2, n_layers, D]
            tokens = self._token_strings(item.input_ids)
            cats = self._categories(item, tokens)
            new.append(_Example(keys[r], int(item.index), [tokens[p] for p in pos], [cats[p] for p in pos], pos, vec))
        self._keep(new)

    def _device(self) -> torch.device | None:
        """The device of the kept tensors (None: the kept vectors are NumPy arrays)."""
        return next((e.vectors.device for e in self.kept if isinstance(e.vectors, torch.Tensor)), None)

    def merge(self, other: "PCAViews") -> "PCAViews":
        self._check_mergeable(other)
        if {e.index for e in self.kept} & {e.index for e in other.kept}:
            raise ValueError("pca_views: the shards share examples")
        device = self._device() or other._device()  # a device shard's tensors go to this one's device (or come here)
        kept = self.kept + list(other.kept)
        if device is not None:
            kept = [replace(e, vectors=torch.as_tensor(e.vectors).to(device)) for e in kept]
        self.kept = []
        self._keep(kept)
        self.n_seen += other.n_seen
        return self

    # ------------------------------------------------------------------------------ results
    @property
    def sample(self) -> list[int]:
        """Indices of the kept examples, in ascending order."""
        return sorted(e.index for e in self.kept)

    def token_matrix(self, model: int, layer: int) -> np.ndarray:
        """The kept tokens' vectors of one model (0 base, 1 tuned) and layer, in (example, position) order."""
        li = self.layers.index(layer)
        ex = sorted(self.kept, key=lambda e: e.index)
        return np.concatenate([host(e.vectors[:, model, li]) for e in ex]).astype(np.float64)

    def compute(self) -> Result:
        """The ``pca_views`` table: one row per model, layer, fit and token."""
        ex = sorted(self.kept, key=lambda e: e.index)
        n = sum(len(e.positions) for e in ex)
        if n < 3:
            raise ValueError(f"pca_views needs at least 3 tokens, got {n}")
        meta = pd.DataFrame({
            "example": np.concatenate([np.full(len(e.positions), e.index) for e in ex]),
            "token_index": np.concatenate([e.positions for e in ex]),
            "token": [t for e in ex for t in e.tokens],
            "category": [c for e in ex for c in e.categories],
            "label": [self.label_of(e.index) for e in ex for _ in e.positions],
        })
        device = self._device()
        # MPS has no float64 (nor eigh): its tensors are fitted on the host, as the CPU's.
        fits = self._fits_on_device(ex, device) if device is not None and device.type != "mps" else self._fits()
        parts = []
        for (layer, fit), (xy, ratio) in fits.items():
            for m, model in enumerate(MODELS):
                r = np.pad(ratio[m], (0, 2 - len(ratio[m])))
                parts.append(meta.assign(model=model, layer=layer, fit=fit, x=xy[m][:, 0], y=xy[m][:, 1],
                                         explained_variance=float(r.sum()), explained_variance_x=float(r[0]),
                                         explained_variance_y=float(r[1]), n_tokens=n))
        df = pd.concat(parts, ignore_index=True)[COLUMNS]
        df["n_examples_seen"] = self.n_seen
        return Result(self.name, df, self.params())

    def _fits(self) -> dict[tuple[int, str], tuple[list[np.ndarray], list[np.ndarray]]]:
        """Per (layer, fit), in table order: each model's coordinates ``[n, 2]`` and variance ratios ``[2]`` (NumPy)."""
        def project(x: np.ndarray, fit: tuple[np.ndarray, np.ndarray, np.ndarray]) -> np.ndarray:
            return (x - fit[0]) @ fit[1].T

        out = {}
        # BLAS on one thread: the products and eighs are small (a few hundred rows), LAPACK's tridiagonal reduction
        # synchronises its threads once per column, and on a shared 2-core machine BERT-base's 13 layers took
        # 1.6 s to 57 s with two threads (the busier the cores elsewhere, the longer), 1.0 s with one
        # (docs/results/benchmarks.md). Same fits to rounding.
        with one_blas_thread():
            for layer in self.layers:
                xs = [self.token_matrix(m, layer) for m in range(2)]
                if "per_layer" in self.fits:
                    fit = [leading_pca(x) for x in xs]
                    out[layer, "per_layer"] = ([project(x, f) for x, f in zip(xs, fit)], [f[2] for f in fit])
                if "shared" in self.fits:
                    fit = leading_pca(np.concatenate(xs))
                    out[layer, "shared"] = ([project(x, fit) for x in xs], [fit[2]] * 2)
        return out

    def _fits_on_device(self, ex: list[_Example], device: torch.device) -> dict[tuple[int, str], tuple[np.ndarray, np.ndarray]]:
        """:meth:`_fits` where the tensors are: one layer's ``[2, n, D]`` at a time in float64, both models'
        per-layer fits as one batched :func:`leading_pca_torch`; the coordinates and ratios of every fit cross to the
        host together at the end, the only host copy."""
        vectors = torch.cat([torch.as_tensor(e.vectors).to(device) for e in ex])  # [n, 2, n_layers, D] float32
        keys, xys, ratios = [], [], []
        for li, layer in enumerate(self.layers):
            x = vectors[:, :, li].transpose(0, 1).double()  # [2, n, D]
            if "per_layer" in self.fits:
                mean, comps, ratio = leading_pca_torch(x)
                keys.append((layer, "per_layer"))
                xys.append((x - mean[:, None]) @ comps.transpose(-1, -2))
                ratios.append(ratio)
            if "shared" in self.fits:
                mean, comps, ratio = leading_pca_torch(x.reshape(-1, x.shape[-1]))
                keys.append((layer, "shared"))
                xys.append((x - mean) @ comps.T)
                ratios.append(ratio.expand(2, -1))
        xy, ratio = torch.stack(xys).cpu().numpy(), torch.stack(ratios).cpu().numpy()
        return {key: (xy[i], ratio[i]) for i, key in enumerate(keys)}


def _build(config: CompareConfig, ctx: BuildContext) -> PCAViews:
    """``pca_examples``: a count (a seeded sample) or the example indices themselves."""
    chosen = config.pca_examples
    if isinstance(chosen, int):
        if chosen < 1:
            raise BertologyError(f"--pca-examples (pca_examples) must be at least 1, not {chosen}.")
    else:
        bad = [i for i in chosen if not 0 <= i < len(ctx.corpus)]
        if bad or not chosen:
            raise BertologyError(f"PCA view example(s) {bad} are not in the corpus (0..{len(ctx.corpus) - 1}).")
        chosen = list(chosen)
    return PCAViews(ctx.num_layers, tokenizer=ctx.tokenizer, corpus=ctx.corpus, examples=chosen, seed=config.seed)


SETTINGS = (
    Setting("pca_examples", 20, "A count (a seeded sample of that many examples) or a comma list of example "
            "indices, e.g. 0,4,9.", kind=tuple, parse=count_or_indices, metavar="N|I,J,..",
            paper="van Aken et al. 2019"),
)

SPEC = AnalysisSpec("pca_views", _build, ("pca_views",), settings=SETTINGS)
